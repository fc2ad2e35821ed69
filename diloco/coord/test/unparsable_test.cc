// Garbage sent to the islands coordinator's gRPC service (issue 27): every method of fl.v1.Islands answers bytes
// that do not parse with INVALID_ARGUMENT naming the message type it expected (ERROR_CODE_MALFORMED), as
// fl-server does, not with the callback API's empty UNIMPLEMENTED; and the coordinator keeps serving islands.
#include <chrono>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coord_test_util.h"
#include "fl/proto/convert.h"

namespace fl::diloco::testing {
namespace {

using ::testing::HasSubstr;

// Bytes that no protobuf message parses from: field 2, length-delimited, announcing 80 bytes but carrying 3.
const std::string kGarbage = std::string("\x12\x50", 2) + "abc";

// One call of `method` whose messages are raw bytes: `writes` are sent in order, then the stream is half-closed,
// everything the server sends is read, and the final status returned. Works for unary and streaming methods.
grpc::Status RawCall(const std::string& address, const std::string& method, const std::vector<std::string>& writes) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto call = stub.PrepareCall(&ctx, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(tag, want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = step(reinterpret_cast<void*>(1));
  for (const std::string& w : writes) {
    if (!open) break;
    grpc::Slice slice(w.data(), w.size());
    call->Write(grpc::ByteBuffer(&slice, 1), reinterpret_cast<void*>(2));
    open = step(reinterpret_cast<void*>(2));
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    step(reinterpret_cast<void*>(3));
  }
  for (;;) {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(4));
    if (!step(reinterpret_cast<void*>(4))) break;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  return status;
}

TEST(IslandsUnparsableTest, GarbageIsInvalidArgumentNamingTheMessageType) {
  CoordinatorHarness harness(TestOptions(1));
  struct Case {
    std::string method;
    std::string type;
  };
  for (const Case& c : {Case{"Join", "fl.v1.IslandJoinRequest"}, Case{"Session", "fl.v1.IslandUp"},
                        Case{"BeginSync", "fl.v1.BeginSyncRequest"}, Case{"SyncDone", "fl.v1.SyncDoneRequest"},
                        Case{"SyncFailed", "fl.v1.SyncFailedRequest"}, Case{"StateLoaded", "fl.v1.StateLoadedRequest"},
                        Case{"Leave", "fl.v1.IslandLeaveRequest"}}) {
    const grpc::Status status = RawCall(harness.address(), fl::StrCat("/fl.v1.Islands/", c.method), {kGarbage});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(fl::StrCat("could not be parsed as ", c.type))) << c.method;
    EXPECT_EQ(proto::ErrorFromGrpcStatus(status).code(), fl::v1::ERROR_CODE_MALFORMED) << c.method;
  }
  // The coordinator still admits an island after the garbage.
  SimIsland island("island-a");
  auto assignment = island.Connect(harness.address());
  EXPECT_TRUE(assignment.ok()) << assignment.status();
}

}  // namespace
}  // namespace fl::diloco::testing
