#include "fl/proto/chunk_reader.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fl::proto {

namespace {

// The tag and length varint of a data chunk of `size` bytes, as one (copied) slice.
grpc::Slice DataChunkPrefix(uint64_t size) {
  uint8_t prefix[11];
  size_t len = 0;
  prefix[len++] = kDataChunkTag;
  for (uint64_t v = size;; v >>= 7) {
    if (v < 0x80) {
      prefix[len++] = static_cast<uint8_t>(v);
      break;
    }
    prefix[len++] = static_cast<uint8_t>(v | 0x80);
  }
  return grpc::Slice(prefix, len);
}

}  // namespace

grpc::ByteBuffer EncodeDataChunk(std::span<const uint8_t> data) {
  grpc::Slice slices[2] = {DataChunkPrefix(data.size()), grpc::Slice(data.data(), data.size())};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeDataChunkInPlace(std::span<const uint8_t> data, std::shared_ptr<const void> owner) {
  // gRPC calls the destroy function once, when the slice's last reference goes: that drops our hold on `owner`.
  auto* hold = new std::shared_ptr<const void>(std::move(owner));
  grpc::Slice body(
      const_cast<uint8_t*>(data.data()), data.size(),  // gRPC only reads a slice it sends
      [](void* h) { delete static_cast<std::shared_ptr<const void>*>(h); }, hold);
  grpc::Slice slices[2] = {DataChunkPrefix(data.size()), std::move(body)};
  return grpc::ByteBuffer(slices, 2);
}

absl::StatusOr<DataChunkReader::Kind> DataChunkReader::Read(const grpc::ByteBuffer& message, uint64_t limit,
                                                            const std::function<void(std::span<const uint8_t>)>& sink) {
  const size_t total = message.Length();
  if (total == 0) return Kind::kOther;
  if (grpc::Status s = message.Dump(&slices_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("a transfer chunk could not be read: ", s.error_message()));
  }
  // The prefix: tag and length varint (at most 11 bytes), which may straddle slices.
  size_t slice = 0;
  size_t at = 0;  // offset inside slices_[slice]
  auto next_byte = [&](uint8_t* out) {
    while (slice < slices_.size() && at >= slices_[slice].size()) {
      ++slice;
      at = 0;
    }
    if (slice == slices_.size()) return false;
    *out = slices_[slice].begin()[at++];
    return true;
  };
  uint8_t byte = 0;
  if (!next_byte(&byte) || byte != kDataChunkTag) return Kind::kOther;
  uint64_t length = 0;
  size_t consumed = 1;
  for (int shift = 0;; shift += 7) {
    if (!next_byte(&byte)) {
      return absl::InvalidArgumentError(absl::StrCat("a data chunk of ", total,
                                                     " bytes ends inside its length varint; the chunk is malformed: "
                                                     "send a serialized fl.v1 ModelChunk/UpdateChunk"));
    }
    ++consumed;
    // The 10th byte holds bit 63 only: anything more is a varint longer than 10 bytes or beyond 64 bits.
    if (shift == 63 && byte > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("a data chunk's length varint is longer than 10 bytes or overflows 64 bits; the chunk (", total,
                       " bytes) is malformed: send a serialized fl.v1 ModelChunk/UpdateChunk"));
    }
    length |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
  }
  const uint64_t remaining = total - consumed;
  if (length > remaining) {
    return absl::InvalidArgumentError(absl::StrCat("a data chunk announces ", length, " bytes but only ", remaining,
                                                   " follow in its message; the chunk is truncated or malformed"));
  }
  // More fields after the data (legal protobuf, but nothing of ours writes it): protobuf's parser decides.
  if (length < remaining) return Kind::kOther;
  if (length > limit) {
    return absl::OutOfRangeError(
        absl::StrCat("a data chunk carries ", length, " bytes, more than the ", limit, " still expected"));
  }
  for (; slice < slices_.size(); ++slice, at = 0) {
    const grpc::Slice& s = slices_[slice];
    if (at < s.size()) sink(std::span<const uint8_t>(s.begin() + at, s.size() - at));
  }
  slices_.clear();  // drops the references now; keeps the capacity for the next chunk
  return Kind::kData;
}

}  // namespace fl::proto
