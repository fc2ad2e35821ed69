// Codec inner loops. See codec_kernels_internal.h for the contract and codec.h for the wire format.
//
// Why one file of this size: every codec's kernels follow the same vectorization rules below and are
// benchmarked together (bench/codec_bench); kept side by side, a change to one pattern is made to all.
//
// Speed comes from auto-vectorization (no intrinsics), so every hot loop is written to be vectorizable by
// construction:
//  - no branches on data inside loops: selects, bit operations, and integer comparisons of float bits where
//    float comparisons would keep GCC from if-converting (it must assume they may trap);
//  - float -> int rounding by the magic-number trick: for |v| < 2^22, v + 1.5*2^23 lands in a binade whose
//    ulp is 1, so the addition itself rounds v to the nearest integer, ties to even (the FPU's default
//    rounding mode), and the integer sits in the low mantissa bits;
//  - reductions the compiler may not reassociate (float sums) are written with explicit lanes;
//  - inner loops have fixed trip counts (32-value runs, 64- or 256-value tiles), so there are no per-block
//    prologues, epilogues or alias checks;
//  - 4-bit and 1-bit codes use the word-interleaved tile layout of codec.h, so packing is shifts and ORs
//    of whole vectors, never a narrowing or shuffle of lanes.
// The value-by-value general path (any block size, subnormal or capped scales, the last partial group) is
// the reference the fast path is tested against byte for byte.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "codec_kernels_internal.h"

// On x86-64 the baseline is SSE2 (4 floats per instruction). The blockwise codecs are also compiled for AVX2
// (8 floats per instruction) and the loader picks the best one the CPU has. The code is the same C++ for both
// clones; only the compiler's target differs, so results are bit-identical (no FMA is enabled, so no
// contraction changes rounding). Elsewhere (arm64: NEON is baseline) one version is built.
#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute)
// Not under GCC's ThreadSanitizer (the tsan preset): the loader runs the clones' resolver before TSan's runtime
// is set up, and the instrumented resolver crashes every binary at load.
#if __has_attribute(target_clones) && !defined(FL_CODEC_NO_MULTIVERSION) && !defined(__SANITIZE_THREAD__)
#define FL_CODEC_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef FL_CODEC_MULTIVERSION
#define FL_CODEC_MULTIVERSION
#endif

// Forced inlining: the multiversioned entry points must contain the whole loop nest, or the AVX2 clone would
// call the baseline-compiled helpers.
#if defined(__GNUC__)
#define FL_INLINE inline __attribute__((always_inline))
#else
#define FL_INLINE inline
#endif

namespace fl::core::codec_internal {
namespace {

static_assert(sizeof(float) == 4 && std::numeric_limits<float>::is_iec559, "codecs need IEEE binary32");

constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23
constexpr uint32_t kRoundMagicBits = 0x4B400000u;

FL_INLINE uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
FL_INLINE float FromBits(uint32_t u) { return std::bit_cast<float>(u); }

FL_INLINE float LoadF32(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}
FL_INLINE void StoreF32(uint8_t* p, float f) { std::memcpy(p, &f, 4); }
FL_INLINE uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
FL_INLINE void StoreU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Max over |x| as integer bit patterns. For non-negative floats the integer order is the float order, and
// every Inf/NaN pattern is above every finite one, so one integer max reduction (which the compiler
// vectorizes freely, unlike a float max whose NaN semantics it must preserve) yields both the absmax and
// whether the block has a non-finite value. Signed int32 because |x| < 2^31 and SSE2 lacks unsigned max.
FL_INLINE int32_t AbsMaxBits(const float* x, size_t n) {
  int32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t a = static_cast<int32_t>(Bits(x[i]) & 0x7fffffffu);
    m = a > m ? a : m;
  }
  return m;
}
constexpr int32_t kInfBits = 0x7f800000;

// The same over `runs` runs of 32 values. Fixed inner trip counts (32, 64 or 128 values) give straight vector code (one
// horizontal reduction per run) instead of a general reduction loop's prologue and epilogue, which cost as
// much as the loop itself on a 32-value block. (Carrying one vector of lanes across the runs and reducing
// once measured slower with GCC 12 on Zen 3: it serializes the block on one accumulator.)
FL_INLINE int32_t AbsMaxBitsRuns(const float* __restrict x, size_t runs) {
  int32_t m = 0;
  if (runs % 4 == 0) {
    for (size_t r = 0; r < runs; r += 4) {
      int32_t mr = 0;
      for (size_t j = 0; j < 128; ++j) {
        const int32_t a = static_cast<int32_t>(Bits(x[32 * r + j]) & 0x7fffffffu);
        mr = a > mr ? a : mr;
      }
      m = mr > m ? mr : m;
    }
    return m;
  }
  if (runs % 2 == 0) {
    for (size_t r = 0; r < runs; r += 2) {
      int32_t mr = 0;
      for (size_t j = 0; j < 64; ++j) {
        const int32_t a = static_cast<int32_t>(Bits(x[32 * r + j]) & 0x7fffffffu);
        mr = a > mr ? a : mr;
      }
      m = mr > m ? mr : m;
    }
    return m;
  }
  for (size_t r = 0; r < runs; ++r) {
    int32_t mr = 0;
    for (size_t j = 0; j < 32; ++j) {
      const int32_t a = static_cast<int32_t>(Bits(x[32 * r + j]) & 0x7fffffffu);
      mr = a > mr ? a : mr;
    }
    m = mr > m ? mr : m;
  }
  return m;
}

size_t FirstNonFinite(const float* x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return kNotFound;
}

// ---------------------------------------------------------------------------------------------------------
// Element-wise codecs.

// c ? a : b as bit operations. With a plain ?: whose arm holds a float operation, GCC keeps a branch (it
// may not speculate an operation that could trap), and the loop no longer vectorizes.
FL_INLINE uint32_t Select(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// fp16 with round-to-nearest-even (after F. Giesen, "float->half variants", 2016), branch-free so that it
// vectorizes. Values that round beyond the fp16 range come out as the Inf pattern 0x7c00, which the caller
// reports as an error; NaN inputs also map to 0x7c00 (the caller rejects them before looking closer).
FL_INLINE uint16_t FloatToHalfBits(float f) {
  const uint32_t u = Bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  constexpr uint32_t kMinNormal = 0x38800000u;  // 2^-14, the smallest normal fp16
  // Subnormal results: adding 0.5 puts the value in a binade whose ulp is 2^-24, the fp16 subnormal step, so
  // the FPU does the rounding and the low bits are the code. Clamped at 2^-14, where it gives 0x400.
  const uint32_t lo = std::min(a, kMinNormal);
  const uint32_t subnormal = Bits(FromBits(lo) + 0.5f) - 0x3F000000u;
  // Normal results: rebias the exponent (127 -> 15), add 0xfff plus the lowest kept mantissa bit so that the
  // shift rounds to nearest, ties to even. Clamped at 2^-14 from below, where it gives 0x400 too. (max(a, C)
  // written as a + C - min(a, C): with both a min and a max of `a`, GCC 12 threads jumps on the shared
  // comparison and the loop stops vectorizing.)
  const uint32_t b = a + kMinNormal - lo;
  const uint32_t normal = (b + 0xC8000FFFu + ((b >> 13) & 1u)) >> 13;
  // Exactly one of the two differs from 0x400, so their sum minus 0x400 is the code: no select, whose float
  // arm GCC would keep behind a branch (it may not speculate a possibly trapping add), blocking
  // vectorization. Beyond the fp16 range `normal` exceeds 0x7c00 (uint32 wrap included), so the min gives the
  // Inf pattern.
  const uint32_t h = std::min(subnormal + normal - 0x400u, 0x7c00u);
  return static_cast<uint16_t>(h | sign);
}

FL_INLINE float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t normal = em + (112u << 23);
  // Subnormal: (1.m * 2^-14) - 2^-14 = 0.m * 2^-14, exact.
  const uint32_t subnormal = Bits(FromBits(em + (113u << 23)) - FromBits(113u << 23));
  return FromBits(Select((h & 0x7c00u) == 0, subnormal, normal) | sign);
}

FL_INLINE uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = Bits(f);
  const uint32_t a = u & 0x7fffffffu;
  // Round to nearest even on the 16 bits that are dropped; a carry into the exponent is the correct result,
  // and a carry into the Inf pattern means overflow, which the caller reports.
  const uint32_t r = (a + 0x7fffu + ((a >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(r | ((u >> 16) & 0x8000u));
}

}  // namespace

size_t FindNonFinite(const float* x, size_t n) {
  return AbsMaxBits(x, n) >= kInfBits ? FirstNonFinite(x, n) : kNotFound;
}

uint16_t FloatToHalf(float f) { return FloatToHalfBits(f); }
float HalfToFloat(uint16_t h) { return HalfBitsToFloat(h); }
uint16_t FloatToBfloat16(float f) { return FloatToBf16Bits(f); }
float Bfloat16ToFloat(uint16_t h) { return FromBits(static_cast<uint32_t>(h) << 16); }

FL_CODEC_MULTIVERSION static size_t EncodeFp32Impl(const float* x, size_t n, uint8_t* body) {
  const size_t bad = AbsMaxBits(x, n) >= kInfBits ? FirstNonFinite(x, n) : kNotFound;
  if (bad != kNotFound) return bad;
  if (n > 0) std::memcpy(body, x, n * sizeof(float));
  return kNotFound;
}

FL_CODEC_MULTIVERSION static size_t EncodeFp16Impl(const float* x, size_t n, uint8_t* body) {
  // Codes are at most 0x7c00 in magnitude, so adding 0x400 sets bit 15 exactly for the Inf pattern: OR-ing
  // those sums flags overflow and NaN/Inf without a branch in the loop.
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToHalfBits(x[i]);
    flags |= (h & 0x7fffu) + 0x400u;
    StoreU16(body + 2 * i, h);
  }
  if ((flags & 0x8000u) == 0) return kNotFound;
  for (size_t i = 0; i < n; ++i) {
    if ((FloatToHalfBits(x[i]) & 0x7fffu) >= 0x7c00u) return i;
  }
  return kNotFound;  // unreachable
}

FL_CODEC_MULTIVERSION static size_t EncodeBf16Impl(const float* x, size_t n, uint8_t* body) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToBf16Bits(x[i]);
    flags |= (h & 0x7fffu) + 0x80u;  // bit 15 set iff the exponent is all ones (Inf/NaN/overflow)
    StoreU16(body + 2 * i, h);
  }
  if ((flags & 0x8000u) == 0) return kNotFound;
  for (size_t i = 0; i < n; ++i) {
    if ((FloatToBf16Bits(x[i]) & 0x7fffu) >= 0x7f80u) return i;
  }
  return kNotFound;  // unreachable
}

FL_CODEC_MULTIVERSION static size_t FindNonFiniteFp32Impl(const uint8_t* body, size_t n) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) flags |= (Bits(LoadF32(body + 4 * i)) & 0x7f800000u) + 0x00800000u;
  if ((flags & 0x80000000u) == 0) return kNotFound;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(LoadF32(body + 4 * i))) return i;
  }
  return kNotFound;
}

FL_CODEC_MULTIVERSION static size_t FindNonFiniteFp16Impl(const uint8_t* body, size_t n) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) flags |= (LoadU16(body + 2 * i) & 0x7c00u) + 0x400u;
  if ((flags & 0x8000u) == 0) return kNotFound;
  for (size_t i = 0; i < n; ++i) {
    if ((LoadU16(body + 2 * i) & 0x7c00u) == 0x7c00u) return i;
  }
  return kNotFound;
}

FL_CODEC_MULTIVERSION static size_t FindNonFiniteBf16Impl(const uint8_t* body, size_t n) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) flags |= (LoadU16(body + 2 * i) & 0x7f80u) + 0x80u;
  if ((flags & 0x8000u) == 0) return kNotFound;
  for (size_t i = 0; i < n; ++i) {
    if ((LoadU16(body + 2 * i) & 0x7f80u) == 0x7f80u) return i;
  }
  return kNotFound;
}

FL_CODEC_MULTIVERSION static void DecodeFp32Impl(const uint8_t* body, size_t n, const float* weight, float* out) {
  if (weight == nullptr) {
    if (n > 0) std::memcpy(out, body, n * sizeof(float));
    return;
  }
  const float w = *weight;
  for (size_t i = 0; i < n; ++i) out[i] += w * LoadF32(body + 4 * i);
}

FL_CODEC_MULTIVERSION static void DecodeFp16Impl(const uint8_t* body, size_t n, const float* weight, float* out) {
  if (weight == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(LoadU16(body + 2 * i));
    return;
  }
  const float w = *weight;
  for (size_t i = 0; i < n; ++i) out[i] += w * HalfBitsToFloat(LoadU16(body + 2 * i));
}

FL_CODEC_MULTIVERSION static void DecodeBf16Impl(const uint8_t* body, size_t n, const float* weight, float* out) {
  if (weight == nullptr) {
    for (size_t i = 0; i < n; ++i) out[i] = FromBits(static_cast<uint32_t>(LoadU16(body + 2 * i)) << 16);
    return;
  }
  const float w = *weight;
  for (size_t i = 0; i < n; ++i) out[i] += w * FromBits(static_cast<uint32_t>(LoadU16(body + 2 * i)) << 16);
}

// The element-wise entry points, multiversioned like the blockwise ones.
size_t EncodeFp32(const float* x, size_t n, uint8_t* body) { return EncodeFp32Impl(x, n, body); }
size_t EncodeFp16(const float* x, size_t n, uint8_t* body) { return EncodeFp16Impl(x, n, body); }
size_t EncodeBf16(const float* x, size_t n, uint8_t* body) { return EncodeBf16Impl(x, n, body); }
size_t FindNonFiniteFp32(const uint8_t* body, size_t n) { return FindNonFiniteFp32Impl(body, n); }
size_t FindNonFiniteFp16(const uint8_t* body, size_t n) { return FindNonFiniteFp16Impl(body, n); }
size_t FindNonFiniteBf16(const uint8_t* body, size_t n) { return FindNonFiniteBf16Impl(body, n); }
void DecodeFp32(const uint8_t* body, size_t n, const float* weight, float* out) {
  DecodeFp32Impl(body, n, weight, out);
}
void DecodeFp16(const uint8_t* body, size_t n, const float* weight, float* out) {
  DecodeFp16Impl(body, n, weight, out);
}
void DecodeBf16(const uint8_t* body, size_t n, const float* weight, float* out) {
  DecodeBf16Impl(body, n, weight, out);
}

// ---------------------------------------------------------------------------------------------------------
// Blockwise codecs.
//
// int8 codes are one byte per value in order. 4-bit and 1-bit codes are packed in tiles of eight
// little-endian u32 words, independent of the block size (codec.h): field k of word j holds value j + 8k, so
// a tile is 64 values (4-bit) or 256 (1-bit), and the last tile is padded with zero fields. This interleave
// lets a vector of 8 words be built from (and expanded into) whole vectors of 8 consecutive values with
// shifts and ORs alone: no narrowing, widening or shuffling of lanes, which is what costs most in packing.
//
// Two implementations write the same bytes (the tests compare them):
//  - the general one goes value by value and takes any block size; it handles block sizes that are not a
//    multiple of 32, blocks whose scale is subnormal or capped, and whatever is left after the last group;
//  - the fast one (block % 32 == 0) works on groups of about kGroupValues values (a multiple of both the
//    block and the tile, small enough to be re-read from L1) in passes that each vectorize: absmax per
//    block, scales for all blocks of the group (divisions vectorize across blocks), then codes tile by
//    tile with one scale per 32-value run, which never straddles a block. Each inner loop has a fixed trip
//    count of 32, so there is no per-block prologue, epilogue or alias check.

namespace {

constexpr size_t kRun = 32;            // values that share one scale in the fast path
constexpr size_t kTileBytes = 32;      // bytes per packing tile
constexpr size_t kGroupValues = 2048;  // 8 KiB of input per group

constexpr float kInt8Top = 127.0f;
constexpr float kInt4Top = 7.0f;
constexpr float kFp4Top = 6.0f;

constexpr float TopOf(BlockFormat format) {
  return format == BlockFormat::kInt8   ? kInt8Top
         : format == BlockFormat::kInt4 ? kInt4Top
         : format == BlockFormat::kFp4  ? kFp4Top
                                        : 1.0f;
}

constexpr uint32_t CodeBits(BlockFormat format) {
  return format == BlockFormat::kInt8 ? 8 : format == BlockFormat::kSign1 ? 1 : 4;
}

// Values per tile (int8 has no tiles; 32 keeps the arithmetic below uniform).
constexpr size_t TileValues(BlockFormat format) { return 8 * 32 / CodeBits(format); }

// Code bytes for the first v values, v a multiple of the tile or the total count.
constexpr size_t CodeBytes(BlockFormat format, size_t v) {
  if (format == BlockFormat::kInt8) return v;
  return kTileBytes * ((v + TileValues(format) - 1) / TileValues(format));
}

// Where value i's code lives: byte and bit shift (0 for int8).
struct CodePos {
  size_t byte;
  uint32_t shift;
};
FL_INLINE CodePos PositionOf(BlockFormat format, size_t i) {
  if (format == BlockFormat::kInt8) return {i, 0};
  const size_t tile = i / TileValues(format);
  const size_t r = i % TileValues(format);
  const size_t bit = (r / 8) * CodeBits(format);  // field k = r / 8 of word j = r % 8
  return {tile * kTileBytes + 4 * (r % 8) + bit / 8, static_cast<uint32_t>(bit % 8)};
}

FL_INLINE uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
FL_INLINE void StoreU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// The largest scale whose decoded values are all finite: s * MaxCodeMagnitude(format) <= FLT_MAX. The
// decoder rejects larger scales, so the encoder must never write one.
float MaxScale(BlockFormat format) {
  const float magnitude = MaxCodeMagnitude(format);
  float limit = FLT_MAX / magnitude;
  while (!(limit * magnitude <= FLT_MAX)) limit = std::nextafter(limit, 0.0f);  // round down if needed
  return limit;
}

// Round-to-nearest-even of v (|v| < 2^22) as an int32, via the magic-number trick.
FL_INLINE int32_t RoundToInt(float v) { return static_cast<int32_t>(Bits(v + kRoundMagic) - kRoundMagicBits); }

// ---- Codes. `inv` is 1/scale; the quantized level is rne(x * inv). A normal scale s = absmax/top and
// inv = fl(1/s) keep |x * inv| <= top * (1 + 3 ulp), which rounds to at most `top`, so no clamp is needed.

FL_INLINE uint32_t Int8Code(float x, float inv) { return static_cast<uint32_t>(RoundToInt(x * inv)) & 0xffu; }

// int4: sign bit (8) | rne(|x| / scale) in 0..7.
FL_INLINE uint32_t Int4Code(float x, float inv) {
  const uint32_t u = Bits(x);
  const uint32_t mag = static_cast<uint32_t>(RoundToInt(FromBits(u & 0x7fffffffu) * inv));
  return mag | ((u >> 28) & 8u);
}

// fp4: sign bit (8) | E2M1 code of |x| / scale. With w = 2|x|/scale in [0, 12]: below w = 4 (values < 2)
// the E2M1 grid is uniform with step 0.5, so code = rne(w) for codes 0..4 (values 0, .5, 1, 1.5, 2); the
// remaining decision points 2|3, 3|4 and 4|6 (w = 5, 7, 10) each add one. Ties go to the even code (OCP MX
// rounding): w = 5 and 10 round down to codes 4 and 6, w = 7 up to code 6; hence > and >= as below.
FL_INLINE uint32_t Fp4Code(float x, float inv2) {
  const uint32_t u = Bits(x);
  const float w = FromBits(u & 0x7fffffffu) * inv2;
  // rne(w) capped at 4, kept as the bits of kRoundMagic + code (an integer min of positive floats' bits is
  // their float min, and one instruction); each comparison's all-ones mask is then subtracted.
  int32_t code = std::min(static_cast<int32_t>(Bits(w + kRoundMagic)), static_cast<int32_t>(kRoundMagicBits + 4));
  code -= -static_cast<int32_t>(w > 5.0f);
  code -= -static_cast<int32_t>(w >= 7.0f);
  code -= -static_cast<int32_t>(w > 10.0f);
  return (static_cast<uint32_t>(code) - kRoundMagicBits) | ((u >> 28) & 8u);
}

FL_INLINE uint32_t SignBit(float x) { return Bits(x) >> 31; }

template <BlockFormat kFormat>
FL_INLINE uint32_t CodeOf(float x, float inv) {
  if constexpr (kFormat == BlockFormat::kInt8) return Int8Code(x, inv);
  if constexpr (kFormat == BlockFormat::kInt4) return Int4Code(x, inv);
  if constexpr (kFormat == BlockFormat::kFp4) return Fp4Code(x, inv);
  return SignBit(x);
}

// Multiplier the codes use: 1/scale, or 2/scale for fp4 (whose grid has step 0.5 below 2).
template <BlockFormat kFormat>
FL_INLINE float CodeMultiplier(float inv) {
  return kFormat == BlockFormat::kFp4 ? 2.0f * inv : inv;
}

// ---- Decoded values (before the weight). scale >= 0 has been validated.

FL_INLINE float Int8Value(uint32_t code, float scale) {
  return static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(code))) * scale;
}

// OR-ing the code's sign into a non-negative product negates it.
FL_INLINE float Int4Value(uint32_t code, float scale) {
  return FromBits(Bits(static_cast<float>(static_cast<int32_t>(code & 7u)) * scale) | ((code & 8u) << 28));
}

// E2M1 codes 2..7 are the float with exponent (code >> 1) - 1 and mantissa bit (code & 1), i.e. the bits
// (code << 22) + (126 << 23); codes 0 and 1 (zero and the subnormal 0.5) are patched in.
FL_INLINE float Fp4Value(uint32_t code, float scale) {
  const uint32_t m = code & 7u;
  const uint32_t normal = (m << 22) + (126u << 23);
  const uint32_t small = m == 1u ? 0x3F000000u : 0u;  // 0.5 or 0
  return FromBits(Bits(FromBits(m >= 2u ? normal : small) * scale) | ((code & 8u) << 28));
}

FL_INLINE float SignValue(uint32_t bit, float scale) { return FromBits(Bits(scale) | (bit << 31)); }

template <BlockFormat kFormat>
FL_INLINE float ValueOf(uint32_t code, float scale) {
  if constexpr (kFormat == BlockFormat::kInt8) return Int8Value(code, scale);
  if constexpr (kFormat == BlockFormat::kInt4) return Int4Value(code, scale);
  if constexpr (kFormat == BlockFormat::kFp4) return Fp4Value(code, scale);
  return SignValue(code & 1u, scale);
}

template <bool kAccumulate>
FL_INLINE void Put(float* out, float v, float w) {
  if constexpr (kAccumulate) {
    *out += w * v;
  } else {
    *out = v;
  }
}

// ---- Scales.

// mean |x| over a block: for a fixed sign pattern the scale s minimizing sum (x_i - s*sign(x_i))^2 solves
// sum (s - |x_i|) = 0, i.e. s = mean |x|, so decoding has the least L2 error this format allows. (1-bit Adam
// uses ||x||_2 / sqrt(n) instead, which preserves the norm of the vector rather than minimizing the error;
// it is >= mean |x| by Cauchy-Schwarz, so it overshoots; error feedback corrects either.)
// Sixteen explicit lanes let the compiler vectorize a float sum it may not reassociate; the order of the
// additions is fixed by the code, so the result is the same on every target.
FL_INLINE float MeanAbs(const float* x, size_t len) {
  float lanes[16] = {};
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    for (size_t k = 0; k < 16; ++k) lanes[k] += std::fabs(x[i + k]);
  }
  for (size_t k = 0; i < len; ++i, ++k) lanes[k] += std::fabs(x[i]);
  for (size_t width = 8; width > 0; width /= 2) {
    for (size_t k = 0; k < width; ++k) lanes[k] += lanes[k + width];
  }
  float mean = lanes[0] / static_cast<float>(len);
  if (!std::isfinite(mean)) {
    // The float sum overflowed (values near FLT_MAX): redo it in double, where it cannot.
    double sum = 0;
    for (size_t j = 0; j < len; ++j) sum += std::fabs(static_cast<double>(x[j]));
    mean = static_cast<float>(std::min(sum / static_cast<double>(len), static_cast<double>(FLT_MAX)));
  }
  return mean;
}

// Scale for a block with the given absmax (finite, >= 0); `inv` gets fl(1/scale). Returns false when the
// block needs the clamped path: a subnormal scale (it has lost relative precision, 1/s may overflow) or a
// scale capped at max_scale (values within a factor 128/127 of FLT_MAX). Then x * inv could leave the code
// range.
FL_INLINE bool ScaleFor(float absmax, float top, float max_scale, float* scale, float* inv) {
  float s = absmax / top;
  bool normal = s >= FLT_MIN || s == 0.0f;
  if (s > max_scale) {
    s = max_scale;
    normal = false;
  }
  *scale = s;
  // For an all-zero block any finite multiplier gives code 0; avoiding 1/0 keeps the path uniform.
  *inv = 1.0f / std::max(s, FLT_MIN);
  return normal;
}

// ---- The general path: blocks [b0, b1), value by value.

template <BlockFormat kFormat>
size_t EncodeGeneral(const float* x, size_t n, size_t block, uint8_t* body, size_t b0, size_t b1) {
  const size_t blocks = (n + block - 1) / block;
  uint8_t* codes = body + 4 * blocks;
  const size_t v0 = b0 * block;
  const size_t v1 = std::min(b1 * block, n);
  // Codes are OR-ed into place; v0 and v1 are tile boundaries (or n), so this touches only our bytes.
  if (v1 > v0) {
    std::memset(codes + CodeBytes(kFormat, v0), 0, CodeBytes(kFormat, v1) - CodeBytes(kFormat, v0));
  }
  const float top = TopOf(kFormat);
  const float max_scale = MaxScale(kFormat);
  for (size_t b = b0; b < b1; ++b) {
    const size_t begin = b * block;
    const size_t len = std::min(block, n - begin);
    const float* xb = x + begin;
    const int32_t max_bits = AbsMaxBits(xb, len);
    if (max_bits >= kInfBits) return begin + FirstNonFinite(xb, len);
    float scale = 0.0f;
    float inv = 0.0f;
    bool normal = true;
    if constexpr (kFormat == BlockFormat::kSign1) {
      scale = MeanAbs(xb, len);
    } else {
      normal = ScaleFor(FromBits(static_cast<uint32_t>(max_bits)), top, max_scale, &scale, &inv);
    }
    for (size_t i = 0; i < len; ++i) {
      uint32_t code;
      if (normal) {
        code = CodeOf<kFormat>(xb[i], CodeMultiplier<kFormat>(inv));
      } else {
        // Re-express the value on a scale of 1, clamped to the code range, then round as usual.
        code = CodeOf<kFormat>(std::clamp(xb[i] / scale, -top, top), CodeMultiplier<kFormat>(1.0f));
      }
      const CodePos pos = PositionOf(kFormat, begin + i);
      codes[pos.byte] = static_cast<uint8_t>(codes[pos.byte] | (code << pos.shift));
    }
    StoreF32(body + 4 * b, scale);
  }
  return kNotFound;
}

template <BlockFormat kFormat, bool kAccumulate>
void DecodeGeneral(const uint8_t* body, size_t n, size_t block, size_t b0, size_t b1, float w, float* out) {
  const size_t blocks = (n + block - 1) / block;
  const uint8_t* codes = body + 4 * blocks;
  const uint32_t mask = kFormat == BlockFormat::kInt8 ? 0xffu : kFormat == BlockFormat::kSign1 ? 1u : 15u;
  for (size_t b = b0; b < b1; ++b) {
    const size_t begin = b * block;
    const size_t len = std::min(block, n - begin);
    const float scale = LoadF32(body + 4 * b);
    for (size_t i = begin; i < begin + len; ++i) {
      const CodePos pos = PositionOf(kFormat, i);
      Put<kAccumulate>(out + i, ValueOf<kFormat>((codes[pos.byte] >> pos.shift) & mask, scale), w);
    }
  }
}

// ---- The fast path.

struct GroupShape {
  size_t values;  // per group: a multiple of the block and of the tile
  size_t blocks;  // per group
  size_t runs;    // per group
};

FL_INLINE GroupShape ShapeFor(BlockFormat format, size_t block) {
  const size_t tile = TileValues(format);
  const size_t unit = std::lcm(block, tile);
  const size_t values = unit * std::max<size_t>(1, kGroupValues / unit);
  return {values, values / block, values / kRun};
}

// Codes for one group of whole tiles; run_mult[r] is the code multiplier of run r (values 32r .. 32r+31).
template <BlockFormat kFormat>
FL_INLINE void EncodeTiles(const float* __restrict x, size_t values, const float* __restrict run_mult,
                           uint8_t* __restrict q) {
  if constexpr (kFormat == BlockFormat::kInt8) {
    for (size_t r = 0; r < values / kRun; ++r) {
      const float m = run_mult[r];
      const float* __restrict xr = x + r * kRun;
      uint8_t* __restrict qr = q + r * kRun;
      for (size_t j = 0; j < kRun; ++j) qr[j] = static_cast<uint8_t>(Int8Code(xr[j], m));
    }
  } else if constexpr (kFormat == BlockFormat::kSign1) {
    // Tile of 256: bit k of word j = sign of value j + 8k. Signs need no scale.
    for (size_t t = 0; t < values / 256; ++t) {
      const float* __restrict xt = x + t * 256;
      uint8_t* __restrict qt = q + t * kTileBytes;
      for (size_t j = 0; j < 8; ++j) {
        uint32_t word = 0;
        // Unrolled so that the loop over j (8 words = 8 consecutive values per field) is what vectorizes.
#pragma GCC unroll 32
        for (uint32_t k = 0; k < 32; ++k) word |= SignBit(xt[8 * k + j]) << k;
        StoreU32(qt + 4 * j, word);
      }
    }
  } else {
    // Tile of 64: nibble k of word j = value j + 8k; fields 0-3 are the first 32-value run, 4-7 the second.
    for (size_t t = 0; t < values / 64; ++t) {
      const float lo_m = run_mult[2 * t];
      const float hi_m = run_mult[2 * t + 1];
      const float* __restrict xt = x + t * 64;
      uint8_t* __restrict qt = q + t * kTileBytes;
      for (size_t j = 0; j < 8; ++j) {
        uint32_t word = 0;
        for (uint32_t k = 0; k < 4; ++k) word |= CodeOf<kFormat>(xt[8 * k + j], lo_m) << (4 * k);
        for (uint32_t k = 4; k < 8; ++k) word |= CodeOf<kFormat>(xt[8 * k + j], hi_m) << (4 * k);
        StoreU32(qt + 4 * j, word);
      }
    }
  }
}

template <BlockFormat kFormat, bool kAccumulate>
FL_INLINE void DecodeTiles(const uint8_t* __restrict q, size_t values, const float* __restrict run_scale, float w,
                           float* __restrict out) {
  if constexpr (kFormat == BlockFormat::kInt8) {
    for (size_t r = 0; r < values / kRun; ++r) {
      const float s = run_scale[r];
      const uint8_t* __restrict qr = q + r * kRun;
      float* __restrict o = out + r * kRun;
      for (size_t j = 0; j < kRun; ++j) Put<kAccumulate>(o + j, Int8Value(qr[j], s), w);
    }
  } else if constexpr (kFormat == BlockFormat::kSign1) {
    for (size_t t = 0; t < values / 256; ++t) {
      const uint8_t* __restrict qt = q + t * kTileBytes;
      float* __restrict o = out + t * 256;
      const float* __restrict s = run_scale + 8 * t;
      for (size_t j = 0; j < 8; ++j) {
        const uint32_t word = LoadU32(qt + 4 * j);
#pragma GCC unroll 32
        for (uint32_t k = 0; k < 32; ++k) {
          Put<kAccumulate>(o + 8 * k + j, SignValue((word >> k) & 1u, s[k / 4]), w);
        }
      }
    }
  } else {
    for (size_t t = 0; t < values / 64; ++t) {
      const float lo_s = run_scale[2 * t];
      const float hi_s = run_scale[2 * t + 1];
      const uint8_t* __restrict qt = q + t * kTileBytes;
      float* __restrict o = out + t * 64;
      for (size_t j = 0; j < 8; ++j) {
        const uint32_t word = LoadU32(qt + 4 * j);
        for (uint32_t k = 0; k < 4; ++k) {
          Put<kAccumulate>(o + 8 * k + j, ValueOf<kFormat>(word >> (4 * k), lo_s), w);
        }
        for (uint32_t k = 4; k < 8; ++k) {
          Put<kAccumulate>(o + 8 * k + j, ValueOf<kFormat>(word >> (4 * k), hi_s), w);
        }
      }
    }
  }
}

template <BlockFormat kFormat>
FL_INLINE size_t EncodeAll(const float* x, size_t n, size_t block, uint8_t* body) {
  const size_t blocks = (n + block - 1) / block;
  if (block % kRun != 0) return EncodeGeneral<kFormat>(x, n, block, body, 0, blocks);
  uint8_t* codes = body + 4 * blocks;
  const GroupShape shape = ShapeFor(kFormat, block);
  const size_t groups = n / shape.values;
  const size_t runs_per_block = block / kRun;
  const float top = TopOf(kFormat);
  const float max_scale = MaxScale(kFormat);
  // Per-group scratch; a group is at most a few thousand values except for huge blocks.
  std::vector<float> scratch(2 * shape.blocks + shape.runs);
  float* scale = scratch.data();
  float* mult = scale + shape.blocks;
  float* run_mult = mult + shape.blocks;
  for (size_t g = 0; g < groups; ++g) {
    const size_t b0 = g * shape.blocks;
    const float* xg = x + g * shape.values;
    // 1. absmax per block (also flags NaN/Inf: see AbsMaxBits).
    int32_t group_max = 0;
    for (size_t b = 0; b < shape.blocks; ++b) {
      const int32_t m = AbsMaxBitsRuns(xg + b * block, runs_per_block);
      scale[b] = FromBits(static_cast<uint32_t>(m));  // the absmax for now
      group_max = std::max(group_max, m);
    }
    if (group_max >= kInfBits) return g * shape.values + FirstNonFinite(xg, shape.values);
    // 2. scales and code multipliers for every block of the group.
    if constexpr (kFormat == BlockFormat::kSign1) {
      for (size_t b = 0; b < shape.blocks; ++b) scale[b] = MeanAbs(xg + b * block, block);
    } else {
      uint32_t unusual = 0;
      const uint32_t max_bits = Bits(max_scale);
      for (size_t b = 0; b < shape.blocks; ++b) {
        const float s = scale[b] / top;
        // s >= 0, so integer comparisons of the bits order like the floats; unlike float comparisons (which
        // may trap on NaN, as far as the compiler knows), they let this loop vectorize.
        const uint32_t bits = Bits(s);
        unusual |= (bits > max_bits ? 1u : 0u) | (bits - 1u < 0x007fffffu ? 1u : 0u);  // capped / subnormal
        scale[b] = s;
        // For an all-zero block any finite multiplier gives code 0; clamping avoids 1/0.
        mult[b] = CodeMultiplier<kFormat>(1.0f / FromBits(bits < 0x00800000u ? 0x00800000u : bits));
      }
      if (unusual != 0) {  // a subnormal or capped scale: let the general path redo this group
        const size_t bad = EncodeGeneral<kFormat>(x, n, block, body, b0, b0 + shape.blocks);
        if (bad != kNotFound) return bad;
        continue;
      }
      if (runs_per_block > 1) {
        for (size_t b = 0; b < shape.blocks; ++b) {
          for (size_t r = 0; r < runs_per_block; ++r) run_mult[b * runs_per_block + r] = mult[b];
        }
      }
    }
    std::memcpy(body + 4 * b0, scale, 4 * shape.blocks);
    // 3. codes.
    EncodeTiles<kFormat>(xg, shape.values, runs_per_block > 1 ? run_mult : mult,
                         codes + CodeBytes(kFormat, g * shape.values));
  }
  if (groups * shape.blocks < blocks) {
    return EncodeGeneral<kFormat>(x, n, block, body, groups * shape.blocks, blocks);
  }
  return kNotFound;
}

template <BlockFormat kFormat, bool kAccumulate>
FL_INLINE void DecodeAll(const uint8_t* body, size_t n, size_t block, float w, float* out) {
  const size_t blocks = (n + block - 1) / block;
  if (block % kRun != 0) return DecodeGeneral<kFormat, kAccumulate>(body, n, block, 0, blocks, w, out);
  const uint8_t* codes = body + 4 * blocks;
  const GroupShape shape = ShapeFor(kFormat, block);
  const size_t groups = n / shape.values;
  const size_t runs_per_block = block / kRun;
  std::vector<float> run_scale(shape.runs);
  for (size_t g = 0; g < groups; ++g) {
    const size_t b0 = g * shape.blocks;
    for (size_t b = 0; b < shape.blocks; ++b) {
      const float s = LoadF32(body + 4 * (b0 + b));
      for (size_t r = 0; r < runs_per_block; ++r) run_scale[b * runs_per_block + r] = s;
    }
    DecodeTiles<kFormat, kAccumulate>(codes + CodeBytes(kFormat, g * shape.values), shape.values, run_scale.data(), w,
                                      out + g * shape.values);
  }
  if (groups * shape.blocks < blocks) {
    DecodeGeneral<kFormat, kAccumulate>(body, n, block, groups * shape.blocks, blocks, w, out);
  }
}

// The multiversioned entry points: one per (format, direction), so that each clone holds fully inlined loops.
#define FL_CODEC_ENCODER(Name, Format)                                                       \
  FL_CODEC_MULTIVERSION size_t Name(const float* x, size_t n, size_t block, uint8_t* body) { \
    return EncodeAll<Format>(x, n, block, body);                                             \
  }
FL_CODEC_ENCODER(EncodeInt8All, BlockFormat::kInt8)
FL_CODEC_ENCODER(EncodeInt4All, BlockFormat::kInt4)
FL_CODEC_ENCODER(EncodeFp4All, BlockFormat::kFp4)
FL_CODEC_ENCODER(EncodeSign1All, BlockFormat::kSign1)
#undef FL_CODEC_ENCODER

#define FL_CODEC_DECODER(Name, Format, Acc)                                                           \
  FL_CODEC_MULTIVERSION void Name(const uint8_t* body, size_t n, size_t block, float w, float* out) { \
    DecodeAll<Format, Acc>(body, n, block, w, out);                                                   \
  }
FL_CODEC_DECODER(DecodeInt8All, BlockFormat::kInt8, false)
FL_CODEC_DECODER(AccumulateInt8All, BlockFormat::kInt8, true)
FL_CODEC_DECODER(DecodeInt4All, BlockFormat::kInt4, false)
FL_CODEC_DECODER(AccumulateInt4All, BlockFormat::kInt4, true)
FL_CODEC_DECODER(DecodeFp4All, BlockFormat::kFp4, false)
FL_CODEC_DECODER(AccumulateFp4All, BlockFormat::kFp4, true)
FL_CODEC_DECODER(DecodeSign1All, BlockFormat::kSign1, false)
FL_CODEC_DECODER(AccumulateSign1All, BlockFormat::kSign1, true)
#undef FL_CODEC_DECODER

}  // namespace

size_t BlockBodyBytes(BlockFormat format, size_t n, size_t block) {
  return 4 * ((n + block - 1) / block) + CodeBytes(format, n);
}

float MaxCodeMagnitude(BlockFormat format) {
  switch (format) {
    case BlockFormat::kInt8: return 128.0f;  // the encoder never writes -128, but it decodes
    case BlockFormat::kInt4: return kInt4Top;
    case BlockFormat::kFp4: return kFp4Top;
    case BlockFormat::kSign1: return 1.0f;
  }
  return 1.0f;
}

size_t EncodeBlocks(BlockFormat format, const float* x, size_t n, size_t block, uint8_t* body) {
  switch (format) {
    case BlockFormat::kInt8: return EncodeInt8All(x, n, block, body);
    case BlockFormat::kInt4: return EncodeInt4All(x, n, block, body);
    case BlockFormat::kFp4: return EncodeFp4All(x, n, block, body);
    case BlockFormat::kSign1: return EncodeSign1All(x, n, block, body);
  }
  return kNotFound;
}

size_t EncodeBlocksGeneralForTesting(BlockFormat format, const float* x, size_t n, size_t block, uint8_t* body) {
  const size_t blocks = (n + block - 1) / block;
  switch (format) {
    case BlockFormat::kInt8: return EncodeGeneral<BlockFormat::kInt8>(x, n, block, body, 0, blocks);
    case BlockFormat::kInt4: return EncodeGeneral<BlockFormat::kInt4>(x, n, block, body, 0, blocks);
    case BlockFormat::kFp4: return EncodeGeneral<BlockFormat::kFp4>(x, n, block, body, 0, blocks);
    case BlockFormat::kSign1: return EncodeGeneral<BlockFormat::kSign1>(x, n, block, body, 0, blocks);
  }
  return kNotFound;
}

void DecodeBlocksGeneralForTesting(BlockFormat format, const uint8_t* body, size_t n, size_t block, float* out) {
  const size_t blocks = (n + block - 1) / block;
  switch (format) {
    case BlockFormat::kInt8: return DecodeGeneral<BlockFormat::kInt8, false>(body, n, block, 0, blocks, 1, out);
    case BlockFormat::kInt4: return DecodeGeneral<BlockFormat::kInt4, false>(body, n, block, 0, blocks, 1, out);
    case BlockFormat::kFp4: return DecodeGeneral<BlockFormat::kFp4, false>(body, n, block, 0, blocks, 1, out);
    case BlockFormat::kSign1: return DecodeGeneral<BlockFormat::kSign1, false>(body, n, block, 0, blocks, 1, out);
  }
}

size_t FindBadScale(BlockFormat format, const uint8_t* body, size_t n, size_t block) {
  const size_t blocks = (n + block - 1) / block;
  const float safe = MaxScale(format);
  uint32_t bad = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const float s = LoadF32(body + 4 * b);
    bad |= (s >= 0.0f && s <= safe) ? 0u : 1u;  // false for NaN too
  }
  if (bad == 0) return kNotFound;
  for (size_t b = 0; b < blocks; ++b) {
    const float s = LoadF32(body + 4 * b);
    if (!(s >= 0.0f && s <= safe)) return b;
  }
  return kNotFound;
}

bool PaddingIsZero(BlockFormat format, const uint8_t* body, size_t n, size_t block) {
  if (format == BlockFormat::kInt8) return true;
  const uint8_t* codes = body + 4 * ((n + block - 1) / block);
  const size_t tile_values = TileValues(format);
  const size_t padded = CodeBytes(format, n) / kTileBytes * tile_values;
  const uint32_t mask = (1u << CodeBits(format)) - 1;
  for (size_t i = n; i < padded; ++i) {
    const CodePos pos = PositionOf(format, i);
    if (((codes[pos.byte] >> pos.shift) & mask) != 0) return false;
  }
  return true;
}

void DecodeBlocks(BlockFormat format, const uint8_t* body, size_t n, size_t block, const float* weight, float* out) {
  const bool acc = weight != nullptr;
  const float w = acc ? *weight : 1.0f;
  switch (format) {
    case BlockFormat::kInt8:
      return acc ? AccumulateInt8All(body, n, block, w, out) : DecodeInt8All(body, n, block, w, out);
    case BlockFormat::kInt4:
      return acc ? AccumulateInt4All(body, n, block, w, out) : DecodeInt4All(body, n, block, w, out);
    case BlockFormat::kFp4:
      return acc ? AccumulateFp4All(body, n, block, w, out) : DecodeFp4All(body, n, block, w, out);
    case BlockFormat::kSign1:
      return acc ? AccumulateSign1All(body, n, block, w, out) : DecodeSign1All(body, n, block, w, out);
  }
}

}  // namespace fl::core::codec_internal
