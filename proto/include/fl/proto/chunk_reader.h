// Reading the data chunks of DownloadModel and UploadUpdate straight from gRPC's buffers.
//
// A data chunk (ModelChunk / UpdateChunk with `bytes data = 2` set) is, as every encoder of ours and protobuf's
// own serializer write it, the tag byte 0x12, a varint length, then exactly that many payload bytes. Parsing it
// into a protobuf message copies the bytes into a std::string (an allocation per chunk) before they are copied
// again into the payload. DataChunkReader instead walks the ByteBuffer's slices (reference-counted, not copied)
// and hands the payload bytes to a sink in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "absl/status/statusor.h"
#include "fl/v1/federation.pb.h"

namespace fl::proto {

// The tag of field 2 (`data`) with wire type 2 (length-delimited): the first byte of a data chunk.
inline constexpr uint8_t kDataChunkTag = (2 << 3) | 2;

// Encodes a data chunk (field 2 = data) into a ByteBuffer by hand: the bytes are copied once, into the
// message's slice, never into a protobuf string first.
grpc::ByteBuffer EncodeDataChunk(std::span<const uint8_t> data);

// Encodes a data chunk without copying its bytes: the message's payload slice refers to `data` where it is, and
// holds `owner` (what keeps `data` alive and unchanged: the model payload every download of a version shares, an
// upload buffer) until gRPC has sent the bytes and released the slice, which may be after the call that wrote
// it returned. The writer must not change `data` while `owner` has other holders. Why: copying each chunk into
// a fresh slice cost fl-server a model-sized memmove (and its page faults) per client per round.
grpc::ByteBuffer EncodeDataChunkInPlace(std::span<const uint8_t> data, std::shared_ptr<const void> owner);

class DataChunkReader {
 public:
  enum class Kind {
    kData,   // a data chunk: the sink got its payload bytes, in order
    kOther,  // not a data chunk (header, trailer, or a data field not laid out as above): parse it with protobuf
  };

  // Reads `message`. A data chunk's payload goes to `sink`, in one call per contiguous piece (the pieces of one
  // chunk may be split anywhere); `limit` is the most payload bytes the caller accepts from this chunk, checked
  // before the sink sees anything. Errors (INVALID_ARGUMENT, naming what is wrong) for a message that starts as
  // a data chunk but is not one: its length varint truncated or longer than 10 bytes, or its length running
  // past the end of the message; OUT_OF_RANGE when the chunk carries more than `limit` bytes.
  // Reuses its slice list: no allocation per chunk once it has seen the largest slice count.
  absl::StatusOr<Kind> Read(const grpc::ByteBuffer& message, uint64_t limit,
                            const std::function<void(std::span<const uint8_t>)>& sink);

 private:
  std::vector<grpc::Slice> slices_;
};

// Writes a whole upload on `writer` (a grpc::ClientWriter<fl::v1::UpdateChunk>): its header, the payload as one data
// chunk, and the trailer with `checksum`. For the raw clients of tests and benchmarks (fl-client streams bounded
// chunks); false once the stream closed, and the caller finishes it.
template <class Writer>
bool WriteWholeUpload(Writer& writer, const fl::v1::UpdateHeader& header, std::span<const uint8_t> payload,
                      uint64_t checksum) {
  fl::v1::UpdateChunk chunk;
  *chunk.mutable_header() = header;
  if (!writer.Write(chunk)) return false;
  chunk.Clear();
  chunk.set_data(payload.data(), payload.size());
  if (!writer.Write(chunk)) return false;
  chunk.Clear();
  chunk.mutable_trailer()->set_payload_checksum(checksum);
  return writer.Write(chunk);
}

}  // namespace fl::proto
