// proto::DataChunkReader against protobuf's own encoding: data chunks of every size class, their bytes split
// into slices anywhere, read back in place; other messages left to protobuf; malformed ones refused.
#include "fl/proto/chunk_reader.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <gtest/gtest.h>

#include "fl/core/checksum.h"
#include "fl/v1/federation.pb.h"

namespace fl::proto {
namespace {

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// `bytes` as a ByteBuffer of slices cut at `cuts` (offsets, any order; duplicates give empty slices).
grpc::ByteBuffer Sliced(const std::string& bytes, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer RandomlySliced(const std::string& bytes, std::mt19937_64& rng) {
  std::vector<size_t> cuts(rng() % 8);
  for (size_t& c : cuts) c = bytes.empty() ? 0 : rng() % (bytes.size() + 1);
  return Sliced(bytes, cuts);
}

struct Read {
  absl::StatusOr<DataChunkReader::Kind> kind;
  std::string data;
  int pieces = 0;
};

Read ReadAll(DataChunkReader& reader, const grpc::ByteBuffer& message, uint64_t limit = UINT64_MAX) {
  Read r;
  r.kind = reader.Read(message, limit, [&](std::span<const uint8_t> piece) {
    r.data.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    ++r.pieces;
  });
  return r;
}

TEST(DataChunkReaderTest, ReadsProtobufsEncodingOfEverySizeSplitAnywhere) {
  std::mt19937_64 rng(16);
  DataChunkReader reader;  // one reader for every message, as a transfer uses it
  std::vector<size_t> sizes = {0, 1, 2, 127, 128, 129, 16383, 16384, 16385, (1u << 20) - 1, 1u << 20, 4u << 20};
  for (int i = 0; i < 200; ++i) sizes.push_back(rng() % 70000);
  for (size_t size : sizes) {
    const std::string data = RandomBytes(size, rng);
    fl::v1::UpdateChunk update;
    update.set_data(data);
    fl::v1::ModelChunk model;
    model.set_data(data);
    for (const std::string& encoded : {update.SerializeAsString(), model.SerializeAsString()}) {
      const Read r = ReadAll(reader, RandomlySliced(encoded, rng));
      ASSERT_TRUE(r.kind.ok()) << size << ": " << r.kind.status();
      ASSERT_EQ(*r.kind, DataChunkReader::Kind::kData) << size;
      ASSERT_EQ(r.data.size(), size);
      ASSERT_TRUE(r.data == data) << "the bytes of a " << size << "-byte chunk differ";
    }
  }
}

TEST(DataChunkReaderTest, EveryCutOfASmallChunkReadsTheSameBytes) {
  std::mt19937_64 rng(7);
  const std::string data = RandomBytes(300, rng);  // a two-byte length varint
  fl::v1::UpdateChunk chunk;
  chunk.set_data(data);
  const std::string encoded = chunk.SerializeAsString();
  DataChunkReader reader;
  for (size_t a = 0; a <= encoded.size(); ++a) {
    for (size_t b = a; b <= encoded.size(); b += 37) {
      const Read r = ReadAll(reader, Sliced(encoded, {a, b}));
      ASSERT_TRUE(r.kind.ok() && *r.kind == DataChunkReader::Kind::kData) << a << "," << b;
      ASSERT_TRUE(r.data == data) << "cut at " << a << " and " << b;
    }
  }
}

TEST(DataChunkReaderTest, EncodeDataChunkIsProtobufsEncoding) {
  std::mt19937_64 rng(3);
  for (size_t size : {0, 1, 127, 128, 300, 70000, 1 << 20}) {
    const std::string data = RandomBytes(size, rng);
    fl::v1::UpdateChunk chunk;
    chunk.set_data(data);
    grpc::ByteBuffer encoded =
        EncodeDataChunk(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
    grpc::Slice flat;
    ASSERT_TRUE(encoded.DumpToSingleSlice(&flat).ok());
    const std::string bytes(reinterpret_cast<const char*>(flat.begin()), flat.size());
    EXPECT_EQ(bytes, chunk.SerializeAsString()) << size;
    fl::v1::ModelChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes)) << size;
    EXPECT_TRUE(parsed.data() == data) << size;
  }
}

// In place: the same bytes on the wire as EncodeDataChunk, the payload slice pointing into the caller's buffer
// (no copy: a later change to the buffer shows through), and the owner held exactly as long as gRPC holds a
// reference to the message (copies of the ByteBuffer share the slice; the last one to go releases it).
TEST(DataChunkReaderTest, EncodeDataChunkInPlaceRefersToTheBufferAndHoldsItsOwnerUntilReleased) {
  std::mt19937_64 rng(4);
  for (size_t size : {0, 1, 300, 70000, 1 << 20}) {
    const std::string data = RandomBytes(size, rng);
    auto owner = std::make_shared<std::vector<uint8_t>>(data.begin(), data.end());
    const std::weak_ptr<std::vector<uint8_t>> watch = owner;
    grpc::ByteBuffer copy_of_message;
    {
      grpc::ByteBuffer message = EncodeDataChunkInPlace(*owner, owner);
      EXPECT_EQ(watch.use_count(), 2) << size;  // ours and the slice's
      grpc::Slice flat;
      ASSERT_TRUE(message.DumpToSingleSlice(&flat).ok());
      fl::v1::UpdateChunk chunk;
      chunk.set_data(data);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(flat.begin()), flat.size()), chunk.SerializeAsString());
      if (size > 0) {
        std::vector<grpc::Slice> slices;
        ASSERT_TRUE(message.Dump(&slices).ok());
        ASSERT_EQ(slices.size(), 2u);
        EXPECT_EQ(slices[1].begin(), owner->data()) << "the payload slice must point into the buffer, not a copy";
      }
      copy_of_message = message;
    }
    owner.reset();
    EXPECT_FALSE(watch.expired()) << "released while a message still refers to the bytes";
    DataChunkReader reader;
    const Read r = ReadAll(reader, copy_of_message);
    ASSERT_TRUE(r.kind.ok()) << r.kind.status();
    EXPECT_TRUE(r.data == data) << size;
    copy_of_message.Clear();
    EXPECT_TRUE(watch.expired()) << "the owner must go with the last reference to the slice";
  }
}

TEST(DataChunkReaderTest, HeadersTrailersAndUnusualLayoutsAreLeftToProtobuf) {
  DataChunkReader reader;
  fl::v1::UpdateChunk header;
  header.mutable_header()->set_client_id("c-1");
  header.mutable_header()->set_payload_bytes(10);
  fl::v1::UpdateChunk trailer;
  trailer.mutable_trailer()->set_payload_checksum(42);
  fl::v1::UpdateChunk data;
  data.set_data("abc");
  // A data field followed by another field: legal protobuf (the last oneof member wins), not our layout.
  const std::string data_then_trailer = data.SerializeAsString() + trailer.SerializeAsString();
  for (const std::string& message :
       {header.SerializeAsString(), trailer.SerializeAsString(), data_then_trailer, std::string()}) {
    const Read r = ReadAll(reader, Sliced(message, {message.size() / 2}));
    ASSERT_TRUE(r.kind.ok()) << r.kind.status();
    EXPECT_EQ(*r.kind, DataChunkReader::Kind::kOther);
    EXPECT_EQ(r.pieces, 0) << "the sink saw bytes of a message that is not a data chunk";
  }
}

TEST(DataChunkReaderTest, MalformedDataChunksAreRefusedNamingTheFault) {
  DataChunkReader reader;
  struct Case {
    std::string bytes;
    std::string expected;
  };
  const Case cases[] = {
      {std::string("\x12", 1), "ends inside its length varint"},
      {std::string("\x12\x80\x80", 3), "ends inside its length varint"},
      {std::string("\x12") + std::string(10, '\x80') + "\x01", "longer than 10 bytes"},
      {std::string("\x12") + std::string(9, '\xff') + "\x02", "overflows 64 bits"},
      {std::string("\x12\x05"
                   "abc",
                   5),
       "announces 5 bytes but only 3 follow"},
      {std::string("\x12\xff\xff\xff\xff\x0f"
                   "a",
                   7),
       "but only 1 follow"},
  };
  for (const Case& c : cases) {
    const Read r = ReadAll(reader, Sliced(c.bytes, {1}));
    ASSERT_FALSE(r.kind.ok()) << c.expected;
    EXPECT_EQ(r.kind.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.kind.status().message().find(c.expected), std::string::npos) << r.kind.status();
    EXPECT_EQ(r.pieces, 0);
    // protobuf refuses the same bytes.
    fl::v1::UpdateChunk parsed;
    EXPECT_FALSE(parsed.ParseFromString(c.bytes)) << c.expected;
  }
}

TEST(DataChunkReaderTest, AChunkBeyondTheLimitIsOutOfRangeBeforeTheSinkSeesIt) {
  DataChunkReader reader;
  fl::v1::UpdateChunk chunk;
  chunk.set_data(std::string(100, 'x'));
  const Read over = ReadAll(reader, Sliced(chunk.SerializeAsString(), {}), 99);
  ASSERT_FALSE(over.kind.ok());
  EXPECT_EQ(over.kind.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(over.kind.status().message().find("carries 100 bytes, more than the 99 still expected"), std::string::npos)
      << over.kind.status();
  EXPECT_EQ(over.pieces, 0);
  const Read exact = ReadAll(reader, Sliced(chunk.SerializeAsString(), {}), 100);
  ASSERT_TRUE(exact.kind.ok());
  EXPECT_EQ(exact.data.size(), 100u);
}

// What the server computes as an upload's chunks arrive, and the client as a download's do, equals the one-shot
// checksum the sender puts in the trailer, whatever the chunking.
TEST(DataChunkReaderTest, TheStreamedXxh3OfTheChunksEqualsTheSendersChecksum) {
  std::mt19937_64 rng(11);
  const std::string payload = RandomBytes(3'000'001, rng);
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  const uint64_t sent = core::TransferChecksum64(std::span<const uint8_t>(bytes, payload.size()));
  DataChunkReader reader;
  core::TransferChecksum received;
  for (size_t chunk_bytes : {size_t{1} << 20, size_t{65536}, size_t{1000}, size_t{4} << 20}) {
    received.Reset();
    for (size_t off = 0; off < payload.size(); off += chunk_bytes) {
      const size_t n = std::min(chunk_bytes, payload.size() - off);
      grpc::ByteBuffer message = EncodeDataChunk(std::span<const uint8_t>(bytes + off, n));
      grpc::Slice flat;
      ASSERT_TRUE(message.DumpToSingleSlice(&flat).ok());
      const std::string encoded(reinterpret_cast<const char*>(flat.begin()), flat.size());
      auto kind =
          reader.Read(RandomlySliced(encoded, rng), n, [&](std::span<const uint8_t> piece) { received.Update(piece); });
      ASSERT_TRUE(kind.ok() && *kind == DataChunkReader::Kind::kData);
    }
    EXPECT_EQ(received.Digest(), sent) << chunk_bytes;
  }
  // Any damaged byte changes it.
  std::string damaged = payload;
  damaged[1'234'567] ^= 0x10;
  EXPECT_NE(core::TransferChecksum64(
                std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(damaged.data()), damaged.size())),
            sent);
}

}  // namespace
}  // namespace fl::proto
