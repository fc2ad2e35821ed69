// Hostile and faulty clients against the real gRPC service (issue 13, items 6-9 and 10(e)): raw bytes that
// do not parse, a session that floods or does not read, a session without hello, uploads that trickle or
// stall, duplicate uploads, a Join that tries to take over a live client's name, and a client that comes
// back after the experiment ended. Each case asserts the status and message the offender gets, and that the
// honest clients' rounds still commit intact.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary

using instrumentation::RecordReader;

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

// Bytes that no protobuf message parses from: field 2, length-delimited, announcing 80 bytes but carrying 3.
const std::string kGarbage = std::string("\x12\x50", 2) + "abc";

// One call of `method` whose messages are raw bytes: `writes` are sent in order, then the stream is half-closed,
// everything the server sends is read, and the final status returned. Works for all four RPC shapes.
grpc::Status RawCall(const std::string& address, const std::string& method, const std::vector<std::string>& writes,
                     int* messages_read = nullptr) {
  grpc::GenericStub stub(Channel(address));
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
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
    call->Write(Bytes(w), reinterpret_cast<void*>(2));
    open = step(reinterpret_cast<void*>(2));
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    step(reinterpret_cast<void*>(3));
  }
  int read = 0;
  for (;;) {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(4));
    if (!step(reinterpret_cast<void*>(4))) break;
    ++read;
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  step(reinterpret_cast<void*>(5));
  if (messages_read != nullptr) *messages_read = read;
  return status;
}

// Runs the honest part of every test: three real clients until the experiment ends; its rounds must all have
// committed with every honest client's update.
void ExpectHonestClientsFinish(TestServer& server, const std::string& db, uint32_t rounds, uint32_t accepted) {
  std::vector<std::unique_ptr<RunningClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(StartClient(server.address(), fl::StrCat("honest", i), i + 1));
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  EXPECT_EQ(result.rounds_committed, rounds);
  for (auto& c : clients) {
    c->thread.join();
    EXPECT_TRUE(c->result.ok()) << c->result;
  }
  server.Stop();
  auto reader = *RecordReader::Open(db);
  auto recorded = *reader->ListRounds(result.experiment_id);
  uint32_t committed = 0;
  for (const auto& r : recorded) {
    if (r.status != instrumentation::RoundStatus::kCommitted) continue;
    ++committed;
    EXPECT_EQ(r.num_accepted, accepted) << "round " << r.round;
    EXPECT_EQ(r.model_version, r.round);
  }
  EXPECT_EQ(committed, rounds);
}

TEST(HostileTest, UnparsableRequestsAreInvalidArgumentNamingTheMessage) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  TestServer server(config, db, InitialModel(1));
  const std::string address = server.address();

  struct Case {
    std::string method;
    std::string type;
  };
  for (const Case& c :
       {Case{"/fl.v1.Federation/Join", "fl.v1.JoinRequest"}, Case{"/fl.v1.Federation/Leave", "fl.v1.LeaveRequest"},
        Case{"/fl.v1.Federation/DownloadModel", "fl.v1.DownloadModelRequest"},
        Case{"/fl.v1.Federation/UploadUpdate", "fl.v1.UpdateChunk"},
        Case{"/fl.v1.Federation/Session", "fl.v1.ClientMessage"}}) {
    const grpc::Status status = RawCall(address, c.method, {kGarbage});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.method << ": " << status.error_message();
    EXPECT_NE(status.error_message().find(fl::StrCat("could not be parsed as ", c.type)), std::string::npos)
        << c.method << ": " << status.error_message();
    EXPECT_EQ(proto::ErrorFromGrpcStatus(status).code(), fl::v1::ERROR_CODE_MALFORMED) << c.method;
  }
  // A client name that is not UTF-8 does not parse either (proto3 strings are checked).
  fl::v1::JoinRequest join;
  join.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  std::string wire_bytes = join.SerializeAsString() + std::string("\x12\x02\xff\xfe", 4);
  grpc::Status status = RawCall(address, "/fl.v1.Federation/Join", {wire_bytes});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("fl.v1.JoinRequest"), std::string::npos) << status.error_message();

  ExpectHonestClientsFinish(server, db, config.num_rounds, 3);
}

// Version 1 checksummed transfers with the home-made Checksum64 (a client speaking it would fail every XXH3
// check); a version 2 peer does not know uploads without a codec body checksum. Both are refused at Join, the
// error naming the client's version and the server's.
TEST(HostileTest, AJoinSpeakingAnOlderProtocolVersionIsRefusedNamingBothVersions) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  TestServer server(SmallConfig(dir.File("ckpt")), db, InitialModel(1));
  auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
  for (const fl::v1::ProtocolVersion old :
       {fl::v1::PROTOCOL_VERSION_1, fl::v1::PROTOCOL_VERSION_2, fl::v1::PROTOCOL_VERSION_UNSPECIFIED}) {
    fl::v1::JoinRequest join;
    join.set_protocol_version(old);
    join.set_client_name("old-client");
    *join.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw");
    fl::v1::JoinResponse joined;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status status = stub->Join(&ctx, join, &joined);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    EXPECT_NE(status.error_message().find(fl::StrCat("protocol version ", static_cast<int>(old),
                                                     " is not supported; this server speaks version 3")),
              std::string::npos)
        << status.error_message();
  }
}

TEST(HostileTest, ASessionWithoutHelloIsClosedAfterTheDeadline) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.session_hello_timeout_ms = 300;
  TestServer server(config, db, InitialModel(1));
  // The stream is opened and nothing is sent: no hello, no half-close.
  auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Session(&ctx);
  fl::v1::ServerMessage msg;
  while (stream->Read(&msg)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_NE(status.error_message().find("no SessionHello within 300 ms"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("--session-hello-timeout-ms"), std::string::npos);
  ExpectHonestClientsFinish(server, db, config.num_rounds, 3);
}

TEST(HostileTest, ASessionFloodingHeartbeatsIsClosedAndSlowsOnlyItself) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.session_max_messages_per_s = 50;
  TestServer server(config, db, InitialModel(1));
  RawClient raw(server.address());
  auto flood = raw.Connect("flood");
  ASSERT_NE(flood, nullptr);
  // Heartbeats as fast as the stream takes them, none of the replies read.
  fl::v1::ClientMessage beat;
  beat.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
  int written = 0;
  const auto started = std::chrono::steady_clock::now();
  while (written < 5000 && flood->stream->Write(beat)) ++written;
  int pings = 0;
  fl::v1::ServerMessage msg;
  while (flood->stream->Read(&msg)) pings += msg.has_ping();
  const grpc::Status status = flood->stream->Finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("more than 50 session messages per second"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("--session-max-messages-per-s"), std::string::npos);
  EXPECT_EQ(proto::ErrorFromGrpcStatus(status).code(), fl::v1::ERROR_CODE_RATE_LIMITED);
  // The engine answered (one ping per heartbeat) only what the limit let through: a burst of twice the rate
  // and the rate itself while the flood lasted, plus the ping of the session's opening, not the thousands sent.
  EXPECT_LE(pings, 2 * 50 + 1 + static_cast<int>(50 * seconds) + 1) << written << " heartbeats written";
  EXPECT_GT(written, pings);
  ExpectHonestClientsFinish(server, db, config.num_rounds, 3);
  // The closing is recorded for the client with the limit that closed it.
  auto reader = *RecordReader::Open(db);
  const std::string experiment = (*reader->ListExperiments()).front().id;
  bool recorded = false;
  const auto events = *reader->ListClientEvents(experiment);
  for (const auto& e : events) {
    if (e.client_id != "flood") continue;
    EXPECT_EQ(e.kind, instrumentation::ClientEventKind::kSessionClosed);
    EXPECT_NE(e.reason.find("--session-max-messages-per-s"), std::string::npos) << e.reason;
    recorded = true;
  }
  EXPECT_TRUE(recorded);
}

TEST(HostileTest, AClientThatDoesNotReadItsSessionIsClosedNotBufferedFor) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.session_max_messages_per_s = 1'000'000;  // let every heartbeat through: the outbound bound is tested
  config.session_max_queued_messages = 16;
  TestServer server(config, db, InitialModel(1));
  // A small receive window that does not grow: the server's pings fill it after a few hundred unread ones.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 10);
  auto stub = fl::v1::Federation::NewStub(
      grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
  fl::v1::JoinRequest join;
  join.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  join.set_client_name("deaf");
  *join.mutable_model_spec() = proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw");
  fl::v1::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Join(&ctx, join, &joined).ok());
  }
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  fl::v1::ClientMessage hello;
  hello.mutable_hello()->set_client_id(joined.client_id());
  hello.mutable_hello()->set_session_token(joined.session_token());
  ASSERT_TRUE(stream->Write(hello));
  // Each heartbeat makes the server send a ping; none is read until the window is long full.
  fl::v1::ClientMessage beat;
  beat.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
  for (int i = 0; i < 20000 && stream->Write(beat); ++i) {
  }
  stream->WritesDone();
  fl::v1::ServerMessage msg;
  while (stream->Read(&msg)) {
  }
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("did not read its session stream: 16 server messages were waiting"),
            std::string::npos)
      << status.error_message();
  ExpectHonestClientsFinish(server, db, config.num_rounds, 3);
}

// A round of two honest clients (training 1.5 s) and a raw one whose upload `misbehave` plays out; returns the
// status the raw upload ended with. The round must commit with the two honest updates.
struct SlowUploadRun {
  grpc::Status status;
  EngineResult result;
};
SlowUploadRun RunRoundWithAMisbehavingUpload(
    EngineConfig config, const std::string& db,
    const std::function<void(grpc::ClientWriter<fl::v1::UpdateChunk>&, size_t payload_bytes)>& misbehave) {
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.fit = {1.0, 2, 3};
  config.upload_slots = 1;
  config.heartbeat_interval_ms = 2000;  // the raw client sends none while it uploads
  TestServer server(config, db, InitialModel(1));
  RawClient raw(server.address());
  auto session = raw.Connect("slow");
  EXPECT_NE(session, nullptr);
  std::vector<std::unique_ptr<RunningClient>> honest;
  for (int i = 0; i < 2; ++i) {
    honest.push_back(StartClient(server.address(), fl::StrCat("honest", i), i + 1, "ethernet", 0, 1500));
  }
  fl::v1::ServerMessage msg;
  fl::v1::Task task;
  while (session->stream->Read(&msg)) {
    if (msg.has_task()) {
      task = msg.task();
      break;
    }
  }
  EXPECT_EQ(task.kind(), fl::v1::TASK_KIND_TRAIN);
  const size_t payload_bytes = (*core::MakeCodec("fp32"))->EncodedSize(kParams);
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = DeltaHeader(session->joined.client_id(), session->joined.session_token(), task, 10);
  auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  fl::v1::UploadUpdateResponse resp;
  auto writer = stub->UploadUpdate(&ctx, &resp);
  writer->Write(chunk);
  misbehave(*writer, payload_bytes);
  SlowUploadRun run;
  run.status = writer->Finish();
  // The offender gives up its task (its session ends); the honest clients finish the round.
  session->ctx.TryCancel();
  run.result = server.Wait();
  for (auto& c : honest) {
    c->thread.join();
    EXPECT_TRUE(c->result.ok()) << c->result;
  }
  server.Stop();
  return run;
}

TEST(HostileTest, AnUploadTricklingBelowTheMinimumRateLosesItsSlot) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.upload_min_bytes_per_s = 65536;
  config.upload_rate_grace_ms = 500;
  config.upload_message_timeout_ms = 0;  // only the rate
  // 100 bytes every 100 ms: about 1 KB/s, until the server ends the upload.
  SlowUploadRun run = RunRoundWithAMisbehavingUpload(config, db, [](auto& writer, size_t) {
    fl::v1::UpdateChunk data;
    data.set_data(std::string(100, '\0'));
    for (int i = 0; i < 300 && writer.Write(data); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  EXPECT_EQ(run.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << run.status.error_message();
  EXPECT_NE(run.status.error_message().find("below the minimum rate of 65536 bytes/s (--upload-min-bytes-per-s)"),
            std::string::npos)
      << run.status.error_message();
  EXPECT_EQ(proto::ErrorFromGrpcStatus(run.status).code(), fl::v1::ERROR_CODE_RATE_LIMITED);
  ASSERT_EQ(run.result.status_name(), "finished") << run.result.reason;
  auto reader = *RecordReader::Open(db);
  auto rounds = *reader->ListRounds(run.result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);  // no failed attempt: the honest updates got the slot in time
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  const auto rows = *reader->ListClientRounds(run.result.experiment_id, 1);
  for (const auto& row : rows) {
    EXPECT_EQ(row.outcome,
              row.client_id == "slow" ? instrumentation::ClientOutcome::kLate : instrumentation::ClientOutcome::kOk)
        << row.client_id;
  }
  // The revocation is in the records with its reason, not only in the log (a `late` row alone cannot say why).
  const auto events = *reader->ListClientEvents(run.result.experiment_id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].client_id, "slow");
  EXPECT_EQ(events[0].kind, instrumentation::ClientEventKind::kUploadRevoked);
  EXPECT_EQ(events[0].round, 1);
  EXPECT_NE(events[0].reason.find("--upload-min-bytes-per-s"), std::string::npos) << events[0].reason;
}

TEST(HostileTest, AStalledUploadLosesItsSlotAfterTheMessageTimeout) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.upload_min_bytes_per_s = 0;  // only the stall
  config.upload_message_timeout_ms = 500;
  // One chunk, then nothing: a client stopped (SIGSTOP) in the middle of its upload.
  SlowUploadRun run = RunRoundWithAMisbehavingUpload(config, db, [](auto& writer, size_t) {
    fl::v1::UpdateChunk data;
    data.set_data(std::string(1024, '\0'));
    writer.Write(data);
  });
  EXPECT_EQ(run.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << run.status.error_message();
  EXPECT_NE(run.status.error_message().find("(limit 500 ms, --upload-message-timeout-ms)"), std::string::npos)
      << run.status.error_message();
  ASSERT_EQ(run.result.status_name(), "finished") << run.result.reason;
  auto reader = *RecordReader::Open(db);
  auto rounds = *reader->ListRounds(run.result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].num_accepted, 2);
  const auto events = *reader->ListClientEvents(run.result.experiment_id);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, instrumentation::ClientEventKind::kUploadRevoked);
  EXPECT_NE(events[0].reason.find("--upload-message-timeout-ms"), std::string::npos) << events[0].reason;
}

TEST(HostileTest, ASecondOrConcurrentUploadForATaskIsADuplicate) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.fit = {1.0, 2, 2};
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, db, InitialModel(1));
  RawClient raw(server.address());
  auto session = raw.Connect("twice");
  ASSERT_NE(session, nullptr);
  auto good = StartClient(server.address(), "good", 3, "ethernet", 0, 1000);
  fl::v1::ServerMessage msg;
  fl::v1::Task task;
  while (session->stream->Read(&msg)) {
    if (msg.has_task()) {
      task = msg.task();
      break;
    }
  }
  ASSERT_EQ(task.kind(), fl::v1::TASK_KIND_TRAIN);
  fl::v1::UpdateHeader h = DeltaHeader(session->joined.client_id(), session->joined.session_token(), task, 10);
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 0.001f), &payload).ok());
  h.set_payload_bytes(payload.size());

  // Upload A sends its header and half its payload; upload B, for the same task, runs whole meanwhile.
  auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
  grpc::ClientContext ctx_a;
  fl::v1::UploadUpdateResponse resp_a;
  auto writer_a = stub->UploadUpdate(&ctx_a, &resp_a);
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = h;
  writer_a->Write(chunk);
  chunk.Clear();
  chunk.set_data(payload.data(), payload.size() / 2);
  writer_a->Write(chunk);
  const fl::v1::UploadUpdateResponse resp_b = raw.Upload(h, payload);
  chunk.Clear();
  chunk.set_data(payload.data() + payload.size() / 2, payload.size() - payload.size() / 2);
  if (writer_a->Write(chunk)) {
    chunk.Clear();
    chunk.mutable_trailer()->set_payload_checksum(core::TransferChecksum64(payload));
    if (writer_a->Write(chunk)) writer_a->WritesDone();
  }
  ASSERT_TRUE(writer_a->Finish().ok());
  // Whichever header the engine saw first is the upload; the other one is a duplicate. Which one comes first
  // is a race this test cannot control (A's header may still be in gRPC's buffers when B has run whole), so
  // every correct outcome is accepted, and each is checked for what it must say:
  //  - A first: B arrived while A still lacked its second half, so B is a duplicate "in progress";
  //  - B first: A's header came either while B was in transit ("in progress") or after B's verdict
  //    ("already answered (outcome ok)"); both are correct answers.
  const bool a_first = resp_a.outcome() == fl::v1::UPDATE_OUTCOME_ACCEPTED;
  const fl::v1::UploadUpdateResponse& accepted = a_first ? resp_a : resp_b;
  const fl::v1::UploadUpdateResponse& duplicate = a_first ? resp_b : resp_a;
  EXPECT_EQ(accepted.outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED) << accepted.error().message();
  EXPECT_EQ(duplicate.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(duplicate.error().code(), fl::v1::ERROR_CODE_DUPLICATE);
  const bool in_progress =
      duplicate.error().message().find("is already in progress: this one is a duplicate") != std::string::npos;
  const bool already_answered =
      duplicate.error().message().find("was already answered (outcome ok): this upload is a duplicate") !=
      std::string::npos;
  if (a_first) {
    EXPECT_TRUE(in_progress) << duplicate.error().message();
  } else {
    EXPECT_TRUE(in_progress || already_answered) << duplicate.error().message();
  }
  // After the verdict: a duplicate, not "late", and the first verdict stands.
  const fl::v1::UploadUpdateResponse again = raw.Upload(h, payload);
  EXPECT_EQ(again.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(again.error().code(), fl::v1::ERROR_CODE_DUPLICATE);
  EXPECT_NE(again.error().message().find("was already answered (outcome ok): this upload is a duplicate"),
            std::string::npos)
      << again.error().message();

  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  auto reader = *RecordReader::Open(db);
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].num_accepted, 2);  // the raw client's update counted once
  auto rows = *reader->ListClientRounds(result.experiment_id, 1);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) EXPECT_EQ(row.outcome, instrumentation::ClientOutcome::kOk) << row.client_id;
}

TEST(HostileTest, AJoinUnderALiveSessionsNameNeedsItsToken) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  TestServer server(config, db, InitialModel(1));
  RawClient owner(server.address());
  auto live = owner.Connect("taken");
  ASSERT_NE(live, nullptr);
  fl::v1::ServerMessage msg;
  ASSERT_TRUE(live->stream->Read(&msg));  // the welcome: the session is live on the server
  ASSERT_TRUE(msg.has_welcome());

  RawClient thief(server.address());
  const core::ModelSpec spec = client::SyntheticTrainer(kParams, 10, 1).spec();
  for (const std::string& token : {std::string(), std::string("forged-token")}) {
    fl::v1::JoinRequest req;
    req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
    req.set_client_name("taken");
    req.set_session_token(token);
    *req.mutable_model_spec() = proto::ToProto(spec, "raw");
    auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
    grpc::ClientContext ctx;
    fl::v1::JoinResponse resp;
    const grpc::Status status = stub->Join(&ctx, req, &resp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << status.error_message();
    EXPECT_NE(status.error_message().find("a live session holds the client name 'taken'"), std::string::npos)
        << status.error_message();
    EXPECT_EQ(proto::ErrorFromGrpcStatus(status).code(), fl::v1::ERROR_CODE_NAME_IN_USE);
  }
  // The owner's session survived both attempts: it still gets the server's pings.
  ASSERT_TRUE(live->stream->Read(&msg));
  // The owner itself, reconnecting with its token, is admitted and its old stream replaced.
  fl::v1::JoinRequest rejoin;
  rejoin.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  rejoin.set_client_name("taken");
  rejoin.set_session_token(live->joined.session_token());
  *rejoin.mutable_model_spec() = proto::ToProto(spec, "raw");
  auto stub = fl::v1::Federation::NewStub(Channel(server.address()));
  grpc::ClientContext ctx;
  fl::v1::JoinResponse resp;
  const grpc::Status status = stub->Join(&ctx, rejoin, &resp);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(resp.session_token(), live->joined.session_token());
  while (live->stream->Read(&msg)) {
  }
  EXPECT_EQ(live->stream->Finish().error_code(), grpc::StatusCode::ABORTED);
  ExpectHonestClientsFinish(server, db, config.num_rounds, 3);
}

// A TCP relay on loopback between a client and the server that can cut a connection on the client's side
// only: the client sees its connection close, the server's socket stays open and silent — the server still
// holds the client's session, as after a link that died without a FIN reaching the server.
class Relay {
 public:
  explicit Relay(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~Relay() {
    shutdown(listen_fd_, SHUT_RDWR);
    close(listen_fd_);
    accept_thread_.join();
    std::lock_guard lock(mu_);
    for (Pair& p : pairs_) {
      shutdown(p.client_fd, SHUT_RDWR);
      shutdown(p.server_fd, SHUT_RDWR);
      p.up.join();
      p.down.join();
      close(p.client_fd);
      close(p.server_fd);
    }
  }
  std::string address() const { return fl::StrCat("127.0.0.1:", port_); }
  // Every current connection: closed towards the client, left open (and no longer fed) towards the server.
  void CutClientSide() {
    std::lock_guard lock(mu_);
    for (Pair& p : pairs_) {
      p.cut = true;
      shutdown(p.client_fd, SHUT_RDWR);
    }
  }

 private:
  struct Pair {
    int client_fd = -1, server_fd = -1;
    std::atomic<bool> cut{false};
    std::thread up, down;
  };
  void AcceptLoop() {
    for (;;) {
      const int client_fd = accept(listen_fd_, nullptr, nullptr);
      if (client_fd < 0) return;
      const int server_fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(server_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        close(client_fd);
        close(server_fd);
        continue;
      }
      std::lock_guard lock(mu_);
      Pair& p = pairs_.emplace_back();
      p.client_fd = client_fd;
      p.server_fd = server_fd;
      p.up = std::thread([&p] { Pump(p, p.client_fd, p.server_fd); });
      p.down = std::thread([&p] { Pump(p, p.server_fd, p.client_fd); });
    }
  }
  static void Pump(Pair& p, int from, int to) {
    char buf[16384];
    for (;;) {
      const ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0 || p.cut) break;
      for (ssize_t off = 0; off < n;) {
        const ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
        if (w <= 0) return;
        off += w;
      }
    }
    if (!p.cut) shutdown(to, SHUT_WR);  // an orderly end is passed on; a cut never reaches the server
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;
  std::list<Pair> pairs_;  // stable addresses for the pump threads
};

TEST(HostileTest, FlClientRejoinsWithItsTokenWhileTheServerStillHoldsItsSession) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.num_rounds = 3;
  config.evaluate_every = 0;
  config.fit = {1.0, 1, 1};
  config.heartbeat_interval_ms = 5000;  // the server drops the old session only after 20 s of silence
  // The sink is added before the server's threads start and removed after they end (the guard outlives the
  // server): a logger's sink list is read without a lock by every thread that logs (ThreadSanitizer).
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(10000);
  struct SinkAdded {
    explicit SinkAdded(spdlog::sink_ptr s) { spdlog::default_logger()->sinks().push_back(std::move(s)); }
    ~SinkAdded() { spdlog::default_logger()->sinks().pop_back(); }
  } added(sink);
  TestServer server(config, db, InitialModel(1));
  const std::string address = server.address();
  Relay relay(std::stoi(address.substr(address.rfind(':') + 1)));
  auto c = StartClient(relay.address(), "c0", 1, "ethernet", 0, 200);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < give_up) {
    auto reader = RecordReader::Open(db);
    if (reader.ok() && (*reader)->QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'").value_or(0) >= 1) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  relay.CutClientSide();  // fl-client's session breaks; the server's end of it stays open and silent
  const EngineResult result = server.Wait();
  c->thread.join();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  EXPECT_EQ(result.rounds_committed, 3u);
  EXPECT_TRUE(c->result.ok()) << c->result;
  server.Stop();
  // It rejoined while the server still held its old session, presenting that session's token: admitted at
  // once, never refused as a name in use.
  bool rejoined = false;
  for (const std::string& line : sink->last_formatted()) {
    rejoined |= line.find("rejoined client 'c0'") != std::string::npos;
    EXPECT_EQ(line.find("refused join of 'c0'"), std::string::npos) << line;
  }
  EXPECT_TRUE(rejoined);
}

TEST(HostileTest, AClientAwayAtTheEndLearnsThatTheExperimentIsOver) {
  fl::testing::ScratchDir dir("fl_hostile");
  const std::string db = dir.File("records.db");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  TestServer server(config, db, InitialModel(1));
  {
    // Joins, then goes away without leaving (as a client stopped or cut off does).
    RawClient away(server.address());
    auto session = away.Connect("away");
    ASSERT_NE(session, nullptr);
    fl::v1::ServerMessage msg;
    ASSERT_TRUE(session->stream->Read(&msg));
    session->ctx.TryCancel();
  }
  std::vector<std::unique_ptr<RunningClient>> clients;
  for (int i = 0; i < 3; ++i) clients.push_back(StartClient(server.address(), fl::StrCat("honest", i), i + 1));
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  for (auto& c : clients) c->thread.join();
  EXPECT_EQ(server.engine().ClientsNotToldOfTheEnd(), 1u);  // fl-server lingers for it (--linger-s)

  // It comes back: its Join is answered with a final "experiment finished", and fl-client exits at once.
  RawClient away(server.address());
  fl::v1::JoinResponse resp;
  const grpc::Status status = away.Join("away", client::SyntheticTrainer(kParams, 10, 1).spec(), &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_EQ(proto::ErrorFromGrpcStatus(status).code(), fl::v1::ERROR_CODE_EXPERIMENT_FINISHED);
  EXPECT_NE(status.error_message().find(fl::StrCat("experiment ", result.experiment_id, " has ended (finished")),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(server.engine().ClientsNotToldOfTheEnd(), 0u);
  auto late = StartClient(server.address(), "late", 9);
  late->thread.join();
  EXPECT_TRUE(late->result.ok()) << late->result;  // not "cannot reach fl-server" after its give-up time
  server.Stop();
}

}  // namespace
}  // namespace fl::server
