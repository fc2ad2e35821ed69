// Tests of the codec kernels below the public API: the fast (grouped, vectorized) blockwise path against the
// value-by-value reference, the exact wire layout, and the fp16/bf16 conversions over every code.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../src/codec_kernels_internal.h"
#include "fl/core/codec.h"

namespace fl::core::codec_internal {
namespace {

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng) * (i / 100 % 3 == 0 ? 1e-3f : 10.0f);
  for (size_t i = 0; i < n; i += 13) x[i] = 0.0f;
  for (size_t i = 7; i < n; i += 29) x[i] = -0.0f;
  return x;
}

TEST(CodecKernelsTest, FastPathMatchesReferenceBytesAndValues) {
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kInt4, BlockFormat::kFp4, BlockFormat::kSign1}) {
    // Multiples of 32 take the fast path (groups + the general path for the remainder).
    for (size_t block : {32, 64, 96, 256, 480, 2048, 4096, 8192}) {
      for (size_t n : {0, 1, 31, 64, 255, 2047, 2048, 4096, 6143, 10000, 65536 + 33}) {
        SCOPED_TRACE(testing::Message() << "format " << static_cast<int>(format) << " block " << block << " n " << n);
        const std::vector<float> x = Values(n, static_cast<uint32_t>(n + block));
        const size_t bytes = BlockBodyBytes(format, n, block);
        std::vector<uint8_t> fast(bytes, 0xAA), reference(bytes, 0x55);
        ASSERT_EQ(EncodeBlocks(format, x.data(), n, block, fast.data()), kNotFound);
        ASSERT_EQ(EncodeBlocksGeneralForTesting(format, x.data(), n, block, reference.data()), kNotFound);
        ASSERT_EQ(fast, reference);
        ASSERT_TRUE(PaddingIsZero(format, fast.data(), n, block));
        ASSERT_EQ(FindBadScale(format, fast.data(), n, block), kNotFound);
        std::vector<float> a(n, 1.0f), b(n, 2.0f);
        DecodeBlocks(format, fast.data(), n, block, nullptr, a.data());
        DecodeBlocksGeneralForTesting(format, fast.data(), n, block, b.data());
        if (n > 0) {
          ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(CodecKernelsTest, FastPathHandsUnusualBlocksToTheReference) {
  // A group with one block of subnormal scale and one near FLT_MAX: the fast path must defer to the general
  // one for that group and still agree byte for byte.
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kInt4, BlockFormat::kFp4}) {
    std::vector<float> x = Values(8192, 3);
    for (size_t i = 64; i < 96; ++i) x[i] = static_cast<float>(i) * 1e-44f;
    for (size_t i = 4096; i < 4128; ++i) x[i] = FLT_MAX / static_cast<float>(i - 4095);
    const size_t bytes = BlockBodyBytes(format, x.size(), 32);
    std::vector<uint8_t> fast(bytes), reference(bytes);
    ASSERT_EQ(EncodeBlocks(format, x.data(), x.size(), 32, fast.data()), kNotFound);
    ASSERT_EQ(EncodeBlocksGeneralForTesting(format, x.data(), x.size(), 32, reference.data()), kNotFound);
    EXPECT_EQ(fast, reference);
    EXPECT_EQ(FindBadScale(format, fast.data(), x.size(), 32), kNotFound);
  }
}

TEST(CodecKernelsTest, NonFiniteFoundInEveryPath) {
  for (BlockFormat format : {BlockFormat::kInt8, BlockFormat::kInt4, BlockFormat::kFp4, BlockFormat::kSign1}) {
    for (size_t block : {32, 40, 256}) {
      for (size_t at : {0, 1, 2047, 2048, 5000, 9999}) {
        std::vector<float> x = Values(10000, 1);
        x[at] = std::nanf("");
        std::vector<uint8_t> body(BlockBodyBytes(format, x.size(), block));
        EXPECT_EQ(EncodeBlocks(format, x.data(), x.size(), block, body.data()), at);
        x[at] = -INFINITY;
        EXPECT_EQ(EncodeBlocks(format, x.data(), x.size(), block, body.data()), at);
      }
    }
  }
}

uint32_t Word(const std::vector<uint8_t>& body, size_t offset) {
  uint32_t w;
  std::memcpy(&w, body.data() + offset, 4);
  return w;
}

// The layout written in codec.h, rebuilt here from the spec with values that quantize exactly.
TEST(CodecKernelsTest, WireLayoutMatchesTheSpec) {
  // int8: levels in value order after the scales.
  {
    std::vector<float> x(300);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 255) - 127);
    x[261] = 127.0f;  // both blocks: absmax 127, scale 1
    std::vector<uint8_t> body(BlockBodyBytes(BlockFormat::kInt8, x.size(), 256));
    ASSERT_EQ(body.size(), 2 * 4 + 300u);
    ASSERT_EQ(EncodeBlocks(BlockFormat::kInt8, x.data(), x.size(), 256, body.data()), kNotFound);
    float scale;
    std::memcpy(&scale, body.data(), 4);
    EXPECT_EQ(scale, 1.0f);
    std::memcpy(&scale, body.data() + 4, 4);
    EXPECT_EQ(scale, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(static_cast<int8_t>(body[8 + i]), static_cast<int>(x[i])) << i;
    }
  }
  // int4 and fp4: tile of 64 = 8 words, nibble k of word j = value j + 8k = sign << 3 | magnitude code.
  for (BlockFormat format : {BlockFormat::kInt4, BlockFormat::kFp4}) {
    const bool fp4 = format == BlockFormat::kFp4;
    static constexpr float kFp4Grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    const size_t n = 100;  // a full tile and a padded one; block 64: scale 1 in both blocks
    std::vector<float> x(n);
    std::vector<uint32_t> code(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t m = static_cast<uint32_t>((i * 5) % 8);
      const uint32_t sign = (i % 3 == 0) ? 8u : 0u;
      x[i] = (sign ? -1.0f : 1.0f) * (fp4 ? kFp4Grid[m] : static_cast<float>(m));
      code[i] = m | sign;
    }
    x[0] = fp4 ? -6.0f : -7.0f;  // absmax sets scale 1
    code[0] = 7 | 8;
    x[64] = fp4 ? 6.0f : 7.0f;
    code[64] = 7;
    std::vector<uint8_t> body(BlockBodyBytes(format, n, 64));
    ASSERT_EQ(body.size(), 2 * 4 + 2 * 32u);
    ASSERT_EQ(EncodeBlocks(format, x.data(), n, 64, body.data()), kNotFound);
    for (size_t tile = 0; tile < 2; ++tile) {
      for (size_t j = 0; j < 8; ++j) {
        uint32_t expected = 0;
        for (size_t k = 0; k < 8; ++k) {
          const size_t i = 64 * tile + j + 8 * k;
          if (i < n) expected |= code[i] << (4 * k);
        }
        EXPECT_EQ(Word(body, 8 + 32 * tile + 4 * j), expected) << "tile " << tile << " word " << j;
      }
    }
  }
  // sign1: tile of 256 = 8 words, bit k of word j = sign of value j + 8k.
  {
    const size_t n = 300;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = (i * 7 % 5 < 2) ? -1.0f - static_cast<float>(i) : 2.0f;
    x[10] = -0.0f;
    std::vector<uint8_t> body(BlockBodyBytes(BlockFormat::kSign1, n, 256));
    ASSERT_EQ(body.size(), 2 * 4 + 2 * 32u);
    ASSERT_EQ(EncodeBlocks(BlockFormat::kSign1, x.data(), n, 256, body.data()), kNotFound);
    for (size_t tile = 0; tile < 2; ++tile) {
      for (size_t j = 0; j < 8; ++j) {
        uint32_t expected = 0;
        for (size_t k = 0; k < 32; ++k) {
          const size_t i = 256 * tile + j + 8 * k;
          if (i < n && std::signbit(x[i])) expected |= 1u << k;
        }
        EXPECT_EQ(Word(body, 8 + 32 * tile + 4 * j), expected) << "tile " << tile << " word " << j;
      }
    }
  }
}

// Reference rounding in double: the nearest representable value, ties to the even code.
TEST(CodecKernelsTest, HalfConversionsOverEveryCode) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t code = static_cast<uint16_t>(h);
    if ((code & 0x7c00u) == 0x7c00u) continue;  // Inf/NaN: never written
    const float f = HalfToFloat(code);
    // Decoding is exact: compare with the textbook formula.
    const int exponent = (code >> 10) & 0x1f;
    const int mantissa = code & 0x3ff;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24) : std::ldexp(1024 + mantissa, exponent - 25);
    ASSERT_EQ(static_cast<double>(f), (code & 0x8000u) ? -magnitude : magnitude) << std::hex << h;
    // Encoding the decoded value gives the code back (-0 included).
    ASSERT_EQ(FloatToHalf(f), code) << std::hex << h;
    // The midpoint to the next code up rounds to whichever of the two is even.
    const uint16_t next = static_cast<uint16_t>(code + 1);
    if ((next & 0x7c00u) == 0x7c00u || (code & 0x3ffu) == 0x3ffu) continue;  // crosses into a new binade
    const float mid = static_cast<float>((static_cast<double>(f) + static_cast<double>(HalfToFloat(next))) / 2);
    ASSERT_EQ(FloatToHalf(mid), (code & 1u) ? next : code) << std::hex << h;
  }
  // Overflow gives the Inf pattern (which the codec turns into an error).
  EXPECT_EQ(FloatToHalf(65520.0f) & 0x7fffu, 0x7c00u);
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bffu);
  EXPECT_EQ(FloatToHalf(1e30f) & 0x7fffu, 0x7c00u);
}

TEST(CodecKernelsTest, Bfloat16ConversionsOverEveryCode) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t code = static_cast<uint16_t>(h);
    if ((code & 0x7f80u) == 0x7f80u) continue;
    const float f = Bfloat16ToFloat(code);
    ASSERT_EQ(FloatToBfloat16(f), code) << std::hex << h;
    if ((code & 0x7fu) == 0x7fu) continue;
    const float mid = static_cast<float>(
        (static_cast<double>(f) + static_cast<double>(Bfloat16ToFloat(static_cast<uint16_t>(code + 1)))) / 2);
    ASSERT_EQ(FloatToBfloat16(mid), (code & 1u) ? code + 1 : code) << std::hex << h;
  }
  EXPECT_EQ(FloatToBfloat16(FLT_MAX) & 0x7fffu, 0x7f80u);
}

}  // namespace
}  // namespace fl::core::codec_internal
