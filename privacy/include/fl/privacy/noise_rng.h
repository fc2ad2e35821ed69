// The randomness of every DP mechanism: a ChaCha20 keystream (libsodium's crypto_stream_chacha20, 64-bit block
// counter) read as uniform 64-bit words. Production seeds its 256-bit key from the operating system through
// randombytes_buf (NoiseRng::FromSystem); tests inject a fixed seed (NoiseRng::FromSeed) and get the very same
// generator with a known key, so that a statistical test sees one fixed sample and cannot flake. Noise for privacy
// must never come from FromSeed in a real run: anyone who knows the seed can subtract the noise.
//
// One owner at a time (not thread-safe); a thread that adds noise takes its own NoiseRng.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace fl::privacy {

class NoiseRng {
 public:
  // Key from randombytes_buf (the kernel's getrandom). Aborts only if libsodium cannot initialise at all.
  static NoiseRng FromSystem();
  // A deterministic key derived from `seed` (tests, benchmarks and reproducible simulations only).
  static NoiseRng FromSeed(uint64_t seed);
  // A given 256-bit key (the caller's own key derivation; known-answer tests).
  static NoiseRng FromKey(const std::array<unsigned char, 32>& key);

  // A uniform 64-bit word.
  uint64_t Next64() {
    if (next_ == kWords) Refill();
    return buffer_[next_++];
  }
  // One uniform bit (64 bits drawn at a time; the exact samplers' Bernoulli trials take about two each).
  bool NextBit() {
    if (bits_left_ == 0) {
      bits_ = Next64();
      bits_left_ = 64;
    }
    const bool bit = (bits_ & 1) != 0;
    bits_ >>= 1;
    --bits_left_;
    return bit;
  }
  // Uniform in (0, 1]: 53 random bits, never 0, so that log() of it is finite.
  double UniformOpenClosed() { return static_cast<double>((Next64() >> 11) + 1) * 0x1.0p-53; }
  // Uniform in [0, 1).
  double UniformClosedOpen() { return static_cast<double>(Next64() >> 11) * 0x1.0p-53; }
  // A standard normal deviate (Marsaglia's polar method on UniformClosedOpen; the spare deviate is kept).
  double Gaussian();
  // Uniform integer in [0, n), n ≥ 1, without modulo bias (rejection on the smallest covering power of two).
  unsigned __int128 UniformBelow(unsigned __int128 n);

 private:
  static constexpr size_t kWords = 512;  // 4 KiB of keystream per refill
  explicit NoiseRng(const std::array<unsigned char, 32>& key);
  void Refill();

  std::array<unsigned char, 32> key_;
  uint64_t block_counter_ = 0;  // ChaCha20 64-byte blocks consumed
  std::array<uint64_t, kWords> buffer_{};
  size_t next_ = kWords;
  uint64_t bits_ = 0;
  int bits_left_ = 0;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace fl::privacy
