#include "fl/privacy/noise_rng.h"

#include <sodium.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace fl::privacy {

NoiseRng::NoiseRng(const std::array<unsigned char, 32>& key) : key_(key) {}

NoiseRng NoiseRng::FromSystem() {
  // sodium_init is idempotent and thread-safe; it fails only when the system offers no randomness at all, and then
  // no noise could be private: stop rather than run without it.
  if (sodium_init() < 0) std::abort();
  std::array<unsigned char, 32> key;
  randombytes_buf(key.data(), key.size());
  return NoiseRng(key);
}

NoiseRng NoiseRng::FromSeed(uint64_t seed) {
  if (sodium_init() < 0) std::abort();
  // The seed through a hash, so that nearby seeds give unrelated keys.
  std::array<unsigned char, 32> key;
  unsigned char seed_bytes[8];
  std::memcpy(seed_bytes, &seed, sizeof(seed));
  crypto_generichash(key.data(), key.size(), seed_bytes, sizeof(seed_bytes), nullptr, 0);
  return NoiseRng(key);
}

NoiseRng NoiseRng::FromKey(const std::array<unsigned char, 32>& key) {
  if (sodium_init() < 0) std::abort();
  return NoiseRng(key);
}

void NoiseRng::Refill() {
  static constexpr unsigned char kNonce[crypto_stream_chacha20_NONCEBYTES] = {};
  auto* bytes = reinterpret_cast<unsigned char*>(buffer_.data());
  const size_t size = sizeof(buffer_);
  std::memset(bytes, 0, size);
  // Zeros XORed with the keystream from block `block_counter_` on: the keystream itself, addressable by counter.
  crypto_stream_chacha20_xor_ic(bytes, bytes, size, kNonce, block_counter_, key_.data());
  block_counter_ += size / 64;
  next_ = 0;
}

double NoiseRng::Gaussian() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u, v, s;
  do {
    u = 2 * UniformClosedOpen() - 1;
    v = 2 * UniformClosedOpen() - 1;
    s = u * u + v * v;
  } while (s >= 1 || s == 0);
  const double factor = std::sqrt(-2 * std::log(s) / s);
  spare_ = v * factor;
  has_spare_ = true;
  return u * factor;
}

unsigned __int128 NoiseRng::UniformBelow(unsigned __int128 n) {
  if (n <= 1) return 0;
  const unsigned __int128 max = n - 1;
  if ((max >> 64) == 0) {
    if (max == ~uint64_t{0}) return Next64();
    // Lemire's multiply-and-shift ("Fast random integer generation in an interval", 2019): exactly uniform, and it
    // rejects only when the low half falls below 2^64 mod n, so it rarely draws twice (masking would reject up to
    // half of the draws; the discrete Gaussian makes about a dozen of these per sample).
    const uint64_t range = static_cast<uint64_t>(n);
    unsigned __int128 product = static_cast<unsigned __int128>(Next64()) * range;
    if (static_cast<uint64_t>(product) < range) {
      const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
      while (static_cast<uint64_t>(product) < threshold) product = static_cast<unsigned __int128>(Next64()) * range;
    }
    return product >> 64;
  }
  const uint64_t high = static_cast<uint64_t>(max >> 64);
  const int bits = high != 0 ? 128 - std::countl_zero(high) : 64 - std::countl_zero(static_cast<uint64_t>(max));
  const unsigned __int128 mask =
      bits == 128 ? ~static_cast<unsigned __int128>(0) : ((static_cast<unsigned __int128>(1) << bits) - 1);
  for (;;) {
    unsigned __int128 x = Next64();
    if (bits > 64) x |= static_cast<unsigned __int128>(Next64()) << 64;
    x &= mask;
    if (x < n) return x;
  }
}

}  // namespace fl::privacy
