#include "fl/server/selection.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "fl/core/str_cat.h"

namespace fl::server {

absl::StatusOr<uint32_t> SelectionSize(const SelectionPolicy& policy, uint32_t num_available) {
  if (num_available < policy.min_available || num_available == 0) {
    return absl::FailedPreconditionError(fl::StrCat("only ", num_available, " client(s) connected; the round needs ",
                                                    std::max<uint32_t>(policy.min_available, 1)));
  }
  const auto by_fraction = static_cast<uint32_t>(std::ceil(policy.fraction * num_available));
  return std::min(num_available, std::max(policy.min_clients, by_fraction));
}

std::vector<std::string> SelectClients(std::vector<std::string> available, uint32_t count, uint64_t seed,
                                       uint64_t round, uint32_t attempt) {
  std::sort(available.begin(), available.end());
  // Mix round and attempt into the seed so that a retried round draws a fresh sample.
  std::mt19937_64 rng(seed ^ (round * 0x9E3779B97F4A7C15ULL) ^ (uint64_t{attempt} * 0xC2B2AE3D27D4EB4FULL));
  // Partial Fisher-Yates with rejection sampling for an unbiased index in [i, n).
  const size_t n = available.size();
  const size_t k = std::min<size_t>(count, n);
  for (size_t i = 0; i < k; ++i) {
    const uint64_t range = n - i;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t r;
    do {
      r = rng();
    } while (r >= limit);
    std::swap(available[i], available[i + static_cast<size_t>(r % range)]);
  }
  available.resize(k);
  return available;
}

}  // namespace fl::server
