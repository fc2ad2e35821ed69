// Tests of the fl.v1 wire schema: messages round-trip, chunked transfers reassemble, and every element of
// the schema carries documentation (the schema is the protocol's reference, so an undocumented field is a bug).
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>

#include "fl/core/checksum.h"
#include "fl/v1/federation.grpc.pb.h"
#include "fl/v1/federation.pb.h"

namespace fl::v1 {
namespace {

google::protobuf::FileDescriptorSet LoadDescriptorSet() {
  std::ifstream in(FL_PROTO_DESCRIPTOR_PATH, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << FL_PROTO_DESCRIPTOR_PATH;
  google::protobuf::FileDescriptorSet set;
  EXPECT_TRUE(set.ParseFromIstream(&in));
  return set;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \n\t");
  size_t e = s.find_last_not_of(" \n\t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

TEST(SchemaDocsTest, EveryElementOfFlV1IsDocumented) {
  auto set = LoadDescriptorSet();
  int checked = 0;
  std::vector<std::string> undocumented;
  for (const auto& file : set.file()) {
    if (file.package() != "fl.v1") continue;
    // Map each location path to its leading comment; paths follow descriptor.proto's field numbers:
    // message_type=4, field=2, nested enum=4... we only need: message 4 / field 2, enum 5 / value 2,
    // service 6 / method 2, and message-nested oneofs are covered by their fields.
    std::map<std::vector<int>, std::string> comments;
    for (const auto& loc : file.source_code_info().location()) {
      comments[std::vector<int>(loc.path().begin(), loc.path().end())] = Trim(loc.leading_comments());
    }
    auto check = [&](const std::vector<int>& path, const std::string& what) {
      ++checked;
      auto it = comments.find(path);
      if (it == comments.end() || it->second.empty()) undocumented.push_back(file.name() + ": " + what);
    };
    for (int m = 0; m < file.message_type_size(); ++m) {
      const auto& msg = file.message_type(m);
      check({4, m}, "message " + msg.name());
      for (int f = 0; f < msg.field_size(); ++f) check({4, m, 2, f}, msg.name() + "." + msg.field(f).name());
      for (int o = 0; o < msg.oneof_decl_size(); ++o)
        check({4, m, 8, o}, msg.name() + " oneof " + msg.oneof_decl(o).name());
    }
    for (int e = 0; e < file.enum_type_size(); ++e) {
      const auto& en = file.enum_type(e);
      check({5, e}, "enum " + en.name());
      for (int v = 0; v < en.value_size(); ++v) check({5, e, 2, v}, en.name() + "." + en.value(v).name());
    }
    for (int s = 0; s < file.service_size(); ++s) {
      const auto& svc = file.service(s);
      check({6, s}, "service " + svc.name());
      for (int r = 0; r < svc.method_size(); ++r) check({6, s, 2, r}, "rpc " + svc.method(r).name());
    }
  }
  EXPECT_GT(checked, 150) << "the descriptor set looks incomplete";
  std::string list;
  for (const auto& u : undocumented) list += "\n  " + u;
  EXPECT_TRUE(undocumented.empty()) << "undocumented schema elements (add a leading comment):" << list;
}

TEST(SchemaDocsTest, EveryEnumStartsWithUnspecifiedZero) {
  // proto3 decodes unknown/missing enums as 0, so 0 must mean "not set", never a real value.
  auto set = LoadDescriptorSet();
  for (const auto& file : set.file()) {
    if (file.package() != "fl.v1") continue;
    for (const auto& en : file.enum_type()) {
      ASSERT_GT(en.value_size(), 0);
      EXPECT_EQ(en.value(0).number(), 0) << en.name();
      const std::string& first = en.value(0).name();
      const bool not_set = first.ends_with("_UNSPECIFIED") || first.ends_with("_NONE");
      EXPECT_TRUE(not_set) << en.name() << " starts with " << first;
    }
  }
}

TEST(SchemaTest, JoinRequestRoundTrips) {
  JoinRequest req;
  req.set_protocol_version(PROTOCOL_VERSION_2);
  req.set_client_name("pi-07");
  req.mutable_device()->set_device_class("rpi4");
  req.mutable_device()->set_cpu_cores(4);
  req.mutable_device()->set_memory_bytes(4ULL << 30);
  req.mutable_link()->set_kind(LINK_KIND_5G);
  req.mutable_link()->set_interface("wwan0");
  auto* t = req.mutable_model_spec()->add_tensors();
  t->set_name("conv1.weight");
  t->add_shape(8);
  t->add_shape(1);
  t->set_dtype(DTYPE_FLOAT32);
  req.mutable_model_spec()->set_fingerprint(0xdeadbeefcafef00dULL);
  (*req.mutable_labels())["site"] = "lab-a";

  std::string bytes;
  ASSERT_TRUE(req.SerializeToString(&bytes));
  JoinRequest back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  EXPECT_EQ(back.client_name(), "pi-07");
  EXPECT_EQ(back.device().memory_bytes(), 4ULL << 30);
  EXPECT_EQ(back.link().kind(), LINK_KIND_5G);
  EXPECT_EQ(back.model_spec().tensors(0).shape(1), 1);
  EXPECT_EQ(back.model_spec().fingerprint(), 0xdeadbeefcafef00dULL);
  EXPECT_EQ(back.labels().at("site"), "lab-a");
}

TEST(SchemaTest, SessionMessagesCarryExactlyOneKind) {
  ServerMessage msg;
  msg.mutable_ping()->set_ping_id(3);
  EXPECT_EQ(msg.kind_case(), ServerMessage::kPing);
  msg.mutable_task()->set_round(4);  // setting another member of the oneof replaces the first
  EXPECT_EQ(msg.kind_case(), ServerMessage::kTask);
  EXPECT_FALSE(msg.has_ping());
  ClientMessage reply;
  reply.mutable_pong()->set_ping_id(3);
  reply.mutable_pong()->set_received_client_ns(10);
  reply.mutable_pong()->set_sent_client_ns(12);
  std::string bytes = reply.SerializeAsString();
  ClientMessage back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  ASSERT_EQ(back.kind_case(), ClientMessage::kPong);
  EXPECT_EQ(back.pong().sent_client_ns() - back.pong().received_client_ns(), 2);
}

TEST(SchemaTest, ChunkedUploadReassemblesAndChecksumCatchesLoss) {
  // A 3 MiB payload split into 256 KiB chunks, as the client's uploader does: header, data..., trailer.
  std::string payload(3 << 20, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>((i * 131) >> 3);
  const auto as_bytes = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  std::vector<std::string> wire;
  UpdateChunk head;
  head.mutable_header()->set_round(5);
  head.mutable_header()->set_payload_bytes(payload.size());
  head.mutable_header()->set_kind(UPDATE_KIND_DELTA);
  wire.push_back(head.SerializeAsString());
  constexpr size_t kChunk = 256 << 10;
  for (size_t off = 0; off < payload.size(); off += kChunk) {
    UpdateChunk c;
    c.set_data(payload.substr(off, kChunk));
    wire.push_back(c.SerializeAsString());
  }
  UpdateChunk trailer;
  trailer.mutable_trailer()->set_payload_checksum(fl::core::TransferChecksum64(as_bytes(payload)));
  wire.push_back(trailer.SerializeAsString());

  for (const auto& m : wire) EXPECT_LT(m.size(), 4u << 20) << "every message stays under gRPC's default limit";

  auto reassemble = [&](const std::vector<std::string>& msgs, std::string* out, uint64_t* checksum) {
    for (const auto& m : msgs) {
      UpdateChunk c;
      ASSERT_TRUE(c.ParseFromString(m));
      if (c.has_trailer()) *checksum = c.trailer().payload_checksum();
      if (c.part_case() == UpdateChunk::kData) *out += c.data();
    }
  };
  std::string got;
  uint64_t checksum = 0;
  reassemble(wire, &got, &checksum);
  EXPECT_EQ(got.size(), payload.size());
  EXPECT_EQ(fl::core::TransferChecksum64(as_bytes(got)), checksum);

  // Drop one data chunk: the receiver's checksum no longer matches the trailer.
  auto lossy = wire;
  lossy.erase(lossy.begin() + 3);
  std::string partial;
  reassemble(lossy, &partial, &checksum);
  EXPECT_NE(fl::core::TransferChecksum64(as_bytes(partial)), checksum);
}

TEST(SchemaTest, ServiceHasTheFiveRpcsWithTheirStreamingShapes) {
  const auto* svc = JoinRequest::descriptor()->file()->FindServiceByName("Federation");
  EXPECT_STREQ(Federation::service_full_name(), "fl.v1.Federation");
  ASSERT_NE(svc, nullptr);
  ASSERT_EQ(svc->method_count(), 5);
  const auto* join = svc->FindMethodByName("Join");
  const auto* session = svc->FindMethodByName("Session");
  const auto* download = svc->FindMethodByName("DownloadModel");
  const auto* upload = svc->FindMethodByName("UploadUpdate");
  ASSERT_TRUE(join && session && download && upload && svc->FindMethodByName("Leave"));
  EXPECT_FALSE(join->client_streaming() || join->server_streaming());
  EXPECT_TRUE(session->client_streaming() && session->server_streaming());
  EXPECT_TRUE(!download->client_streaming() && download->server_streaming());
  EXPECT_TRUE(upload->client_streaming() && !upload->server_streaming());
}

}  // namespace
}  // namespace fl::v1
