// Codecs: how a vector of fp32 values (a model, an update, a pseudo-gradient fragment) is put on the wire.
//
// Every codec writes a self-describing payload: a fixed 32-byte header (magic, format version, codec kind,
// block size, element count, checksum of the body) followed by the codec's body. Decoders verify all of
// it before touching the output, so a truncated, oversized or corrupt payload is rejected with an error that
// says what was wrong and never reaches an aggregate.
//
// Header layout (little-endian):
//   0  u32 magic 'FLCD'   4  u8 format version (1)   5  u8 CodecKind   6  u16 flags
//   8  u32 block size     12 u32 reserved (0)         16 u64 element count   24 u64 Checksum64(body)
// Block size is 0 for the element-wise codecs (fp32, fp16, bf16). Flags: bit 0 (kCodecFlagNoBodyChecksum) says
// the body checksum was not computed (the field is 0) because the payload travels inside a transfer that is
// checksummed as a whole (fl-client's uploads: XXH3-64 of the payload in the upload's trailer); such a payload
// is decoded only with DecodeOptions::transfer_verified. Other flag bits are reserved (0).
//
// Why the flag: on fl's federation wire every payload is covered twice, by the transfer's XXH3 and by this
// body checksum, and the second pass over a 100 MB update cost 6% of a round's CPU (docs/performance.md).
// Payloads stored or sent without a transfer checksum (checkpoints, islands' fragments) keep the body checksum.
//
// Bodies (little-endian; n values, block size B):
//   fp32: n f32.   fp16, bf16: n u16 (round to nearest even).
//   int8, int4, fp4, sign1: ceil(n/B) f32 scales (block i covers values [iB, iB+B), the last one the rest),
//   then the codes:
//   int8:  n bytes in value order, two's complement in [-127, 127]; value = q * scale. (-128 is never
//          written; a decoder reads it as -128 * scale, still finite.)
//   int4, fp4: tiles of 64 values, each 8 u32 words (32 bytes): bits 4k..4k+3 of word j hold value j + 8k of
//          the tile. A nibble is sign (bit 3, set = negative) | magnitude code (bits 0-2): int4: the
//          magnitude 0..7 itself; fp4: the E2M1 code of {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Every nibble is valid.
//   sign1: tiles of 256 values, each 8 u32 words: bit k of word j is the sign of value j + 8k of the tile
//          (set = negative, -0 included); value = +/- scale.
//   The last tile is padded with zero fields (checked by the decoder), so the code bytes are
//   32 * ceil(n/64) for int4/fp4 and 32 * ceil(n/256) for sign1. The interleave (value j + 8k in word j)
//   is what lets both directions vectorize: eight consecutive values fill one field of eight words with
//   shifts and ORs, with no narrowing or shuffling of vector lanes. Tiles do not depend on B.
//
// Rounding: int8/int4 round x/scale to the nearest integer (ties to even); fp4 rounds x/scale to the nearest
// E2M1 value, ties to the even code (OCP MX rule); x/scale is computed as x times the float reciprocal of
// the scale, which moves a value by at most a few ulp. Error bounds per value: int8 absmax_block/254, int4
// absmax_block/14, fp4 half the gap between the two E2M1 neighbours times the scale (at most
// absmax_block/6), each plus that fp slack. Blocks whose scale would be subnormal (absmax below ~1e-36) or
// too large to decode finitely (absmax within 1% of FLT_MAX) are quantized by division with clamping, so
// their bound holds only approximately; neither occurs in real updates.
//
// Range: encoders reject NaN/Inf inputs, naming the index. fp16 also rejects finite values that round
// beyond its range (|x| >= 65520) instead of saturating them: a silently clipped update changes the model
// in a way nobody sees, whereas the error says which tensor needs bf16/fp32. bf16 does the same for the
// (rare) values that round above its largest finite value. The blockwise codecs cannot overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::core {

enum class CodecKind : uint8_t {
  kFp32 = 1,       // raw IEEE binary32
  kFp16 = 2,       // IEEE binary16, round to nearest even
  kBf16 = 3,       // bfloat16, round to nearest even
  kInt8Block = 4,  // per block: fp32 scale = absmax/127, int8 values, round to nearest
  kInt4Block = 5,  // per block: fp32 scale = absmax/7, int4 values in [-7, 7], two per byte
  kFp4E2M1 = 6,    // per block: fp32 scale = absmax/6, FP4 E2M1 values {0,.5,1,1.5,2,3,4,6} x sign
  kSign1 = 7,      // per block: fp32 scale = mean |x|, one sign bit per value
};

inline constexpr size_t kCodecHeaderBytes = 32;
inline constexpr uint32_t kCodecMagic = 0x44434c46;  // "FLCD" read as little-endian u32
inline constexpr uint8_t kCodecFormatVersion = 1;

std::string_view CodecKindName(CodecKind kind);  // "fp32", "fp16", "bf16", "int8", "int4", "fp4", "sign1"
// The inverse of CodecKindName; the error lists the known names.
absl::StatusOr<CodecKind> ParseCodecKind(std::string_view name);
// Values per scale when CodecOptions::block_size is 0: int8 256, int4 64, fp4 32, sign1 256; 0 for the
// element-wise codecs.
uint32_t CodecDefaultBlockSize(CodecKind kind);

struct CodecOptions {
  // Values per scale for the blockwise codecs; 0 picks the codec's default. Ignored by fp32/fp16/bf16.
  uint32_t block_size = 0;
};

inline constexpr uint16_t kCodecFlagNoBodyChecksum = 1;

struct EncodeOptions {
  // false: skip the pass that computes the body checksum and set kCodecFlagNoBodyChecksum instead. Only for a
  // payload whose transfer carries its own checksum of these bytes, checked by the receiver before decoding.
  bool body_checksum = true;
};

struct DecodeOptions {
  // The caller has verified these exact payload bytes with a transfer checksum (XXH3-64 of the whole payload):
  // the body checksum is not checked again, and payloads encoded without one are accepted. Every other check
  // (header, length, NaN/Inf, scales, padding) still runs.
  bool transfer_verified = false;
};

// A Codec is immutable: every method is const and safe to call from several threads at once.
class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecKind kind() const = 0;
  std::string_view name() const { return CodecKindName(kind()); }
  // Values per scale; 0 for the element-wise codecs.
  virtual uint32_t block_size() const = 0;

  // Exact payload size in bytes (header included) for `num_values` values.
  virtual size_t EncodedSize(size_t num_values) const = 0;

  // Encodes `values` into `out`, which is resized to EncodedSize(values.size()). Rejects NaN/Inf inputs (and,
  // for fp16/bf16, values beyond the format's range), naming the index; `out` is then left empty.
  absl::Status Encode(std::span<const float> values, std::vector<uint8_t>* out) const {
    return Encode(values, out, EncodeOptions{});
  }
  virtual absl::Status Encode(std::span<const float> values, std::vector<uint8_t>* out,
                              const EncodeOptions& options) const = 0;

  // Decodes a payload holding exactly out.size() values. The payload is fully validated first (header,
  // exact length, checksum, scales / codes that would decode to NaN/Inf): on error `out` is untouched. A payload
  // without a body checksum (kCodecFlagNoBodyChecksum) is refused (DATA_LOSS) unless options.transfer_verified.
  absl::Status Decode(std::span<const uint8_t> payload, std::span<float> out) const {
    return Decode(payload, out, DecodeOptions{});
  }
  virtual absl::Status Decode(std::span<const uint8_t> payload, std::span<float> out,
                              const DecodeOptions& options) const = 0;

  // acc[i] += weight * decoded[i] (the same float operations as Decode followed by that update). The payload
  // and weight (must be finite) are fully validated first: on error `acc` is untouched.
  virtual absl::Status DecodeAccumulate(std::span<const uint8_t> payload, float weight, std::span<float> acc) const = 0;
};

// A codec by kind, with options validated (block size must be a positive multiple of 2 for the 4-bit and
// of 8 for the 1-bit codec, at most 1<<20).
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(CodecKind kind, const CodecOptions& options = {});
// A codec by name as written in configs and manifests: "fp32", "fp16", "bf16", "int8", "int4", "fp4",
// "sign1", optionally with a block size: "int8:128".
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(std::string_view spec);

struct PayloadInfo {
  CodecKind kind;
  uint32_t block_size;
  uint64_t num_values;
};
// Reads and checks a payload's header and that the payload's length is the one the header implies (not the
// body's checksum or contents, which Decode checks): lets a receiver pick the codec from the bytes.
absl::StatusOr<PayloadInfo> PeekPayload(std::span<const uint8_t> payload);
// An fp32 payload built in place: the caller sized `payload` to EncodedSize(n) of the fp32 codec and wrote the n
// values into the body (after the header) as little-endian floats, e.g. computing an update straight into it;
// this checks that every value is finite (InvalidArgument naming the first index that is not, as Encode) and
// writes the header. The result is byte for byte what the fp32 codec's Encode makes of the same values, without
// its copy of them. InvalidArgument when the size is not a whole fp32 payload.
absl::Status SealFp32Payload(std::span<uint8_t> payload, const EncodeOptions& options = {});

// The same checks from the header alone (its first kCodecHeaderBytes bytes) and the payload's length, for a
// receiver that put the body somewhere else as it arrived (fl-client writes an fp32 model's body straight into
// its parameters): the body itself is the receiver's to check (finite values; its transfer checksum).
absl::StatusOr<PayloadInfo> PeekPayloadHeader(std::span<const uint8_t> header, uint64_t payload_bytes);

// Error feedback (as in 1-bit Adam / EF-SGD): the part of each input that the codec lost is kept and added
// to the next input, so that the running sum of decoded values tracks the running sum of inputs to within
// one step's error, however many steps are taken.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t num_values) : residual_(num_values, 0.0f) {}

  // Encodes values + residual, then sets residual = (values + residual) − decode(payload). On error (a size
  // mismatch, a NaN/Inf input) the residual is left as it was, so the caller may skip the step.
  absl::Status Encode(const Codec& codec, std::span<const float> values, std::vector<uint8_t>* out,
                      const EncodeOptions& options = {});

  std::span<const float> residual() const { return residual_; }
  void Reset();

 private:
  std::vector<float> residual_;
  std::vector<float> scratch_;
};

}  // namespace fl::core
