#include "fl/diloco/net/ring_wire.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"

namespace fl::diloco::wire {
namespace {

static_assert(std::endian::native == std::endian::little, "the ring's headers are little-endian");

// Byte offsets of the header fields.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffType = 5, kOffPayload = 6, kOffRing = 8, kOffExchange = 16,
                 kOffSender = 24, kOffStep = 28, kOffChunk = 32, kOffSub = 36, kOffOffset = 40, kOffCount = 48,
                 kOffTotal = 56;

template <typename T>
void Put(uint8_t* out, size_t at, T value) {
  std::memcpy(out + at, &value, sizeof(T));
}
template <typename T>
T Get(const uint8_t* in, size_t at) {
  T value;
  std::memcpy(&value, in + at, sizeof(T));
  return value;
}

}  // namespace

std::string_view MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kReduceScatter: return "reduce-scatter";
    case MessageType::kAllGather: return "all-gather";
    case MessageType::kAbort: return "abort";
  }
  return "unknown";
}

std::string_view PayloadKindName(PayloadKind kind) {
  switch (kind) {
    case PayloadKind::kCodec: return "codec";
    case PayloadKind::kRawFp32: return "raw fp32";
  }
  return "unknown";
}

std::array<uint8_t, kHeaderBytes> EncodeHeader(const Header& header) {
  std::array<uint8_t, kHeaderBytes> out{};
  uint8_t* p = out.data();
  Put<uint32_t>(p, kOffMagic, kMagic);
  Put<uint8_t>(p, kOffVersion, kVersion);
  Put<uint8_t>(p, kOffType, static_cast<uint8_t>(header.type));
  Put<uint16_t>(p, kOffPayload, static_cast<uint16_t>(header.payload));
  Put<uint64_t>(p, kOffRing, header.ring);
  Put<uint64_t>(p, kOffExchange, header.exchange_id);
  Put<uint32_t>(p, kOffSender, header.sender);
  Put<uint32_t>(p, kOffStep, header.step);
  Put<uint32_t>(p, kOffChunk, header.chunk);
  Put<uint32_t>(p, kOffSub, header.sub);
  Put<uint64_t>(p, kOffOffset, header.offset);
  Put<uint64_t>(p, kOffCount, header.count);
  Put<uint64_t>(p, kOffTotal, header.total);
  return out;
}

absl::StatusOr<Header> DecodeHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() != kHeaderBytes) {
    return absl::InvalidArgumentError(
        fl::StrCat("ring message header has ", bytes.size(), " bytes, expected ", kHeaderBytes));
  }
  const uint8_t* p = bytes.data();
  if (const auto magic = Get<uint32_t>(p, kOffMagic); magic != kMagic) {
    return absl::InvalidArgumentError(fl::StrCat("ring message header has magic 0x", absl::Hex(magic), ", expected 0x",
                                                 absl::Hex(kMagic), " ('FLRG')"));
  }
  if (const auto version = Get<uint8_t>(p, kOffVersion); version != kVersion) {
    return absl::InvalidArgumentError(fl::StrCat("ring message header has format version ", static_cast<int>(version),
                                                 ", this build speaks version ", static_cast<int>(kVersion)));
  }
  const auto type = Get<uint8_t>(p, kOffType);
  if (type < static_cast<uint8_t>(MessageType::kHello) || type > static_cast<uint8_t>(MessageType::kAbort)) {
    return absl::InvalidArgumentError(fl::StrCat("ring message header has unknown type ", static_cast<int>(type)));
  }
  const auto payload = Get<uint16_t>(p, kOffPayload);
  if (payload > static_cast<uint16_t>(PayloadKind::kRawFp32)) {
    return absl::InvalidArgumentError(
        fl::StrCat("ring message header has unknown payload kind ", payload, " (0 codec, 1 raw fp32)"));
  }
  Header h;
  h.type = static_cast<MessageType>(type);
  h.ring = Get<uint64_t>(p, kOffRing);
  h.exchange_id = Get<uint64_t>(p, kOffExchange);
  h.sender = Get<uint32_t>(p, kOffSender);
  h.step = Get<uint32_t>(p, kOffStep);
  h.chunk = Get<uint32_t>(p, kOffChunk);
  h.sub = Get<uint32_t>(p, kOffSub);
  h.offset = Get<uint64_t>(p, kOffOffset);
  h.count = Get<uint64_t>(p, kOffCount);
  h.total = Get<uint64_t>(p, kOffTotal);
  h.payload = static_cast<PayloadKind>(payload);
  return h;
}

}  // namespace fl::diloco::wire
