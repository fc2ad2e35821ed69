// The generator every mechanism draws from: its stream is ChaCha20's keystream (a known answer, and libsodium's own
// keystream across refills), a seed fixes it, the system seed does not repeat, and its bits are balanced.
#include "fl/privacy/noise_rng.h"

#include <gtest/gtest.h>
#include <sodium.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace fl::privacy {
namespace {

// ChaCha20 with an all-zero key and nonce (the test vector of draft-agl-tls-chacha20poly1305, TC1): the stream's
// first 16 bytes, read little-endian as two words.
TEST(NoiseRngTest, StreamIsChaCha20) {
  NoiseRng rng = NoiseRng::FromKey({});
  EXPECT_EQ(rng.Next64(), 0x903df1a0ade0b876ull);
  EXPECT_EQ(rng.Next64(), 0x28bd8653e56a5d40ull);
}

// Across refills the block counter continues: the words are libsodium's keystream of the same key, read in one go.
TEST(NoiseRngTest, RefillsContinueTheKeystream) {
  std::array<unsigned char, 32> key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<unsigned char>(i * 7 + 1);
  const size_t words = 3 * 512 + 17;
  std::vector<unsigned char> stream(words * 8);
  const unsigned char nonce[crypto_stream_chacha20_NONCEBYTES] = {};
  ASSERT_EQ(crypto_stream_chacha20(stream.data(), stream.size(), nonce, key.data()), 0);
  NoiseRng rng = NoiseRng::FromKey(key);
  for (size_t i = 0; i < words; ++i) {
    uint64_t expected;
    std::memcpy(&expected, stream.data() + 8 * i, 8);
    ASSERT_EQ(rng.Next64(), expected) << "word " << i;
  }
}

TEST(NoiseRngTest, SeedFixesTheStreamAcrossRefills) {
  NoiseRng a = NoiseRng::FromSeed(77);
  NoiseRng b = NoiseRng::FromSeed(77);
  NoiseRng c = NoiseRng::FromSeed(78);
  int same_as_c = 0;
  for (int i = 0; i < 5000; ++i) {  // past several 512-word refills
    const uint64_t x = a.Next64();
    EXPECT_EQ(x, b.Next64());
    same_as_c += x == c.Next64();
  }
  EXPECT_EQ(same_as_c, 0);
}

TEST(NoiseRngTest, SystemSeedsDiffer) {
  NoiseRng a = NoiseRng::FromSystem();
  NoiseRng b = NoiseRng::FromSystem();
  EXPECT_NE(a.Next64(), b.Next64());
}

TEST(NoiseRngTest, BitsAreBalanced) {
  NoiseRng rng = NoiseRng::FromSeed(5);
  const int n = 1 << 16;
  int ones[64] = {};
  for (int i = 0; i < n; ++i) {
    const uint64_t x = rng.Next64();
    for (int bit = 0; bit < 64; ++bit) ones[bit] += (x >> bit) & 1;
  }
  // Five binomial standard errors (√(n/4)) per bit.
  for (int bit = 0; bit < 64; ++bit) EXPECT_LT(std::abs(ones[bit] - n / 2), 5 * std::sqrt(n / 4.0)) << bit;
}

TEST(NoiseRngTest, BitsAreTheWordsLeastSignificantFirst) {
  NoiseRng words = NoiseRng::FromSeed(6);
  NoiseRng bits = NoiseRng::FromSeed(6);
  for (int w = 0; w < 3; ++w) {
    const uint64_t word = words.Next64();
    uint64_t rebuilt = 0;
    for (int i = 0; i < 64; ++i) rebuilt |= static_cast<uint64_t>(bits.NextBit()) << i;
    EXPECT_EQ(rebuilt, word) << w;
  }
}

TEST(NoiseRngTest, UniformIntegersAndRealsStayInRange) {
  NoiseRng rng = NoiseRng::FromSeed(4);
  const unsigned __int128 big = (static_cast<unsigned __int128>(1) << 100) + 12345;
  for (int i = 0; i < 10000; ++i) {
    EXPECT_LT(rng.UniformBelow(7), 7u);
    EXPECT_LT(rng.UniformBelow(big), big);
    EXPECT_GT(rng.UniformOpenClosed(), 0.0);
    EXPECT_LT(rng.UniformClosedOpen(), 1.0);
  }
  EXPECT_EQ(rng.UniformBelow(1), 0u);
}

}  // namespace
}  // namespace fl::privacy
