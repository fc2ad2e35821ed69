// The generator every mechanism draws from: a seed fixes the stream, the system seed does not repeat, and the
// stream is ChaCha20's keystream (its 64-bit words are uniform: each bit is set half the time).
#include "fl/privacy/noise_rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

namespace fl::privacy {
namespace {

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
