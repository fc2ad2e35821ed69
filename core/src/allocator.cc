#include "fl/core/allocator.h"

#include <malloc.h>

#include <limits>

#include "fl/core/str_cat.h"

namespace fl::core {

absl::Status KeepFreedMemory(size_t mmap_threshold, size_t trim_threshold) {
  constexpr size_t kIntMax = static_cast<size_t>(std::numeric_limits<int>::max());
  if (mmap_threshold > kIntMax || trim_threshold > kIntMax) {
    return absl::InvalidArgumentError(fl::StrCat("KeepFreedMemory: thresholds must fit an int (mallopt), got mmap ",
                                                 mmap_threshold, ", trim ", trim_threshold));
  }
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(mmap_threshold)) != 1) {
    return absl::InvalidArgumentError(fl::StrCat("glibc refused M_MMAP_THRESHOLD=", mmap_threshold, ""));
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) != 1) {
    return absl::InvalidArgumentError(fl::StrCat("glibc refused M_TRIM_THRESHOLD=", trim_threshold));
  }
  return absl::OkStatus();
}

}  // namespace fl::core
