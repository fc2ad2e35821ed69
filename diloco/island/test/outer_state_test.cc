// The arithmetic of the outer loop on known values: the Streaming DiLoCo schedule (which fragment syncs at
// which step, apply = send + tau), the mixing formula, the Nesterov outer step through the core optimizer
// against a hand computation, and the state image / hash that islands compare.
#include "fl/diloco/island/outer_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

namespace fl::diloco {
namespace {

// blocks.0 (2 values), blocks.1 (3), blocks.2 (1), emb (2) -> non-layer.
std::shared_ptr<const core::ModelSpec> SmallSpec() {
  std::vector<core::TensorSpec> t(4);
  t[0].name = "emb";
  t[0].shape = {2};
  t[1].name = "blocks.0.w";
  t[1].shape = {2};
  t[2].name = "blocks.1.w";
  t[2].shape = {3};
  t[3].name = "blocks.2.w";
  t[3].shape = {1};
  return std::make_shared<const core::ModelSpec>(*core::ModelSpec::Create(t));
}

TEST(FragmentScheduleTest, OneFragmentEveryHOverPStepsAndApplyTauLater) {
  // H = 12, P = 3, tau = 2: fragment 0 at 4, 16, 28..; fragment 1 at 8, 20..; fragment 2 at 12, 24..
  absl::StatusOr<core::FragmentSchedule> s = core::FragmentSchedule::Create(12, 3, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<std::pair<uint64_t, size_t>> sends;
  for (uint64_t t = 1; t <= 24; ++t) {
    if (auto f = s->FragmentSyncingAt(t)) sends.emplace_back(t, *f);
  }
  const std::vector<std::pair<uint64_t, size_t>> want = {{4, 0}, {8, 1}, {12, 2}, {16, 0}, {20, 1}, {24, 2}};
  EXPECT_EQ(sends, want);
  for (const auto& [t, f] : sends) {
    EXPECT_EQ(s->ApplyStep(t), t + 2);
    ASSERT_TRUE(s->FragmentApplyingAt(t + 2).has_value());
    EXPECT_EQ(*s->FragmentApplyingAt(t + 2), f);
    EXPECT_FALSE(s->FragmentApplyingAt(t + 1).has_value());
  }
  // The round index the island runtime derives for a send step: (t - SendStep(f, 0)) / H.
  EXPECT_EQ(s->SendStep(1, 1), 20u);
  EXPECT_EQ((20 - s->SendStep(1, 0)) / 12, 1u);
}

TEST(OuterOptionsTest, RejectsScheduleThatCannotWork) {
  OuterOptions o;
  o.inner_steps = 10;
  o.num_fragments = 3;  // does not divide H
  EXPECT_FALSE(o.Validate().ok());
  o.num_fragments = 2;
  o.overlap_steps = 5;  // not below H/P
  EXPECT_FALSE(o.Validate().ok());
  o.overlap_steps = 4;
  EXPECT_TRUE(o.Validate().ok());
  o.mixing_alpha = 1.5;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(OuterOptionsTest, DefaultAlphaIsZeroWithoutOverlapAndHalfWithIt) {
  OuterOptions o;
  EXPECT_EQ(o.EffectiveAlpha(), 0.0);
  o.overlap_steps = 2;
  EXPECT_EQ(o.EffectiveAlpha(), 0.5);
  o.mixing_alpha = 0.25;
  EXPECT_EQ(o.EffectiveAlpha(), 0.25);
}

TEST(MixingTest, AlphaLocalPlusOneMinusAlphaGlobal) {
  std::vector<float> global = {1.0f, -2.0f, 4.0f};
  std::vector<float> local = {3.0f, 2.0f, 0.0f};
  ASSERT_TRUE(MixLocal(0.5f, global, local).ok());
  EXPECT_EQ(local, (std::vector<float>{2.0f, 0.0f, 2.0f}));
  std::vector<float> local2 = {3.0f, 2.0f, 0.0f};
  ASSERT_TRUE(MixLocal(0.25f, global, local2).ok());
  EXPECT_FLOAT_EQ(local2[0], 0.25f * 3 + 0.75f * 1);
  EXPECT_FLOAT_EQ(local2[1], 0.25f * 2 + 0.75f * -2);
  std::vector<float> local3 = {3.0f, 2.0f, 0.0f};
  ASSERT_TRUE(MixLocal(0.0f, global, local3).ok());  // alpha 0 = DiLoCo: replace by the global model
  EXPECT_EQ(local3, global);
  std::vector<float> wrong(2);
  EXPECT_FALSE(MixLocal(0.5f, global, wrong).ok());
}

TEST(OuterStateTest, NesterovOuterStepEqualsHandComputationPerFragment) {
  OuterOptions o;
  o.inner_steps = 6;
  o.num_fragments = 3;  // blocks.{0,2} -> fragment 0 (strided, L = 2), blocks.1 -> 1, emb -> 2
  o.overlap_steps = 1;
  o.mixing_alpha = 0.5;
  o.outer_optimizer = "nesterov:lr=0.7,momentum=0.9";
  std::vector<float> init = {10, 20, 1, 2, 3, 4, 5, 6};  // emb | b0 | b1 | b2
  absl::StatusOr<OuterState> state = OuterState::Create(SmallSpec(), init, o);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_EQ(state->plan().num_fragments(), 3u);
  EXPECT_EQ(state->fragment_size(0), 3u);  // blocks.0 (2) + blocks.2 (1)
  EXPECT_EQ(state->fragment_size(1), 3u);
  EXPECT_EQ(state->fragment_size(2), 2u);

  // Local model after some inner steps; pseudo-gradient of fragment 0 = global - local on b0 and b2.
  std::vector<float> local = {9, 19, 0.5f, 1.0f, 3, 4, 5, 7};
  std::vector<float> delta(3);
  ASSERT_TRUE(state->PseudoGradient(0, local, delta).ok());
  EXPECT_EQ(delta, (std::vector<float>{0.5f, 1.0f, -1.0f}));

  // Two outer steps with averaged pseudo-gradients g1, g2, by hand: buf = mu buf + g; x -= lr (g + mu buf).
  const std::vector<float> g1 = {0.5f, 1.0f, -1.0f}, g2 = {0.25f, -0.5f, 2.0f};
  std::vector<float> x = {1, 2, 6}, buf = {0, 0, 0};
  for (const auto* g : {&g1, &g2}) {
    for (size_t i = 0; i < 3; ++i) {
      buf[i] = 0.9f * buf[i] + (*g)[i];
      x[i] -= 0.7f * ((*g)[i] + 0.9f * buf[i]);
    }
  }
  ASSERT_TRUE(state->ApplyOuterStep(0, g1).ok());
  ASSERT_TRUE(state->ApplyOuterStep(0, g2).ok());
  EXPECT_EQ(state->global()[2], x[0]);
  EXPECT_EQ(state->global()[3], x[1]);
  EXPECT_EQ(state->global()[7], x[2]);
  // Other fragments untouched; their optimizers did not step.
  EXPECT_EQ(state->global()[0], 10.0f);
  EXPECT_EQ(state->global()[4], 3.0f);
  EXPECT_EQ(state->outer_steps(0), 2u);
  EXPECT_EQ(state->outer_steps(1), 0u);

  // Mixing fragment 0 into the local model with alpha 0.5; the rest of the local model stays.
  ASSERT_TRUE(state->MixInto(0, local).ok());
  EXPECT_EQ(local[2], 0.5f * 0.5f + 0.5f * x[0]);
  EXPECT_EQ(local[3], 0.5f * 1.0f + 0.5f * x[1]);
  EXPECT_EQ(local[7], 0.5f * 7.0f + 0.5f * x[2]);
  EXPECT_EQ(local[0], 9.0f);
  EXPECT_EQ(local[4], 3.0f);
}

TEST(OuterStateTest, PseudoGradientSignMatchesCoreConvention) {
  // With lr 1 and no momentum the outer step must land exactly on the islands' mean model.
  OuterOptions o;
  o.inner_steps = 1;
  o.outer_optimizer = "nesterov:lr=1,momentum=0";
  absl::StatusOr<OuterState> state = OuterState::Create(SmallSpec(), std::vector<float>(8, 1.0f), o);
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<float> a = {1.5f, 0.5f, 2, 0, 1, 1, 3, -1};
  std::vector<float> b = {0.5f, 1.5f, 0, 2, 1, 3, 1, 1};
  std::vector<float> da(8), db(8), mean(8);
  ASSERT_TRUE(state->PseudoGradient(0, a, da).ok());
  ASSERT_TRUE(state->PseudoGradient(0, b, db).ok());
  for (size_t i = 0; i < 8; ++i) mean[i] = (da[i] + db[i]) / 2;
  ASSERT_TRUE(state->ApplyOuterStep(0, mean).ok());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(state->global()[i], (a[i] + b[i]) / 2) << i;
}

TEST(OuterStateTest, SerializeRestoreGivesEqualHashAndCorruptionIsRejected) {
  OuterOptions o;
  o.inner_steps = 4;
  o.num_fragments = 2;
  absl::StatusOr<OuterState> a = OuterState::Create(SmallSpec(), {1, 2, 3, 4, 5, 6, 7, 8}, o);
  absl::StatusOr<OuterState> b = OuterState::Create(SmallSpec(), {1, 2, 3, 4, 5, 6, 7, 8}, o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->Hash(), b->Hash());
  std::vector<float> g(a->fragment_size(0), 0.125f);
  ASSERT_TRUE(a->ApplyOuterStep(0, g).ok());
  EXPECT_NE(a->Hash(), b->Hash());  // parameters and momentum changed
  std::vector<uint8_t> image = a->Serialize();
  ASSERT_TRUE(b->Restore(image).ok());
  EXPECT_EQ(a->Hash(), b->Hash());
  EXPECT_EQ(b->outer_steps(0), 1u);
  // Same next step on both: still identical (momentum was carried over).
  ASSERT_TRUE(a->ApplyOuterStep(0, g).ok());
  ASSERT_TRUE(b->ApplyOuterStep(0, g).ok());
  EXPECT_EQ(a->Hash(), b->Hash());

  const uint64_t before = b->Hash();
  std::vector<uint8_t> bad = a->Serialize();
  bad[bad.size() / 2] ^= 0x40;
  absl::Status s = b->Restore(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(b->Hash(), before);  // nothing changed
}

TEST(OuterStateTest, RestoreRefusesAnotherModel) {
  OuterOptions o;
  o.inner_steps = 4;
  absl::StatusOr<OuterState> a = OuterState::Create(SmallSpec(), std::vector<float>(8, 1.0f), o);
  std::vector<core::TensorSpec> t(1);
  t[0].name = "w";
  t[0].shape = {8};
  auto other = std::make_shared<const core::ModelSpec>(*core::ModelSpec::Create(t));
  absl::StatusOr<OuterState> b = OuterState::Create(other, std::vector<float>(8, 1.0f), o);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::Status s = b->Restore(a->Serialize());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

}  // namespace
}  // namespace fl::diloco
