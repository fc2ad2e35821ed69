// A fitted rate process: the figures a link profile ships instead of a measured trace, and the generator that
// turns them back into a Mahimahi trace of the same statistics (docs/testbed.md, "Profiles from measurements").
//
// Fit (FitRateProcess): the trace's per-interval rates, computed as ../shared/traces/README.md does (a delivery at
// timestamp t falls in interval (t-1) / interval_ms, t = 0 in interval 0; only full intervals count; an interval's
// rate is packets x 12,000 bit / interval), then
//   - the quantiles at p = 0, 0.025, 0.05, ..., 0.975, 1 (41 values; linear interpolation between order
//     statistics, Python's statistics.quantiles(method="inclusive"), as the README's p5/p95 are computed). 41
//     rather than 21: the piecewise-linear quantile function through 21 points overstates the mean of the
//     heavy-tailed LTE traces by 6%, through 41 points by under 2% (docs/testbed.md),
//   - the lag-1 autocorrelation of the rates (sum of (x_t - m)(x_t+1 - m) over sum of (x_t - m)^2).
// Generate (GenerateIntervalRates, GenerateTrace): a Gaussian AR(1) z_t = phi z_t-1 + sqrt(1 - phi^2) e_t, each
// z_t mapped through the piecewise-linear quantile function by its rank (the k-th smallest of n gets
// Q(k / (n - 1)): for large n that is Q(Phi(z_t)), and for any n the series' mean and quantiles are the
// process's whatever the seed). Because the mapping is not linear, phi is chosen (GaussianLag1For) so that the
// mapped rates have the fitted lag-1 autocorrelation.
// Rates become delivery opportunities with the README's exact credit rule (RatesToTrace). Everything is seeded
// and uses no implementation-defined distribution, so a seed gives the same trace on every platform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

// Quantiles fitted: 0, 2.5, 5, ..., 100 percent.
inline constexpr int kFittedQuantiles = 41;

// The summary figures of a rate series, in Mbit/s (lag1 has no unit).
struct RateStats {
  size_t intervals = 0;
  double mean_mbit = 0;
  double p5_mbit = 0;
  double median_mbit = 0;
  double p95_mbit = 0;
  double lag1 = 0;
};

// Per-interval rates in Mbit/s of `trace` (see the top of this file). Fewer than one full interval: an error.
absl::StatusOr<std::vector<double>> IntervalRatesMbit(const MahimahiTrace& trace, uint64_t interval_ms);
// The p-quantile (0 <= p <= 1) of `values` by linear interpolation ("inclusive"); values need not be sorted.
double InclusiveQuantile(std::vector<double> values, double p);
// Lag-1 autocorrelation; 0 for a constant series or fewer than 2 values.
double Lag1Autocorrelation(const std::vector<double>& values);
RateStats ComputeRateStats(const std::vector<double>& rates_mbit);

// Checks a process's figures (the profile parser names the field; this names the value and what is allowed).
absl::Status ValidateRateProcess(const RateProcess& process);

// Fits a process to `trace`'s per-interval rates; duration_s is the trace's whole intervals' duration.
absl::StatusOr<RateProcess> FitRateProcess(const MahimahiTrace& trace, uint64_t interval_ms, std::string source);

// The process's quantile function (piecewise linear through quantiles_mbit) at u in [0, 1].
double QuantileFunction(const std::vector<double>& quantiles_mbit, double u);
// The Gaussian AR(1) coefficient whose mapped rates have lag-1 autocorrelation `target` (found by bisection on
// the exact bivariate-normal expectation, computed by quadrature; deterministic).
double GaussianLag1For(const std::vector<double>& quantiles_mbit, double target);

// `count` interval rates of the process, seeded (their sorted values do not depend on the seed).
std::vector<double> GenerateIntervalRates(const RateProcess& process, uint64_t seed, size_t count);
// Rates (Mbit/s, one per interval) to delivery opportunities by the README's credit rule; the period is
// rates.size() x interval_ms. Refuses a trace of more than kMaxTraceBytes / 2 opportunities.
absl::StatusOr<MahimahiTrace> RatesToTrace(const std::vector<double>& rates_mbit, uint64_t interval_ms,
                                           std::string path);
// A trace of process.duration_s from process.seed; its path names the process and the seed.
absl::StatusOr<MahimahiTrace> GenerateTrace(const RateProcess& process);

// The process as a one-line YAML flow map (`rate_process: {...}` in a profile), figures rounded to 4 decimals.
std::string RateProcessToYamlFlow(const RateProcess& process);

}  // namespace fl::emulation
