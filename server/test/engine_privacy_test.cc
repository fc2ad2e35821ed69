// Differential privacy in the round engine (server/src/engine_privacy.h, docs/privacy.md) on an injected
// ManualClock: central DP's every update clipped to C and averaged uniformly, the mean noised with std σ·C/m (measured
// over the 5,000 coordinates of the synthetic model, read back from the round's checkpoint), ε per round in the records
// equal to the accountant's for (σ, q = clients per round / population, rounds, δ), the run ended before a round
// would spend past --dp-target-epsilon, adaptive clipping's C moving towards its quantile; the ledger in the
// checkpoint (a resumed run's ε continues, other settings refused); local and distributed DP (what the tasks carry,
// who clips, the accounting); and the refusals at start.
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../src/engine_privacy.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/privacy/accountant.h"
#include "fl/server/checkpoint.h"
#include "manual_engine.h"

namespace fl::server {
namespace {

using test_harness::kParams;
using test_harness::LastTask;
using test_harness::TestClient;

class EnginePrivacyTest : public test_harness::ManualEngineTest {
 protected:
  EnginePrivacyTest() : ManualEngineTest("fl_engine_privacy") {}

  // Two clients, both selected each round (K = 2), a population of 10: q = 0.2.
  EngineConfig Config(double sigma, double clip) {
    EngineConfig c = test_harness::SmallConfig(dir_.File("ckpt"));
    c.num_rounds = 2;
    c.fit = {1.0, 2, 2};
    c.evaluate_every = 0;
    c.round_deadline_ms = 10'000;
    c.heartbeat_interval_ms = 60'000;
    c.print_table = false;
    c.dp_noise_multiplier = sigma;
    c.dp_clip_norm = clip;
    c.dp_population = 10;
    c.dp_delta = 1e-5;
    return c;
  }

  fl::v1::UploadUpdateResponse Upload(const TestClient& c, float value, uint64_t examples) {
    const fl::v1::Task task = *LastTask(c);
    const auto header = test_harness::DeltaHeader(c.id, c.token, task, examples);
    const int64_t first = clock_.NowNs();
    if (auto refused = StartUpload(header); refused.has_value()) return *refused;
    return FinishUpload(header, Fp32Delta(value), first);
  }

  // The engine stops (its open round aborted) and its records are closed, as when fl-server is killed.
  void StopEngine() {
    engine_->Post(ShutdownEvent{"killed"});
    engine_->RunUntilIdle();
    engine_.reset();
    ASSERT_TRUE(records_->Close().ok());
    records_.reset();
  }

  // One round of the two clients: a's update 0.1 on every coordinate (10 examples), b's −0.3 (30).
  void OpposedRound(const TestClient& a, const TestClient& b) {
    ASSERT_EQ(Upload(a, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
    ASSERT_EQ(Upload(b, -0.3f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  }

  // fl-server killed after round `round` and started again with --resume: a new engine on the same records, from
  // that round's checkpoint (what PlanResume hands it), the clients joining again.
  void ResumeFrom(uint64_t round, EngineConfig config) {
    StopEngine();
    auto ckpt = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), round));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    RoundEngine::StartPoint start;
    start.checkpoint = *std::move(ckpt);
    start.resume = true;
    start.committed_attempt = 1;
    // The shutdown recorded round `round` + 1's open attempt 1 as aborted: the next one is attempt 2.
    start.first_attempt = 2;
    start.first_attempts[round + 1] = 2;
    StartEngine(std::move(config), std::move(start));
  }

  static double Mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  }
  static double StdDev(const std::vector<double>& v) {
    const double m = Mean(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / static_cast<double>(v.size() - 1));
  }

  double ExpectedEpsilon(double sigma, int64_t rounds) {
    auto e = privacy::ComputeEpsilon(sigma, 0.2, rounds, 1e-5);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? e->epsilon : NAN;
  }
};

// Opposite updates, both far above C: clipped to ±C/√n per coordinate, their uniform mean is 0, so the model moves by
// the noise alone, N(0, (σC/m)²) = N(0, 0.25²) per coordinate. Over 5,000 coordinates the sample's std is within
// 1% of 0.25 (one standard error is 0.25/√10,000 = 0.0025): the band of ±6% is 6 standard errors wide each side.
TEST_F(EnginePrivacyTest, TheMeanOfClippedUpdatesIsNoisedWithSigmaTimesCOverMAndEpsilonIsRecordedEachRound) {
  StartEngine(Config(/*sigma=*/1.0, /*clip=*/0.5));
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  ASSERT_EQ(Upload(a, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(b, -0.3f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  const std::vector<double> move = MoveIn(1);
  ASSERT_EQ(move.size(), kParams);
  EXPECT_NEAR(StdDev(move), 0.25, 0.015);
  EXPECT_NEAR(Mean(move), 0.0, 5 * 0.25 / std::sqrt(double{kParams}));

  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_TRUE(rounds[0].dp_epsilon.has_value());
  EXPECT_NEAR(*rounds[0].dp_epsilon, ExpectedEpsilon(1.0, 1), 1e-9);
  EXPECT_EQ(rounds[0].dp_clip_norm, 0.5);
  EXPECT_EQ(rounds[0].dp_noise_multiplier, 1.0);

  // Round 2: ε composes over the rounds, as the accountant says for two steps.
  ASSERT_EQ(engine_->state(), EngineState::kCollecting);
  ASSERT_EQ(Upload(a, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(b, -0.3f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 2u);
  ASSERT_TRUE(rounds[1].dp_epsilon.has_value());
  EXPECT_NEAR(*rounds[1].dp_epsilon, ExpectedEpsilon(1.0, 2), 1e-9);
  EXPECT_GT(*rounds[1].dp_epsilon, *rounds[0].dp_epsilon);
}

// The ledger in the checkpoint: a run resumed after round 1 records for round 2 the ε of two rounds, exactly what
// the uninterrupted run records (the first test), not one round's again.
TEST_F(EnginePrivacyTest, AResumedRunContinuesTheAccountantFromItsCheckpoint) {
  const EngineConfig config = Config(/*sigma=*/1.0, /*clip=*/0.5);
  StartEngine(config);
  const TestClient a1 = Connect("a");
  const TestClient b1 = Connect("b");
  OpposedRound(a1, b1);
  auto ckpt = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), 1));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE(ckpt->privacy.has_value()) << "the checkpoint keeps the ledger";
  EXPECT_EQ(ckpt->privacy->rounds(), 1u);
  EXPECT_EQ(ckpt->privacy->mode(), "central");
  EXPECT_EQ(ckpt->privacy->orders_size(), ckpt->privacy->rdp_size());

  ResumeFrom(1, config);
  ASSERT_EQ(engine_->state(), EngineState::kWaitingForClients);
  const TestClient a2 = Connect("a");
  const TestClient b2 = Connect("b");
  OpposedRound(a2, b2);
  // Round 1, round 2's attempt 1 (aborted by the kill) and round 2's attempt 2.
  std::vector<instrumentation::RoundRecord> committed;
  auto rows = Reader()->ListRounds(ExperimentId());
  ASSERT_TRUE(rows.ok()) << rows.status();
  for (const auto& r : *rows) {
    if (r.status == instrumentation::RoundStatus::kCommitted) committed.push_back(r);
  }
  ASSERT_EQ(committed.size(), 2u);
  ASSERT_TRUE(committed[0].dp_epsilon.has_value() && committed[1].dp_epsilon.has_value());
  EXPECT_NEAR(*committed[0].dp_epsilon, ExpectedEpsilon(1.0, 1), 1e-9);
  EXPECT_NEAR(*committed[1].dp_epsilon, ExpectedEpsilon(1.0, 2), 1e-9);
}

TEST_F(EnginePrivacyTest, AResumeWithOtherPrivacySettingsIsRefusedNamingTheDifference) {
  const EngineConfig config = Config(/*sigma=*/1.0, /*clip=*/0.5);
  StartEngine(config);
  const TestClient a = Connect("a");
  const TestClient b = Connect("b");
  OpposedRound(a, b);
  auto ckpt = LoadCheckpoint(CheckpointPath(dir_.File("ckpt"), 1));
  ASSERT_TRUE(ckpt.ok() && ckpt->privacy.has_value());
  auto restore = [&](EngineConfig c, std::optional<fl::v1::PrivacyLedger> ledger) {
    engine::CentralDp dp;
    EXPECT_TRUE(dp.Configure(c).ok());
    return dp.Restore(ledger, 1);
  };
  EngineConfig other = config;
  other.dp_noise_multiplier = 2.0;
  absl::Status s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--dp-noise-multiplier=1, this run has 2"), std::string::npos) << s;
  other = config;
  other.dp_population = 11;
  s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--dp-population=10, this run has 11"), std::string::npos) << s;
  other = config;
  other.dp_delta = 1e-6;
  s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--dp-delta=1e-05, this run has 1e-06"), std::string::npos) << s;
  // A difference beyond six digits is one too (σ from fl-privacy noise has eleven).
  other = config;
  other.dp_noise_multiplier = 1.0000001;
  s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--dp-noise-multiplier=1, this run has 1.0000001"), std::string::npos) << s;
  other = config;
  other.dp_mode = "local";
  s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--dp-mode=central, this run has local"), std::string::npos) << s;
  s = restore(config, std::nullopt);
  EXPECT_NE(std::string(s.message()).find("holds no privacy ledger"), std::string::npos) << s;
  other = config;
  other.dp_noise_multiplier = 0;
  s = restore(other, ckpt->privacy);
  EXPECT_NE(std::string(s.message()).find("--resume without --dp-noise-multiplier"), std::string::npos) << s;
  EXPECT_TRUE(restore(config, ckpt->privacy).ok());
  // Through the engine: Start fails with the same reason.
  other = config;
  other.dp_noise_multiplier = 2.0;
  StopEngine();
  RoundEngine::StartPoint start;
  start.checkpoint = *std::move(ckpt);
  start.resume = true;
  start.committed_attempt = 1;
  records_ = *instrumentation::RecordStore::Open(dir_.File("records.db"));
  engine_ = std::make_unique<RoundEngine>(other, records_.get(), std::move(start), &clock_);
  s = engine_->StartManual();
  EXPECT_NE(std::string(s.message()).find("--resume with other differential privacy settings"), std::string::npos) << s;
  engine_.reset();
}

// Local DP: the clients clip and noise (their tasks say C and the std σ·C); the server neither clips (a locally
// noised update is far above C, and clipping it would cut its noise with its signal) nor noises, and averages
// uniformly; ε is one client's: the Gaussian mechanism of sensitivity 2C and std σC, multiplier σ/2 at q = 1.
TEST_F(EnginePrivacyTest, LocalDpLeavesClippingAndNoiseToTheClientsAndAccountsEachClientsReleases) {
  EngineConfig config = Config(/*sigma=*/1.0, /*clip=*/0.5);
  config.dp_mode = "local";
  config.dp_population = 0;  // not needed: q = 1
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  const fl::v1::Task task = *LastTask(a);
  ASSERT_TRUE(task.has_privacy());
  EXPECT_EQ(task.privacy().clip_norm(), 0.5);
  EXPECT_EQ(task.privacy().local_noise_stddev(), 0.5);
  EXPECT_EQ(task.privacy().central_noise_steps(), 0);
  OpposedRound(a, b);
  const std::vector<double> move = MoveIn(1);
  ASSERT_EQ(move.size(), kParams);
  // (0.1 − 0.3)/2 on every coordinate: not clipped (it would be ±0.5/√5000 ≈ 0.007), not weighted (−0.2), no noise.
  EXPECT_NEAR(Mean(move), -0.1, 1e-6);
  EXPECT_LT(StdDev(move), 1e-6);
  auto rounds = *Reader()->ListRounds(ExperimentId());
  ASSERT_EQ(rounds.size(), 1u);
  ASSERT_TRUE(rounds[0].dp_epsilon.has_value());
  auto expected = privacy::ComputeEpsilon(0.5, 1.0, 1, 1e-5);
  ASSERT_TRUE(expected.ok());
  EXPECT_NEAR(*rounds[0].dp_epsilon, expected->epsilon, 1e-9);
}

// Almost no noise (σ = 0.01: std 0.01 x 1 / 2 = 0.005 per coordinate, 7e-5 on the mean over 5,000): a's update
// (norm 0.1 x √5000 ≈ 7.07) is clipped to C = 1, b's (0.004 x √5000 ≈ 0.28) is not, and the two are averaged with
// equal weights although b claims three times the examples: (0.1/7.07 − 0.004)/2 per coordinate.
TEST_F(EnginePrivacyTest, UpdatesAreClippedToCAndAveragedUniformly) {
  StartEngine(Config(/*sigma=*/0.01, /*clip=*/1.0));
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  ASSERT_EQ(Upload(a, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(b, -0.004f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  const double clipped_a = 0.1 / (0.1 * std::sqrt(double{kParams}));
  const double uniform = (clipped_a - 0.004) / 2;
  const double by_examples = (10 * clipped_a - 30 * 0.004) / 40;
  const double mean = Mean(MoveIn(1));
  EXPECT_NEAR(mean, uniform, 5e-4);
  EXPECT_GT(std::abs(mean - by_examples), 1e-3) << "weighted by examples, it would be " << by_examples;
}

// The target lies between what one round and two rounds spend: round 1 commits, and the run ends (finished, with
// the budget as the reason) instead of starting round 2.
TEST_F(EnginePrivacyTest, TheRunEndsBeforeARoundWouldSpendPastTheTarget) {
  EngineConfig config = Config(1.0, 0.5);
  config.num_rounds = 5;
  const double one = ExpectedEpsilon(1.0, 1);
  const double two = ExpectedEpsilon(1.0, 2);
  ASSERT_LT(one, two);
  config.dp_target_epsilon = (one + two) / 2;
  StartEngine(config);
  TestClient a = Connect("a");
  TestClient b = Connect("b");
  ASSERT_EQ(Upload(a, 0.1f, 10).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  ASSERT_EQ(Upload(b, -0.3f, 30).outcome(), fl::v1::UPDATE_OUTCOME_ACCEPTED);
  Advance(3'000);  // past the grace for the last uplink reports
  ASSERT_EQ(engine_->state(), EngineState::kFinished);
  auto result = engine_->result();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->status, instrumentation::ExperimentStatus::kFinished);
  EXPECT_EQ(result->rounds_committed, 1u);
  EXPECT_NE(result->reason.find("privacy budget: round 2 would bring epsilon to"), std::string::npos) << result->reason;
  EXPECT_NE(result->reason.find("--dp-target-epsilon"), std::string::npos) << result->reason;
}

// Adaptive clipping (Andrew et al. 2021): with every update above C the noisy fraction at or below it stays near
// 0 < γ, so C grows round after round; with every update below it, C shrinks. A seeded generator makes the noisy
// counts, hence the run, the same every time.
TEST(CentralDpTest, AdaptiveClippingMovesCTowardsItsQuantile) {
  EngineConfig config;
  config.dp_noise_multiplier = 1.0;
  config.dp_clip_norm = 1.0;
  config.dp_clipping = "adaptive";
  config.dp_clipped_count_stddev = 5.0;
  config.dp_population = 1000;
  for (bool above : {true, false}) {
    engine::CentralDp dp;
    ASSERT_TRUE(dp.Configure(config, privacy::NoiseRng::FromSeed(7)).ok());
    // The count takes a share of the round's σ, so the update's own noise multiplier σ_Δ is above σ.
    EXPECT_GT(dp.noise_multiplier(), 1.0);
    double c = dp.clip_norm();
    for (int round = 0; round < 20; ++round) {
      auto spent = dp.AfterRound(100, 100, above ? 0 : 100);
      ASSERT_TRUE(spent.ok()) << spent.status();
      EXPECT_EQ(spent->clip_norm, c) << "the record names the C the round used";
      c = dp.clip_norm();
    }
    if (above) {
      EXPECT_GT(c, 5.0) << "C grew towards updates above it";
    } else {
      EXPECT_LT(c, 0.2) << "C shrank towards updates below it";
    }
  }
}

// Adaptive clipping's C is in the ledger: a restored one continues from the C the run had reached, and its next ε
// and C are the uninterrupted run's.
TEST(CentralDpTest, ARestoredLedgerContinuesEpsilonAndAdaptiveC) {
  EngineConfig config;
  config.dp_noise_multiplier = 1.0;
  config.dp_clip_norm = 1.0;
  config.dp_clipping = "adaptive";
  config.dp_clipped_count_stddev = 5.0;
  config.dp_population = 1000;
  engine::CentralDp run;
  ASSERT_TRUE(run.Configure(config, privacy::NoiseRng::FromSeed(3)).ok());
  for (int round = 0; round < 5; ++round) ASSERT_TRUE(run.AfterRound(100, 100, 0).ok());
  ASSERT_GT(run.clip_norm(), 1.5) << "C moved";
  auto ledger = run.Ledger();
  ASSERT_TRUE(ledger.has_value());
  EXPECT_EQ(ledger->rounds(), 5u);
  EXPECT_EQ(ledger->current_clip_norm(), run.clip_norm());
  engine::CentralDp resumed;
  ASSERT_TRUE(resumed.Configure(config, privacy::NoiseRng::FromSeed(4)).ok());
  ASSERT_TRUE(resumed.Restore(ledger, 5).ok());
  EXPECT_EQ(resumed.clip_norm(), run.clip_norm());
  auto next_run = run.AfterRound(100, 100, 0);
  auto next_resumed = resumed.AfterRound(100, 100, 0);
  ASSERT_TRUE(next_run.ok() && next_resumed.ok());
  EXPECT_EQ(next_resumed->epsilon, next_run->epsilon);
  EXPECT_EQ(next_resumed->clip_norm, next_run->clip_norm);
  // A ledger of more rounds than the checkpoint's round is damaged.
  EXPECT_FALSE(resumed.Restore(ledger, 4).ok());
}

// What a train task tells its client in each mode.
TEST(CentralDpTest, TasksCarryWhatTheClientsMustDoInEachMode) {
  EngineConfig config;
  config.dp_noise_multiplier = 2.0;
  config.dp_clip_norm = 0.5;
  config.dp_population = 1000;
  auto fill = [](const EngineConfig& c) {
    engine::CentralDp dp;
    EXPECT_TRUE(dp.Configure(c).ok());
    fl::v1::ClientPrivacy p;
    dp.FillClientPrivacy(10, &p);
    return p;
  };
  // Central without secure aggregation: the server clips and noises; the task carries nothing.
  EXPECT_EQ(fill(config).ByteSizeLong(), 0u);
  {
    engine::CentralDp dp;
    ASSERT_TRUE(dp.Configure(config).ok());
    EXPECT_TRUE(dp.ServerClips());
    EXPECT_TRUE(dp.ServerNoises());
  }
  // Central with secure aggregation: the clients clip, the server noises the unmasked mean.
  EngineConfig secure = config;
  secure.secure_aggregation = "secagg+";
  fl::v1::ClientPrivacy p = fill(secure);
  EXPECT_EQ(p.clip_norm(), 0.5);
  EXPECT_EQ(p.local_noise_stddev(), 0);
  EXPECT_EQ(p.central_noise_steps(), 0);
  {
    engine::CentralDp dp;
    ASSERT_TRUE(dp.Configure(secure).ok());
    EXPECT_FALSE(dp.ServerClips());
    EXPECT_TRUE(dp.ServerNoises());
  }
  // Local: clip and N(0, (σC)²).
  EngineConfig local = config;
  local.dp_mode = "local";
  p = fill(local);
  EXPECT_EQ(p.clip_norm(), 0.5);
  EXPECT_EQ(p.local_noise_stddev(), 1.0);
  // Distributed: clip, and a share of σ·C·scale quantisation steps over the round's 10 clients.
  EngineConfig distributed = secure;
  distributed.dp_mode = "distributed";
  distributed.secagg_scale = 1024;
  p = fill(distributed);
  EXPECT_EQ(p.clip_norm(), 0.5);
  EXPECT_EQ(p.central_noise_steps(), 2.0 * 0.5 * 1024);
  EXPECT_EQ(p.expected_clients(), 10u);
  {
    engine::CentralDp dp;
    ASSERT_TRUE(dp.Configure(distributed).ok());
    EXPECT_FALSE(dp.ServerClips());
    EXPECT_FALSE(dp.ServerNoises());
  }
  // Off: nothing.
  EngineConfig off;
  EXPECT_EQ(fill(off).ByteSizeLong(), 0u);
}

// Distributed DP accounts a round with the survivors' shares: 8 of 10 → σ·√(8/10), at q = 10 / 1000.
TEST(CentralDpTest, DistributedDpAccountsTheSurvivorsNoise) {
  EngineConfig config;
  config.dp_noise_multiplier = 2.0;
  config.dp_population = 1000;
  config.dp_mode = "distributed";
  config.secure_aggregation = "secagg+";
  engine::CentralDp dp;
  ASSERT_TRUE(dp.Configure(config).ok());
  auto spent = dp.AfterRound(10, 8, 8);
  ASSERT_TRUE(spent.ok()) << spent.status();
  const double sigma = 2.0 * std::sqrt(0.8);
  EXPECT_NEAR(spent->noise_multiplier, sigma, 1e-12);
  auto expected = privacy::ComputeEpsilon(sigma, 0.01, 1, 1e-5);
  ASSERT_TRUE(expected.ok());
  EXPECT_NEAR(spent->epsilon, expected->epsilon, 1e-9);
  // More than the same round with every share in it.
  engine::CentralDp all;
  ASSERT_TRUE(all.Configure(config).ok());
  EXPECT_LT(all.AfterRound(10, 10, 10)->epsilon, spent->epsilon);
}

TEST(CentralDpTest, OffWithoutANoiseMultiplier) {
  engine::CentralDp dp;
  ASSERT_TRUE(dp.Configure(EngineConfig{}).ok());
  EXPECT_FALSE(dp.on());
  auto past = dp.EpsilonPastTarget(10);
  ASSERT_TRUE(past.ok());
  EXPECT_FALSE(past->has_value());
}

TEST(EnginePrivacyConfigTest, SettingsThatGiveNoPrivacyOrCannotBeAccountedAreRefusedSayingWhy) {
  auto refused = [](auto change, const std::string& words) {
    EngineConfig c = test_harness::SmallConfig("");
    c.dp_noise_multiplier = 1.0;
    c.dp_population = 100;
    change(c);
    absl::Status s = c.Validate();
    EXPECT_FALSE(s.ok()) << words;
    EXPECT_NE(std::string(s.message()).find(words), std::string::npos) << s;
  };
  refused([](EngineConfig& c) { c.dp_clip_norm = 0; }, "--dp-clip-norm=0 gives no privacy");
  refused([](EngineConfig& c) { c.dp_population = 0; }, "needs --dp-population");
  refused(
      [](EngineConfig& c) {
        c.dp_noise_multiplier = 0;
        c.dp_target_epsilon = 4;
      },
      "without --dp-noise-multiplier gives no privacy");
  refused([](EngineConfig& c) { c.aggregation = "buffered"; }, "--aggregation=buffered is not supported");
  refused([](EngineConfig& c) { c.aggregator = "median"; }, "needs the mean of the updates");
  refused([](EngineConfig& c) { c.deadline_policy = "fold"; }, "--deadline-policy=fold is not supported");
  refused([](EngineConfig& c) { c.clip_update_norm = "2"; }, "--clip-update-norm=2 with --dp-noise-multiplier");
  refused(
      [](EngineConfig& c) {
        c.dp_clipping = "adaptive";
        c.dp_clipped_count_stddev = 0.5;
      },
      "needs --dp-clipped-count-stddev above --dp-noise-multiplier / 2");
  refused([](EngineConfig& c) { c.dp_mode = "distributed"; }, "--dp-mode=distributed needs --secure-aggregation");
  refused(
      [](EngineConfig& c) {
        c.secure_aggregation = "secagg+";
        c.dp_clipping = "adaptive";
        c.dp_clipped_count_stddev = 5;
      },
      "--dp-clipping=adaptive with --secure-aggregation=secagg+ is not supported");
  refused(
      [](EngineConfig& c) {
        c.dp_mode = "local";
        c.dp_clipping = "adaptive";
        c.dp_clipped_count_stddev = 5;
      },
      "--dp-clipping=adaptive with --dp-mode=local is not supported");
  refused(
      [](EngineConfig& c) {
        c.secure_aggregation = "secagg+";
        c.secagg_max_weight = 100;
        c.secagg_scale = 1024;
      },
      "needs uniform weights (--secagg-max-weight=1, not 100)");
  // σ = 1, C = 1, 2 clients at least: a share of std 1/√2 ≈ 0.71, so the range must be at least 1 + 8 × 0.71.
  refused(
      [](EngineConfig& c) {
        c.secure_aggregation = "secagg+";
        c.dp_mode = "distributed";
        c.secagg_range = 2;
      },
      "--secagg-range=2 leaves no room for the noise");
  refused([](EngineConfig& c) { c.dp_mode = "other"; }, "--dp-mode=other is not known");
  EngineConfig fine = test_harness::SmallConfig("");
  fine.dp_noise_multiplier = 1.0;
  fine.dp_population = 100;
  EXPECT_TRUE(fine.Validate().ok()) << fine.Validate();
  EngineConfig local = fine;
  local.dp_mode = "local";
  local.dp_population = 0;
  EXPECT_TRUE(local.Validate().ok()) << local.Validate();
  EngineConfig distributed = fine;
  distributed.dp_mode = "distributed";
  distributed.secure_aggregation = "secagg+";
  distributed.secagg_range = 8;
  EXPECT_TRUE(distributed.Validate().ok()) << distributed.Validate();
}

}  // namespace
}  // namespace fl::server
