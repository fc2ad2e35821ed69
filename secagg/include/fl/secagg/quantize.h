// Quantisation of updates into Z_2^32, the ring SecAgg+ masks in (4 bytes per coordinate on the wire).
//
// A value x is clipped to [-range, range] and becomes q = round(x * scale), an integer in [-R, R] with
// R = range * scale (an integer); a client with weight w (FedAvg: its examples, at most max_weight; uniform:
// 1) contributes w * q to each coordinate and w to the weight coordinate, both as two's complement uint32.
// The unmasked sum over n clients is then at most n * max_weight * R in magnitude, so it is exact as an int32
// as long as n * max_weight * R <= 2^31 - 1: MaxPopulation is that n, and a round with more clients is
// refused, never wrapped. The dequantised aggregate sum_u w_u q_u / (scale * sum_u w_u) is within
// 1 / (2 * scale) of the weighted mean of the clipped inputs (each q is within 1/2 of x * scale), plus the
// float32 rounding of the result.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace fl::secagg {

struct QuantizationSpec {
  double range = 1.0;       // values are clipped to [-range, range]
  double scale = 65536.0;   // steps per unit; range * scale must be an integer
  uint32_t max_weight = 1;  // the largest weight a client may give (1: uniform averaging)
};

// Refused (kInvalidInput): range or scale not finite and > 0, range * scale not an integer >= 1,
// max_weight 0, or max_weight * range * scale above 2^31 - 1 (not even one client fits).
absl::Status ValidateQuantization(const QuantizationSpec& spec);

// The most clients whose weighted, quantised updates sum without wrapping: floor((2^31 - 1) / (max_weight * R)).
uint64_t MaxPopulation(const QuantizationSpec& spec);

// Refused (kPopulationBeyondRange) when clients > MaxPopulation(spec), naming both and what to change.
absl::Status CheckPopulation(const QuantizationSpec& spec, uint64_t clients);

// round(clip(x) * scale) (x finite; the caller checks).
int32_t Quantize(const QuantizationSpec& spec, float x);

// The error bound of the dequantised aggregate against the weighted mean of the clipped inputs, before the
// float32 rounding of the result: 1 / (2 * scale).
double AggregateErrorBound(const QuantizationSpec& spec);

}  // namespace fl::secagg
