// Inner loops of the ring's raw fp32 path (see ring_allreduce.cc): one pass over the values that adds (and,
// for the owner of a chunk, divides) and checks that the result is finite, so that refusing NaN/Inf costs
// no extra pass over the 100 MB. Received payloads are raw little-endian fp32 bytes (any alignment).
#pragma once

#include <cstddef>
#include <cstdint>

namespace fl::diloco::kernels {

// out[i] = own[i] + received[i]. Returns true iff every out[i] is finite (a NaN/Inf in either input, or an
// overflow of the sum, makes it false). out may not overlap own or received.
bool AddChecked(const float* own, const uint8_t* received, size_t n, float* out);

// out[i] = (own[i] + received[i]) / divisor: the sum rounded to fp32, then one correctly rounded division
// (the documented order of a mean). Returns true iff every out[i] is finite.
bool AddDivideChecked(const float* own, const uint8_t* received, size_t n, float divisor, float* out);

// out[i] = received[i]. Returns true iff every value is finite.
bool CopyChecked(const uint8_t* received, size_t n, float* out);

}  // namespace fl::diloco::kernels
