// Client selection for a round: which of the available clients get a task.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::server {

struct SelectionPolicy {
  // Fraction of available clients asked to train each round (Flower's fraction_fit).
  double fraction = 1.0;
  // Never select fewer than this many (Flower's min_fit_clients).
  uint32_t min_clients = 2;
  // Do not start a round until this many clients are connected (Flower's min_available_clients).
  uint32_t min_available = 2;
};

// Number of clients to select from `num_available`: max(min_clients, ceil(fraction * num_available)),
// capped at num_available. FailedPrecondition when fewer than min_available are connected.
absl::StatusOr<uint32_t> SelectionSize(const SelectionPolicy& policy, uint32_t num_available);

// A seeded, deterministic sample of `count` ids from `available` (order of `available` does not matter: it
// is sorted first). The same (seed, round, attempt) and the same available set give the same selection on
// every run and platform: the shuffle uses mt19937_64's raw output, not std:: distributions, whose
// results are implementation-defined.
std::vector<std::string> SelectClients(std::vector<std::string> available, uint32_t count, uint64_t seed,
                                       uint64_t round, uint32_t attempt);

}  // namespace fl::server
