// TransferChecksum64 is XXH3-64 (seed 0), one-shot and streamed alike.
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/checksum.h"

namespace fl::core {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(TransferChecksumTest, IsXxh3With64BitOutputAndSeedZero) {
  // The reference value of XXH3_64bits over no bytes (xxHash's own test vector); any other implementation of
  // the wire checksum (a Python or Rust peer) can check itself against it.
  EXPECT_EQ(TransferChecksum64({}), 0x2D06800538D394C2ULL);
  EXPECT_NE(TransferChecksum64(Bytes("a")), TransferChecksum64({}));
}

TEST(TransferChecksumTest, StreamedInAnyPiecesEqualsOneShot) {
  std::mt19937_64 rng(5);
  for (size_t size : {0, 1, 16, 17, 128, 129, 240, 241, 1024, 100'000, 2'000'003}) {
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const uint64_t whole = TransferChecksum64(Bytes(data));
    TransferChecksum streamed;
    for (int trial = 0; trial < 3; ++trial) {
      streamed.Reset();
      for (size_t off = 0; off < size;) {
        const size_t n = std::min<size_t>(size - off, 1 + rng() % (trial == 0 ? 7 : 70'000));
        streamed.Update(Bytes(data).subspan(off, n));
        off += n;
      }
      EXPECT_EQ(streamed.Digest(), whole) << size << " trial " << trial;
    }
  }
}

TEST(TransferChecksumTest, DetectsEveryFlippedBitAndTruncation) {
  std::string data(257, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  const uint64_t base = TransferChecksum64(Bytes(data));
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] = static_cast<char>(data[i] ^ (1 << bit));
      EXPECT_NE(TransferChecksum64(Bytes(data)), base) << "byte " << i << " bit " << bit;
      data[i] = static_cast<char>(data[i] ^ (1 << bit));
    }
  }
  for (size_t len = 0; len < data.size(); ++len) EXPECT_NE(TransferChecksum64(Bytes(data).first(len)), base) << len;
}

}  // namespace
}  // namespace fl::core
