// What a hostile or broken client sends, through the real gRPC service (issue 13, items 1-5): a model spec
// too large or overflowing, an initial model never uploaded, absurd figures in updates, evaluations and
// clock-sync answers, an update weight above what the client declared, an update that would set the global
// model, megabytes of labels and device strings. Each case asserts the status and the message, that the
// server stays healthy (other clients proceed, the experiment finishes) and that the committed rounds'
// figures are the honest clients' only.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "fl/core/clock.h"
#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/server/strategy.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary
using instrumentation::RecordReader;

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::unique_ptr<fl::v1::Federation::Stub> Stub(const std::string& address) {
  return fl::v1::Federation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

fl::v1::JoinRequest JoinOf(const std::string& name, const fl::v1::ModelSpec& spec) {
  fl::v1::JoinRequest req;
  req.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  req.set_client_name(name);
  *req.mutable_model_spec() = spec;
  req.set_num_train_examples(1000);
  return req;
}

grpc::Status CallJoin(fl::v1::Federation::Stub& stub, const fl::v1::JoinRequest& req, fl::v1::JoinResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ctx.set_wait_for_ready(true);
  return stub.Join(&ctx, req, resp);
}

fl::v1::ModelSpec SyntheticSpec() { return proto::ToProto(client::SyntheticTrainer(kParams, 10, 1).spec(), "raw"); }

// ---- item 1: the model's size ----

TEST(ClientReportsTest, AHugeSpecIsRefusedAtJoinNamingTheLimitAndTheFlag) {
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 1};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  TestServer server(config, dir.File("records.db"));  // no initial model: the first client's is asked for
  auto stub = Stub(server.address());

  // 2^36 float32 values: 256 GiB. Refused before anything is kept or allocated.
  const core::ModelSpec huge = *core::ModelSpec::Create({{"huge", {int64_t{1} << 36}, core::DType::kFloat32, 0}});
  fl::v1::JoinResponse resp;
  grpc::Status status = CallJoin(*stub, JoinOf("greedy", proto::ToProto(huge, "huge")), &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_ADMISSION_REFUSED);
  EXPECT_EQ(detail.field(), "model_spec");
  EXPECT_TRUE(Contains(detail.message(), "68719476736 values")) << detail.message();
  EXPECT_TRUE(Contains(detail.message(), "at most 536870912 values (--max-model-values)")) << detail.message();

  // [2^62, 4]: its element count wraps around to 0 in 64 bits; refused naming the tensor.
  fl::v1::ModelSpec wraps;
  fl::v1::TensorSpec* t = wraps.add_tensors();
  t->set_name("wraps");
  t->add_shape(int64_t{1} << 62);
  t->add_shape(4);
  t->set_dtype(fl::v1::DTYPE_FLOAT32);
  status = CallJoin(*stub, JoinOf("wrapping", wraps), &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  detail = proto::ErrorFromGrpcStatus(status);
  EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_MALFORMED);
  EXPECT_TRUE(Contains(detail.message(), "tensor 'wraps' has shape [4611686018427387904, 4]")) << detail.message();

  // The server is healthy: an honest client is asked for the initial model and the experiment runs.
  auto good = StartClient(server.address(), "good", 1);
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto clients = *reader->ListClients(result.experiment_id);
  ASSERT_EQ(clients.size(), 1u);
  EXPECT_EQ(clients[0].client_id, "good");
}

TEST(ClientReportsTest, AnAnnouncedInitialModelUploadAllocatesOnlyWhatArrives) {
  // The crash of issue 13: the first client declares a huge model and announces its initial-model upload;
  // the server reserved the announced size up front (std::bad_alloc, SIGABRT). Here the limit is raised so
  // that the spec is admitted and 256 GiB are announced (more than this machine has): the server must take
  // the chunk that arrives, and stay up when the client gives up.
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 1};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.max_model_values = uint64_t{1} << 36;
  config.initial_model_deadline_ms = 300;
  TestServer server(config, dir.File("records.db"));
  auto stub = Stub(server.address());
  const core::ModelSpec huge = *core::ModelSpec::Create({{"huge", {int64_t{1} << 36}, core::DType::kFloat32, 0}});
  fl::v1::JoinResponse joined;
  ASSERT_TRUE(CallJoin(*stub, JoinOf("greedy", proto::ToProto(huge, "huge")), &joined).ok());
  ASSERT_TRUE(joined.initial_model_requested());
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    fl::v1::UploadUpdateResponse resp;
    auto writer = stub->UploadUpdate(&ctx, &resp);
    fl::v1::UpdateChunk chunk;
    fl::v1::UpdateHeader* h = chunk.mutable_header();
    h->set_client_id(joined.client_id());
    h->set_session_token(joined.session_token());
    h->set_kind(fl::v1::UPDATE_KIND_INITIAL_MODEL);
    h->set_model_fingerprint(huge.fingerprint());
    h->set_codec("fp32");
    h->set_num_examples(1000);
    h->set_payload_bytes((*core::MakeCodec("fp32"))->EncodedSize(huge.num_elements()));
    ASSERT_TRUE(writer->Write(chunk));
    chunk.Clear();
    chunk.set_data(std::string(64 << 10, '\0'));
    writer->Write(chunk);
    ctx.TryCancel();  // the client gives up mid-upload
    (void)writer->Finish();
  }
  // Past the (300 ms) deadline the greedy client has stalled: the next client to join is asked instead.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  // Still serving: an honest client joins (the greedy one has stalled and gone: this one is asked), trains.
  auto good = StartClient(server.address(), "good", 1);
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
}

// ---- item 2: the client asked for the initial model never uploads it ----

TEST(ClientReportsTest, AStalledInitialModelHolderIsReplacedByAnotherConnectedClient) {
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.fit = {1.0, 1, 1};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 200;
  config.initial_model_deadline_ms = 1000;
  TestServer server(config, dir.File("records.db"));
  // The first client is asked for the initial weights, keeps its session alive and never uploads them.
  RawClient raw(server.address());
  auto stall = raw.Connect("stall");
  ASSERT_NE(stall, nullptr);
  ASSERT_TRUE(stall->joined.initial_model_requested());
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    fl::v1::ClientMessage hb;
    hb.mutable_heartbeat()->set_state(fl::v1::CLIENT_STATE_IDLE);
    while (!stop && stall->stream->Write(hb)) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  // An honest client of the same model joins meanwhile: after the deadline it is asked instead.
  auto good = StartClient(server.address(), "good", 1);
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  stop = true;
  stall->ctx.TryCancel();
  heartbeats.join();
  good->thread.join();
  server.Stop();
  // The initial model is the honest client's, and the records say why the first one lost the role.
  auto ckpt = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 0));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<float> initial(kParams);
  ASSERT_TRUE(client::SyntheticTrainer(kParams, 101, 1).GetParameters(initial).ok());
  EXPECT_EQ(ckpt->values, initial);
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto clients = *reader->ListClients(result.experiment_id);
  bool found = false;
  for (const auto& c : clients) {
    if (c.client_id != "stall") continue;
    found = true;
    EXPECT_TRUE(Contains(c.left_reason, "asked for the initial model")) << c.left_reason;
    EXPECT_TRUE(Contains(c.left_reason, "--initial-model-deadline-ms=1000")) << c.left_reason;
    EXPECT_TRUE(Contains(c.left_reason, "client 'good' is asked instead")) << c.left_reason;
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(reader->ListRounds(result.experiment_id)->size(), 1u);
}

TEST(ClientReportsTest, AnInitialModelHolderThatLeavesIsReplacedByAConnectedClient) {
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.fit = {1.0, 1, 1};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.initial_model_deadline_ms = 500;
  TestServer server(config, dir.File("records.db"));
  RawClient raw(server.address());
  auto quitter = raw.Connect("quitter");
  ASSERT_NE(quitter, nullptr);
  ASSERT_TRUE(quitter->joined.initial_model_requested());
  // An honest client joins while the quitter still holds the role (it is compared with the quitter's model).
  auto good = StartClient(server.address(), "good", 1);
  {
    auto stub = Stub(server.address());
    grpc::ClientContext ctx;
    fl::v1::LeaveRequest leave;
    leave.set_client_id(quitter->joined.client_id());
    leave.set_session_token(quitter->joined.session_token());
    leave.set_reason("operator\nstopped it");
    fl::v1::LeaveResponse left;
    ASSERT_TRUE(stub->Leave(&ctx, leave, &left).ok());
    EXPECT_TRUE(left.acknowledged());
  }
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  const auto clients = *reader->ListClients(result.experiment_id);
  for (const auto& c : clients) {
    if (c.client_id == "quitter") {
      EXPECT_TRUE(Contains(c.left_reason, "client 'good' is asked instead")) << c.left_reason;
    }
  }
  EXPECT_EQ(reader->ListRounds(result.experiment_id)->size(), 1u);
}

// ---- items 3 and 4: the numbers of a train update ----

struct BadUpdate {
  std::string name;
  std::function<void(fl::v1::UpdateHeader&)> mutate;
  std::string field;   // ErrorDetail.field
  std::string needle;  // in the message and the recorded reject_reason
};

void PrintTo(const BadUpdate& bad, std::ostream* os) { *os << bad.name; }

fl::v1::PhaseTiming Timing(fl::v1::Phase phase, int64_t start, int64_t duration, uint64_t bytes = 0) {
  fl::v1::PhaseTiming t;
  t.set_phase(phase);
  t.set_start_client_ns(start);
  t.set_duration_ns(duration);
  t.set_bytes(bytes);
  return t;
}

// Runs one round with an honest client and a raw client whose update header `mutate` makes; returns the raw
// client's verdict and checks that the committed round is the honest client's alone.
class BadUpdateTest : public ::testing::TestWithParam<BadUpdate> {};

TEST_P(BadUpdateTest, IsRefusedWithTheFieldAndARecordedReasonAndNeverCounts) {
  const BadUpdate& bad = GetParam();
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  config.fit = {1.0, 1, 2};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 2000;  // the raw client sends none
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("raw");  // declares 1000 train examples
  ASSERT_NE(session, nullptr);
  fl::v1::ServerMessage msg;
  fl::v1::Task task;
  while (session->stream->Read(&msg)) {
    if (msg.has_task()) {
      task = msg.task();
      break;
    }
  }
  ASSERT_EQ(task.kind(), fl::v1::TASK_KIND_TRAIN);
  fl::v1::UpdateHeader h = DeltaHeader(session->joined.client_id(), session->joined.session_token(), task, 500);
  (*h.mutable_metrics())["train_loss"] = 0.5;
  (*h.mutable_metrics())["num_steps"] = 10;
  bad.mutate(h);
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 0.5f), &payload).ok());
  const fl::v1::UploadUpdateResponse r = raw.Upload(h, payload);
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(r.error().code(), fl::v1::ERROR_CODE_MALFORMED);
  EXPECT_EQ(r.error().field(), bad.field) << r.error().message();
  EXPECT_TRUE(Contains(r.error().message(), bad.needle)) << r.error().message();

  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();

  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto rows = *reader->ListClientRounds(result.experiment_id, 1);
  ASSERT_EQ(rows.size(), 2u);
  const auto& raw_row = rows[0].client_id == "raw" ? rows[0] : rows[1];
  const auto& good_row = rows[0].client_id == "raw" ? rows[1] : rows[0];
  EXPECT_EQ(raw_row.outcome, instrumentation::ClientOutcome::kRejected);
  EXPECT_TRUE(Contains(raw_row.reject_reason, bad.needle)) << raw_row.reject_reason;
  // None of the refused report's numbers are in the records.
  EXPECT_FALSE(raw_row.train_loss.has_value());
  EXPECT_FALSE(raw_row.train_ms.has_value());
  EXPECT_FALSE(raw_row.num_examples.has_value() && *raw_row.num_examples != 0);
  EXPECT_FALSE(raw_row.train_start_unix_ms.has_value());
  // The committed round is the honest client's: its examples, its loss, its model.
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  EXPECT_EQ(rounds[0].num_rejected, 1);
  EXPECT_EQ(rounds[0].num_examples, good_row.num_examples.value_or(-1));
  EXPECT_EQ(rounds[0].train_loss, good_row.train_loss);
  auto ckpt = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 1));
  ASSERT_TRUE(ckpt.ok());
  std::vector<float> local(kParams);
  ASSERT_TRUE(good->trainer->GetParameters(local).ok());
  for (size_t i = 0; i < kParams; i += 97) EXPECT_NEAR(ckpt->values[i], local[i], 1e-6);
}

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

INSTANTIATE_TEST_SUITE_P(
    Reports, BadUpdateTest,
    ::testing::Values(
        BadUpdate{"InfiniteTrainLoss",
                  [](auto& h) { (*h.mutable_metrics())["train_loss"] = std::numeric_limits<double>::infinity(); },
                  "metrics[train_loss]", "metrics[\"train_loss\"] is inf"},
        BadUpdate{"NegativeTrainLoss", [](auto& h) { (*h.mutable_metrics())["train_loss"] = -2; },
                  "metrics[train_loss]", "is -2; a loss is a finite value >= 0"},
        BadUpdate{"AccuracyAboveOne", [](auto& h) { (*h.mutable_metrics())["train_accuracy"] = 2.5; },
                  "metrics[train_accuracy]", "is 2.5; an accuracy is in [0, 1]"},
        BadUpdate{"NegativeSteps", [](auto& h) { (*h.mutable_metrics())["num_steps"] = -3; }, "metrics[num_steps]",
                  "metrics[\"num_steps\"] is -3"},
        BadUpdate{"AbsurdSteps", [](auto& h) { (*h.mutable_metrics())["num_steps"] = 1e300; }, "metrics[num_steps]",
                  "whole number in [0, "},
        // Item 4: the weight is bounded by the 1000 train examples the client declared at Join.
        BadUpdate{"WeightAboveWhatTheClientDeclared", [](auto& h) { h.set_num_examples(1'000'000'000'000); },
                  "num_examples",
                  "claims 1000000000000 training examples; it must be in [1, 1000] (client 'raw' "
                  "declared 1000 train examples at Join)"},
        BadUpdate{"NegativeDuration", [](auto& h) { *h.add_timings() = Timing(fl::v1::PHASE_TRAIN, 1'000'000, -5); },
                  "timings (PHASE_TRAIN)", "lasted -5 ns"},
        BadUpdate{"TrainLongerThanTheTaskExisted",
                  [](auto& h) { *h.add_timings() = Timing(fl::v1::PHASE_TRAIN, 1'000'000, 3'600'000'000'000); },
                  "timings (PHASE_TRAIN)", "lasted 3600000000000 ns"},
        BadUpdate{"ClockReadingNoClockHas",
                  [](auto& h) { *h.add_timings() = Timing(fl::v1::PHASE_TRAIN, kI64Max, 1000); },
                  "timings (PHASE_TRAIN)", "no monotonic clock reads that"},
        BadUpdate{
            "DownlinkBytesBeyondTheModel",
            [](auto& h) { *h.add_timings() = Timing(fl::v1::PHASE_DOWNLINK, 1'000'000, 1000, uint64_t{1} << 63); },
            "timings (PHASE_DOWNLINK)", "moved 9223372036854775808 bytes"},
        BadUpdate{"UnknownPhase",
                  [](auto& h) { *h.add_timings() = Timing(static_cast<fl::v1::Phase>(99), 1'000'000, 1000); },
                  "timings", "phase 99, which is not a known fl.v1.Phase"},
        // Item 5: maps are bounded too.
        BadUpdate{"ThousandMetrics",
                  [](auto& h) {
                    for (int i = 0; i < 1000; ++i) (*h.mutable_metrics())[fl::StrCat("m", i)] = i;
                  },
                  "metrics", "metrics holds 1002 entries; the limit is 32"}),
    [](const ::testing::TestParamInfo<BadUpdate>& param_info) { return param_info.param.name; });

// ---- item 3: clock-sync answers ----

// A raw client that answers every ping with `pong` (t2, t3 of its own clock) and uploads a zero delta with
// one train phase at `train_start_client_ns` when its task comes; returns the verdict.
fl::v1::UploadUpdateResponse RunRawWithPongs(RawClient& raw, RawClient::Session& session,
                                             std::function<void(fl::v1::ClockPong&)> pong,
                                             int64_t train_start_client_ns) {
  fl::v1::ServerMessage msg;
  while (session.stream->Read(&msg)) {
    if (msg.has_ping()) {
      fl::v1::ClientMessage m;
      m.mutable_pong()->set_ping_id(msg.ping().ping_id());
      m.mutable_pong()->set_ping_sent_server_ns(msg.ping().sent_server_ns());
      pong(*m.mutable_pong());
      session.stream->Write(m);
      continue;
    }
    if (!msg.has_task()) continue;
    fl::v1::UpdateHeader h = DeltaHeader(session.joined.client_id(), session.joined.session_token(), msg.task(), 500);
    *h.add_timings() = Timing(fl::v1::PHASE_TRAIN, train_start_client_ns, 1'000'000);
    std::vector<uint8_t> payload;
    EXPECT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 0.0f), &payload).ok());
    return raw.Upload(h, payload);
  }
  return {};
}

TEST(ClientReportsTest, PongsAtInt64ExtremesAreIgnoredAndPlaceNothing) {
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 2, 2};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("raw");
  ASSERT_NE(session, nullptr);
  const fl::v1::UploadUpdateResponse r = RunRawWithPongs(
      raw, *session,
      [](fl::v1::ClockPong& p) {
        p.set_received_client_ns(std::numeric_limits<int64_t>::min());
        p.set_sent_client_ns(std::numeric_limits<int64_t>::max());
      },
      1'000'000);
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED) << r.error().message();
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  const auto rows = *reader->ListClientRounds(result.experiment_id, 1);
  for (const auto& row : rows) {
    if (row.client_id != "raw") continue;
    // No offset was ever estimated from such answers: nothing of the client's is placed on the timeline.
    EXPECT_FALSE(row.clock_offset_ms.has_value());
    EXPECT_FALSE(row.train_start_unix_ms.has_value());
  }
  // And no phase anywhere in the records lies outside the experiment's hour.
  auto ahead =
      reader->QueryText(fl::StrCat("SELECT count(*) FROM client_rounds WHERE experiment_id = '", result.experiment_id,
                                   "' AND train_start_unix_ms > ", fl::UnixMs() + 3'600'000));
  ASSERT_TRUE(ahead.ok());
  EXPECT_EQ(*ahead, "0");
  // Each refused pong is recorded with its reason (client_events), not only logged.
  const auto events = *reader->ListClientEvents(result.experiment_id);
  int refused = 0;
  for (const auto& e : events) {
    if (e.client_id != "raw") continue;
    EXPECT_EQ(e.kind, instrumentation::ClientEventKind::kReportRefused);
    EXPECT_NE(e.reason.find("clock pong refused: impossible timestamps"), std::string::npos) << e.reason;
    ++refused;
  }
  EXPECT_GE(refused, 1);
}

TEST(ClientReportsTest, PhasesPlacedOutsideTheTaskAreRefused) {
  // Consistent pongs of a clock 2^59 ns (18 years) ahead, then a train phase at an ordinary reading of that
  // clock: placed 18 years before the task was dispatched. Refused, recorded, never placed.
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 2};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("raw");
  ASSERT_NE(session, nullptr);
  const fl::v1::UploadUpdateResponse r = RunRawWithPongs(
      raw, *session,
      [](fl::v1::ClockPong& p) {
        p.set_received_client_ns(int64_t{1} << 59);
        p.set_sent_client_ns(int64_t{1} << 59);
      },
      5'000'000'000);
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_TRUE(Contains(r.error().message(), "timings (PHASE_TRAIN) place the phase")) << r.error().message();
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  const auto rows = *reader->ListClientRounds(result.experiment_id, 1);
  for (const auto& row : rows) {
    if (row.client_id != "raw") continue;
    EXPECT_EQ(row.outcome, instrumentation::ClientOutcome::kRejected);
    EXPECT_TRUE(Contains(row.reject_reason, "outside the")) << row.reject_reason;
    EXPECT_FALSE(row.train_start_unix_ms.has_value());
  }
  EXPECT_EQ((*reader->ListRounds(result.experiment_id))[0].num_accepted, 1);
}

// ---- item 3: evaluation results ----

TEST(ClientReportsTest, AnEvaluationWithAnImpossibleExampleCountIsRefusedAndRecordedAsZero) {
  // 2^64 - 1 examples: cast to the records' INTEGER it was -1, a row the CHECK constraint lost.
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 2};
  config.num_rounds = 1;
  config.round_deadline_ms = 1000;  // the raw client never trains
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, dir.File("records.db"), InitialModel(1));
  auto good = StartClient(server.address(), "good", 1);
  RawClient raw(server.address());
  auto session = raw.Connect("raw");
  ASSERT_NE(session, nullptr);
  fl::v1::ServerMessage msg;
  while (session->stream->Read(&msg)) {
    if (!msg.has_task() || msg.task().kind() != fl::v1::TASK_KIND_EVALUATE) continue;
    fl::v1::ClientMessage m;
    fl::v1::EvaluationResult* r = m.mutable_evaluation();
    r->set_task_id(msg.task().task_id());
    r->set_round(msg.task().round());
    r->set_num_examples(std::numeric_limits<uint64_t>::max());
    r->set_loss(0.5);
    r->set_accuracy(0.5);
    ASSERT_TRUE(session->stream->Write(m));
  }
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto evaluations = *reader->ListEvaluations(result.experiment_id, 1);
  ASSERT_EQ(evaluations.size(), 2u);
  const auto& raw_row = evaluations[0].client_id == "raw" ? evaluations[0] : evaluations[1];
  const auto& good_row = evaluations[0].client_id == "raw" ? evaluations[1] : evaluations[0];
  EXPECT_TRUE(Contains(raw_row.reject_reason, "claims 18446744073709551615 examples")) << raw_row.reject_reason;
  EXPECT_EQ(raw_row.num_examples, 0);
  EXPECT_FALSE(raw_row.loss.has_value());
  auto rounds = *reader->ListRounds(result.experiment_id);
  EXPECT_EQ(rounds[0].eval_num_examples, good_row.num_examples);
  EXPECT_EQ(rounds[0].eval_loss, good_row.loss);
}

// ---- item 4: norm bounding ----

TEST(ClientReportsTest, WithANormBoundOneClientCannotSetTheGlobalModel) {
  // The attacker's delta is 1e18 per value (within the range an aggregate takes). Bounded at norm 1, the
  // committed model moves by at most 1 whatever it sends.
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig(dir.File("ckpt"));
  ASSERT_TRUE(ResolveStrategy("fedavg", &config).ok());
  config.clip_update_norm = "1";
  config.fit = {1.0, 2, 2};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  config.heartbeat_interval_ms = 2000;
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("attacker");
  ASSERT_NE(session, nullptr);
  fl::v1::ServerMessage msg;
  while (session->stream->Read(&msg)) {
    if (!msg.has_task()) continue;
    fl::v1::UpdateHeader h =
        DeltaHeader(session->joined.client_id(), session->joined.session_token(), msg.task(), 1000);
    std::vector<uint8_t> payload;
    ASSERT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, 1e18f), &payload).ok());
    EXPECT_EQ(raw.Upload(h, payload).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
    break;
  }
  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  auto r0 = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 0));
  auto r1 = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 1));
  ASSERT_TRUE(r0.ok() && r1.ok());
  double moved = 0;
  for (size_t i = 0; i < kParams; ++i) moved += std::pow(r1->values[i] - r0->values[i], 2);
  EXPECT_LE(std::sqrt(moved), 1.0 + 1e-3);
}

TEST(ClientReportsTest, TheRobustStrategiesBoundByTheMedianNormAndTheMeanRefusesIt) {
  EngineConfig config = SmallConfig("");
  ASSERT_TRUE(ResolveStrategy("fedmedian", &config).ok());
  EXPECT_EQ(config.UpdateNormClip()->mode, core::NormClip::Mode::kMedian);
  ASSERT_TRUE(ResolveStrategy("fedtrimmedavg:0.1", &config).ok());
  EXPECT_EQ(config.UpdateNormClip()->mode, core::NormClip::Mode::kMedian);
  ASSERT_TRUE(ResolveStrategy("fedavg", &config).ok());
  EXPECT_EQ(config.UpdateNormClip()->mode, core::NormClip::Mode::kOff);
  config.clip_update_norm = "median";
  const absl::Status s = config.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(Contains(std::string(fl::ToStd(s.message())), "--clip-update-norm=median")) << s;
  config.clip_update_norm = "-3";
  EXPECT_TRUE(Contains(std::string(fl::ToStd(config.Validate().message())), "--clip-update-norm=-3"));
}

// ---- item 5: strings and maps of a Join ----

struct Oversize {
  std::string name;
  std::function<void(fl::v1::JoinRequest&)> mutate;
  std::string field;
  std::string needle;
};

TEST(ClientReportsTest, OversizeJoinStringsAndMapsAreRefusedNamingTheFieldAndTheLimit) {
  fl::testing::ScratchDir dir("fl_reports");
  EngineConfig config = SmallConfig("");
  config.fit = {1.0, 1, 1};
  config.num_rounds = 1;
  config.evaluate_every = 0;
  TestServer server(config, dir.File("records.db"), InitialModel(1));
  auto stub = Stub(server.address());
  const std::string mb(1 << 20, 'x');
  const Oversize cases[] = {
      {"device_class", [&](auto& r) { r.mutable_device()->set_device_class(mb); }, "device.device_class",
       "device.device_class is 1048576 bytes long; the limit is 64 bytes"},
      {"os", [&](auto& r) { r.mutable_device()->set_os(mb); }, "device.os", "the limit is 256 bytes"},
      {"accelerator", [&](auto& r) { r.mutable_device()->mutable_accelerator()->set_name(mb); },
       "device.accelerator.name", "the limit is 256 bytes"},
      {"link_description", [&](auto& r) { r.mutable_link()->set_description(mb); }, "link.description",
       "link.description is 1048576 bytes long"},
      {"label_value", [&](auto& r) { (*r.mutable_labels())["site"] = mb; }, "labels[\"site\"]",
       "the limit is 256 bytes"},
      {"many_labels",
       [&](auto& r) {
         for (int i = 0; i < 40; ++i) (*r.mutable_labels())[fl::StrCat("k", i)] = "v";
       },
       "labels", "labels holds 40 entries; the limit is 16"},
      {"software_version", [&](auto& r) { r.set_software_version(mb); }, "software_version", "limit is 256"},
      {"memory_bytes", [&](auto& r) { r.mutable_device()->set_memory_bytes(~uint64_t{0}); }, "device.memory_bytes",
       "device.memory_bytes is 18446744073709551615; the limit is 1125899906842624"},
      {"control_characters_in_name", [&](auto& r) { r.set_client_name("evil\n[info] forged line"); }, "client_name",
       "client name 'evil\\n[info] forged line' is invalid"},
  };
  for (const Oversize& c : cases) {
    fl::v1::JoinRequest req = JoinOf(fl::StrCat("c-", c.name), SyntheticSpec());
    c.mutate(req);
    fl::v1::JoinResponse resp;
    const grpc::Status status = CallJoin(*stub, req, &resp);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
    EXPECT_EQ(detail.code(), fl::v1::ERROR_CODE_MALFORMED) << c.name;
    EXPECT_EQ(detail.field(), c.field) << c.name;
    EXPECT_TRUE(Contains(detail.message(), c.needle)) << c.name << ": " << detail.message();
    EXPECT_LT(detail.message().size(), 1000u) << c.name << ": a refusal does not echo the megabyte back";
  }
  // Declared example counts are bounded by the server's policy.
  fl::v1::JoinRequest greedy = JoinOf("greedy", SyntheticSpec());
  greedy.set_num_train_examples(1'000'000'000'000);
  fl::v1::JoinResponse resp;
  const grpc::Status status = CallJoin(*stub, greedy, &resp);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Contains(proto::ErrorFromGrpcStatus(status).message(),
                       "declares 1000000000000 num_train_examples; this server takes at most 1000000000 "
                       "(--max-client-examples)"))
      << status.error_message();

  // Healthy: an honest client runs the experiment; none of the refused joins left a row.
  auto good = StartClient(server.address(), "good", 1);
  const EngineResult result = server.Wait();
  EXPECT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto clients = *reader->ListClients(result.experiment_id);
  ASSERT_EQ(clients.size(), 1u);
  EXPECT_EQ(clients[0].client_id, "good");
}

}  // namespace
}  // namespace fl::server
