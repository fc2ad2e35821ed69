// Fast non-cryptographic 64-bit checksums: Checksum64 (home-made; codec bodies, checkpoints, state hashes)
// and TransferChecksum64 (XXH3-64; wire transfers).
//
// It guards against truncation and bit flips (a corrupt chunk, a bug in a transport), not against an
// adversary. Four independent lanes over 32-byte stripes keep it well above memory bandwidth of a small
// payload, so verifying before decoding costs little next to the decode itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace fl::core {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed = 0);

// The checksum of a wire transfer (a model download, an update upload: the trailer's payload_checksum since
// PROTOCOL_VERSION_2): XXH3-64 with seed 0, from libxxhash. Both sides compute it as the chunks pass
// (TransferChecksum), so verifying a transfer costs no second pass over the payload.
uint64_t TransferChecksum64(std::span<const uint8_t> bytes);

// XXH3-64 over bytes given in pieces: Update with each piece in order, then Digest, which equals
// TransferChecksum64 of the concatenation. Reset starts over (the state is reused, not reallocated).
class TransferChecksum {
 public:
  TransferChecksum();
  ~TransferChecksum();
  TransferChecksum(const TransferChecksum&) = delete;
  TransferChecksum& operator=(const TransferChecksum&) = delete;

  void Reset();
  void Update(std::span<const uint8_t> bytes);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fl::core
