#include "fl/core/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fl/core/checksum.h"
#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

constexpr CodecKind kAllKinds[] = {CodecKind::kFp32,      CodecKind::kFp16,    CodecKind::kBf16, CodecKind::kInt8Block,
                                   CodecKind::kInt4Block, CodecKind::kFp4E2M1, CodecKind::kSign1};
constexpr CodecKind kBlockKinds[] = {CodecKind::kInt8Block, CodecKind::kInt4Block, CodecKind::kFp4E2M1,
                                     CodecKind::kSign1};

std::string Msg(const absl::Status& s) { return std::string(fl::ToStd(s.message())); }

#define EXPECT_ERROR_HAS(status, text)                                          \
  do {                                                                          \
    const absl::Status _s = (status);                                           \
    EXPECT_FALSE(_s.ok()) << "expected an error mentioning '" << (text) << "'"; \
    EXPECT_NE(Msg(_s).find(text), std::string::npos) << "message: " << Msg(_s); \
  } while (0)

std::unique_ptr<Codec> Make(CodecKind kind, uint32_t block = 0) {
  auto codec = MakeCodec(kind, CodecOptions{block});
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(*codec);
}

bool IsBlockwise(CodecKind kind) {
  return std::find(std::begin(kBlockKinds), std::end(kBlockKinds), kind) != std::end(kBlockKinds);
}

// Gaussian values whose magnitude changes every 37 values (so blocks see very different scales), with
// exact zeros and an all-zero stretch mixed in.
std::vector<float> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 3.0f);
  std::vector<float> x(n);
  float magnitude = 1.0f;
  for (size_t i = 0; i < n; ++i) {
    if (i % 37 == 0) magnitude = std::pow(10.0f, exponent(rng));
    x[i] = normal(rng) * magnitude;
    if (i % 11 == 5) x[i] = 0.0f;
    if (i >= 300 && i < 340) x[i] = 0.0f;
  }
  return x;
}

void PutU32(std::vector<uint8_t>* p, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*p)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(std::vector<uint8_t>* p, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*p)[at + i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetU64(const std::vector<uint8_t>& p, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[at + i]} << (8 * i);
  return v;
}
void PutF32(std::vector<uint8_t>* p, size_t at, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  PutU32(p, at, u);
}
// After editing a body, make the checksum match again, so that the decoder's later checks are exercised.
void RewriteChecksum(std::vector<uint8_t>* p) {
  PutU64(p, 24, Checksum64(std::span<const uint8_t>(*p).subspan(kCodecHeaderBytes)));
}

// Per-element error bounds of each codec, from the values' own block absmax.
class RoundTripChecker {
 public:
  RoundTripChecker(CodecKind kind, uint32_t block) : kind_(kind), block_(block) {}

  void Check(const std::vector<float>& x, const std::vector<float>& y, const std::string& where) const {
    ASSERT_EQ(x.size(), y.size());
    const size_t block = block_ == 0 ? std::max<size_t>(x.size(), 1) : block_;  // element-wise: one range
    for (size_t begin = 0; begin < x.size(); begin += block) {
      const size_t end = std::min(x.size(), begin + block);
      float absmax = 0.0f;
      double sum_abs = 0.0;
      for (size_t i = begin; i < end; ++i) {
        absmax = std::max(absmax, std::fabs(x[i]));
        sum_abs += std::fabs(x[i]);
      }
      const float slack = absmax * 1e-6f;
      for (size_t i = begin; i < end; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << where << " index " << i;
        const float err = std::fabs(x[i] - y[i]);
        switch (kind_) {
          case CodecKind::kFp32: ASSERT_EQ(x[i], y[i]) << where << " index " << i; break;
          case CodecKind::kFp16:
            if (std::fabs(x[i]) >= 6.103515625e-05f) {  // normal fp16 range
              ASSERT_LE(err, std::fabs(x[i]) * 0x1p-11f) << where << " index " << i << " x=" << x[i];
            } else {
              ASSERT_LE(err, 0x1p-25f) << where << " index " << i << " x=" << x[i];  // half a subnormal step
            }
            break;
          case CodecKind::kBf16: ASSERT_LE(err, std::fabs(x[i]) * 0x1p-8f) << where << " index " << i; break;
          case CodecKind::kInt8Block: ASSERT_LE(err, absmax / 254 + slack) << where << " index " << i; break;
          case CodecKind::kInt4Block: ASSERT_LE(err, absmax / 14 + slack) << where << " index " << i; break;
          case CodecKind::kFp4E2M1: ASSERT_LE(err, Fp4Bound(x[i], absmax) + slack) << where << " index " << i; break;
          case CodecKind::kSign1: {
            const float mean = static_cast<float>(sum_abs / static_cast<double>(end - begin));
            ASSERT_NEAR(std::fabs(y[i]), mean, mean * 1e-4f) << where << " index " << i;
            ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << where << " index " << i;
            break;
          }
        }
      }
    }
  }

  // Half the gap between the two E2M1 grid points around |x| / scale, times the scale: 0 for a value that
  // is exactly representable.
  static float Fp4Bound(float x, float absmax) {
    static constexpr float kGrid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    if (absmax == 0.0f) return 0.0f;
    const float scale = absmax / 6.0f;
    const float v = std::fabs(x) / scale;
    for (int g = 0; g < 7; ++g) {
      if (v == kGrid[g]) return 0.0f;
      if (v < kGrid[g + 1]) return (kGrid[g + 1] - kGrid[g]) / 2 * scale;
    }
    return 0.0f;  // v == 6 (or a hair above by rounding): the top grid point
  }

 private:
  CodecKind kind_;
  uint32_t block_;
};

std::vector<uint32_t> BlockSizesFor(CodecKind kind) {
  switch (kind) {
    case CodecKind::kInt8Block: return {0, 32, 64, 100, 1, 3, 2048, 4096};
    case CodecKind::kInt4Block:
    case CodecKind::kFp4E2M1: return {0, 32, 2, 6, 96, 128, 4096};
    case CodecKind::kSign1: return {0, 8, 24, 32, 512};
    default: return {0};
  }
}

const size_t kSizes[] = {0, 1, 2, 3, 31, 32, 33, 64, 65, 255, 256, 257, 1000, 2048, 2049, 5000, 9000, 70001};

TEST(CodecTest, RoundTripWithinTheoreticalBounds) {
  uint32_t seed = 1;
  for (CodecKind kind : kAllKinds) {
    for (uint32_t block : BlockSizesFor(kind)) {
      const auto codec = Make(kind, block);
      const RoundTripChecker checker(kind, codec->block_size());
      for (size_t n : kSizes) {
        const std::string where = fl::StrCat(CodecKindName(kind), ":", codec->block_size(), " n=", n);
        const std::vector<float> x = RandomValues(n, seed++);
        std::vector<uint8_t> payload;
        ASSERT_TRUE(codec->Encode(x, &payload).ok()) << where;
        ASSERT_EQ(payload.size(), codec->EncodedSize(n)) << where;
        std::vector<float> y(n, -7.0f);
        const absl::Status s = codec->Decode(payload, y);
        ASSERT_TRUE(s.ok()) << where << ": " << s;
        checker.Check(x, y, where);
        // Encoding is deterministic.
        std::vector<uint8_t> again;
        ASSERT_TRUE(codec->Encode(x, &again).ok());
        ASSERT_EQ(payload, again) << where;
      }
    }
  }
}

TEST(CodecTest, EncodedSizes) {
  EXPECT_EQ(Make(CodecKind::kFp32)->EncodedSize(10), 32u + 40u);
  EXPECT_EQ(Make(CodecKind::kFp16)->EncodedSize(10), 32u + 20u);
  EXPECT_EQ(Make(CodecKind::kBf16)->EncodedSize(0), 32u);
  EXPECT_EQ(Make(CodecKind::kInt8Block)->EncodedSize(4096),
            32u + 16 * 4 + 4096);  // the brief's example: 4192
  EXPECT_EQ(Make(CodecKind::kInt8Block)->EncodedSize(257), 32u + 2 * 4 + 257);
  EXPECT_EQ(Make(CodecKind::kInt4Block)->EncodedSize(64), 32u + 4 + 32);
  EXPECT_EQ(Make(CodecKind::kInt4Block)->EncodedSize(65), 32u + 2 * 4 + 64);  // two tiles, the last padded
  EXPECT_EQ(Make(CodecKind::kFp4E2M1)->EncodedSize(1), 32u + 4 + 32);
  EXPECT_EQ(Make(CodecKind::kSign1)->EncodedSize(1 << 20), 32u + 4096 * 4 + (1 << 17));
  EXPECT_EQ(Make(CodecKind::kSign1)->EncodedSize(0), 32u);
}

TEST(CodecTest, Int8AndInt4RoundHalfToEven) {
  // absmax 127 -> scale 1 exactly: values are their own levels.
  std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.49f, -126.6f};
  std::vector<uint8_t> payload;
  std::vector<float> y(x.size());
  auto int8 = Make(CodecKind::kInt8Block);
  ASSERT_TRUE(int8->Encode(x, &payload).ok());
  ASSERT_TRUE(int8->Decode(payload, y).ok());
  EXPECT_EQ(y, (std::vector<float>{127, 0, 2, 2, -0.0f, -2, 3, -127}));

  x = {7.0f, 0.5f, 1.5f, 2.5f, -3.5f, -0.49f, 6.5f, -6.51f};
  auto int4 = Make(CodecKind::kInt4Block);
  ASSERT_TRUE(int4->Encode(x, &payload).ok());
  ASSERT_TRUE(int4->Decode(payload, y).ok());
  EXPECT_EQ(y, (std::vector<float>{7, 0, 2, 2, -4, -0.0f, 6, -7}));
}

TEST(CodecTest, Fp4IsExactOnItsGridAndRoundsTiesToEvenCodes) {
  auto fp4 = Make(CodecKind::kFp4E2M1);
  // absmax 6 * 2^-3: the scale is a power of two, so every grid value times it is exact.
  const float s = 0.125f;
  std::vector<float> grid = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, -0.0f};
  for (float& v : grid) v *= s;
  std::vector<uint8_t> payload;
  std::vector<float> y(grid.size());
  ASSERT_TRUE(fp4->Encode(grid, &payload).ok());
  ASSERT_TRUE(fp4->Decode(payload, y).ok());
  for (size_t i = 0; i < grid.size(); ++i) {
    EXPECT_EQ(y[i], grid[i]) << i;
    EXPECT_EQ(std::signbit(y[i]), std::signbit(grid[i])) << i;
  }
  // Midpoints (scale 1): ties go to the even code (mantissa bit 0): 0.25->0, 0.75->1, 1.25->1, 1.75->2,
  // 2.5->2, 3.5->4, 5->4. Just off the midpoints they go to the nearest.
  std::vector<float> x = {6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -5, 5.01f, 2.49f, 0.26f};
  ASSERT_TRUE(fp4->Encode(x, &payload).ok());
  y.resize(x.size());
  ASSERT_TRUE(fp4->Decode(payload, y).ok());
  EXPECT_EQ(y, (std::vector<float>{6, 0, 1, 1, 2, 2, 4, 4, -4, 6, 2, 0.5f}));
}

TEST(CodecTest, HalfPrecisionRangeAndRounding) {
  auto fp16 = Make(CodecKind::kFp16);
  auto bf16 = Make(CodecKind::kBf16);
  std::vector<uint8_t> payload;
  // 65504 is fp16's largest finite value; 65519 rounds down to it; 65520 rounds to infinity.
  std::vector<float> ok = {65504.0f, -65519.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 0x1p-24f, 0x1p-25f};
  ASSERT_TRUE(fp16->Encode(ok, &payload).ok());
  std::vector<float> y(ok.size());
  ASSERT_TRUE(fp16->Decode(payload, y).ok());
  // Ties to even: 1 + 2^-11 -> 1; 1 + 3*2^-11 -> 1 + 2^-9; 2^-25 is half the smallest subnormal -> 0.
  EXPECT_EQ(y, (std::vector<float>{65504.0f, -65504.0f, 1.0f, 1.0f + 0x1p-9f, 0x1p-24f, 0.0f}));

  std::vector<float> big = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 65520.0f};
  EXPECT_ERROR_HAS(fp16->Encode(big, &payload), "index 5");
  EXPECT_ERROR_HAS(fp16->Encode(big, &payload), "65520");
  EXPECT_ERROR_HAS(fp16->Encode(big, &payload), "fp16 range");
  EXPECT_TRUE(payload.empty());

  // bf16 keeps fp32's range but FLT_MAX itself rounds up past its largest finite value.
  std::vector<float> wide = {3.0e38f, -1e-30f, 1.0f + 0x1p-8f};
  ASSERT_TRUE(bf16->Encode(wide, &payload).ok());
  y.resize(wide.size());
  ASSERT_TRUE(bf16->Decode(payload, y).ok());
  EXPECT_EQ(y[2], 1.0f);  // tie to even
  EXPECT_ERROR_HAS(bf16->Encode(std::vector<float>{0, FLT_MAX}, &payload), "index 1");
}

TEST(CodecTest, EncodeRejectsNonFiniteNamingTheIndex) {
  for (CodecKind kind : kAllKinds) {
    const auto codec = Make(kind);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      for (size_t at : {size_t{0}, size_t{17}, size_t{4999}}) {
        std::vector<float> x = RandomValues(5000, 3);
        x[at] = bad;
        std::vector<uint8_t> payload = {1, 2, 3};
        const absl::Status s = codec->Encode(x, &payload);
        EXPECT_FALSE(s.ok()) << CodecKindName(kind);
        EXPECT_NE(Msg(s).find(fl::StrCat("index ", at, " ")), std::string::npos) << Msg(s);
        EXPECT_TRUE(payload.empty());
      }
    }
  }
}

TEST(CodecTest, ExtremeMagnitudesDecodeFinite) {
  for (CodecKind kind : kBlockKinds) {
    const auto codec = Make(kind, 32);
    std::vector<float> x(96);
    for (size_t i = 0; i < 32; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * FLT_MAX / static_cast<float>(i + 1);
    for (size_t i = 32; i < 64; ++i) x[i] = static_cast<float>(i) * 1e-44f;  // subnormal
    for (size_t i = 64; i < 96; ++i) x[i] = static_cast<float>(i - 80) * 1e-38f;
    std::vector<uint8_t> payload;
    ASSERT_TRUE(codec->Encode(x, &payload).ok()) << CodecKindName(kind);
    std::vector<float> y(x.size());
    ASSERT_TRUE(codec->Decode(payload, y).ok()) << CodecKindName(kind);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(y[i])) << CodecKindName(kind) << " " << i;
      if (kind != CodecKind::kSign1) {
        // The clamped path keeps every value within one block absmax of its input.
        const float absmax = i < 32 ? FLT_MAX : i < 64 ? 63e-44f : 16e-38f;
        ASSERT_LE(std::fabs(x[i] - y[i]), absmax) << CodecKindName(kind) << " " << i;
        ASSERT_EQ(std::signbit(y[i]) && y[i] != 0, std::signbit(x[i]) && y[i] != 0);
      }
    }
  }
}

TEST(CodecTest, DecodeAccumulateAddsWeightTimesDecode) {
  for (CodecKind kind : kAllKinds) {
    for (uint32_t block : BlockSizesFor(kind)) {
      const auto codec = Make(kind, block);
      for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{4096}, size_t{9001}}) {
        const std::vector<float> x = RandomValues(n, 100 + static_cast<uint32_t>(n));
        std::vector<uint8_t> payload;
        ASSERT_TRUE(codec->Encode(x, &payload).ok());
        std::vector<float> decoded(n);
        ASSERT_TRUE(codec->Decode(payload, decoded).ok());
        std::vector<float> acc = RandomValues(n, 7);
        const std::vector<float> before = acc;
        const float w = 0.37f;
        ASSERT_TRUE(codec->DecodeAccumulate(payload, w, acc).ok());
        for (size_t i = 0; i < n; ++i) {
          const float expected = before[i] + w * decoded[i];
          // Equal up to FMA contraction, which some compilers apply to one side and not the other.
          ASSERT_NEAR(acc[i], expected, 1e-6f * (std::fabs(before[i]) + std::fabs(w * decoded[i])) + 1e-30f)
              << CodecKindName(kind) << ":" << codec->block_size() << " n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(CodecTest, DecodeAccumulateRejectsNonFiniteWeight) {
  const auto codec = Make(CodecKind::kInt8Block);
  std::vector<uint8_t> payload;
  ASSERT_TRUE(codec->Encode(RandomValues(10, 1), &payload).ok());
  std::vector<float> acc(10, 1.0f);
  EXPECT_ERROR_HAS(codec->DecodeAccumulate(payload, std::numeric_limits<float>::quiet_NaN(), acc), "weight");
  EXPECT_EQ(acc, std::vector<float>(10, 1.0f));
}

// ---- Corrupt payloads: every one is rejected, with a message that names the problem, and neither Decode's
// output nor DecodeAccumulate's accumulator is touched.

class CorruptPayloadTest : public ::testing::TestWithParam<CodecKind> {
 protected:
  void SetUp() override {
    codec_ = Make(GetParam());
    ASSERT_TRUE(codec_->Encode(RandomValues(kN, 5), &good_).ok());
  }

  // Returns the decode error after checking that nothing was written.
  absl::Status Reject(const std::vector<uint8_t>& payload, size_t out_size = kN) {
    std::vector<float> out(out_size, 123.0f);
    const absl::Status s = codec_->Decode(payload, out);
    EXPECT_FALSE(s.ok()) << "corrupt payload accepted";
    EXPECT_EQ(out, std::vector<float>(out_size, 123.0f)) << "Decode wrote before failing";
    std::vector<float> acc(out_size, 5.0f);
    const absl::Status a = codec_->DecodeAccumulate(payload, 0.5f, acc);
    EXPECT_FALSE(a.ok());
    EXPECT_EQ(acc, std::vector<float>(out_size, 5.0f)) << "DecodeAccumulate touched acc on error";
    EXPECT_EQ(Msg(s), Msg(a));
    return s;
  }

  static constexpr size_t kN = 1000;  // not a multiple of any block or tile
  std::unique_ptr<Codec> codec_;
  std::vector<uint8_t> good_;
};

TEST_P(CorruptPayloadTest, GoodPayloadDecodes) {
  std::vector<float> out(kN);
  EXPECT_TRUE(codec_->Decode(good_, out).ok());
}

TEST_P(CorruptPayloadTest, HeaderFields) {
  auto p = good_;
  p[0] ^= 1;
  EXPECT_ERROR_HAS(Reject(p), "magic");
  p = good_;
  p[4] = 2;
  EXPECT_ERROR_HAS(Reject(p), "version 2");
  p = good_;
  p[5] = 9;
  EXPECT_ERROR_HAS(Reject(p), "unknown codec kind 9");
  p = good_;
  p[5] = static_cast<uint8_t>(GetParam() == CodecKind::kFp16 ? CodecKind::kBf16 : CodecKind::kFp16);
  (void)Reject(p);  // another codec: its block size or length no longer fits, or the codec does not match
  p = good_;
  p[6] = 2;  // bit 0 is kCodecFlagNoBodyChecksum; the other flag bits are reserved
  EXPECT_ERROR_HAS(Reject(p), "reserved");
  p = good_;
  p[7] = 0x80;
  EXPECT_ERROR_HAS(Reject(p), "unknown flags");
  p = good_;
  p[6] = 1;  // no body checksum, yet the checksum field is set
  EXPECT_ERROR_HAS(Reject(p), "its checksum field is");
  p = good_;
  p[13] = 1;
  EXPECT_ERROR_HAS(Reject(p), "reserved");
  p = good_;
  PutU32(&p, 8, IsBlockwise(GetParam()) ? 0 : 16);
  EXPECT_ERROR_HAS(Reject(p), "block size");
  if (IsBlockwise(GetParam())) {
    p = good_;
    PutU32(&p, 8, codec_->block_size() / 2);
    (void)Reject(p);  // a valid block size, but more scales than the payload has
  }
  p = good_;
  PutU64(&p, 16, kN + 1);
  (void)Reject(p);  // one more value: either the length or the output size no longer matches
  p = good_;
  PutU64(&p, 16, uint64_t{1} << 60);
  EXPECT_ERROR_HAS(Reject(p), "more than any payload can hold");
  p = good_;
  p[24] ^= 0x80;
  EXPECT_ERROR_HAS(Reject(p), "checksum");
}

TEST_P(CorruptPayloadTest, Length) {
  auto p = good_;
  p.pop_back();
  EXPECT_ERROR_HAS(Reject(p), "truncated");
  EXPECT_ERROR_HAS(Reject(p), fl::StrCat("take exactly ", good_.size(), " bytes"));
  p = good_;
  p.push_back(0);
  EXPECT_ERROR_HAS(Reject(p), "1 extra bytes");
  EXPECT_ERROR_HAS(Reject(std::vector<uint8_t>(good_.begin(), good_.begin() + 10)), "shorter than the 32-byte");
  EXPECT_ERROR_HAS(Reject({}), "payload is 0 bytes");
}

TEST_P(CorruptPayloadTest, FlippedBodyByteFailsChecksum) {
  for (size_t at : {kCodecHeaderBytes, good_.size() / 2, good_.size() - 1}) {
    auto p = good_;
    p[at] ^= 0x10;
    const absl::Status s = Reject(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(Msg(s).find("checksum"), std::string::npos) << Msg(s);
  }
}

// A payload encoded without its body checksum (fl-client's uploads, whose transfer has an XXH3 of the same
// bytes): the same body, the flag set and the field zero; refused unless the caller verified the transfer.
TEST_P(CorruptPayloadTest, WithoutABodyChecksumOnlyAVerifiedTransferDecodes) {
  std::vector<uint8_t> bare;
  ASSERT_TRUE(codec_->Encode(RandomValues(kN, 5), &bare, EncodeOptions{.body_checksum = false}).ok());
  ASSERT_EQ(bare.size(), good_.size());
  EXPECT_TRUE(std::equal(bare.begin() + kCodecHeaderBytes, bare.end(), good_.begin() + kCodecHeaderBytes));
  EXPECT_EQ(bare[6], kCodecFlagNoBodyChecksum);
  EXPECT_EQ(GetU64(bare, 24), 0u);

  const absl::Status s = Reject(bare);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_ERROR_HAS(s, "carries no body checksum");
  EXPECT_ERROR_HAS(s, "transfer_verified");

  const DecodeOptions verified{.transfer_verified = true};
  std::vector<float> from_bare(kN), from_good(kN);
  ASSERT_TRUE(codec_->Decode(bare, from_bare, verified).ok());
  ASSERT_TRUE(codec_->Decode(good_, from_good).ok());
  EXPECT_EQ(from_bare, from_good);
  // Peeking reads the header the same way.
  ASSERT_TRUE(PeekPayload(bare).ok());
  EXPECT_EQ(PeekPayload(bare)->num_values, kN);
}

// transfer_verified skips the body checksum (the caller checked these bytes), not the other checks: a body whose
// checksum no longer matches decodes, a header or value that is wrong is still refused.
TEST_P(CorruptPayloadTest, AVerifiedTransferSkipsOnlyTheBodyChecksum) {
  const DecodeOptions verified{.transfer_verified = true};
  auto p = good_;
  p[good_.size() / 2] ^= 0x01;  // low bit: still a finite value / valid code in every codec
  std::vector<float> out(kN);
  EXPECT_TRUE(codec_->Decode(p, out, verified).ok());
  EXPECT_EQ(Reject(p).code(), absl::StatusCode::kDataLoss);  // without the option: the checksum catches it

  p = good_;
  p.pop_back();
  std::vector<float> untouched(kN, 123.0f);
  EXPECT_ERROR_HAS(codec_->Decode(p, untouched, verified), "truncated");
  EXPECT_EQ(untouched, std::vector<float>(kN, 123.0f));
  if (GetParam() == CodecKind::kFp32) {
    p = good_;
    PutF32(&p, kCodecHeaderBytes + 4 * 7, std::numeric_limits<float>::quiet_NaN());
    EXPECT_ERROR_HAS(codec_->Decode(p, untouched, verified), "index 7");
    EXPECT_EQ(untouched, std::vector<float>(kN, 123.0f));
  }
}

TEST_P(CorruptPayloadTest, WrongOutputSize) {
  EXPECT_ERROR_HAS(Reject(good_, kN - 1), "holds 1000 values but the output has room for 999");
  EXPECT_ERROR_HAS(Reject(good_, kN + 1), "has room for 1001");
}

TEST_P(CorruptPayloadTest, ValuesThatWouldNotDecodeFinite) {
  const CodecKind kind = GetParam();
  const size_t body = kCodecHeaderBytes;
  if (IsBlockwise(kind)) {
    // Scales are checked even when the checksum matches (a faulty encoder, not the network).
    // The largest |code| a scale multiplies: int8 128 (-128 decodes), int4 7, fp4 6, sign1 1.
    const float limit = FLT_MAX / (kind == CodecKind::kInt8Block   ? 128.0f
                                   : kind == CodecKind::kInt4Block ? 7.0f
                                   : kind == CodecKind::kFp4E2M1   ? 6.0f
                                                                   : 1.0f);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), -1.0f, std::numeric_limits<float>::infinity(),
                      kind == CodecKind::kSign1 ? std::numeric_limits<float>::infinity() : limit * 1.01f}) {
      auto p = good_;
      PutF32(&p, body + 4 * 2, bad);  // block 2
      RewriteChecksum(&p);
      EXPECT_ERROR_HAS(Reject(p), "scale of block 2");
      EXPECT_ERROR_HAS(Reject(p), fl::StrCat(bad));
    }
    if (kind != CodecKind::kInt8Block) {
      // Padding after the last value (the top bit of the last word is the last tile's last field).
      auto p = good_;
      p.back() |= 0x80;
      RewriteChecksum(&p);
      EXPECT_ERROR_HAS(Reject(p), "padding");
    }
  } else {
    auto p = good_;
    if (kind == CodecKind::kFp32) PutF32(&p, body + 4 * 5, std::numeric_limits<float>::infinity());
    if (kind == CodecKind::kFp16) p[body + 2 * 5 + 1] = 0x7c;  // exponent all ones
    if (kind == CodecKind::kBf16) {
      p[body + 2 * 5 + 1] = 0x7f;
      p[body + 2 * 5] = 0x80;
    }
    RewriteChecksum(&p);
    EXPECT_ERROR_HAS(Reject(p), "index 5");
  }
}

TEST_P(CorruptPayloadTest, WrongCodecForThePayload) {
  for (CodecKind other : kAllKinds) {
    if (other == GetParam()) continue;
    const auto codec = Make(other);
    std::vector<uint8_t> p;
    ASSERT_TRUE(codec->Encode(RandomValues(kN, 9), &p).ok());
    const absl::Status s = Reject(p);
    EXPECT_NE(Msg(s).find(fl::StrCat("encoded with ", CodecKindName(other))), std::string::npos) << Msg(s);
    EXPECT_NE(Msg(s).find(fl::StrCat("this codec is ", CodecKindName(GetParam()))), std::string::npos) << Msg(s);
  }
  if (IsBlockwise(GetParam())) {
    // Same codec, other block size.
    const auto codec = Make(GetParam(), 2 * codec_->block_size());
    std::vector<uint8_t> p;
    ASSERT_TRUE(codec->Encode(RandomValues(kN, 9), &p).ok());
    EXPECT_ERROR_HAS(Reject(p), fl::StrCat("block ", 2 * codec_->block_size()));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CorruptPayloadTest, ::testing::ValuesIn(kAllKinds),
                         [](const ::testing::TestParamInfo<CodecKind>& param) {
                           return std::string(CodecKindName(param.param));
                         });

// ---- Construction.

// A payload built in place (fl-client computes its fp32 update straight into the body): sealing it gives the
// bytes Encode gives for the same values, with and without the body checksum; a NaN/Inf is refused naming its
// index, as Encode does; a buffer that is not a whole fp32 payload is refused.
TEST(SealFp32PayloadTest, SealingValuesInPlaceIsEncodingThem) {
  const std::vector<float> values = RandomValues(1000, 6);
  auto fp32 = MakeCodec(CodecKind::kFp32);
  ASSERT_TRUE(fp32.ok());
  for (const bool checksum : {true, false}) {
    const EncodeOptions options{.body_checksum = checksum};
    std::vector<uint8_t> encoded;
    ASSERT_TRUE((*fp32)->Encode(values, &encoded, options).ok());
    std::vector<uint8_t> sealed((*fp32)->EncodedSize(values.size()), 0xAB);  // the header's bytes are overwritten
    std::memcpy(sealed.data() + kCodecHeaderBytes, values.data(), values.size() * sizeof(float));
    ASSERT_TRUE(SealFp32Payload(sealed, options).ok());
    EXPECT_EQ(sealed, encoded) << "body checksum " << checksum;
  }
  std::vector<uint8_t> bad((*fp32)->EncodedSize(values.size()));
  std::vector<float> with_nan = values;
  with_nan[417] = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + kCodecHeaderBytes, with_nan.data(), with_nan.size() * sizeof(float));
  std::vector<uint8_t> refused;
  const absl::Status by_encode = (*fp32)->Encode(with_nan, &refused);
  const absl::Status by_seal = SealFp32Payload(bad);
  EXPECT_EQ(by_seal.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(by_seal), Msg(by_encode));
  EXPECT_ERROR_HAS(by_seal, "index 417");
  std::vector<uint8_t> ragged(kCodecHeaderBytes + 6);
  EXPECT_ERROR_HAS(SealFp32Payload(ragged), "4 bytes per value");
  std::vector<uint8_t> short_one(10);
  EXPECT_ERROR_HAS(SealFp32Payload(short_one), "EncodedSize");
}

TEST(MakeCodecTest, ParsesSpecs) {
  for (CodecKind kind : kAllKinds) {
    auto codec = MakeCodec(CodecKindName(kind));
    ASSERT_TRUE(codec.ok()) << codec.status();
    EXPECT_EQ((*codec)->kind(), kind);
    EXPECT_EQ((*codec)->name(), CodecKindName(kind));
    EXPECT_EQ((*codec)->block_size(), CodecDefaultBlockSize(kind));
    auto parsed = ParseCodecKind(CodecKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(CodecDefaultBlockSize(CodecKind::kInt8Block), 256u);
  EXPECT_EQ(CodecDefaultBlockSize(CodecKind::kInt4Block), 64u);
  EXPECT_EQ(CodecDefaultBlockSize(CodecKind::kFp4E2M1), 32u);
  EXPECT_EQ(CodecDefaultBlockSize(CodecKind::kSign1), 256u);
  auto codec = MakeCodec("int8:128");
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->kind(), CodecKind::kInt8Block);
  EXPECT_EQ((*codec)->block_size(), 128u);
  codec = MakeCodec("sign1:16");
  ASSERT_TRUE(codec.ok());
  EXPECT_EQ((*codec)->block_size(), 16u);
  codec = MakeCodec("int4:1048576");
  ASSERT_TRUE(codec.ok());
}

TEST(MakeCodecTest, RejectsBadSpecsClearly) {
  EXPECT_ERROR_HAS(MakeCodec("int9").status(), "unknown codec 'int9'");
  EXPECT_ERROR_HAS(MakeCodec("int9").status(), "fp32, fp16, bf16, int8, int4, fp4, sign1");
  EXPECT_ERROR_HAS(MakeCodec("").status(), "unknown codec ''");
  EXPECT_ERROR_HAS(MakeCodec("INT8").status(), "unknown codec 'INT8'");
  EXPECT_ERROR_HAS(MakeCodec("int8:0").status(), "codec spec 'int8:0': block size '0' is not a positive integer");
  EXPECT_ERROR_HAS(MakeCodec("int8:abc").status(), "block size 'abc'");
  EXPECT_ERROR_HAS(MakeCodec("int8:").status(), "block size ''");
  EXPECT_ERROR_HAS(MakeCodec("int8:-4").status(), "block size '-4'");
  EXPECT_ERROR_HAS(MakeCodec("int8:12x").status(), "block size '12x'");
  EXPECT_ERROR_HAS(MakeCodec("int8:99999999999").status(), "block size '99999999999'");
  EXPECT_ERROR_HAS(MakeCodec("int8:2000000").status(), "block size 2000000 is not valid for int8");
  EXPECT_ERROR_HAS(MakeCodec("sign1:12").status(), "block size 12 is not valid for sign1");
  EXPECT_ERROR_HAS(MakeCodec("sign1:12").status(), "multiple of 8");
  EXPECT_ERROR_HAS(MakeCodec("int4:3").status(), "multiple of 2");
  EXPECT_ERROR_HAS(MakeCodec("fp16:128").status(), "fp16 is element-wise and takes no block size");
  EXPECT_ERROR_HAS(MakeCodec(CodecKind::kFp4E2M1, CodecOptions{7}).status(), "multiple of 2");
  EXPECT_ERROR_HAS(MakeCodec(static_cast<CodecKind>(0)).status(), "unknown codec kind 0");
  EXPECT_ERROR_HAS(ParseCodecKind("fp8").status(), "unknown codec 'fp8'");
}

TEST(MakeCodecTest, ElementwiseCodecsIgnoreBlockOption) {
  auto codec = MakeCodec(CodecKind::kFp16, CodecOptions{64});
  ASSERT_TRUE(codec.ok());
  EXPECT_EQ((*codec)->block_size(), 0u);
}

// ---- PeekPayload.

TEST(PeekPayloadTest, ReadsTheHeader) {
  const auto codec = Make(CodecKind::kFp4E2M1, 64);
  std::vector<uint8_t> p;
  ASSERT_TRUE(codec->Encode(RandomValues(777, 1), &p).ok());
  auto info = PeekPayload(p);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, CodecKind::kFp4E2M1);
  EXPECT_EQ(info->block_size, 64u);
  EXPECT_EQ(info->num_values, 777u);
  // The receiver's use: pick the codec from the bytes, then decode.
  auto picked = MakeCodec(info->kind, CodecOptions{info->block_size});
  ASSERT_TRUE(picked.ok());
  std::vector<float> out(info->num_values);
  EXPECT_TRUE((*picked)->Decode(p, out).ok());

  // The body is not checked (Decode does that) ...
  p[40] ^= 1;
  EXPECT_TRUE(PeekPayload(p).ok());
  // ... the header and the length are.
  EXPECT_ERROR_HAS(PeekPayload(std::vector<uint8_t>(p.begin(), p.begin() + 31)).status(), "shorter");
  p.push_back(0);
  EXPECT_ERROR_HAS(PeekPayload(p).status(), "extra bytes");
  p.pop_back();
  p[0] = 'X';
  EXPECT_ERROR_HAS(PeekPayload(p).status(), "magic");
}

// ---- Error feedback.

// Runs `steps` rounds of random inputs through `codec`, with or without error feedback, and returns the
// largest |sum of inputs - sum of decoded values| seen in each half of the run.
struct Drift {
  float first_half = 0;
  float second_half = 0;
  float final_l2 = 0;
  float one_step_error = 0;  // largest error of encoding a single input alone
};

Drift RunFeedback(const Codec& codec, bool feedback, size_t n, int steps) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ErrorFeedback ef(n);
  std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
  std::vector<float> x(n), y(n);
  std::vector<uint8_t> payload;
  Drift d;
  for (int step = 0; step < steps; ++step) {
    for (float& v : x) v = normal(rng);
    if (feedback) {
      EXPECT_TRUE(ef.Encode(codec, x, &payload).ok());
    } else {
      EXPECT_TRUE(codec.Encode(x, &payload).ok());
    }
    EXPECT_TRUE(codec.Decode(payload, y).ok());
    float drift = 0;
    for (size_t i = 0; i < n; ++i) {
      sum_in[i] += x[i];
      sum_out[i] += y[i];
      drift = std::max(drift, static_cast<float>(std::fabs(sum_in[i] - sum_out[i])));
      if (!feedback) d.one_step_error = std::max(d.one_step_error, std::fabs(x[i] - y[i]));
    }
    float& half = step < steps / 2 ? d.first_half : d.second_half;
    half = std::max(half, drift);
    if (feedback) {
      // The drift is exactly the carried residual.
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(sum_in[i] - sum_out[i], ef.residual()[i], 1e-3) << "step " << step;
      }
    }
  }
  double l2 = 0;
  for (size_t i = 0; i < n; ++i) l2 += (sum_in[i] - sum_out[i]) * (sum_in[i] - sum_out[i]);
  d.final_l2 = static_cast<float>(std::sqrt(l2));
  return d;
}

TEST(ErrorFeedbackTest, RunningSumTracksInputsWithoutGrowing) {
  for (CodecKind kind :
       {CodecKind::kFp16, CodecKind::kInt8Block, CodecKind::kInt4Block, CodecKind::kFp4E2M1, CodecKind::kSign1}) {
    const auto codec = Make(kind);
    const Drift without = RunFeedback(*codec, false, 1000, 200);
    const Drift with = RunFeedback(*codec, true, 1000, 200);
    SCOPED_TRACE(CodecKindName(kind));
    // Bounded by (about) one step's error, and not growing with the number of steps.
    const float bound = kind == CodecKind::kSign1 ? 4 * without.one_step_error : 1.5f * without.one_step_error;
    EXPECT_LE(with.first_half, bound);
    EXPECT_LE(with.second_half, bound);
    EXPECT_LE(with.final_l2, without.final_l2) << "feedback made it worse";
  }
}

TEST(ErrorFeedbackTest, MuchBetterThanNoFeedbackForSign1) {
  const auto codec = Make(CodecKind::kSign1);
  const Drift without = RunFeedback(*codec, false, 1000, 200);
  const Drift with = RunFeedback(*codec, true, 1000, 200);
  // Without feedback the sign codec's errors add up like a random walk (sqrt(200) ~ 14 steps' worth).
  EXPECT_LT(with.final_l2 * 5, without.final_l2) << with.final_l2 << " vs " << without.final_l2;
  EXPECT_GT(without.second_half, 3 * with.second_half);
}

TEST(ErrorFeedbackTest, ResidualAndErrors) {
  const auto codec = Make(CodecKind::kInt4Block);
  ErrorFeedback ef(100);
  std::vector<uint8_t> payload;
  std::vector<float> x = RandomValues(100, 4);
  ASSERT_TRUE(ef.Encode(*codec, x, &payload).ok());
  std::vector<float> y(100);
  ASSERT_TRUE(codec->Decode(payload, y).ok());
  for (size_t i = 0; i < 100; ++i) EXPECT_FLOAT_EQ(ef.residual()[i], x[i] - y[i]);
  const std::vector<float> residual(ef.residual().begin(), ef.residual().end());

  EXPECT_ERROR_HAS(ef.Encode(*codec, std::vector<float>(99), &payload), "set up for 100 values but got 99");
  x[42] = std::numeric_limits<float>::infinity();
  EXPECT_ERROR_HAS(ef.Encode(*codec, x, &payload), "index 42");
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()), residual) << "residual changed";

  ef.Reset();
  EXPECT_EQ(std::vector<float>(ef.residual().begin(), ef.residual().end()), std::vector<float>(100, 0.0f));
}

}  // namespace
}  // namespace fl::core
