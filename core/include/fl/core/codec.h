// Codecs: how a vector of fp32 values (a model, an update, a pseudo-gradient fragment) is put on the wire.
//
// Every codec writes a self-describing payload: a fixed 32-byte header (magic, format version, codec kind,
// block size, element count, checksum of the body) followed by the codec's body. Decoders verify all of
// it before touching the output, so a truncated, oversized or corrupt payload is rejected with an error that
// says what was wrong and never reaches an aggregate.
//
// Header layout (little-endian):
//   0  u32 magic 'FLCD'   4  u8 format version (1)   5  u8 CodecKind   6  u16 reserved (0)
//   8  u32 block size     12 u32 reserved (0)         16 u64 element count   24 u64 Checksum64(body)
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

struct CodecOptions {
  // Values per scale for the blockwise codecs; 0 picks the codec's default. Ignored by fp32/fp16/bf16.
  uint32_t block_size = 0;
};

class Codec {
 public:
  virtual ~Codec() = default;

  virtual CodecKind kind() const = 0;
  std::string_view name() const { return CodecKindName(kind()); }
  // Values per scale; 0 for the element-wise codecs.
  virtual uint32_t block_size() const = 0;

  // Exact payload size in bytes (header included) for `num_values` values.
  virtual size_t EncodedSize(size_t num_values) const = 0;

  // Encodes `values` into `out`, which is resized to EncodedSize(values.size()). Rejects NaN/Inf inputs.
  virtual absl::Status Encode(std::span<const float> values, std::vector<uint8_t>* out) const = 0;

  // Decodes a payload holding exactly out.size() values. On error `out` may be partly written but the
  // status says why; nothing else is touched.
  virtual absl::Status Decode(std::span<const uint8_t> payload, std::span<float> out) const = 0;

  // acc[i] += weight * decoded[i]. The payload is fully validated first: on error `acc` is untouched.
  virtual absl::Status DecodeAccumulate(std::span<const uint8_t> payload, float weight,
                                        std::span<float> acc) const = 0;
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
// Reads and checks a payload's header (not its body): lets a receiver pick the codec from the bytes.
absl::StatusOr<PayloadInfo> PeekPayload(std::span<const uint8_t> payload);

// Error feedback (as in 1-bit Adam / EF-SGD): the part of each input that the codec lost is kept and added
// to the next input, so that the running sum of decoded values tracks the running sum of inputs to within
// one step's error, however many steps are taken.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t num_values) : residual_(num_values, 0.0f) {}

  // Encodes values + residual, then sets residual = (values + residual) − decode(payload).
  absl::Status Encode(const Codec& codec, std::span<const float> values, std::vector<uint8_t>* out);

  std::span<const float> residual() const { return residual_; }
  void Reset();

 private:
  std::vector<float> residual_;
  std::vector<float> scratch_;
};

}  // namespace fl::core
