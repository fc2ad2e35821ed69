// The ring all-reduce's message header (see ring_allreduce.h, "Wire format"). Public so that tests and tools
// can forge, inspect or replay messages; RingAllReduce is the only producer in the product.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"

namespace fl::diloco::wire {

inline constexpr uint32_t kMagic = 0x47524c46;  // "FLRG" read as little-endian u32
inline constexpr uint8_t kVersion = 2;          // 2: payload kind in the header, raw fp32 payloads
inline constexpr size_t kHeaderBytes = 64;

enum class MessageType : uint8_t {
  kHello = 1,          // first message on every connection: says which member (and ring) it comes from
  kReduceScatter = 2,  // a running partial sum of one sub-chunk
  kAllGather = 3,      // final values of one sub-chunk, encoded once by the chunk's owner
  kAbort = 4,          // the exchange failed: chunk = blamed member, sub = originator, step = absl::StatusCode
};

std::string_view MessageTypeName(MessageType type);  // "hello", "reduce-scatter", "all-gather", "abort"

// What frame 1 holds (header bytes 6-7, u16).
enum class PayloadKind : uint16_t {
  kCodec = 0,    // an fl::core codec payload (self-describing, checksummed); an abort's text; a hello's nothing
  kRawFp32 = 1,  // `count` little-endian fp32 values, nothing else (codec "fp32": no framing, no checksum)
};

std::string_view PayloadKindName(PayloadKind kind);  // "codec", "raw fp32"

struct Header {
  MessageType type = MessageType::kHello;
  uint64_t ring = 0;  // RingFingerprint(members)
  uint64_t exchange_id = 0;
  uint32_t sender = 0;  // index of the member that sent this message (the receiver's predecessor)
  uint32_t step = 0;
  uint32_t chunk = 0;
  uint32_t sub = 0;
  uint64_t offset = 0;  // index of the first value in the whole vector
  uint64_t count = 0;   // values in the payload
  uint64_t total = 0;   // values in the whole vector
  PayloadKind payload = PayloadKind::kCodec;
};

std::array<uint8_t, kHeaderBytes> EncodeHeader(const Header& header);
// Checks the size, magic, version, type and payload kind; InvalidArgument saying which is wrong.
absl::StatusOr<Header> DecodeHeader(std::span<const uint8_t> bytes);

}  // namespace fl::diloco::wire
