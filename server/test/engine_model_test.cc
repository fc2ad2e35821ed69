// The round engine's global model (server/src/engine_model.h): adopting weights, the server step (optimizer,
// integer tensors kept, a non-finite result refused), commit and undo, the download payload, pseudo-gradients of
// whole-weight updates, link-aware codec choice and the checkpoint file.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../src/engine_model.h"
#include "fl/core/codec.h"
#include "fl/server/checkpoint.h"
#include "fl/testing/scratch_dir.h"

namespace fl::server::engine {
namespace {

core::ModelSpec Spec() {
  // Three floats and one integer counter (as BatchNorm's num_batches_tracked).
  return *core::ModelSpec::Create({core::TensorSpec{"w", {3}}, core::TensorSpec{"n", {1}, core::DType::kInt64}});
}

GlobalModel Configured(const std::string& optimizer = "fedavg", const std::string& policy = "") {
  GlobalModel m;
  EXPECT_TRUE(m.Configure("fp32", policy, "fp32", optimizer).ok());
  return m;
}

std::unique_ptr<core::Aggregator> MeanOf(const GlobalModel& m, const std::vector<std::vector<float>>& updates) {
  auto agg = *core::MakeAggregator("mean", m.spec());
  for (const auto& u : updates) EXPECT_TRUE(agg->Add(u, 1.0, m.spec()->fingerprint(), "test").ok());
  return agg;
}

std::vector<float> Decoded(const ModelPayload& p) {
  auto codec = *core::MakeCodec(p.codec);
  std::vector<float> out(4);
  EXPECT_TRUE(codec->Decode(p.bytes, out).ok());
  return out;
}

TEST(GlobalModelTest, AdoptPublishesThePayloadOfTheGivenVersionAndRound) {
  GlobalModel m = Configured();
  EXPECT_FALSE(m.loaded());
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 5, 2).ok());
  ASSERT_TRUE(m.loaded());
  EXPECT_EQ(m.version(), 5u);
  EXPECT_EQ(m.name(), "tiny");
  ASSERT_NE(m.payload(), nullptr);
  EXPECT_EQ(m.payload()->model_version, 5u);
  EXPECT_EQ(m.payload()->round, 2u);
  EXPECT_EQ(m.payload()->spec.name(), "tiny");
  EXPECT_EQ(Decoded(*m.payload()), (std::vector<float>{1, 2, 3, 7}));
}

TEST(GlobalModelTest, AdoptRefusesValuesThatDoNotFitTheSpecAndKeepsTheModel) {
  GlobalModel m = Configured();
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 1, 0).ok());
  absl::Status s = m.Adopt(Spec(), "tiny", {1, 2}, 9, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("2 values but its spec needs 4"), std::string::npos) << s;
  EXPECT_EQ(m.version(), 1u);
  EXPECT_EQ(m.values().size(), 4u);
}

TEST(GlobalModelTest, StepAppliesTheOptimizerAndKeepsIntegerTensorsUntilCommitMovesTheVersion) {
  GlobalModel m = Configured("fedavg");
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 1, 0).ok());
  auto agg = MeanOf(m, {{0.5F, 1, -1, 100}, {1.5F, 1, -1, 100}});  // mean pseudo-gradient {1, 1, -1, 100}
  ASSERT_TRUE(m.Step(*agg, "round 1").ok());
  // FedAvg (lr 1): θ − g; the integer counter keeps its value whatever the mean says.
  EXPECT_EQ(std::vector<float>(m.values().begin(), m.values().end()), (std::vector<float>{0, 1, 4, 7}));
  EXPECT_EQ(m.version(), 1u) << "a step is not a commit";
  EXPECT_EQ(Decoded(*m.payload()), (std::vector<float>{1, 2, 3, 7})) << "clients still download the committed one";
  m.Commit(1);
  EXPECT_EQ(m.version(), 2u);
  EXPECT_EQ(m.payload()->model_version, 2u);
  EXPECT_EQ(m.payload()->round, 1u);
  EXPECT_EQ(Decoded(*m.payload()), (std::vector<float>{0, 1, 4, 7}));
  m.UndoCommit();
  EXPECT_EQ(m.version(), 1u);
}

TEST(GlobalModelTest, AStepThatLeavesTheModelNonFiniteIsAnErrorNamingWhat) {
  GlobalModel m = Configured("fedavg:lr=1e38");
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 1, 0).ok());
  auto agg = MeanOf(m, {{-10, 0, 0, 0}});  // 1e38 x 10 overflows float
  absl::Status s = m.Step(*agg, "round 4");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("the global model after round 4"), std::string::npos) << s;
}

TEST(GlobalModelTest, WholeWeightsBecomeThePseudoGradientAgainstTheGlobalModel) {
  GlobalModel m = Configured();
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 1, 0).ok());
  auto codec = *core::MakeCodec("fp32");
  std::vector<uint8_t> bytes;
  ASSERT_TRUE(codec->Encode(std::vector<float>{0.5F, 2, 5, 7}, &bytes).ok());
  std::vector<float> out;
  ASSERT_TRUE(m.PseudoGradientOfWeights(*codec, bytes, "client a", out).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5F, 0, -2, 0}));
}

TEST(GlobalModelTest, TheUplinkCodecFollowsThePolicyAndAnUnnamedCodecIsTheFixedOne) {
  GlobalModel m = Configured("fedavg", "by-link:wifi=int8");
  EXPECT_EQ(m.UplinkCodecFor("wifi", std::nullopt), "int8");
  EXPECT_EQ(m.UplinkCodecFor("ethernet", std::nullopt), "fp32");
  EXPECT_EQ(m.UplinkCodecOf("int8").name(), "int8");
  EXPECT_EQ(m.UplinkCodecOf("").name(), "fp32");
}

TEST(GlobalModelTest, ConfigureNamesTheSettingThatDoesNotParse) {
  GlobalModel m;
  absl::Status s = m.Configure("fp32", "", "no-such-codec", "fedavg");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("--downlink-codec"), std::string::npos) << s;
}

TEST(GlobalModelTest, TheCheckpointHoldsTheModelItsOptimizerStateAndTheTask) {
  testing::ScratchDir dir("engine_model");
  GlobalModel m = Configured("fedavgm");
  ASSERT_TRUE(m.Adopt(Spec(), "tiny", {1, 2, 3, 7}, 1, 0).ok());
  auto agg = MeanOf(m, {{1, 1, 1, 0}});
  ASSERT_TRUE(m.Step(*agg, "round 1").ok());
  m.Commit(1);
  auto row = m.WriteCheckpoint(CheckpointTarget{dir.path().string(), "exp-1", 1, core::Task::kClassification, 1234});
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_TRUE(row->has_value());
  EXPECT_EQ((*row)->round, 1);
  EXPECT_EQ((*row)->model_version, 2);
  EXPECT_GT((*row)->bytes, 0);
  auto ckpt = LoadCheckpoint((*row)->path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->experiment_id, "exp-1");
  EXPECT_EQ(ckpt->model_version, 2u);
  EXPECT_EQ(ckpt->values, std::vector<float>(m.values().begin(), m.values().end()));
  EXPECT_EQ(ckpt->optimizer.optimizer, "fedavgm");
  EXPECT_EQ(ckpt->task, "classification");
  EXPECT_EQ(ckpt->created_unix_ms, 1234);

  auto none = m.WriteCheckpoint(CheckpointTarget{"", "exp-1", 1, std::nullopt, 0});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace fl::server::engine
