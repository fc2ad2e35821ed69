// Codec payload framing, validation and the Codec implementations; the loops live in codec_kernels.cc.
#include "fl/core/codec.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "codec_kernels_internal.h"
#include "fl/core/checksum.h"
#include "fl/core/str_cat.h"

namespace fl::core {

// Bodies are the host's float and integer bytes copied as they are; every supported target (x86-64, arm64)
// is little-endian. A big-endian port needs byte swaps in codec_kernels.cc, not a silent format change.
static_assert(std::endian::native == std::endian::little, "codec bodies are little-endian");

namespace {

namespace ci = codec_internal;

constexpr uint32_t kMaxBlockSize = 1u << 20;
// More values than any payload can hold (2^56 values are 2^58 bytes of fp32): rejecting such headers early
// keeps every size computation below far from overflow.
constexpr uint64_t kMaxValues = uint64_t{1} << 56;

bool IsBlockwise(CodecKind kind) {
  return kind == CodecKind::kInt8Block || kind == CodecKind::kInt4Block || kind == CodecKind::kFp4E2M1 ||
         kind == CodecKind::kSign1;
}

bool IsKnownKind(uint8_t byte) { return byte >= 1 && byte <= 7; }

ci::BlockFormat FormatOf(CodecKind kind) {
  switch (kind) {
    case CodecKind::kInt4Block: return ci::BlockFormat::kInt4;
    case CodecKind::kFp4E2M1: return ci::BlockFormat::kFp4;
    case CodecKind::kSign1: return ci::BlockFormat::kSign1;
    default: return ci::BlockFormat::kInt8;
  }
}

uint32_t DefaultBlockSize(CodecKind kind) {
  switch (kind) {
    case CodecKind::kInt8Block: return 256;
    case CodecKind::kInt4Block: return 64;
    case CodecKind::kFp4E2M1: return 32;
    case CodecKind::kSign1: return 256;
    default: return 0;
  }
}

// Block sizes must keep every full block's codes on whole bytes (the packing in codec.h relies on it).
uint32_t BlockMultiple(CodecKind kind) {
  switch (kind) {
    case CodecKind::kInt4Block:
    case CodecKind::kFp4E2M1: return 2;
    case CodecKind::kSign1: return 8;
    default: return 1;
  }
}

absl::Status CheckBlockSize(CodecKind kind, uint64_t block, std::string_view where) {
  const uint32_t multiple = BlockMultiple(kind);
  if (block == 0 || block > kMaxBlockSize || block % multiple != 0) {
    return absl::InvalidArgumentError(
        fl::StrCat(where, "block size ", block, " is not valid for ", CodecKindName(kind), ": it must be in [1, ",
                   kMaxBlockSize, "]", multiple > 1 ? fl::StrCat(" and a multiple of ", multiple) : std::string(),
                   " (the default is ", DefaultBlockSize(kind), ")"));
  }
  return absl::OkStatus();
}

size_t BodyBytes(CodecKind kind, uint32_t block, size_t n) {
  switch (kind) {
    case CodecKind::kFp32: return 4 * n;
    case CodecKind::kFp16:
    case CodecKind::kBf16: return 2 * n;
    default: return ci::BlockBodyBytes(FormatOf(kind), n, block);
  }
}

std::string Describe(CodecKind kind, uint32_t block) {
  return IsBlockwise(kind) ? fl::StrCat(CodecKindName(kind), " (block ", block, ")") : std::string(CodecKindName(kind));
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%016x", v); }

// ---- Header (see codec.h for the layout). Written byte by byte so the layout is explicit.

template <typename T>
void PutLe(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i));
}
template <typename T>
T GetLe(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<T>(v);
}

void WriteHeader(CodecKind kind, uint32_t block, uint64_t n, uint16_t flags, uint64_t checksum, uint8_t* p) {
  std::memset(p, 0, kCodecHeaderBytes);
  PutLe<uint32_t>(p + 0, kCodecMagic);
  p[4] = kCodecFormatVersion;
  p[5] = static_cast<uint8_t>(kind);
  PutLe<uint16_t>(p + 6, flags);
  PutLe<uint32_t>(p + 8, block);
  PutLe<uint64_t>(p + 16, n);
  PutLe<uint64_t>(p + 24, checksum);
}

struct Header {
  PayloadInfo info;
  uint16_t flags;
  uint64_t checksum;
};

// Checks everything the header alone can tell, plus the payload length it implies. `head` holds the payload's
// first bytes (at least the header's, when payload_size allows), `payload_size` is the whole payload's length.
absl::StatusOr<Header> ReadHeader(std::span<const uint8_t> head, size_t payload_size) {
  if (payload_size < kCodecHeaderBytes || head.size() < kCodecHeaderBytes) {
    return absl::InvalidArgumentError(
        fl::StrCat("payload is ", payload_size, " bytes, shorter than the ", kCodecHeaderBytes,
                   "-byte codec header: it was truncated in transit or is not a codec payload; resend it"));
  }
  const uint8_t* p = head.data();
  const uint32_t magic = GetLe<uint32_t>(p);
  if (magic != kCodecMagic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload starts with 0x%08x, not the codec magic 0x%08x ('FLCD'): it is not a codec payload (or its "
        "start was lost); check what the sender put in this field",
        magic, kCodecMagic));
  }
  if (p[4] != kCodecFormatVersion) {
    return absl::InvalidArgumentError(
        fl::StrCat("payload has codec format version ", p[4], " but this build reads version ", kCodecFormatVersion,
                   ": upgrade the receiver, or have the sender encode with version ", kCodecFormatVersion));
  }
  if (!IsKnownKind(p[5])) {
    return absl::InvalidArgumentError(
        fl::StrCat("payload has unknown codec kind ", p[5],
                   " (known: 1=fp32 .. 7=sign1): the sender is newer than this build or the header is corrupt"));
  }
  const uint16_t flags = GetLe<uint16_t>(p + 6);
  const uint32_t reserved1 = GetLe<uint32_t>(p + 12);
  if ((flags & ~kCodecFlagNoBodyChecksum) != 0 || reserved1 != 0) {
    return absl::InvalidArgumentError(
        fl::StrCat("payload header has unknown flags or non-zero reserved fields (bytes "
                   "6-7: ",
                   flags, ", known flags: ", kCodecFlagNoBodyChecksum, "; bytes 12-15: ", reserved1,
                   "): the header is corrupt or from an incompatible encoder; resend"));
  }
  Header h;
  h.info.kind = static_cast<CodecKind>(p[5]);
  h.info.block_size = GetLe<uint32_t>(p + 8);
  h.info.num_values = GetLe<uint64_t>(p + 16);
  h.flags = flags;
  h.checksum = GetLe<uint64_t>(p + 24);
  if ((flags & kCodecFlagNoBodyChecksum) != 0 && h.checksum != 0) {
    return absl::InvalidArgumentError(fl::StrCat("payload header says it has no body checksum (flag ",
                                                 kCodecFlagNoBodyChecksum, ") yet its checksum field is ",
                                                 Hex(h.checksum), ": the header is corrupt; resend"));
  }
  if (IsBlockwise(h.info.kind)) {
    absl::Status s = CheckBlockSize(h.info.kind, h.info.block_size, "payload header: ");
    if (!s.ok()) {
      return absl::InvalidArgumentError(fl::StrCat(fl::ToStd(s.message()), "; the header is corrupt"));
    }
  } else if (h.info.block_size != 0) {
    return absl::InvalidArgumentError(
        fl::StrCat("payload header gives block size ", h.info.block_size, " for ", CodecKindName(h.info.kind),
                   ", which is element-wise and must have 0: the header is corrupt; resend"));
  }
  if (h.info.num_values > kMaxValues) {
    return absl::InvalidArgumentError(fl::StrCat("payload header claims ", h.info.num_values,
                                                 " values, more than any payload can hold (max ", kMaxValues,
                                                 "): the header is corrupt; resend"));
  }
  const size_t expected =
      kCodecHeaderBytes + BodyBytes(h.info.kind, h.info.block_size, static_cast<size_t>(h.info.num_values));
  if (payload_size != expected) {
    const bool short_payload = payload_size < expected;
    return absl::InvalidArgumentError(fl::StrCat(
        "payload is ", payload_size, " bytes but ", h.info.num_values, " values in ",
        Describe(h.info.kind, h.info.block_size), " take exactly ", expected, " bytes with the header; ",
        short_payload ? "it was truncated in transit: resend it"
                      : fl::StrCat("it has ", payload_size - expected,
                                   " extra bytes (padded or concatenated in transit): send the payload alone")));
  }
  return h;
}

// An encoder's refusal of a NaN/Inf input.
absl::Status NotFiniteError(std::string_view codec, float value, size_t index) {
  return absl::InvalidArgumentError(fl::StrCat("value at index ", index, " is ", value, "; ", codec,
                                               " encodes finite values only: find where the NaN/Inf came from "
                                               "(diverged training, bad data) before sending"));
}

class CodecImpl final : public Codec {
 public:
  CodecImpl(CodecKind kind, uint32_t block) : kind_(kind), block_(block) {}

  CodecKind kind() const override { return kind_; }
  uint32_t block_size() const override { return block_; }

  size_t EncodedSize(size_t num_values) const override {
    return kCodecHeaderBytes + BodyBytes(kind_, block_, num_values);
  }

  using Codec::Decode;
  using Codec::Encode;

  absl::Status Encode(std::span<const float> values, std::vector<uint8_t>* out,
                      const EncodeOptions& options) const override {
    const size_t n = values.size();
    out->resize(EncodedSize(n));
    uint8_t* body = out->data() + kCodecHeaderBytes;
    size_t bad = ci::kNotFound;
    switch (kind_) {
      case CodecKind::kFp32: bad = ci::EncodeFp32(values.data(), n, body); break;
      case CodecKind::kFp16: bad = ci::EncodeFp16(values.data(), n, body); break;
      case CodecKind::kBf16: bad = ci::EncodeBf16(values.data(), n, body); break;
      default: bad = ci::EncodeBlocks(FormatOf(kind_), values.data(), n, block_, body); break;
    }
    if (bad != ci::kNotFound) {
      out->clear();
      return UnencodableError(values[bad], bad);
    }
    if (options.body_checksum) {
      const uint64_t checksum = Checksum64(std::span<const uint8_t>(body, out->size() - kCodecHeaderBytes));
      WriteHeader(kind_, block_, n, 0, checksum, out->data());
    } else {
      WriteHeader(kind_, block_, n, kCodecFlagNoBodyChecksum, 0, out->data());
    }
    return absl::OkStatus();
  }

  absl::Status Decode(std::span<const uint8_t> payload, std::span<float> out,
                      const DecodeOptions& options) const override {
    absl::Status s = Validate(payload, out.size(), options);
    if (!s.ok()) return s;
    Run(payload.data() + kCodecHeaderBytes, out.size(), nullptr, out.data());
    return absl::OkStatus();
  }

  absl::Status DecodeAccumulate(std::span<const uint8_t> payload, float weight, std::span<float> acc) const override {
    if (!std::isfinite(weight)) {
      return absl::InvalidArgumentError(
          fl::StrCat("weight ", weight, " passed to ", name(),
                     " DecodeAccumulate is not finite: it would poison the aggregate; fix the weighting"));
    }
    absl::Status s = Validate(payload, acc.size(), DecodeOptions{});
    if (!s.ok()) return s;
    Run(payload.data() + kCodecHeaderBytes, acc.size(), &weight, acc.data());
    return absl::OkStatus();
  }

 private:
  absl::Status UnencodableError(float value, size_t index) const {
    if (!std::isfinite(value)) return NotFiniteError(name(), value, index);
    if (kind_ == CodecKind::kFp16) {
      return absl::InvalidArgumentError(
          fl::StrCat("value ", value, " at index ", index,
                     " is outside the fp16 range (|x| <= 65504 after rounding): fp16 rejects rather than saturates, "
                     "because a clipped update silently changes the model; use bf16 or fp32 for this tensor, or "
                     "scale it down"));
    }
    return absl::InvalidArgumentError(fl::StrCat("value ", value, " at index ", index, " is outside the ", name(),
                                                 " range (it rounds to infinity): use fp32 for this tensor"));
  }

  absl::Status Validate(std::span<const uint8_t> payload, size_t out_size, const DecodeOptions& options) const {
    absl::StatusOr<Header> h = ReadHeader(payload, payload.size());
    if (!h.ok()) return h.status();
    const PayloadInfo& info = h->info;
    if (info.kind != kind_ || info.block_size != block_) {
      return absl::InvalidArgumentError(
          fl::StrCat("payload was encoded with ", Describe(info.kind, info.block_size), " but this codec is ",
                     Describe(kind_, block_), ": pick the codec from the payload with PeekPayload, or MakeCodec(\"",
                     CodecKindName(info.kind), IsBlockwise(info.kind) ? fl::StrCat(":", info.block_size) : "", "\")"));
    }
    if (info.num_values != out_size) {
      return absl::InvalidArgumentError(
          fl::StrCat("payload holds ", info.num_values, " values but the output has room for ", out_size,
                     ": sender and receiver disagree on the tensor size; check that both use the same model spec"));
    }
    const std::span<const uint8_t> body = payload.subspan(kCodecHeaderBytes);
    if (!options.transfer_verified) {
      if ((h->flags & kCodecFlagNoBodyChecksum) != 0) {
        return absl::DataLossError(fl::StrCat(
            "payload carries no body checksum (header flag ", kCodecFlagNoBodyChecksum,
            ": its sender relied on the transfer's checksum) and nothing verified its ", body.size(),
            " body bytes here: decode it only after checking the transfer checksum (DecodeOptions::transfer_verified), "
            "or have the sender encode it with a body checksum"));
      }
      const uint64_t checksum = Checksum64(body);
      if (checksum != h->checksum) {
        return absl::DataLossError(fl::StrCat("payload body checksum is ", Hex(checksum), " but the header says ",
                                              Hex(h->checksum), ": the ", body.size(),
                                              "-byte body was corrupted in transit or storage; resend it"));
      }
    }
    size_t bad = ci::kNotFound;
    switch (kind_) {
      case CodecKind::kFp32: bad = ci::FindNonFiniteFp32(body.data(), out_size); break;
      case CodecKind::kFp16: bad = ci::FindNonFiniteFp16(body.data(), out_size); break;
      case CodecKind::kBf16: bad = ci::FindNonFiniteBf16(body.data(), out_size); break;
      default: {
        const ci::BlockFormat format = FormatOf(kind_);
        const size_t bad_scale = ci::FindBadScale(format, body.data(), out_size, block_);
        if (bad_scale != ci::kNotFound) {
          float scale;
          std::memcpy(&scale, body.data() + 4 * bad_scale, 4);
          const uint64_t first = uint64_t{bad_scale} * block_;
          return absl::InvalidArgumentError(fl::StrCat(
              "scale of block ", bad_scale, " (values ", first, "..", std::min<uint64_t>(first + block_, out_size) - 1,
              ") is ", scale, "; scales must be finite, >= 0 and small enough that every decoded value is finite (<= ",
              std::numeric_limits<float>::max() / ci::MaxCodeMagnitude(format),
              "): the encoder that wrote it is faulty (the checksum matches); re-encode with this library"));
        }
        if (!ci::PaddingIsZero(format, body.data(), out_size, block_)) {
          return absl::InvalidArgumentError(
              fl::StrCat("padding of the last ", name(), " tile (the fields after value ", out_size - 1,
                         ") is not zero: the encoder that wrote it is faulty (the checksum matches); re-encode with "
                         "this library"));
        }
        return absl::OkStatus();
      }
    }
    if (bad != ci::kNotFound) {
      return absl::InvalidArgumentError(
          fl::StrCat("payload value at index ", bad, " is NaN or Inf in ", name(),
                     ": decoded values must be finite; the encoder that wrote it is faulty (the checksum matches): "
                     "re-encode with this library"));
    }
    return absl::OkStatus();
  }

  void Run(const uint8_t* body, size_t n, const float* weight, float* out) const {
    switch (kind_) {
      case CodecKind::kFp32: return ci::DecodeFp32(body, n, weight, out);
      case CodecKind::kFp16: return ci::DecodeFp16(body, n, weight, out);
      case CodecKind::kBf16: return ci::DecodeBf16(body, n, weight, out);
      default: return ci::DecodeBlocks(FormatOf(kind_), body, n, block_, weight, out);
    }
  }

  CodecKind kind_;
  uint32_t block_;
};

constexpr CodecKind kAllKinds[] = {CodecKind::kFp32,      CodecKind::kFp16,    CodecKind::kBf16, CodecKind::kInt8Block,
                                   CodecKind::kInt4Block, CodecKind::kFp4E2M1, CodecKind::kSign1};

}  // namespace

std::string_view CodecKindName(CodecKind kind) {
  switch (kind) {
    case CodecKind::kFp32: return "fp32";
    case CodecKind::kFp16: return "fp16";
    case CodecKind::kBf16: return "bf16";
    case CodecKind::kInt8Block: return "int8";
    case CodecKind::kInt4Block: return "int4";
    case CodecKind::kFp4E2M1: return "fp4";
    case CodecKind::kSign1: return "sign1";
  }
  return "unknown";
}

absl::StatusOr<CodecKind> ParseCodecKind(std::string_view name) {
  for (CodecKind kind : kAllKinds) {
    if (CodecKindName(kind) == name) return kind;
  }
  return absl::InvalidArgumentError(
      fl::StrCat("unknown codec '", name, "'; expected one of fp32, fp16, bf16, int8, int4, fp4, sign1"));
}

uint32_t CodecDefaultBlockSize(CodecKind kind) { return DefaultBlockSize(kind); }

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(CodecKind kind, const CodecOptions& options) {
  if (!IsKnownKind(static_cast<uint8_t>(kind))) {
    return absl::InvalidArgumentError(
        fl::StrCat("unknown codec kind ", static_cast<int>(kind), "; expected 1 (fp32) .. 7 (sign1)"));
  }
  if (!IsBlockwise(kind)) return std::unique_ptr<Codec>(new CodecImpl(kind, 0));
  const uint32_t block = options.block_size == 0 ? DefaultBlockSize(kind) : options.block_size;
  absl::Status s = CheckBlockSize(kind, block, "");
  if (!s.ok()) return s;
  return std::unique_ptr<Codec>(new CodecImpl(kind, block));
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  absl::StatusOr<CodecKind> kind = ParseCodecKind(name);
  if (!kind.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("codec spec '", spec, "': ", fl::ToStd(kind.status().message()),
                                                 ", optionally with a block size such as 'int8:128'"));
  }
  CodecOptions options;
  if (colon != std::string_view::npos) {
    const std::string_view digits = spec.substr(colon + 1);
    if (!IsBlockwise(*kind)) {
      return absl::InvalidArgumentError(fl::StrCat("codec spec '", spec, "': ", name,
                                                   " is element-wise and takes no block size; write '", name, "'"));
    }
    uint32_t block = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), block);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || block == 0) {
      return absl::InvalidArgumentError(fl::StrCat("codec spec '", spec, "': block size '", digits,
                                                   "' is not a positive integer; write e.g. '", name, ":",
                                                   DefaultBlockSize(*kind), "', or '", name, "' for the default"));
    }
    options.block_size = block;
  }
  absl::StatusOr<std::unique_ptr<Codec>> codec = MakeCodec(*kind, options);
  if (!codec.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("codec spec '", spec, "': ", fl::ToStd(codec.status().message())));
  }
  return codec;
}

absl::StatusOr<PayloadInfo> PeekPayload(std::span<const uint8_t> payload) {
  absl::StatusOr<Header> h = ReadHeader(payload, payload.size());
  if (!h.ok()) return h.status();
  return h->info;
}

absl::Status SealFp32Payload(std::span<uint8_t> payload, const EncodeOptions& options) {
  if (payload.size() < kCodecHeaderBytes || (payload.size() - kCodecHeaderBytes) % sizeof(float) != 0) {
    return absl::InvalidArgumentError(fl::StrCat("an fp32 payload is the ", kCodecHeaderBytes,
                                                 "-byte header and 4 bytes per value; got ", payload.size(),
                                                 " bytes: size it with EncodedSize(n)"));
  }
  uint8_t* body = payload.data() + kCodecHeaderBytes;
  const size_t n = (payload.size() - kCodecHeaderBytes) / sizeof(float);
  if (const size_t bad = ci::FindNonFiniteFp32(body, n); bad != ci::kNotFound) {
    float value;
    std::memcpy(&value, body + sizeof(float) * bad, sizeof value);
    return NotFiniteError("fp32", value, bad);
  }
  if (options.body_checksum) {
    WriteHeader(CodecKind::kFp32, 0, n, 0,
                Checksum64(std::span<const uint8_t>(body, payload.size() - kCodecHeaderBytes)), payload.data());
  } else {
    WriteHeader(CodecKind::kFp32, 0, n, kCodecFlagNoBodyChecksum, 0, payload.data());
  }
  return absl::OkStatus();
}

absl::StatusOr<PayloadInfo> PeekPayloadHeader(std::span<const uint8_t> header, uint64_t payload_bytes) {
  absl::StatusOr<Header> h = ReadHeader(header, static_cast<size_t>(payload_bytes));
  if (!h.ok()) return h.status();
  return h->info;
}

absl::Status ErrorFeedback::Encode(const Codec& codec, std::span<const float> values, std::vector<uint8_t>* out,
                                   const EncodeOptions& options) {
  if (values.size() != residual_.size()) {
    return absl::InvalidArgumentError(
        fl::StrCat("error feedback was set up for ", residual_.size(), " values but got ", values.size(),
                   ": use one ErrorFeedback per tensor (or fragment) and keep its size fixed"));
  }
  scratch_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) scratch_[i] = values[i] + residual_[i];
  absl::Status s = codec.Encode(scratch_, out, options);
  if (!s.ok()) {
    // The residual is left as it was, so the caller can skip this step and carry on.
    return absl::Status(s.code(), fl::StrCat("error feedback (input + carried residual): ", fl::ToStd(s.message())));
  }
  // residual = (values + residual) - decode(payload); decoding straight into residual_ avoids a buffer.
  // The payload never left this process: its body checksum (if any) would only be recomputed.
  s = codec.Decode(*out, std::span<float>(residual_), DecodeOptions{.transfer_verified = true});
  if (!s.ok()) return s;  // cannot happen for a payload we just wrote
  for (size_t i = 0; i < residual_.size(); ++i) residual_[i] = scratch_[i] - residual_[i];
  return absl::OkStatus();
}

void ErrorFeedback::Reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

}  // namespace fl::core
