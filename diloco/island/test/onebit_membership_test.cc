// The fold at a 1-bit Adam membership window's end (onebit_membership.h) with the real ring between islands run
// as threads: after sign1 exchanges with error feedback on both sides, every island's momentum gains the ring's
// mean of the islands' residuals, equal bit for bit to the same sum computed in one process in the ring's order;
// the residuals are gone, the state (residuals included) hashes alike everywhere, the ring is back on sign1, and
// the state image carries the residual a joining island checks.
#include "fl/diloco/island/onebit_membership.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/testing/subprocess.h"

namespace fl::diloco {
namespace {

std::vector<RingMember> Members(size_t m) {
  std::set<int> ports;
  while (ports.size() < m) ports.insert(fl::testing::FreeLoopbackPort());
  std::vector<RingMember> members;
  for (int port : ports) {
    members.push_back({fl::StrCat("island-", members.size()), fl::StrCat("tcp://127.0.0.1:", port)});
  }
  return members;
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::string Bytes(std::span<const float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size_bytes());
}

struct Island {
  std::unique_ptr<RingAllReduce> ring;
  std::optional<OneBitAdam> adam;
  std::vector<float> w;
};

class FoldTest : public ::testing::TestWithParam<size_t> {};

TEST_P(FoldTest, TheMomentumGainsTheRingsMeanResidualBitForBitAndTheResidualsAreGone) {
  const size_t m = GetParam();
  const size_t n = 1000;  // chunks of 333-500 values, several sign1 scales of 64 each
  OneBitAdamOptions options;
  options.warmup_steps = 0;  // compression from the first step: every exchange leaves residuals
  options.total_steps = 10;
  options.chunk = 64;
  const std::vector<RingMember> members = Members(m);
  std::vector<Island> islands(m);
  for (size_t i = 0; i < m; ++i) {
    RingOptions ro;
    ro.members = members;
    ro.self = i;
    ro.codec = options.CompressedCodec();
    ro.error_feedback = true;
    ro.timeout = absl::Seconds(60);
    auto ring = RingAllReduce::Create(ro);
    ASSERT_TRUE(ring.ok()) << ring.status();
    islands[i].ring = std::move(*ring);
    auto adam = OneBitAdam::Create(n, options);
    ASSERT_TRUE(adam.ok()) << adam.status();
    islands[i].adam.emplace(std::move(*adam));
    islands[i].w = Random(n, 7);  // the same model everywhere, as after a start or a copied state
  }
  auto on_every_island = [&](auto&& body) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) threads.emplace_back([&, i] { body(islands[i], i); });
    for (auto& t : threads) t.join();
  };
  // Three compressed steps: each island's own momentum through sign1 with error feedback on both sides.
  for (uint64_t step = 1; step <= 3; ++step) {
    on_every_island([&](Island& is, size_t i) {
      std::vector<float> send(n);
      ASSERT_TRUE(is.adam->LocalMomentum(Random(n, static_cast<uint32_t>(100 * step + i)), send).ok());
      std::vector<float> mean(n);
      ASSERT_TRUE(
          is.ring->AllReduce(step, kOneBitMomentumKey, std::span<const float>(send), mean, ReduceOp::kMean, nullptr)
              .ok());
      ASSERT_TRUE(is.adam->CompressedStep(mean, 0.01, is.w).ok());
    });
  }
  // Before the fold: the same m everywhere, residuals of each island's own.
  std::vector<std::vector<float>> residuals(m);
  for (size_t i = 0; i < m; ++i) {
    std::span<const float> r = islands[i].ring->Residual(kOneBitMomentumKey);
    ASSERT_EQ(r.size(), n);
    residuals[i].assign(r.begin(), r.end());
    EXPECT_EQ(Bytes(islands[i].adam->momentum()), Bytes(islands[0].adam->momentum()));
  }
  EXPECT_NE(Bytes(residuals[0]), Bytes(std::vector<float>(n, 0.0f)));
  EXPECT_NE(islands[0].adam->Hash(islands[0].w, residuals[0]), islands[1].adam->Hash(islands[1].w, residuals[1]));

  // The reference in one process: chunk c of the ring's fp32 mean is the left fold of the members' values in
  // ring order from member c, divided once by M (ring_allreduce.h), added to m.
  std::vector<float> expected(islands[0].adam->momentum().begin(), islands[0].adam->momentum().end());
  for (size_t c = 0; c < m; ++c) {
    const ValueRange range = RingChunk(n, m, c);
    for (size_t k = range.begin; k < range.end; ++k) {
      float sum = residuals[c][k];
      for (size_t hop = 1; hop < m; ++hop) sum += residuals[(c + hop) % m][k];
      expected[k] += sum / static_cast<float>(m);
    }
  }

  std::vector<ExchangeStats> stats(m);
  on_every_island(
      [&](Island& is, size_t i) { ASSERT_TRUE(FoldResidualsIntoMomentum(*is.ring, 10, *is.adam, &stats[i]).ok()); });
  for (size_t i = 0; i < m; ++i) {
    EXPECT_EQ(Bytes(islands[i].adam->momentum()), Bytes(expected)) << "island " << i;
    EXPECT_TRUE(islands[i].ring->Residual(kOneBitMomentumKey).empty());
    EXPECT_EQ(islands[i].ring->options().codec, options.CompressedCodec());
    // The fold travels in fp32: 2(M-1)/M of the vector's 4 bytes a value, plus the headers.
    absl::StatusOr<uint64_t> fp32_bytes = RingBytesSentPerMember(n, m, i, "fp32", size_t{1} << 20);
    ASSERT_TRUE(fp32_bytes.ok());
    EXPECT_EQ(stats[i].bytes_sent, *fp32_bytes);
    // The whole state, residuals (now none: zeros) included, is the same on every island.
    EXPECT_EQ(islands[i].adam->Hash(islands[i].w, islands[i].ring->Residual(kOneBitMomentumKey)),
              islands[0].adam->Hash(islands[0].w));
  }

  // The ring goes on in sign1 after the fold, and every island still agrees.
  on_every_island([&](Island& is, size_t i) {
    std::vector<float> send(n);
    ASSERT_TRUE(is.adam->LocalMomentum(Random(n, static_cast<uint32_t>(900 + i)), send).ok());
    std::vector<float> mean(n);
    ASSERT_TRUE(
        is.ring->AllReduce(11, kOneBitMomentumKey, std::span<const float>(send), mean, ReduceOp::kMean, nullptr).ok());
    ASSERT_TRUE(is.adam->CompressedStep(mean, 0.01, is.w).ok());
  });
  for (size_t i = 1; i < m; ++i) EXPECT_EQ(islands[i].adam->Hash(islands[i].w), islands[0].adam->Hash(islands[0].w));
}

INSTANTIATE_TEST_SUITE_P(Members, FoldTest, ::testing::Values(2, 3));

TEST(OneBitStateImageTest, CarriesTheResidualAndAJoinerReadsItBack) {
  OneBitAdamOptions options;
  options.warmup_steps = 0;
  options.total_steps = 10;
  options.chunk = 8;
  auto a = OneBitAdam::Create(4, options);
  auto b = OneBitAdam::Create(4, options);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> w = {1, 2, 3, 4}, residual = {0, 0.5f, 0, 0};
  const std::vector<uint8_t> folded = a->Serialize(w);
  const std::vector<uint8_t> unfolded = a->Serialize(w, residual);
  EXPECT_NE(a->Hash(w), a->Hash(w, residual));
  EXPECT_EQ(a->Hash(w), a->Hash(w, std::vector<float>(4, 0.0f)));  // no residual is a zero residual
  std::vector<float> wb(4, 0.0f), got;
  ASSERT_TRUE(b->Restore(unfolded, wb, &got).ok());
  EXPECT_EQ(got, residual);
  EXPECT_EQ(b->Hash(wb, got), a->Hash(w, residual));
  ASSERT_TRUE(b->Restore(folded, wb, &got).ok());
  EXPECT_EQ(got, std::vector<float>(4, 0.0f));
  // During the warm-up there are no momentum residuals: a fold is refused and changes nothing.
  options.warmup_steps = 5;
  auto warm = OneBitAdam::Create(4, options);
  ASSERT_TRUE(warm.ok());
  absl::Status s = warm->FoldIntoMomentum(std::vector<float>(4, 1.0f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(warm->momentum()[0], 0.0f);
}

}  // namespace
}  // namespace fl::diloco
