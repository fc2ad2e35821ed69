// The hot loops of the codecs, kept apart from the payload framing in codec.cc.
//
// Every function here works on raw pointers whose sizes the caller has already checked against the header:
// no validation of lengths happens at this level. Bodies are little-endian (codec.cc asserts the host is).
// Loops are written so that GCC and Clang auto-vectorize them at -O3 for any target (SSE2 on a baseline
// x86-64 build, NEON on arm64): no intrinsics, branch-free bodies, bit manipulation instead of tables.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fl::core::codec_internal {

// Returned by the scanning functions when nothing was found.
inline constexpr size_t kNotFound = static_cast<size_t>(-1);

// Index of the first NaN/Inf in x, or kNotFound.
size_t FindNonFinite(const float* x, size_t n);

// ---- Element-wise codecs. Encoders return the index of the first value they cannot represent (NaN/Inf,
// or beyond the format's range), or kNotFound when the whole body was written.
size_t EncodeFp32(const float* x, size_t n, uint8_t* body);
size_t EncodeFp16(const float* x, size_t n, uint8_t* body);
size_t EncodeBf16(const float* x, size_t n, uint8_t* body);

// Index of the first code that is not finite (Inf/NaN pattern), or kNotFound.
size_t FindNonFiniteFp32(const uint8_t* body, size_t n);
size_t FindNonFiniteFp16(const uint8_t* body, size_t n);
size_t FindNonFiniteBf16(const uint8_t* body, size_t n);

// Decoders assume a validated body (every code finite). weight == nullptr: out = value; otherwise
// out += *weight * value.
void DecodeFp32(const uint8_t* body, size_t n, const float* weight, float* out);
void DecodeFp16(const uint8_t* body, size_t n, const float* weight, float* out);
void DecodeBf16(const uint8_t* body, size_t n, const float* weight, float* out);

// Scalar conversions (exposed for tests and error messages).
uint16_t FloatToHalf(float f);  // round to nearest even; overflow gives the Inf pattern
float HalfToFloat(uint16_t h);
uint16_t FloatToBfloat16(float f);  // round to nearest even; overflow gives the Inf pattern
float Bfloat16ToFloat(uint16_t h);

// ---- Blockwise codecs. Body = ceil(n/block) f32 scales, then the codes packed in 32-byte tiles (codec.h).
enum class BlockFormat : uint8_t { kInt8, kInt4, kFp4, kSign1 };

// Whole body for n values in blocks of `block`.
size_t BlockBodyBytes(BlockFormat format, size_t n, size_t block);
// The largest |code value| a scale multiplies when decoding (int8 -128 included): a scale s decodes to
// finite values iff s * MaxCodeMagnitude <= FLT_MAX.
float MaxCodeMagnitude(BlockFormat format);

// Encodes the whole body; returns the index of the first NaN/Inf (body then incomplete) or kNotFound.
size_t EncodeBlocks(BlockFormat format, const float* x, size_t n, size_t block, uint8_t* body);

// Index of the first scale that is negative, NaN, Inf or too large to decode to finite values; kNotFound
// when all are fine.
size_t FindBadScale(BlockFormat format, const uint8_t* body, size_t n, size_t block);
// True when the unused bits of the last, partial tile (odd count for 4-bit codecs, sign1) are zero.
bool PaddingIsZero(BlockFormat format, const uint8_t* body, size_t n, size_t block);

// Decodes a validated body: weight == nullptr: out = value; otherwise out += *weight * value.
void DecodeBlocks(BlockFormat format, const uint8_t* body, size_t n, size_t block, const float* weight, float* out);

// The value-by-value reference implementation that EncodeBlocks / DecodeBlocks fall back on; the fast
// paths must produce identical bytes and values (codec_kernels_test.cc).
size_t EncodeBlocksGeneralForTesting(BlockFormat format, const float* x, size_t n, size_t block, uint8_t* body);
void DecodeBlocksGeneralForTesting(BlockFormat format, const uint8_t* body, size_t n, size_t block, float* out);

}  // namespace fl::core::codec_internal
