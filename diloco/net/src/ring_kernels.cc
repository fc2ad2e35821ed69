// See ring_kernels.h. Written like core/src/codec_kernels.cc: auto-vectorized C++, no intrinsics, compiled
// for AVX2 and the SSE2 baseline (the loader picks one; no FMA is enabled, so both give the same bits). The
// finite check is an integer bit test on the result (exponent all ones <=> Inf/NaN), OR-ed into one flag
// word: no branch inside the loop, so the check rides along with the add at no measurable cost.
#include "ring_kernels.h"

#include <bit>
#include <cstring>

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute)
// Not under GCC's ThreadSanitizer (the tsan preset): the loader runs the clones' resolver before TSan's runtime
// is set up, and the instrumented resolver crashes every binary at load.
#if __has_attribute(target_clones) && !defined(__SANITIZE_THREAD__)
#define FL_RING_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef FL_RING_MULTIVERSION
#define FL_RING_MULTIVERSION
#endif

namespace fl::diloco::kernels {
namespace {

inline __attribute__((always_inline)) float Load(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, sizeof(f));
  return f;
}

// Bit 31 of the result is set iff the exponent of f is all ones (Inf or NaN).
inline __attribute__((always_inline)) uint32_t NonFiniteFlag(float f) {
  return (std::bit_cast<uint32_t>(f) & 0x7f800000u) + 0x00800000u;
}

}  // namespace

FL_RING_MULTIVERSION bool AddChecked(const float* __restrict own, const uint8_t* __restrict received, size_t n,
                                     float* __restrict out) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = own[i] + Load(received + 4 * i);
    out[i] = v;
    flags |= NonFiniteFlag(v);
  }
  return (flags & 0x80000000u) == 0;
}

FL_RING_MULTIVERSION bool AddDivideChecked(const float* __restrict own, const uint8_t* __restrict received, size_t n,
                                           float divisor, float* __restrict out) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = (own[i] + Load(received + 4 * i)) / divisor;
    out[i] = v;
    flags |= NonFiniteFlag(v);
  }
  return (flags & 0x80000000u) == 0;
}

FL_RING_MULTIVERSION bool CopyChecked(const uint8_t* __restrict received, size_t n, float* __restrict out) {
  uint32_t flags = 0;
  for (size_t i = 0; i < n; ++i) {
    const float v = Load(received + 4 * i);
    out[i] = v;
    flags |= NonFiniteFlag(v);
  }
  return (flags & 0x80000000u) == 0;
}

}  // namespace fl::diloco::kernels
