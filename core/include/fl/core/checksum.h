// A fast non-cryptographic 64-bit checksum for codec payloads and wire transfers.
//
// It guards against truncation and bit flips (a corrupt chunk, a bug in a transport), not against an
// adversary. Four independent lanes over 32-byte stripes keep it well above memory bandwidth of a small
// payload, so verifying before decoding costs little next to the decode itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace fl::core {

uint64_t Checksum64(std::span<const uint8_t> bytes, uint64_t seed = 0);

}  // namespace fl::core
