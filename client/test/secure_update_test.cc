// fl-client's side of secure aggregation and Task.privacy (secure_update.h, update_privacy.h), driven against a
// real secagg::ServerRound the way the session and the round engine carry the messages: the payloads the clients
// produce (codec "secagg-z32": (dimension + 1) little-endian words) unmask to the plain quantised weighted sum;
// a client that drops after its shares is recovered; clipping and local noise do what they say; distributed DP's
// shares sum to the central variance; the worker's wait for the masking start (before or after the training,
// cancelled, past the deadline, refused) without sleeping.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fl/client/secure_update.h"
#include "fl/client/update_privacy.h"
#include "fl/privacy/mechanisms.h"
#include "fl/secagg/quantize.h"
#include "fl/secagg/server_round.h"

namespace fl::client {
namespace {

using Outcome = SecureUpdate::Outcome;

constexpr uint64_t kRound = 7;

std::chrono::steady_clock::time_point FarAway() { return std::chrono::steady_clock::now() + std::chrono::hours(1); }

// The task id of client `id`'s train task.
std::string TaskOf(uint64_t id) { return "task-" + std::to_string(id); }

// The words of a payload, read as little-endian (the wire's order).
std::vector<uint32_t> WordsOf(const std::vector<uint8_t>& payload) {
  std::vector<uint32_t> words(payload.size() / 4);
  for (size_t i = 0; i < words.size(); ++i) {
    words[i] = uint32_t{payload[4 * i]} | uint32_t{payload[4 * i + 1]} << 8 | uint32_t{payload[4 * i + 2]} << 16 |
               uint32_t{payload[4 * i + 3]} << 24;
  }
  return words;
}

// A payload buffer as RunTask makes it: the delta's floats in the first dimension * 4 bytes.
std::vector<uint8_t> PayloadWith(const std::vector<float>& delta) {
  std::vector<uint8_t> payload(SecAggPayloadBytes(delta.size()));
  std::memcpy(payload.data(), delta.data(), delta.size() * sizeof(float));
  return payload;
}

// A round of n clients (ids 100, 103, ...): one real ServerRound, a SecureUpdate per client, the messages handed
// over as the session's reader thread would.
struct Federation {
  secagg::ServerRoundConfig config;
  std::unique_ptr<secagg::ServerRound> server;
  std::map<uint64_t, std::unique_ptr<SecureUpdate>> clients;
  std::map<uint64_t, std::vector<float>> deltas;
  std::map<uint64_t, uint64_t> examples;

  Federation(size_t n, uint64_t dimension, secagg::QuantizationSpec spec, uint64_t seed,
             const std::set<uint64_t>& drop_after_shares = {}) {
    config.round = kRound;
    config.dimension = dimension;
    config.quantization = spec;
    privacy::NoiseRng values = privacy::NoiseRng::FromSeed(seed);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = 100 + 3 * i;
      config.participants.push_back(id);
      clients[id] =
          std::make_unique<SecureUpdate>(SecureUpdate::Options{.drop_after_shares = drop_after_shares.contains(id)});
      std::vector<float>& d = deltas[id];
      // Mostly inside the range, a few coordinates beyond it (clipped by the quantisation).
      for (uint64_t j = 0; j < dimension; ++j) {
        d.push_back(static_cast<float>((values.UniformClosedOpen() * 2 - 1) * spec.range * 1.01));
      }
      examples[id] = 10 + 37 * i;
    }
    auto created = secagg::ServerRound::Create(config, secagg::RandomSource::SeededForTests(seed));
    EXPECT_TRUE(created.ok()) << created.status();
    if (created.ok()) server = *std::move(created);
  }

  v1::SecAggQuantization Quantization() const {
    v1::SecAggQuantization q;
    q.set_range(config.quantization.range);
    q.set_scale(config.quantization.scale);
    q.set_max_weight(config.quantization.max_weight);
    return q;
  }
  uint32_t WeightOf(uint64_t id) const { return SecAggWeight(Quantization(), examples.at(id)); }

  // Stage 1 and 2, as the reader thread answers them.
  void AdvertiseAndShare() {
    for (uint64_t id : config.participants) {
      v1::SecAggSetup setup;
      ASSERT_TRUE(server->SetupFor(id, &setup).ok());
      auto keys =
          clients[id]->Start(TaskOf(id), setup, config.dimension, secagg::RandomSource::SeededForTests(1000 + id));
      ASSERT_TRUE(keys.ok()) << keys.status();
      ASSERT_TRUE(server->OnPublicKeys(*keys).ok());
    }
    ASSERT_TRUE(server->CloseAdvertiseKeys().ok()) << server->failure();
    for (uint64_t id : server->Alive()) {
      v1::SecAggNeighbourKeys keys;
      ASSERT_TRUE(server->NeighbourKeysFor(id, &keys).ok());
      std::optional<v1::SecAggShares> shares = clients[id]->OnNeighbourKeys(keys);
      ASSERT_TRUE(shares.has_value());
      ASSERT_TRUE(server->OnShares(*shares).ok());
    }
    ASSERT_TRUE(server->CloseShareKeys().ok()) << server->failure();
  }

  void SendMaskingStart(uint64_t id) {
    v1::SecAggMaskingStart start;
    ASSERT_TRUE(server->MaskingStartFor(id, &start).ok());
    clients[id]->OnMaskingStart(start);
  }

  // The worker's part: the wait, then the masked payload; uploaded to the server when ready.
  Outcome TrainAndUpload(uint64_t id, const DistributedNoise& noise = {}, privacy::NoiseRng* rng = nullptr) {
    std::atomic<bool> interrupted{false};
    const SecureUpdate::Waited waited =
        clients[id]->AwaitMaskingStart(TaskOf(id), WeightOf(id), interrupted, FarAway());
    if (waited.outcome != Outcome::kReady) return waited.outcome;
    std::vector<uint8_t> payload = PayloadWith(deltas[id]);
    privacy::NoiseRng own = privacy::NoiseRng::FromSeed(id);
    auto report = clients[id]->MaskInPlace(TaskOf(id), payload, noise, rng != nullptr ? *rng : own);
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return Outcome::kAbandoned;
    EXPECT_EQ(payload.size(), (config.dimension + 1) * 4);
    EXPECT_EQ(report->weight, WeightOf(id));
    // The client's own time in each stage's work was taken.
    EXPECT_GT(report->keys_seconds, 0);
    EXPECT_GT(report->shares_seconds, 0);
    EXPECT_GT(report->masking_start_seconds, 0);
    clipped[id] = report->clipped_values;
    const std::vector<uint32_t> words = WordsOf(payload);
    uploaded[id] = words;
    EXPECT_TRUE(server->OnMaskedWords(kRound, id, 0, words).ok());
    return Outcome::kReady;
  }

  absl::Status Unmask() {
    if (absl::Status s = server->CloseMaskedUpload(); !s.ok()) return s;
    for (uint64_t id : server->Alive()) {
      v1::SecAggUnmaskRequest request;
      EXPECT_TRUE(server->UnmaskRequestFor(id, &request).ok());
      std::optional<v1::SecAggUnmaskResponse> response = clients[id]->OnUnmaskRequest(request);
      EXPECT_TRUE(response.has_value());
      if (response.has_value()) {
        EXPECT_TRUE(server->OnUnmaskResponse(*response).ok());
      }
    }
    return server->CloseUnmask();
  }

  // The plain weighted quantised sum (dimension words, then the total weight), mod 2^32.
  std::vector<uint32_t> PlainSum(const std::vector<uint64_t>& survivors) const {
    std::vector<uint32_t> sum(config.dimension + 1, 0);
    for (uint64_t id : survivors) {
      const uint32_t w = WeightOf(id);
      for (size_t i = 0; i < config.dimension; ++i) {
        sum[i] += static_cast<uint32_t>(secagg::Quantize(config.quantization, deltas.at(id)[i])) * w;
      }
      sum[config.dimension] += w;
    }
    return sum;
  }

  uint64_t OutOfRange(uint64_t id) const {
    uint64_t n = 0;
    for (float x : deltas.at(id)) n += std::fabs(x) > config.quantization.range ? 1 : 0;
    return n;
  }

  std::map<uint64_t, std::vector<uint32_t>> uploaded;
  std::map<uint64_t, uint64_t> clipped;
};

std::vector<uint32_t> Sum(std::span<const uint32_t> s) { return std::vector<uint32_t>(s.begin(), s.end()); }

TEST(SecureUpdateTest, MaskedPayloadsUnmaskToThePlainQuantisedWeightedSum) {
  // 40,000 coordinates: more than two masking steps of 16,384 (the copy-out window), the last one partial.
  Federation f(5, 40000, {1.0, 65536.0, 100}, 1);
  f.AdvertiseAndShare();
  // The masking start before the training ended for some (held until the weight is known), after it for others.
  for (uint64_t id : {100u, 106u, 112u}) f.SendMaskingStart(id);
  for (uint64_t id : {100u, 106u, 112u}) ASSERT_EQ(f.TrainAndUpload(id), Outcome::kReady);
  for (uint64_t id : {103u, 109u}) {
    std::atomic<bool> interrupted{false};
    SecureUpdate::Waited waited;
    std::thread worker(
        [&] { waited = f.clients[id]->AwaitMaskingStart(TaskOf(id), f.WeightOf(id), interrupted, FarAway()); });
    while (!f.clients[id]->worker_waiting()) std::this_thread::yield();
    f.SendMaskingStart(id);
    worker.join();
    ASSERT_EQ(waited.outcome, Outcome::kReady) << waited.why;
  }
  // The waits above applied the starts; masking needs nothing more.
  for (uint64_t id : {103u, 109u}) {
    std::vector<uint8_t> payload = PayloadWith(f.deltas[id]);
    privacy::NoiseRng rng = privacy::NoiseRng::FromSeed(id);
    auto report = f.clients[id]->MaskInPlace(TaskOf(id), payload, {}, rng);
    ASSERT_TRUE(report.ok()) << report.status();
    f.clipped[id] = report->clipped_values;
    f.uploaded[id] = WordsOf(payload);
    ASSERT_TRUE(f.server->OnMaskedWords(kRound, id, 0, f.uploaded[id]).ok());
  }
  ASSERT_TRUE(f.Unmask().ok()) << f.server->failure();
  const auto result = f.server->Result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->survivors, f.config.participants);
  EXPECT_EQ(Sum(f.server->running_sum()), f.PlainSum(result->survivors));
  // Weights: examples 10, 47, 84 as given, 121 and 158 capped at max_weight 100.
  EXPECT_EQ(result->total_weight, 10u + 47 + 84 + 100 + 100);
  for (uint64_t id : f.config.participants) {
    EXPECT_EQ(f.clipped[id], f.OutOfRange(id)) << id;
    EXPECT_GT(f.clipped[id], 0u);  // the check is not vacuous
    // What left the client is masked: almost no word equals its plain weighted quantised value.
    const std::vector<uint32_t> plain = f.PlainSum({id});
    size_t same = 0;
    for (size_t i = 0; i < plain.size(); ++i) same += f.uploaded[id][i] == plain[i] ? 1 : 0;
    EXPECT_LT(same, 5u) << id;
  }
}

TEST(SecureUpdateTest, AClientThatDropsAfterItsSharesIsRecoveredAndUploadsNothing) {
  Federation f(5, 3000, {2.0, 4096.0, 1}, 2, /*drop_after_shares=*/{106});
  f.AdvertiseAndShare();
  for (uint64_t id : f.server->Alive()) f.SendMaskingStart(id);
  std::vector<uint64_t> survivors;
  for (uint64_t id : f.config.participants) {
    const Outcome outcome = f.TrainAndUpload(id);
    if (id == 106) {
      EXPECT_EQ(outcome, Outcome::kDropped);
      EXPECT_FALSE(f.clients[id]->open());
    } else {
      ASSERT_EQ(outcome, Outcome::kReady);
      survivors.push_back(id);
    }
  }
  // The dropped client ignores the rest of its round (it would not answer an unmask request either).
  v1::SecAggUnmaskRequest late;
  late.set_round(kRound);
  EXPECT_FALSE(f.clients[106]->OnUnmaskRequest(late).has_value());
  ASSERT_TRUE(f.Unmask().ok()) << f.server->failure();
  const auto result = f.server->Result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->survivors, survivors);
  EXPECT_EQ(Sum(f.server->running_sum()), f.PlainSum(survivors));
  EXPECT_EQ(result->total_weight, 4u);  // uniform weights
}

// The sample mean and variance of the centred values.
struct Moments {
  double mean = 0, variance = 0;
};
Moments MomentsOf(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= static_cast<double>(v.size() - 1);
  return m;
}

TEST(SecureUpdateTest, DistributedNoiseSharesSumToTheCentralVariance) {
  constexpr uint64_t kDimension = 50000;
  constexpr double kCentralSteps = 40;  // each of 4 clients adds std 40 / sqrt(4) = 20 steps
  Federation f(4, kDimension, {1.0, 65536.0, 1}, 3);
  f.AdvertiseAndShare();
  for (uint64_t id : f.server->Alive()) f.SendMaskingStart(id);
  privacy::NoiseRng rng = privacy::NoiseRng::FromSeed(33);
  for (uint64_t id : f.config.participants) {
    ASSERT_EQ(f.TrainAndUpload(id, {.central_noise_steps = kCentralSteps, .expected_clients = 4}, &rng),
              Outcome::kReady);
  }
  ASSERT_TRUE(f.Unmask().ok()) << f.server->failure();
  const std::vector<uint32_t> plain = f.PlainSum(f.config.participants);
  const std::span<const uint32_t> sum = f.server->running_sum();
  EXPECT_EQ(sum[kDimension], plain[kDimension]);  // the weight coordinate carries no noise
  std::vector<double> noise(kDimension);
  for (size_t i = 0; i < kDimension; ++i) noise[i] = static_cast<int32_t>(sum[i] - plain[i]);
  const Moments m = MomentsOf(noise);
  // Bounds of six standard errors of this sample size: the variance's relative standard error is sqrt(2/n).
  const double variance = kCentralSteps * kCentralSteps;
  EXPECT_NEAR(m.variance, variance, 6 * variance * std::sqrt(2.0 / kDimension));
  EXPECT_NEAR(m.mean, 0, 6 * kCentralSteps / std::sqrt(static_cast<double>(kDimension)));
}

TEST(UpdatePrivacyTest, ClipsToTheNormThenAddsLocalNoiseOfTheGivenStd) {
  constexpr size_t kN = 1'000'000;
  constexpr double kClip = 2.0, kStd = 0.01;
  privacy::NoiseRng values = privacy::NoiseRng::FromSeed(5);
  std::vector<float> x(kN);
  for (float& v : x) v = static_cast<float>(values.Gaussian());  // norm about 1000, far above C
  // Clipping alone: the norm is C (to float rounding), the direction kept.
  std::vector<float> clipped = x;
  v1::ClientPrivacy clip_only;
  clip_only.set_clip_norm(kClip);
  privacy::NoiseRng rng = privacy::NoiseRng::FromSeed(6);
  auto c = ApplyClientPrivacy(clipped, clip_only, rng);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->clipped);
  EXPECT_LE(privacy::L2Norm(clipped), kClip * (1 + 1e-6));
  EXPECT_NEAR(privacy::L2Norm(clipped), kClip, kClip * 1e-6);
  for (size_t i = 0; i < kN; i += 99991) EXPECT_NEAR(clipped[i], x[i] * c->scale, 1e-6 * std::fabs(x[i]) + 1e-12);
  // Clip, then noise: what differs from the clipped update is noise of std kStd.
  std::vector<float> noised = x;
  v1::ClientPrivacy both = clip_only;
  both.set_local_noise_stddev(kStd);
  auto b = ApplyClientPrivacy(noised, both, rng);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<double> diff(kN);
  for (size_t i = 0; i < kN; ++i) diff[i] = static_cast<double>(noised[i]) - static_cast<double>(clipped[i]);
  const Moments m = MomentsOf(diff);
  EXPECT_NEAR(m.variance, kStd * kStd, 6 * kStd * kStd * std::sqrt(2.0 / kN));
  EXPECT_NEAR(m.mean, 0, 6 * kStd / std::sqrt(static_cast<double>(kN)));
  // Nothing set: nothing changes.
  std::vector<float> same = x;
  ASSERT_TRUE(ApplyClientPrivacy(same, v1::ClientPrivacy(), rng).ok());
  EXPECT_EQ(same, x);
  // An update below C is left alone by the clip.
  std::vector<float> small = {0.5f, -0.5f};
  auto s = ApplyClientPrivacy(small, clip_only, rng);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->clipped);
  EXPECT_EQ(small[0], 0.5f);
  // A diverged update cannot be clipped.
  std::vector<float> diverged = {1.0f, std::nanf("")};
  EXPECT_EQ(ApplyClientPrivacy(diverged, clip_only, rng).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(UpdatePrivacyTest, BadValuesAreRefusedNamingTheField) {
  auto refused = [](const v1::ClientPrivacy& p, bool secagg) {
    const absl::Status s = CheckClientPrivacy(p, secagg);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.message());
  };
  v1::ClientPrivacy p;
  EXPECT_TRUE(CheckClientPrivacy(p, false).ok());
  p.set_clip_norm(std::nan(""));
  EXPECT_NE(refused(p, false).find("clip_norm"), std::string::npos);
  p = v1::ClientPrivacy();
  p.set_local_noise_stddev(-1);
  EXPECT_NE(refused(p, false).find("local_noise_stddev = -1"), std::string::npos);
  p = v1::ClientPrivacy();
  p.set_central_noise_steps(std::numeric_limits<double>::infinity());
  EXPECT_NE(refused(p, true).find("central_noise_steps"), std::string::npos);
  p = v1::ClientPrivacy();
  p.set_central_noise_steps(100);
  p.set_expected_clients(10);
  EXPECT_TRUE(CheckClientPrivacy(p, true).ok());
  EXPECT_NE(refused(p, false).find("without secure aggregation"), std::string::npos);
  p.set_expected_clients(0);
  EXPECT_NE(refused(p, true).find("expected_clients = 0"), std::string::npos);
  p.set_central_noise_steps(1e9);
  p.set_expected_clients(4);
  EXPECT_NE(refused(p, true).find("2^20"), std::string::npos);
}

TEST(SecureUpdateTest, WeightIsOneForUniformAveragingElseTheExamplesCapped) {
  v1::SecAggQuantization q;
  q.set_max_weight(1);
  EXPECT_EQ(SecAggWeight(q, 500), 1u);
  q.set_max_weight(50);
  EXPECT_EQ(SecAggWeight(q, 7), 7u);
  EXPECT_EQ(SecAggWeight(q, 500), 50u);
  EXPECT_EQ(SecAggWeight(q, 0), 1u);
}

// One client of a round of three, up to its shares; the others' keys and shares as the server routes them.
struct OneClient {
  Federation f{3, 100, {1.0, 256.0, 1}, 4};
  uint64_t id = 100;
  SecureUpdate& client() { return *f.clients[id]; }
  std::atomic<bool> interrupted{false};
};

TEST(SecureUpdateTest, CancelledWhileWaitingNothingIsMasked) {
  OneClient c;
  c.f.AdvertiseAndShare();
  SecureUpdate::Waited waited;
  std::thread worker([&] { waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway()); });
  while (!c.client().worker_waiting()) std::this_thread::yield();
  c.interrupted = true;  // the session's cancel: task_cancelled_, then Wake()
  c.client().Wake();
  worker.join();
  EXPECT_EQ(waited.outcome, Outcome::kInterrupted);
  std::vector<uint8_t> payload = PayloadWith(c.f.deltas[c.id]);
  privacy::NoiseRng rng = privacy::NoiseRng::FromSeed(1);
  EXPECT_EQ(c.client().MaskInPlace(TaskOf(c.id), payload, {}, rng).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SecureUpdateTest, TheServersCancelAbandonsTheRoundAndWakesTheWorker) {
  OneClient c;
  c.f.AdvertiseAndShare();
  SecureUpdate::Waited waited;
  std::thread worker([&] { waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway()); });
  while (!c.client().worker_waiting()) std::this_thread::yield();
  c.client().Abandon("another-task", "not this one");  // another task's cancel changes nothing
  EXPECT_TRUE(c.client().open());
  c.client().Abandon(TaskOf(c.id), "the server cancelled the task");
  worker.join();
  EXPECT_EQ(waited.outcome, Outcome::kAbandoned);
  EXPECT_NE(std::string(waited.why.message()).find("the server cancelled"), std::string::npos);
  // A masking start arriving now is for no open round: ignored.
  c.f.SendMaskingStart(c.id);
  EXPECT_FALSE(c.client().open());
}

TEST(SecureUpdateTest, ALaterTasksRoundEndsTheWaitOfTheOneItReplaces) {
  OneClient c;
  v1::SecAggSetup next;  // the next round's setup: this one's with another round number
  ASSERT_TRUE(c.f.server->SetupFor(c.id, &next).ok());
  next.set_round(kRound + 1);
  c.f.AdvertiseAndShare();
  SecureUpdate::Waited waited;
  std::thread worker([&] { waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway()); });
  while (!c.client().worker_waiting()) std::this_thread::yield();
  EXPECT_TRUE(c.client().Start("task-next", next, 100, secagg::RandomSource::SeededForTests(2)).ok());
  worker.join();
  EXPECT_EQ(waited.outcome, Outcome::kAbandoned);
  EXPECT_NE(std::string(waited.why.message()).find("replaced by task task-next"), std::string::npos) << waited.why;
  EXPECT_TRUE(c.client().open());  // the new round is
}

TEST(SecureUpdateTest, NoMaskingStartBeforeTheDeadlineAbandonsTheRound) {
  OneClient c;
  c.f.AdvertiseAndShare();
  const SecureUpdate::Waited waited = c.client().AwaitMaskingStart(
      TaskOf(c.id), 1, c.interrupted, std::chrono::steady_clock::now() - std::chrono::seconds(1));
  EXPECT_EQ(waited.outcome, Outcome::kDeadline);
  EXPECT_EQ(waited.why.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(c.client().open());
}

TEST(SecureUpdateTest, MessagesOfAnotherRoundAreIgnoredAndARefusalAbandons) {
  OneClient c;
  v1::SecAggSetup setup;
  ASSERT_TRUE(c.f.server->SetupFor(c.id, &setup).ok());
  // Before any round is open: ignored.
  v1::SecAggNeighbourKeys keys;
  keys.set_round(kRound);
  EXPECT_FALSE(c.client().OnNeighbourKeys(keys).has_value());
  ASSERT_TRUE(c.client().Start(TaskOf(c.id), setup, 100, secagg::RandomSource::SeededForTests(1)).ok());
  // Another round's keys: ignored, the round stays open.
  keys.set_round(kRound + 1);
  EXPECT_FALSE(c.client().OnNeighbourKeys(keys).has_value());
  EXPECT_TRUE(c.client().open());
  // This round's, but refused by the library (none of the neighbours' keys): the round is abandoned, with why.
  keys.set_round(kRound);
  EXPECT_FALSE(c.client().OnNeighbourKeys(keys).has_value());
  EXPECT_FALSE(c.client().open());
  const SecureUpdate::Waited waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway());
  EXPECT_EQ(waited.outcome, Outcome::kAbandoned);
  EXPECT_NE(std::string(waited.why.message()).find("neighbour keys were refused"), std::string::npos);
}

TEST(SecureUpdateTest, ASetupOfAnotherDimensionIsRefusedAndTheTaskToldWhy) {
  OneClient c;
  v1::SecAggSetup setup;
  ASSERT_TRUE(c.f.server->SetupFor(c.id, &setup).ok());
  auto keys = c.client().Start(TaskOf(c.id), setup, 99, secagg::RandomSource::SeededForTests(1));
  ASSERT_FALSE(keys.ok());
  EXPECT_NE(std::string(keys.status().message()).find("dimension 100 but this client's model has 99"),
            std::string::npos);
  const SecureUpdate::Waited waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway());
  EXPECT_EQ(waited.outcome, Outcome::kAbandoned);
  EXPECT_EQ(waited.why.message(), keys.status().message());
  // A task whose round never opened (its Task.secagg was replaced by a later task's) is told so too.
  EXPECT_EQ(c.client().AwaitMaskingStart("task-other", 1, c.interrupted, FarAway()).outcome, Outcome::kAbandoned);
}

TEST(SecureUpdateTest, AForgedMaskingStartAbandonsTheRound) {
  OneClient c;
  c.f.AdvertiseAndShare();
  v1::SecAggMaskingStart start;
  ASSERT_TRUE(c.f.server->MaskingStartFor(c.id, &start).ok());
  ASSERT_GT(start.shares_size(), 0);
  start.mutable_shares(0)->mutable_ciphertext()->at(0) ^= 1;  // fails authentication
  c.client().OnMaskingStart(start);                           // held: the weight is not known yet
  const SecureUpdate::Waited waited = c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway());
  EXPECT_EQ(waited.outcome, Outcome::kAbandoned);
  EXPECT_NE(std::string(waited.why.message()).find("masking start was refused"), std::string::npos);
}

TEST(SecureUpdateTest, ANonFiniteDeltaIsRefusedNamingTheCoordinate) {
  OneClient c;
  c.f.AdvertiseAndShare();
  c.f.SendMaskingStart(c.id);
  ASSERT_EQ(c.client().AwaitMaskingStart(TaskOf(c.id), 1, c.interrupted, FarAway()).outcome, Outcome::kReady);
  c.f.deltas[c.id][42] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> payload = PayloadWith(c.f.deltas[c.id]);
  privacy::NoiseRng rng = privacy::NoiseRng::FromSeed(1);
  const auto masked = c.client().MaskInPlace(TaskOf(c.id), payload, {}, rng);
  ASSERT_FALSE(masked.ok());
  EXPECT_NE(std::string(masked.status().message()).find("coordinate 42"), std::string::npos);
  EXPECT_FALSE(c.client().open());
}

}  // namespace
}  // namespace fl::client
