// Staleness weights of buffered aggregation (staleness.h).
#include "fl/server/staleness.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"

namespace fl::server {

double StalenessWeight::operator()(uint64_t tau) const {
  if (exponent == 0) return 1.0;
  return std::pow(1.0 + static_cast<double>(tau), -exponent);
}

std::string StalenessWeight::ToString() const {
  return exponent == 0 ? std::string("constant") : absl::StrFormat("poly:a=%g", exponent);
}

absl::StatusOr<StalenessWeight> ParseStalenessWeight(std::string_view spec) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--staleness-weight=", spec, " is invalid: ", why,
        "; use \"constant\" (s = 1) or \"poly:a=A\" with A >= 0 (s = 1/(1+tau)^A; poly:a=0.5 is 1/sqrt(1+tau))"));
  };
  if (spec == "constant") return StalenessWeight{0.0};
  if (spec == "poly") return StalenessWeight{0.5};
  constexpr std::string_view kPoly = "poly:a=";
  if (!spec.starts_with(kPoly)) return bad("not a known form");
  double a = 0;
  if (!absl::SimpleAtod(std::string(spec.substr(kPoly.size())), &a) || !std::isfinite(a)) {
    return bad("the exponent is not a number");
  }
  if (a < 0) return bad("a negative exponent would weigh stale updates more than fresh ones");
  return StalenessWeight{a};
}

}  // namespace fl::server
