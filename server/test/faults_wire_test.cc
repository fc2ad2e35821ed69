// Issue 27's answers and the stalled upload through the real gRPC service (engine, reactors, records on loopback),
// as the independent client that speaks the wire protocol met them: an upload that stalls after a fast start, an
// upload after CancelTask, an upload for a task dropped by a rejoin on another link, and an update header naming
// another base_model_version. Each test waits for the message or answer it needs (blocking reads, Finish), never
// for a time; the exact timing behaviour is faults_engine_test's (ManualClock).
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server {
namespace {

using instrumentation::RecordReader;
using test_harness::DeltaHeader;
using test_harness::InitialModel;
using test_harness::kParams;
using test_harness::RunningClient;
using test_harness::SmallConfig;
using test_harness::StartClient;
using test_harness::TestServer;

bool Contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// A raw session: Join (optionally with the token of a live session: a rejoin) and the Session stream, with a
// deadline so that a missing message fails the test instead of hanging it.
struct RawSession {
  fl::v1::JoinResponse joined;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<fl::v1::ClientMessage, fl::v1::ServerMessage>> stream;
};

class Wire {
 public:
  explicit Wire(const std::string& address)
      : stub_(fl::v1::Federation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

  std::unique_ptr<RawSession> Connect(const std::string& name, const std::string& token = "",
                                      fl::v1::LinkKind link = fl::v1::LINK_KIND_ETHERNET) {
    auto s = std::make_unique<RawSession>();
    fl::v1::JoinRequest req;
    req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    req.set_client_name(name);
    req.set_session_token(token);
    req.mutable_link()->set_kind(link);
    req.set_num_train_examples(1000);
    *req.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw");
    grpc::ClientContext join_ctx;
    join_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    join_ctx.set_wait_for_ready(true);
    grpc::Status status = stub_->Join(&join_ctx, req, &s->joined);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (!status.ok()) return nullptr;
    s->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    s->stream = stub_->Session(&s->ctx);
    fl::v1::ClientMessage hello;
    hello.mutable_hello()->set_client_id(s->joined.client_id());
    hello.mutable_hello()->set_session_token(s->joined.session_token());
    s->stream->Write(hello);
    return s;
  }

  // The next server message `want` accepts on the session (nullopt: the stream ended first).
  template <class Pred>
  static std::optional<fl::v1::ServerMessage> Next(RawSession& s, Pred want) {
    fl::v1::ServerMessage msg;
    while (s.stream->Read(&msg)) {
      if (want(msg)) return msg;
    }
    return std::nullopt;
  }
  static std::optional<fl::v1::Task> NextTrainTask(RawSession& s) {
    auto m = Next(
        s, [](const fl::v1::ServerMessage& x) { return x.has_task() && x.task().kind() == fl::v1::TASK_KIND_TRAIN; });
    if (!m.has_value()) return std::nullopt;
    return m->task();
  }

  // The whole update of `value` in every coordinate for `task`, under `header` as given; the answer.
  fl::v1::UploadUpdateResponse Upload(const fl::v1::UpdateHeader& header, grpc::Status* status = nullptr) {
    std::vector<uint8_t> payload;
    EXPECT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 0.001f), &payload).ok());
    fl::v1::UpdateHeader h = header;
    h.set_payload_bytes(payload.size());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    fl::v1::UploadUpdateResponse resp;
    auto writer = stub_->UploadUpdate(&ctx, &resp);
    if (proto::WriteWholeUpload(*writer, h, payload, core::TransferChecksum64(payload))) writer->WritesDone();
    grpc::Status s = writer->Finish();
    if (status != nullptr) *status = s;
    return resp;
  }

  fl::v1::Federation::Stub& stub() { return *stub_; }

 private:
  std::unique_ptr<fl::v1::Federation::Stub> stub_;
};

EngineConfig Config(const fl::testing::ScratchDir& dir) {
  EngineConfig c = SmallConfig(dir.File("ckpt"));
  c.num_rounds = 2;
  c.evaluate_every = 0;
  c.fit = {1.0, 2, 2};
  c.heartbeat_interval_ms = 5000;  // the raw sessions send no heartbeat
  c.print_table = false;
  return c;
}

// Half of the update fast, then nothing: the upload loses its slot within its recent window (not after the 30 s
// message timeout), the two honest clients waiting for the one slot upload in time and the round commits.
TEST(FaultsWireTest, AnUploadThatStallsAfterAFastStartLosesItsSlotAndTheRoundCommits) {
  fl::testing::ScratchDir dir("fl_faults_wire");
  EngineConfig config = Config(dir);
  config.num_rounds = 1;
  config.fit = {1.0, 2, 3};
  config.upload_slots = 1;
  config.round_deadline_ms = 15'000;
  config.upload_min_bytes_per_s = 100;  // the average of a 10 KB start stays above it for 100 s
  config.upload_message_timeout_ms = 30'000;
  const std::string db = dir.File("records.db");
  TestServer server(config, db, InitialModel(1));
  Wire wire(server.address());
  auto stalled = wire.Connect("stalled");
  ASSERT_NE(stalled, nullptr);
  std::vector<std::unique_ptr<RunningClient>> honest;
  for (int i = 0; i < 2; ++i) {
    honest.push_back(StartClient(server.address(), fl::StrCat("honest", i), i + 1, "ethernet", 0, 1500));
  }
  const std::optional<fl::v1::Task> task = Wire::NextTrainTask(*stalled);
  ASSERT_TRUE(task.has_value());
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = DeltaHeader(stalled->joined.client_id(), stalled->joined.session_token(), *task, 10);
  const uint64_t payload_bytes = chunk.header().payload_bytes();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  fl::v1::UploadUpdateResponse resp;
  auto writer = wire.stub().UploadUpdate(&ctx, &resp);
  ASSERT_TRUE(writer->Write(chunk));
  for (uint64_t sent = 0; sent < payload_bytes / 2; sent += 1000) {
    fl::v1::UpdateChunk data;
    data.set_data(std::string(1000, '\0'));
    ASSERT_TRUE(writer->Write(data));
  }
  const grpc::Status status = writer->Finish();  // returns when the server ends the upload
  // (Otherwise the round cannot commit any more: the destructors stop the clients and the server.)
  ASSERT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(Contains(status.error_message(), "over its most recent window: it stalled")) << status.error_message();
  stalled->ctx.TryCancel();  // the stalled client goes away; the honest ones finish the round
  const EngineResult result = server.Wait();
  for (auto& c : honest) {
    c->thread.join();
    EXPECT_TRUE(c->result.ok()) << c->result;
  }
  server.Stop();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  auto reader = *RecordReader::Open(db);
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u) << rounds[0].failure_reason;
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  auto events = *reader->ListClientEvents(result.experiment_id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].client_id, "stalled");
  EXPECT_EQ(events[0].kind, instrumentation::ClientEventKind::kUploadRevoked);
}

TEST(FaultsWireTest, AnUploadAfterCancelTaskIsToldItWasCancelled) {
  fl::testing::ScratchDir dir("fl_faults_wire");
  EngineConfig config = Config(dir);
  config.fit = {0.5, 1, 2};
  config.overcommit = 2.0;  // both selected, the first update commits the round, the other task is cancelled
  TestServer server(config, dir.File("records.db"), InitialModel(1));
  Wire wire(server.address());
  auto a = wire.Connect("a"), b = wire.Connect("b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const auto task_a = Wire::NextTrainTask(*a), task_b = Wire::NextTrainTask(*b);
  ASSERT_TRUE(task_a.has_value() && task_b.has_value());
  EXPECT_EQ(wire.Upload(DeltaHeader(a->joined.client_id(), a->joined.session_token(), *task_a, 10)).outcome(),
            fl::v1::UPDATE_OUTCOME_ACCEPTED);
  auto cancel = Wire::Next(*b, [](const fl::v1::ServerMessage& m) { return m.has_cancel(); });
  ASSERT_TRUE(cancel.has_value());
  EXPECT_EQ(cancel->cancel().task_id(), task_b->task_id());
  const fl::v1::UploadUpdateResponse r =
      wire.Upload(DeltaHeader(b->joined.client_id(), b->joined.session_token(), *task_b, 10));
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_LATE);
  EXPECT_TRUE(Contains(r.error().message(), "was cancelled: round 1 committed with its first 1 updates"))
      << r.error().message();
  EXPECT_FALSE(Contains(r.error().message(), "deadline")) << r.error().message();
}

TEST(FaultsWireTest, AnUploadForATaskDroppedWhenTheClientRejoinedOnAnotherLinkIsToldSo) {
  fl::testing::ScratchDir dir("fl_faults_wire");
  TestServer server(Config(dir), dir.File("records.db"), InitialModel(1));
  Wire wire(server.address());
  auto a = wire.Connect("a"), b = wire.Connect("b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const auto old_task = Wire::NextTrainTask(*a);
  ASSERT_TRUE(old_task.has_value());
  // a moves to its 5G link and joins again with its session's token: its old session and task are given up.
  auto moved = wire.Connect("a", a->joined.session_token(), fl::v1::LINK_KIND_5G);
  ASSERT_NE(moved, nullptr);
  grpc::Status status;
  const fl::v1::UploadUpdateResponse r =
      wire.Upload(DeltaHeader(moved->joined.client_id(), moved->joined.session_token(), *old_task, 10), &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(r.error().code(), fl::v1::ERROR_CODE_WRONG_ROUND);
  EXPECT_TRUE(Contains(r.error().message(), "was closed before this upload (dropped): the client rejoined"))
      << r.error().message();
  EXPECT_FALSE(Contains(r.error().message(), "deadline")) << r.error().message();
}

TEST(FaultsWireTest, AnUpdateNamingAnotherBaseModelVersionIsRefusedNamingBoth) {
  fl::testing::ScratchDir dir("fl_faults_wire");
  TestServer server(Config(dir), dir.File("records.db"), InitialModel(1));
  Wire wire(server.address());
  auto a = wire.Connect("a"), b = wire.Connect("b");
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const auto task = Wire::NextTrainTask(*a);
  ASSERT_TRUE(task.has_value());
  fl::v1::UpdateHeader h = DeltaHeader(a->joined.client_id(), a->joined.session_token(), *task, 10);
  h.set_base_model_version(task->model_version() + 3);
  const fl::v1::UploadUpdateResponse r = wire.Upload(h);
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(r.error().code(), fl::v1::ERROR_CODE_WRONG_ROUND);
  EXPECT_EQ(r.error().field(), "base_model_version");
  EXPECT_TRUE(
      Contains(r.error().message(), fl::StrCat("trained from model version ", task->model_version() + 3, " but task '",
                                               task->task_id(), "' gave model version ", task->model_version())))
      << r.error().message();
  // The task stays open: the right header is taken.
  h.set_base_model_version(task->model_version());
  EXPECT_EQ(wire.Upload(h).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
}

}  // namespace
}  // namespace fl::server
