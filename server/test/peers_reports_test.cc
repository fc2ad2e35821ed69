// Finite but huge reports from a hostile client, through the real gRPC service (issue 27, "Hostile clients"): a
// train_loss or an evaluation loss of 1.7e308 passed the per-value check and the round recorded inf (the weighted
// sum overflowed); deltas far beyond any trained model's moved every weight when no norm bound was set. Each is
// now refused naming the field (or tensor and element) and the value, and the committed round is the honest
// client's alone, with finite figures and a finite model.
#include <cmath>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/codec.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "federation_harness.h"

namespace fl::server {
namespace {

using namespace test_harness;  // NOLINT: the harness is this file's vocabulary
using instrumentation::RecordReader;
using ::testing::HasSubstr;

constexpr double kHuge = 1.7e308;  // finite; times any example count it overflows a double

EngineConfig OneRound(const std::string& checkpoint_dir) {
  EngineConfig config = SmallConfig(checkpoint_dir);
  config.fit = {1.0, 1, 2};
  config.num_rounds = 1;
  config.heartbeat_interval_ms = 2000;  // the raw client sends none
  return config;
}

// The raw client's first train task.
fl::v1::Task NextTrainTask(RawClient::Session& session) {
  fl::v1::ServerMessage msg;
  while (session.stream->Read(&msg)) {
    if (msg.has_task() && msg.task().kind() == fl::v1::TASK_KIND_TRAIN) return msg.task();
  }
  return {};
}

std::vector<uint8_t> Fp32(float value) {
  std::vector<uint8_t> payload;
  EXPECT_TRUE((*core::MakeCodec("fp32"))->Encode(std::vector<float>(kParams, value), &payload).ok());
  return payload;
}

TEST(PeersReportsTest, AHugeFiniteTrainLossIsRefusedNamingTheFieldAndTheRoundStaysFinite) {
  fl::testing::ScratchDir dir("fl_peers_reports");
  EngineConfig config = OneRound(dir.File("ckpt"));
  config.evaluate_every = 0;
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("raw");
  ASSERT_NE(session, nullptr);
  const fl::v1::Task task = NextTrainTask(*session);
  ASSERT_EQ(task.kind(), fl::v1::TASK_KIND_TRAIN);
  fl::v1::UpdateHeader h = DeltaHeader(session->joined.client_id(), session->joined.session_token(), task, 1000);
  (*h.mutable_metrics())["train_loss"] = kHuge;
  const fl::v1::UploadUpdateResponse r = raw.Upload(h, Fp32(0.0f));
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_EQ(r.error().code(), fl::v1::ERROR_CODE_MALFORMED);
  EXPECT_EQ(r.error().field(), "metrics[train_loss]");
  EXPECT_THAT(r.error().message(), HasSubstr("metrics[\"train_loss\"] is 1.7e+308"));
  EXPECT_THAT(r.error().message(), HasSubstr("at most 3.40282e+38 in magnitude"));

  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  auto reader = *RecordReader::Open(dir.File("records.db"));
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].status, instrumentation::RoundStatus::kCommitted);
  EXPECT_EQ(rounds[0].num_accepted, 1);
  ASSERT_TRUE(rounds[0].train_loss.has_value());
  EXPECT_TRUE(std::isfinite(*rounds[0].train_loss)) << *rounds[0].train_loss;
  EXPECT_LT(*rounds[0].train_loss, 1e6);
}

TEST(PeersReportsTest, AHugeFiniteEvaluationLossIsRefusedAndTheRoundsLossStaysTheHonestOne) {
  fl::testing::ScratchDir dir("fl_peers_reports");
  EngineConfig config = OneRound("");
  config.round_deadline_ms = 1000;  // the raw client never trains
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
    r->set_num_examples(100);
    r->set_loss(kHuge);
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
  EXPECT_THAT(raw_row.reject_reason, HasSubstr("loss is 1.7e+308"));
  EXPECT_FALSE(raw_row.loss.has_value());
  auto rounds = *reader->ListRounds(result.experiment_id);
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_TRUE(rounds[0].eval_loss.has_value());
  EXPECT_TRUE(std::isfinite(*rounds[0].eval_loss)) << *rounds[0].eval_loss;
  EXPECT_EQ(rounds[0].eval_loss, good_row.loss);
}

TEST(PeersReportsTest, WithoutANormBoundAHugeDeltaIsRefusedNamingTensorElementAndValue) {
  // 1e12 per value: within the 2^64 an fp32 aggregate takes, so it was aggregated and moved every weight by
  // about 1e12 x its weight share. Without --clip-update-norm the default --max-update-value (1e8) refuses it.
  fl::testing::ScratchDir dir("fl_peers_reports");
  EngineConfig config = OneRound(dir.File("ckpt"));
  config.evaluate_every = 0;
  ASSERT_TRUE(config.clip_update_norm.empty());  // the weighted mean's default: no norm bound
  TestServer server(config, dir.File("records.db"), InitialModel(3));
  auto good = StartClient(server.address(), "good", 3);
  RawClient raw(server.address());
  auto session = raw.Connect("attacker");
  ASSERT_NE(session, nullptr);
  const fl::v1::Task task = NextTrainTask(*session);
  ASSERT_EQ(task.kind(), fl::v1::TASK_KIND_TRAIN);
  const fl::v1::UploadUpdateResponse r =
      raw.Upload(DeltaHeader(session->joined.client_id(), session->joined.session_token(), task, 1000), Fp32(1e12f));
  EXPECT_EQ(r.outcome(), fl::v1::UPDATE_OUTCOME_REJECTED);
  EXPECT_THAT(r.error().message(), HasSubstr("contains 1e+12 at tensor '"));
  EXPECT_THAT(r.error().message(), HasSubstr("' element 0; values beyond +-1e+08 (--max-update-value"));

  const EngineResult result = server.Wait();
  ASSERT_EQ(result.status_name(), "finished") << result.reason;
  good->thread.join();
  session->ctx.TryCancel();
  server.Stop();
  // The committed model is the honest client's: finite, where the attacker's would have been ~1e12 away.
  auto ckpt = LoadCheckpoint(CheckpointPath(dir.File("ckpt"), 1));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<float> local(kParams);
  ASSERT_TRUE(good->trainer->GetParameters(local).ok());
  for (size_t i = 0; i < kParams; i += 97) {
    ASSERT_TRUE(std::isfinite(ckpt->values[i]));
    EXPECT_NEAR(ckpt->values[i], local[i], 1e-6);
  }
}

TEST(PeersReportsTest, TheUpdateValueBoundIsValidatedNamingTheFlag) {
  EngineConfig config = SmallConfig("");
  for (double bad : {0.0, -1.0, 1e30, std::nan("")}) {
    config.max_update_value = bad;
    const absl::Status s = config.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--max-update-value=")) << bad;
  }
  config.max_update_value = 1e3;
  EXPECT_TRUE(config.Validate().ok());
}

}  // namespace
}  // namespace fl::server
