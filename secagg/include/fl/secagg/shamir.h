// Shamir secret sharing over GF(2^8), byte by byte (the field of AES: x^8 + x^4 + x^3 + x + 1).
//
// Each byte of the secret is the constant term of its own random polynomial of degree threshold - 1; a
// holder's share is the polynomial's values at its x coordinate, one byte per secret byte. x coordinates are
// 1..255 (0 is the secret itself), so at most 255 holders: enough for SecAgg+, where a client's secrets go
// only to its neighbourhood (docs/privacy.md). The field is our own, small and tested (shamir_test.cc):
// multiplication is a fixed 8-step shift-and-add without tables or branches on secret data, so that its
// timing does not depend on the shares.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::secagg {

// GF(2^8) arithmetic (exposed for the tests).
uint8_t GfMul(uint8_t a, uint8_t b);
// a^-1 for a != 0 (a^254); GfInv(0) is 0.
uint8_t GfInv(uint8_t a);

struct Share {
  uint8_t x = 0;           // the holder's coordinate, 1..255
  std::vector<uint8_t> y;  // one byte per secret byte
};

// Fills a buffer with uniformly random bytes (the caller's randomness: libsodium's, or a seeded test source).
using RandomFill = std::function<void(std::span<uint8_t>)>;

// Shares of `secret` for the holders at `xs` (distinct, 1..255), any `threshold` of which reconstruct it.
// Refused: threshold 0 or above xs.size(), an x of 0 or repeated.
absl::StatusOr<std::vector<Share>> ShamirSplit(std::span<const uint8_t> secret, uint32_t threshold,
                                               std::span<const uint8_t> xs, const RandomFill& random);

// The secret from at least `threshold` shares (distinct x, equal lengths). The first `threshold` shares
// interpolate the polynomial; every further share must lie on it, else the shares are inconsistent (one was
// altered) and the call fails: the caller learns that a share is wrong instead of using a wrong secret.
absl::StatusOr<std::vector<uint8_t>> ShamirCombine(std::span<const Share> shares, uint32_t threshold);

}  // namespace fl::secagg
