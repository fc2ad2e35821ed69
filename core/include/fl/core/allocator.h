// Process-wide glibc malloc settings for processes that allocate and free large buffers over and over
// (fl-client's training steps, the ring all-reduce's received messages).
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace fl::core {

// glibc's defaults, and why they hurt such processes: a block of 128 KiB or more (M_MMAP_THRESHOLD) is its own
// mmap, unmapped again at free; the threshold rises dynamically (up to 32 MiB) only when such a block is freed,
// and a fixed setting turns that off. The top of a heap is returned to the kernel (trimmed) once more than
// 128 KiB (M_TRIM_THRESHOLD) is free there. Either way the next allocation of the same size gets fresh pages,
// which the kernel must fault in and zero: LibTorch's activations and gradients (one training step) and
// ZeroMQ's 4 MiB messages are freed and reallocated at every step, so a process pays page faults and kernel time
// for every step until the dynamic threshold has caught up (fl-client's first round, issue 32 item 5).
//
// KeepFreedMemory sets both thresholds explicitly: blocks below `mmap_threshold` come from the heap and freed
// memory stays there (up to `trim_threshold` free at the top) for the next allocation. The price is resident
// memory: a process keeps up to about trim_threshold of freed memory instead of returning it, and blocks below
// mmap_threshold fragment the heap instead of being unmapped. Call once, before any thread exists.
inline constexpr size_t kKeepMmapThreshold = size_t{32} << 20;  // glibc's largest dynamic threshold (64-bit)
inline constexpr size_t kKeepTrimThreshold = size_t{1} << 30;

// Returns an error naming the setting glibc refused or a threshold mallopt cannot take (above INT_MAX).
absl::Status KeepFreedMemory(size_t mmap_threshold = kKeepMmapThreshold, size_t trim_threshold = kKeepTrimThreshold);

}  // namespace fl::core
