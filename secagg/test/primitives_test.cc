// The pieces under the protocol: the GF(2^8) field and Shamir sharing, the libsodium wrappers (key agreement,
// share encryption, the counter-addressable mask stream), the quantiser and the neighbour graph.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/secagg/crypto.h"
#include "fl/secagg/events.h"
#include "fl/secagg/graph.h"
#include "fl/secagg/quantize.h"
#include "fl/secagg/shamir.h"

namespace fl::secagg {
namespace {

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

TEST(GfTest, KnownProductsAndFieldLaws) {
  EXPECT_EQ(GfMul(0x57, 0x83), 0xc1);  // FIPS-197, section 4.2
  EXPECT_EQ(GfMul(0x57, 0x13), 0xfe);
  for (int a = 0; a < 256; ++a) {
    EXPECT_EQ(GfMul(static_cast<uint8_t>(a), 1), a);
    EXPECT_EQ(GfMul(static_cast<uint8_t>(a), 0), 0);
    if (a != 0) {
      EXPECT_EQ(GfMul(static_cast<uint8_t>(a), GfInv(static_cast<uint8_t>(a))), 1) << a;
    }
    for (int b = 0; b < 256; b += 7) {
      const auto x = static_cast<uint8_t>(a), y = static_cast<uint8_t>(b), z = static_cast<uint8_t>(a * 31 + b);
      EXPECT_EQ(GfMul(x, y), GfMul(y, x));
      EXPECT_EQ(GfMul(GfMul(x, y), z), GfMul(x, GfMul(y, z)));
      EXPECT_EQ(GfMul(x, static_cast<uint8_t>(y ^ z)), GfMul(x, y) ^ GfMul(x, z));
    }
  }
  // The multiplicative group is cyclic of order 255 with generator 3: its powers hit every non-zero element.
  std::set<int> powers;
  uint8_t p = 1;
  for (int i = 0; i < 255; ++i, p = GfMul(p, 3)) powers.insert(p);
  EXPECT_EQ(powers.size(), 255u);
  EXPECT_EQ(p, 1);
}

TEST(ShamirTest, AnyThresholdSubsetReconstructsAndFewerDoNot) {
  RandomSource random = RandomSource::SeededForTests(7);
  std::vector<uint8_t> secret(32);
  random.Fill(secret);
  const std::vector<uint8_t> xs = {1, 2, 3, 5, 8, 13, 200};
  auto shares = ShamirSplit(secret, 4, xs, random.AsFill());
  ASSERT_TRUE(shares.ok()) << shares.status();
  // Every 4-subset of 7 (35 of them) gives the secret back.
  for (int mask = 0; mask < 128; ++mask) {
    if (__builtin_popcount(mask) != 4) continue;
    std::vector<Share> subset;
    for (int i = 0; i < 7; ++i) {
      if (mask & (1 << i)) subset.push_back((*shares)[i]);
    }
    auto back = ShamirCombine(subset, 4);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Str(*back), Str(secret));
  }
  // Three shares with a guessed fourth: interpolating through them gives a different value (the secret is
  // not determined by t - 1 shares; every byte value stays possible).
  std::vector<Share> three(shares->begin(), shares->begin() + 3);
  EXPECT_FALSE(ShamirCombine(three, 4).ok());
  std::set<uint8_t> candidates;
  for (int guess = 0; guess < 256; ++guess) {
    std::vector<Share> with_guess = three;
    with_guess.push_back({250, std::vector<uint8_t>(32, static_cast<uint8_t>(guess))});
    candidates.insert((*ShamirCombine(with_guess, 4))[0]);
  }
  EXPECT_EQ(candidates.size(), 256u);
}

TEST(ShamirTest, AlteredShareIsCaughtWhenMoreThanThresholdArrive) {
  RandomSource random = RandomSource::SeededForTests(8);
  const std::vector<uint8_t> secret(32, 0x42);
  const std::vector<uint8_t> xs = {1, 2, 3, 4, 5};
  auto shares = ShamirSplit(secret, 3, xs, random.AsFill());
  ASSERT_TRUE(shares.ok());
  (*shares)[4].y[10] ^= 1;
  auto back = ShamirCombine(*shares, 3);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(back.status().message().find("coordinate 5"), absl::string_view::npos) << back.status();
}

TEST(ShamirTest, RefusesBadThresholdsAndCoordinates) {
  RandomSource random = RandomSource::SeededForTests(9);
  const std::vector<uint8_t> secret(4, 1);
  EXPECT_FALSE(ShamirSplit(secret, 0, std::vector<uint8_t>{1, 2}, random.AsFill()).ok());
  EXPECT_FALSE(ShamirSplit(secret, 3, std::vector<uint8_t>{1, 2}, random.AsFill()).ok());
  EXPECT_FALSE(ShamirSplit(secret, 2, std::vector<uint8_t>{0, 2}, random.AsFill()).ok());
  EXPECT_FALSE(ShamirSplit(secret, 2, std::vector<uint8_t>{2, 2}, random.AsFill()).ok());
  std::vector<uint8_t> all(255);
  std::iota(all.begin(), all.end(), 1);
  auto shares = ShamirSplit(secret, 128, all, random.AsFill());
  ASSERT_TRUE(shares.ok());
  EXPECT_EQ(Str(*ShamirCombine(std::vector<Share>(shares->end() - 128, shares->end()), 128)), Str(secret));
}

TEST(CryptoTest, MaskStreamIsCounterAddressable) {
  RandomSource random = RandomSource::SeededForTests(1);
  Key key{};
  random.Fill(key);
  std::vector<uint32_t> whole(10007, 0);
  ApplyMask(key, +1, 0, whole);
  EXPECT_GT(std::count_if(whole.begin(), whole.end(), [](uint32_t w) { return w != 0; }), 10000);
  // Chunks at odd offsets and of odd sizes give the same words as the whole stream.
  std::vector<uint32_t> pieces(whole.size(), 0);
  for (size_t off = 0, n = 1; off < pieces.size(); off += n, n = n * 3 + 1) {
    n = std::min(n, pieces.size() - off);
    ApplyMask(key, +1, off, std::span<uint32_t>(pieces).subspan(off, n));
  }
  EXPECT_EQ(pieces, whole);
  ApplyMask(key, -1, 0, pieces);
  EXPECT_TRUE(std::all_of(pieces.begin(), pieces.end(), [](uint32_t w) { return w == 0; }));
  // A different round gives a different stream.
  std::vector<uint32_t> r1(16, 0), r2(16, 0);
  ApplyMask(RoundMaskKey(key, 1), +1, 0, r1);
  ApplyMask(RoundMaskKey(key, 2), +1, 0, r2);
  EXPECT_NE(r1, r2);
}

TEST(CryptoTest, KeyAgreementIsSymmetricAndPurposeSeparated) {
  RandomSource random = RandomSource::SeededForTests(2);
  const KeyPair a = NewKeyPair(random), b = NewKeyPair(random);
  EXPECT_EQ(PublicKeyOf(a.secret_key), a.public_key);
  auto ab = AgreeKey(KeyPurpose::kMask, a.secret_key, a.public_key, b.public_key);
  auto ba = AgreeKey(KeyPurpose::kMask, b.secret_key, b.public_key, a.public_key);
  ASSERT_TRUE(ab.ok() && ba.ok());
  EXPECT_EQ(*ab, *ba);
  EXPECT_NE(*AgreeKey(KeyPurpose::kShareEncryption, a.secret_key, a.public_key, b.public_key), *ab);
  const Key low_order{};  // the point 0
  auto bad = AgreeKey(KeyPurpose::kMask, a.secret_key, a.public_key, low_order);
  EXPECT_EQ(SecurityEventOf(bad.status()), SecurityEventKind::kBadKey);
}

TEST(CryptoTest, SharesAreBoundToRoundSenderAndReceiver) {
  RandomSource random = RandomSource::SeededForTests(3);
  Key key{};
  random.Fill(key);
  const std::vector<uint8_t> text(65, 9);
  auto [nonce, ciphertext] = Seal(key, ShareAssociatedData(5, 1, 2), text, random);
  auto opened = Open(key, ShareAssociatedData(5, 1, 2), nonce, ciphertext);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(*opened, Str(text));
  for (const std::string& ad :
       {ShareAssociatedData(6, 1, 2), ShareAssociatedData(5, 2, 1), ShareAssociatedData(5, 1, 3)}) {
    EXPECT_EQ(SecurityEventOf(Open(key, ad, nonce, ciphertext).status()), SecurityEventKind::kAuthenticationFailed);
  }
  std::string altered = ciphertext;
  altered[3] ^= 0x10;
  EXPECT_EQ(SecurityEventOf(Open(key, ShareAssociatedData(5, 1, 2), nonce, altered).status()),
            SecurityEventKind::kAuthenticationFailed);
  EXPECT_EQ(SecurityEventOf(Open(key, ShareAssociatedData(5, 1, 2), nonce.substr(1), ciphertext).status()),
            SecurityEventKind::kWrongLength);
}

TEST(CryptoTest, SeededRandomnessRepeatsAndSystemRandomnessDiffers) {
  RandomSource a = RandomSource::SeededForTests(11), b = RandomSource::SeededForTests(11);
  EXPECT_EQ(NewKeyPair(a).public_key, NewKeyPair(b).public_key);
  RandomSource s1 = RandomSource::System(), s2 = RandomSource::System();
  EXPECT_NE(NewKeyPair(s1).public_key, NewKeyPair(s2).public_key);
}

TEST(QuantizeTest, RoundsClipsAndStatesTheLargestPopulation) {
  const QuantizationSpec spec{1.0, 65536.0, 1};
  EXPECT_TRUE(ValidateQuantization(spec).ok());
  EXPECT_EQ(Quantize(spec, 0.5f), 32768);
  EXPECT_EQ(Quantize(spec, -0.25f), -16384);
  EXPECT_EQ(Quantize(spec, 3.0f), 65536);  // clipped to the range
  EXPECT_EQ(Quantize(spec, -3.0f), -65536);
  EXPECT_EQ(MaxPopulation(spec), 32767u);  // floor((2^31 - 1) / 2^16)
  EXPECT_TRUE(CheckPopulation(spec, 32767).ok());
  const absl::Status beyond = CheckPopulation(spec, 32768);
  EXPECT_EQ(SecurityEventOf(beyond), SecurityEventKind::kPopulationBeyondRange);
  EXPECT_NE(beyond.message().find("32768 clients"), absl::string_view::npos) << beyond;
  EXPECT_NE(beyond.message().find("at most 32767"), absl::string_view::npos) << beyond;
  EXPECT_EQ(MaxPopulation({1.0, 1024.0, 1000}), 2097u);  // weighted by up to 1000 examples
  EXPECT_DOUBLE_EQ(AggregateErrorBound(spec), 0.5 / 65536);
  EXPECT_FALSE(ValidateQuantization({0.0, 65536.0, 1}).ok());
  EXPECT_FALSE(ValidateQuantization({1.0, NAN, 1}).ok());
  EXPECT_FALSE(ValidateQuantization({1.0, 1.5, 1}).ok());  // range * scale not an integer
  EXPECT_FALSE(ValidateQuantization({1.0, 65536.0, 0}).ok());
  EXPECT_FALSE(ValidateQuantization({1.0, 65536.0, 40000}).ok());  // one client already overflows
}

TEST(GraphTest, SizesFollowTheLogRuleAndTheFullGraphBelowItsSize) {
  const GraphOptions options;
  EXPECT_EQ(NeighbourhoodSize(10, options), 10u);  // full graph
  EXPECT_EQ(NeighbourhoodSize(32, options), 32u);
  EXPECT_EQ(NeighbourhoodSize(50, options), 17u);   // ceil(3 log2 50) = 17
  EXPECT_EQ(NeighbourhoodSize(100, options), 21u);  // ceil(3 log2 100) = 20 -> odd 21
  EXPECT_EQ(NeighbourhoodSize(1000000, options), 61u);
}

TEST(GraphTest, NeighbourhoodsAreRegularSymmetricAndSeeded) {
  std::vector<uint64_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + 7 * i;
  auto g = BuildNeighbourGraph(ids, GraphOptions{}, 42);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->neighbourhood_size, 21u);
  EXPECT_EQ(g->threshold, 11u);
  for (uint64_t u : ids) {
    auto hood = g->NeighbourhoodOf(u);
    ASSERT_EQ(hood.size(), 21u);
    EXPECT_TRUE(std::binary_search(hood.begin(), hood.end(), u));
    for (uint64_t v : hood) {
      auto back = g->NeighbourhoodOf(v);
      EXPECT_TRUE(std::binary_search(back.begin(), back.end(), u)) << u << " " << v;
    }
  }
  auto again = BuildNeighbourGraph(ids, GraphOptions{}, 42);
  auto other = BuildNeighbourGraph(ids, GraphOptions{}, 43);
  EXPECT_EQ(again->neighbourhoods, g->neighbourhoods);
  EXPECT_NE(other->neighbourhoods, g->neighbourhoods);
  EXPECT_TRUE(g->NeighbourhoodOf(5).empty());
}

TEST(GraphTest, RefusesAThresholdOutsideTheNeighbourhood) {
  std::vector<uint64_t> ids(50);
  std::iota(ids.begin(), ids.end(), 1);
  for (uint32_t t : {18u, 8u}) {  // k = 17: t must be in [9, 17]
    GraphOptions options;
    options.threshold = t;
    auto g = BuildNeighbourGraph(ids, options, 1);
    EXPECT_EQ(SecurityEventOf(g.status()), SecurityEventKind::kThresholdAboveNeighbours) << t;
    EXPECT_NE(g.status().message().find(fl::StrCat("threshold ", t)), absl::string_view::npos) << g.status();
    EXPECT_NE(g.status().message().find("[9, 17]"), absl::string_view::npos) << g.status();
  }
  GraphOptions ok;
  ok.threshold = 17;
  EXPECT_TRUE(BuildNeighbourGraph(ids, ok, 1).ok());
  EXPECT_FALSE(BuildNeighbourGraph(std::vector<uint64_t>{1}, GraphOptions{}, 1).ok());
  EXPECT_EQ(SecurityEventOf(BuildNeighbourGraph(std::vector<uint64_t>{1, 2, 2}, GraphOptions{}, 1).status()),
            SecurityEventKind::kDuplicate);
}

}  // namespace
}  // namespace fl::secagg
