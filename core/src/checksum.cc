#include "fl/core/checksum.h"

#include <cstring>

namespace fl::core {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

inline uint64_t Mix(uint64_t lane, uint64_t word) { return Rotl(lane + word * kP2, 31) * kP1; }

inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed) {
  const uint8_t* p = bytes.data();
  size_t n = bytes.size();
  uint64_t a = seed + kP1 + kP2, b = seed + kP2, c = seed, d = seed - kP1;
  // Four independent lanes so that the multiplies pipeline instead of forming one dependency chain.
  while (n >= 32) {
    a = Mix(a, LoadLe64(p));
    b = Mix(b, LoadLe64(p + 8));
    c = Mix(c, LoadLe64(p + 16));
    d = Mix(d, LoadLe64(p + 24));
    p += 32;
    n -= 32;
  }
  uint64_t h = Rotl(a, 1) + Rotl(b, 7) + Rotl(c, 12) + Rotl(d, 18);
  h += static_cast<uint64_t>(bytes.size());
  while (n >= 8) {
    h = Rotl(h ^ Mix(0, LoadLe64(p)), 27) * kP1 + kP3;
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    h = Rotl(h ^ (static_cast<uint64_t>(*p) * kP3), 11) * kP1;
    ++p;
    --n;
  }
  return Avalanche(h);
}

}  // namespace fl::core

// XXH3 inlined (header-only use of libxxhash-dev): no shared library to ship with fl-client, and the
// compiler sees the whole hash.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace fl::core {

uint64_t TransferChecksum64(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

struct TransferChecksum::State {
  XXH3_state_t xxh;
};

TransferChecksum::TransferChecksum() : state_(std::make_unique<State>()) { Reset(); }
TransferChecksum::~TransferChecksum() = default;

void TransferChecksum::Reset() { XXH3_64bits_reset(&state_->xxh); }

void TransferChecksum::Update(std::span<const uint8_t> bytes) {
  if (!bytes.empty()) XXH3_64bits_update(&state_->xxh, bytes.data(), bytes.size());
}

uint64_t TransferChecksum::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

}  // namespace fl::core
