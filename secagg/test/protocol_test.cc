// Whole SecAgg+ rounds: the unmasked sum is the plain quantised sum exactly, the dequantised aggregate is within
// the stated bound of the weighted mean, the server holds only masked vectors, and dropouts are recovered up to
// the threshold and fail cleanly beyond it.
#include <gtest/gtest.h>

#include <algorithm>

#include "round_harness.h"

namespace fl::secagg {
namespace {

using testing::RoundHarness;

std::vector<uint32_t> Words(std::span<const uint32_t> s) { return std::vector<uint32_t>(s.begin(), s.end()); }

void ExpectWithinBound(const RoundHarness& h, const AggregateResult& r) {
  const std::vector<double> mean = h.PlainMean(r.survivors);
  const double bound = AggregateErrorBound(h.config.quantization);
  double worst = 0;
  for (size_t i = 0; i < mean.size(); ++i) {
    // The stated bound, plus the float32 rounding of the result (half an ulp of |mean| <= range).
    const double err = std::fabs(static_cast<double>(r.mean[i]) - mean[i]);
    worst = std::max(worst, err);
    ASSERT_LE(err, bound + std::fabs(mean[i]) * 0x1p-24) << "coordinate " << i;
  }
  EXPECT_GT(worst, 0);  // the comparison is not vacuous
}

TEST(SecAggRoundTest, FullGraphSumIsExactAndTheMeanWithinTheBound) {
  RoundHarness h = RoundHarness::Make(6, 1000, {1.0, 65536.0, 5}, 1);
  ASSERT_EQ(h.server->graph().neighbourhood_size, 6u);  // below full_graph_max: every pair
  ASSERT_EQ(h.server->graph().threshold, 4u);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload().ok());
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  ASSERT_EQ(h.server->stage(), Stage::kDone);
  const auto result = h.server->Result();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->survivors, h.config.participants);
  EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(result->survivors));
  EXPECT_EQ(result->total_weight, 1u + 2 + 3 + 4 + 5 + 1);
  ExpectWithinBound(h, *result);
}

TEST(SecAggRoundTest, SparseGraphOfSixtyClientsWithAWholeChunkUpload) {
  RoundHarness h = RoundHarness::Make(60, 300, {2.0, 4096.0, 1}, 2);
  ASSERT_EQ(h.server->graph().neighbourhood_size, 19u);  // ceil(3 log2 60) = 18 -> odd 19
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({}, 300).ok());
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  const auto result = h.server->Result();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(result->survivors));
  EXPECT_EQ(result->total_weight, 60u);
  ExpectWithinBound(h, *result);
}

// The clients with id % 10 in `digits` drop after sharing keys (they trained and never uploaded).
std::set<uint64_t> DropByDigit(const RoundHarness& h, std::set<uint64_t> digits) {
  std::set<uint64_t> out;
  for (size_t i = 0; i < h.config.participants.size(); ++i) {
    if (digits.contains(i % 10)) out.insert(h.config.participants[i]);
  }
  return out;
}

TEST(SecAggRoundTest, TenAndThirtyPercentDroppingAfterSharingKeysAreRecovered) {
  for (const std::set<uint64_t>& digits : {std::set<uint64_t>{4}, std::set<uint64_t>{1, 5, 8}}) {
    RoundHarness h = RoundHarness::Make(60, 200, {1.0, 65536.0, 3}, 3);
    h.Advertise();
    h.Share();
    const std::set<uint64_t> dropping = DropByDigit(h, digits);
    ASSERT_TRUE(h.Upload(dropping).ok()) << h.server->failure();
    EXPECT_EQ(h.server->DroppedAt(Stage::kMaskedUpload).size(), dropping.size());
    ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
    const auto result = h.server->Result();
    ASSERT_TRUE(result.ok());
    EXPECT_EQ(result->survivors.size(), 60 - dropping.size());
    for (uint64_t d : dropping) EXPECT_FALSE(std::binary_search(result->survivors.begin(), result->survivors.end(), d));
    EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(result->survivors)) << dropping.size() << " dropped";
    ExpectWithinBound(h, *result);
  }
}

TEST(SecAggRoundTest, DropoutsExactlyAtTheThresholdAreRecovered) {
  // Full graph of 7: t = 4; 3 drop after sharing keys, the 4 left are exactly t.
  RoundHarness h = RoundHarness::Make(7, 100, {1.0, 65536.0, 1}, 4);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({100, 103, 106}).ok()) << h.server->failure();
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  const auto result = h.server->Result();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->survivors.size(), 4u);
  EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(result->survivors));
}

TEST(SecAggRoundTest, OneBeyondTheThresholdFailsTheRoundCleanly) {
  RoundHarness h = RoundHarness::Make(7, 100, {1.0, 65536.0, 1}, 5);
  h.Advertise();
  h.Share();
  const absl::Status closed = h.Upload({100, 103, 106, 109});
  EXPECT_EQ(SecurityEventOf(closed), SecurityEventKind::kTooFewSurvivors) << closed;
  EXPECT_EQ(h.server->stage(), Stage::kFailed);
  EXPECT_NE(h.server->failure().find("threshold is 4"), std::string::npos) << h.server->failure();
  EXPECT_NE(h.server->failure().find("model kept"), std::string::npos) << h.server->failure();
  EXPECT_FALSE(h.server->Result().ok());
  EXPECT_TRUE(std::all_of(h.server->running_sum().begin(), h.server->running_sum().end(),
                          [](uint32_t w) { return w == 0; }));  // nothing of the updates kept
  ASSERT_FALSE(h.server->events().empty());
  EXPECT_EQ(h.server->events().back().kind, SecurityEventKind::kTooFewSurvivors);
}

TEST(SecAggRoundTest, TooFewUnmaskResponsesFailTheRound) {
  // 5 of 7 upload (t = 4); two of them never answer the unmask request: 3 shares of each seed < t.
  RoundHarness h = RoundHarness::Make(7, 50, {1.0, 65536.0, 1}, 6);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({100, 103}).ok());
  const absl::Status closed = h.Unmask({106, 109});
  EXPECT_EQ(SecurityEventOf(closed), SecurityEventKind::kTooFewSurvivors) << closed;
  EXPECT_EQ(h.server->stage(), Stage::kFailed);
  EXPECT_NE(h.server->failure().find("3 shares of client"), std::string::npos) << h.server->failure();
  EXPECT_FALSE(h.server->Result().ok());
}

TEST(SecAggRoundTest, ClientsDroppingBeforeSharingAreLeftOutOfTheMasks) {
  RoundHarness h = RoundHarness::Make(8, 64, {1.0, 65536.0, 1}, 7);
  h.Advertise({100});
  h.Share({103});
  EXPECT_EQ(h.server->DroppedAt(Stage::kAdvertiseKeys), std::vector<uint64_t>{100});
  EXPECT_EQ(h.server->DroppedAt(Stage::kShareKeys), std::vector<uint64_t>{103});
  ASSERT_TRUE(h.Upload().ok());
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  const auto result = h.server->Result();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->survivors.size(), 6u);
  EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(result->survivors));
}

TEST(SecAggRoundTest, TheServerHoldsOnlyMaskedVectors) {
  RoundHarness h = RoundHarness::Make(5, 2000, {1.0, 65536.0, 1}, 8);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({109}).ok());  // one drops after sharing: both kinds of secrets get reconstructed
  // Every masked vector the server received differs from its client's quantised update at (almost) every
  // coordinate: a uniform mask equals 0 with probability 2^-32 per word.
  for (const auto& [id, words] : h.masked) {
    size_t equal = 0;
    for (size_t i = 0; i < h.config.dimension; ++i) {
      equal += words[i] == static_cast<uint32_t>(Quantize(h.config.quantization, h.inputs[id][i])) ? 1 : 0;
    }
    EXPECT_LE(equal, 1u) << "client " << id;
  }
  // The running sum before unmasking is not the sum of the updates either (the self masks are still on it),
  // nor any single update.
  const std::vector<uint64_t> survivors = {100, 103, 106, 112};
  const std::vector<uint32_t> plain = h.PlainSum(survivors);
  size_t equal = 0;
  for (size_t i = 0; i < h.config.dimension; ++i) equal += h.server->running_sum()[i] == plain[i] ? 1 : 0;
  EXPECT_LE(equal, 1u);
  // The difference of two masked vectors is not the difference of their updates: pairwise masks do not cancel
  // between two clients alone (each also carries its own self mask and masks with the others).
  const std::vector<uint32_t>& a = h.masked[100];
  const std::vector<uint32_t>& b = h.masked[103];
  equal = 0;
  for (size_t i = 0; i < h.config.dimension; ++i) {
    const uint32_t qa = static_cast<uint32_t>(Quantize(h.config.quantization, h.inputs[100][i]));
    const uint32_t qb = static_cast<uint32_t>(Quantize(h.config.quantization, h.inputs[103][i]));
    equal += (a[i] - b[i]) == (qa - qb) ? 1 : 0;
  }
  EXPECT_LE(equal, 1u);
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  // Of every client the server reconstructed one secret, never both: the seed of a survivor (its pair masks
  // stay on its vector) or the mask key of the dropped one (whose vector the server never got).
  std::map<uint64_t, int> secrets;
  for (const auto& [id, secret] : h.server->reconstructed()) secrets[id] |= 1 << secret;
  for (const auto& [id, bits] : secrets) EXPECT_TRUE(bits == 2 || bits == 4) << id << " " << bits;
  EXPECT_EQ(secrets[109], 1 << v1::SECAGG_SECRET_MASK_KEY);
  EXPECT_EQ(Words(h.server->running_sum()), h.PlainSum(survivors));
}

TEST(SecAggRoundTest, CallerQuantisedWordsWithIntegerNoiseSumExactly) {
  // Distributed DP's path: the client quantises and adds its integer noise share itself, then masks the words;
  // the unmasked sum is the sum of what the clients put in, exactly.
  RoundHarness h = RoundHarness::Make(5, 300, {1.0, 4096.0, 1}, 10);
  h.Advertise();
  h.Share();
  std::vector<uint32_t> expected(h.config.dimension + 1, 0);
  for (uint64_t id : h.server->Alive()) {
    v1::SecAggMaskingStart start;
    ASSERT_TRUE(h.server->MaskingStartFor(id, &start).ok());
    ASSERT_TRUE(h.clients[id]->OnMaskingStart(start, 1).ok());
    std::vector<uint32_t> words(h.config.dimension);
    for (size_t i = 0; i < words.size(); ++i) {
      const int32_t noise = static_cast<int32_t>((id * 31 + i * 17) % 41) - 20;
      words[i] = static_cast<uint32_t>(Quantize(h.config.quantization, h.inputs[id][i]) + noise);
      expected[i] += words[i];
    }
    expected[h.config.dimension] += 1;
    ASSERT_TRUE(h.clients[id]->MaskQuantizedChunk(0, words).ok());
    ASSERT_TRUE(h.server->OnMaskedWords(7, id, 0, words).ok());
    v1::SecAggMaskedChunk weight;
    ASSERT_TRUE(h.clients[id]->MaskWeight(&weight).ok());
    ASSERT_TRUE(h.server->OnMaskedChunk(weight).ok());
  }
  ASSERT_TRUE(h.server->CloseMaskedUpload().ok());
  ASSERT_TRUE(h.Unmask().ok()) << h.server->failure();
  EXPECT_EQ(Words(h.server->running_sum()), expected);
}

TEST(SecAggRoundTest, BytesPerClientAndStageAreRecorded) {
  RoundHarness h = RoundHarness::Make(5, 1000, {1.0, 65536.0, 1}, 9);
  h.Advertise();
  h.Share();
  ASSERT_TRUE(h.Upload({}, 1000).ok());
  ASSERT_TRUE(h.Unmask().ok());
  const auto bytes = h.server->BytesOf(100);
  for (const StageBytes& b : bytes) {
    EXPECT_GT(b.down, 0u);
    EXPECT_GT(b.up, 0u);
  }
  // The upload: 4 bytes a coordinate and the weight word, plus the messages' framing.
  EXPECT_GE(bytes[2].up, 4u * 1001);
  EXPECT_LE(bytes[2].up, 4u * 1001 + 64);
  // Four shares of 81 bytes with their nonces.
  EXPECT_GE(bytes[1].up, 4u * (81 + 24));
}

}  // namespace
}  // namespace fl::secagg
