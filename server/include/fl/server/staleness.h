// The staleness weight of buffered asynchronous aggregation (FedBuff, docs/round-engine.md "Buffered
// aggregation"): an update trained from a model tau versions older than the one it is applied to counts with
// weight n_k * s(tau) in its step's weighted mean.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fl::server {

struct StalenessWeight {
  // s(tau) = 1 / (1 + tau)^exponent; "constant" is exponent 0 (s = 1 whatever tau).
  double exponent = 0.5;
  double operator()(uint64_t tau) const;
  // The spec it was parsed from, normalised: "constant" or "poly:a=<exponent>".
  std::string ToString() const;
};

// "constant" or "poly:a=A" with A a finite number >= 0 ("poly" alone: A = 0.5, i.e. 1/sqrt(1+tau)); errors name
// the flag, the value and what is accepted.
absl::StatusOr<StalenessWeight> ParseStalenessWeight(std::string_view spec);

}  // namespace fl::server
