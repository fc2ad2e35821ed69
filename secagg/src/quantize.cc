#include "fl/secagg/quantize.h"

#include <cmath>
#include <limits>

#include "fl/core/str_cat.h"
#include "fl/secagg/events.h"

namespace fl::secagg {
namespace {

constexpr double kInt32Max = 2147483647.0;

absl::Status Invalid(std::string_view message) {
  return Refusal(SecurityEventKind::kInvalidInput, absl::StatusCode::kInvalidArgument, message);
}

}  // namespace

absl::Status ValidateQuantization(const QuantizationSpec& spec) {
  if (!std::isfinite(spec.range) || spec.range <= 0) {
    return Invalid(fl::StrCat("secagg quantisation range ", spec.range, " must be finite and > 0"));
  }
  if (!std::isfinite(spec.scale) || spec.scale <= 0) {
    return Invalid(fl::StrCat("secagg quantisation scale ", spec.scale, " must be finite and > 0"));
  }
  const double steps = spec.range * spec.scale;
  if (steps < 1 || steps != std::floor(steps)) {
    return Invalid(fl::StrCat("secagg range * scale = ", spec.range, " * ", spec.scale, " = ", steps,
                              " must be an integer >= 1 (so that clipped values quantise inside the range); "
                              "pick a scale that makes it one, e.g. a power of two with a power-of-two range"));
  }
  if (spec.max_weight == 0) return Invalid("secagg max_weight 0: it must be >= 1 (1 for uniform averaging)");
  if (static_cast<double>(spec.max_weight) * steps > kInt32Max) {
    return Invalid(fl::StrCat("secagg max_weight * range * scale = ", spec.max_weight, " * ", steps,
                              " exceeds 2^31 - 1: not even one client's update fits; lower the scale or max_weight"));
  }
  return absl::OkStatus();
}

uint64_t MaxPopulation(const QuantizationSpec& spec) {
  const double per_client = static_cast<double>(spec.max_weight) * spec.range * spec.scale;
  return static_cast<uint64_t>(std::floor(kInt32Max / per_client));
}

absl::Status CheckPopulation(const QuantizationSpec& spec, uint64_t clients) {
  if (absl::Status s = ValidateQuantization(spec); !s.ok()) return s;
  const uint64_t most = MaxPopulation(spec);
  if (clients > most) {
    return Refusal(SecurityEventKind::kPopulationBeyondRange, absl::StatusCode::kInvalidArgument,
                   fl::StrCat("secure aggregation of ", clients, " clients: at range ", spec.range, ", scale ",
                              spec.scale, " and max_weight ", spec.max_weight, " at most ", most,
                              " clients sum without wrapping modulo 2^32; lower the scale, the range or max_weight, "
                              "or select fewer clients per round"));
  }
  return absl::OkStatus();
}

int32_t Quantize(const QuantizationSpec& spec, float x) {
  const double clipped = std::fmax(-spec.range, std::fmin(spec.range, static_cast<double>(x)));
  return static_cast<int32_t>(std::llround(clipped * spec.scale));
}

double AggregateErrorBound(const QuantizationSpec& spec) { return 0.5 / spec.scale; }

}  // namespace fl::secagg
