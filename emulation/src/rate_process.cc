#include "fl/emulation/rate_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
#include <sstream>

#include "fl/core/str_cat.h"

namespace fl::emulation {
namespace {

// One 1500-byte packet, in millibits (the README's credit unit): rates in Mbit/s are 10^6 millibits per ms.
constexpr int64_t kPacketMillibits = 12'000'000;
constexpr double kPacketBits = 12'000.0;
constexpr uint64_t kMaxGeneratedOpportunities = kMaxTraceBytes / 2;

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

// A uniform double in (0, 1] from 53 random bits: the same on every platform (std::*_distribution are not).
double UnitInterval(std::mt19937_64& rng) { return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53; }

// A standard normal by Box-Muller (one of the pair), deterministic for the engine's state.
double StandardNormal(std::mt19937_64& rng) {
  const double u1 = UnitInterval(rng);
  const double u2 = UnitInterval(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// Rounded to 4 decimals, without trailing zeros ("12.8", "0.0312", "0").
std::string Short(double v) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(4);
  os << (std::abs(v) < 5e-5 ? 0.0 : v);
  std::string s = os.str();
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return s;
}

std::string Quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

absl::StatusOr<std::vector<double>> IntervalRatesMbit(const MahimahiTrace& trace, uint64_t interval_ms) {
  if (interval_ms == 0) return absl::InvalidArgumentError("interval_ms 0: an interval must be at least 1 ms");
  const uint64_t intervals = trace.period_ms / interval_ms;
  if (intervals == 0) {
    return absl::InvalidArgumentError(StrCat(trace.path, ": the trace lasts ", trace.period_ms,
                                             " ms, less than one interval of ", interval_ms,
                                             " ms; use a shorter interval or a longer trace"));
  }
  std::vector<uint64_t> counts(intervals, 0);
  for (const uint64_t t : trace.opportunities_ms) {
    const uint64_t w = t > 0 ? (t - 1) / interval_ms : 0;
    if (w < intervals) ++counts[w];
  }
  std::vector<double> rates(intervals);
  const double scale = kPacketBits / (static_cast<double>(interval_ms) / 1000.0) / 1e6;
  for (size_t i = 0; i < intervals; ++i) rates[i] = static_cast<double>(counts[i]) * scale;
  return rates;
}

double InclusiveQuantile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double h = static_cast<double>(values.size() - 1) * std::clamp(p, 0.0, 1.0);
  const size_t lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (h - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

double Lag1Autocorrelation(const std::vector<double>& values) {
  if (values.size() < 2) return 0;
  double mean = 0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(values.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    den += (values[i] - mean) * (values[i] - mean);
    if (i + 1 < values.size()) num += (values[i] - mean) * (values[i + 1] - mean);
  }
  return den > 0 ? num / den : 0;
}

RateStats ComputeRateStats(const std::vector<double>& rates_mbit) {
  RateStats s;
  s.intervals = rates_mbit.size();
  if (rates_mbit.empty()) return s;
  double sum = 0;
  for (double r : rates_mbit) sum += r;
  s.mean_mbit = sum / static_cast<double>(rates_mbit.size());
  s.p5_mbit = InclusiveQuantile(rates_mbit, 0.05);
  s.median_mbit = InclusiveQuantile(rates_mbit, 0.5);
  s.p95_mbit = InclusiveQuantile(rates_mbit, 0.95);
  s.lag1 = Lag1Autocorrelation(rates_mbit);
  return s;
}

absl::Status ValidateRateProcess(const RateProcess& p) {
  if (p.interval_ms < 1 || p.interval_ms > 60'000) {
    return absl::InvalidArgumentError(
        StrCat("interval_ms ", p.interval_ms, " is out of range; allowed: an integer 1 <= interval_ms <= 60000"));
  }
  if (p.duration_s < 1 || p.duration_s > 86'400) {
    return absl::InvalidArgumentError(
        StrCat("duration_s ", p.duration_s, " is out of range; allowed: an integer 1 <= duration_s <= 86400"));
  }
  if (!(p.lag1_autocorrelation > -1 && p.lag1_autocorrelation < 1)) {
    return absl::InvalidArgumentError(StrCat("lag1_autocorrelation ", p.lag1_autocorrelation,
                                             " is out of range; allowed: -1 < lag1_autocorrelation < 1"));
  }
  const std::vector<double>& q = p.quantiles_mbit;
  if (q.size() < 2 || q.size() > 1001) {
    return absl::InvalidArgumentError(
        StrCat("quantiles_mbit has ", q.size(),
               " values; allowed: 2 to 1001 rates in Mbit/s at evenly spaced "
               "probabilities from 0 to 1 (fl-link fit-trace writes 41: p0, p2.5, ..., p100)"));
  }
  for (size_t i = 0; i < q.size(); ++i) {
    if (!std::isfinite(q[i]) || q[i] < 0 || q[i] > 1e6) {
      return absl::InvalidArgumentError(StrCat("quantiles_mbit[", i, "] = ", q[i],
                                               " is out of range; allowed: a rate in Mbit/s, 0 <= rate <= 1000000"));
    }
    if (i > 0 && q[i] < q[i - 1]) {
      return absl::InvalidArgumentError(StrCat("quantiles_mbit[", i, "] = ", q[i], " is below quantiles_mbit[", i - 1,
                                               "] = ", q[i - 1], "; allowed: non-decreasing quantiles"));
    }
  }
  if (q.back() <= 0) {
    return absl::InvalidArgumentError(
        "quantiles_mbit are all 0: a link that never delivers; allowed: a largest quantile above 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<RateProcess> FitRateProcess(const MahimahiTrace& trace, uint64_t interval_ms, std::string source) {
  absl::StatusOr<std::vector<double>> rates = IntervalRatesMbit(trace, interval_ms);
  if (!rates.ok()) return rates.status();
  RateProcess p;
  p.interval_ms = interval_ms;
  p.duration_s = std::max<uint64_t>(1, rates->size() * interval_ms / 1000);
  // The sample lag-1 autocorrelation, bounded away from +-1 (a process needs |phi| < 1).
  p.lag1_autocorrelation = std::clamp(Lag1Autocorrelation(*rates), -0.99, 0.99);
  p.quantiles_mbit.reserve(kFittedQuantiles);
  for (int i = 0; i < kFittedQuantiles; ++i) {
    p.quantiles_mbit.push_back(InclusiveQuantile(*rates, static_cast<double>(i) / (kFittedQuantiles - 1)));
  }
  p.source = std::move(source);
  if (absl::Status s = ValidateRateProcess(p); !s.ok()) {
    return absl::InvalidArgumentError(StrCat(trace.path, ": cannot fit a rate process: ", s.message()));
  }
  return p;
}

double QuantileFunction(const std::vector<double>& q, double u) {
  if (q.empty()) return 0;
  if (q.size() == 1) return q[0];
  const double h = std::clamp(u, 0.0, 1.0) * static_cast<double>(q.size() - 1);
  const size_t lo = std::min(static_cast<size_t>(std::floor(h)), q.size() - 2);
  return q[lo] + (h - static_cast<double>(lo)) * (q[lo + 1] - q[lo]);
}

double GaussianLag1For(const std::vector<double>& quantiles_mbit, double target) {
  // Midpoint rule on [-6, 6] with normal weights: the mapped rates are bounded (the quantiles), so the
  // truncated tails contribute below 1e-8 of the moments.
  constexpr int kPoints = 161;
  constexpr double kLo = -6, kHi = 6;
  constexpr double kStep = (kHi - kLo) / kPoints;
  std::vector<double> z(kPoints), w(kPoints), g(kPoints);
  double wsum = 0;
  for (int i = 0; i < kPoints; ++i) {
    z[i] = kLo + (i + 0.5) * kStep;
    w[i] = std::exp(-0.5 * z[i] * z[i]);
    wsum += w[i];
  }
  double mean = 0, second = 0;
  for (int i = 0; i < kPoints; ++i) {
    w[i] /= wsum;
    g[i] = QuantileFunction(quantiles_mbit, NormalCdf(z[i]));
    mean += w[i] * g[i];
    second += w[i] * g[i] * g[i];
  }
  const double var = second - mean * mean;
  const double clamped = std::clamp(target, -0.99, 0.99);
  if (!(var > 1e-12)) return clamped;  // a constant rate: the correlation does not matter
  // g = Q(Phi(.)) tabulated on a fine grid and interpolated linearly: the double sum below evaluates it 26,000
  // times per step of the bisection, and erfc each time made a profile's load take a noticeable fraction of a
  // second. |phi z_i + s z_j| <= 6 (|phi| + s) <= 6 sqrt(2) < 8.5; the table's step (0.002) keeps the
  // interpolation error far below the quadrature's.
  constexpr double kTableEdge = 8.5;
  constexpr int kTable = 8501;
  constexpr double kTableStep = 2 * kTableEdge / (kTable - 1);
  std::vector<double> table(kTable);
  for (int k = 0; k < kTable; ++k) table[k] = QuantileFunction(quantiles_mbit, NormalCdf(-kTableEdge + k * kTableStep));
  const auto g_at = [&table](double x) {
    const double h = std::clamp((x + kTableEdge) / kTableStep, 0.0, static_cast<double>(kTable - 1));
    const int lo = std::min(static_cast<int>(h), kTable - 2);
    return table[lo] + (h - lo) * (table[lo + 1] - table[lo]);
  };
  // corr(g(X), g(Y)) for standard normals X, Y with correlation phi; Y = phi X + sqrt(1 - phi^2) W.
  const auto mapped_corr = [&](double phi) {
    const double s = std::sqrt(1 - phi * phi);
    double cross = 0;
    for (int i = 0; i < kPoints; ++i) {
      double inner = 0;
      for (int j = 0; j < kPoints; ++j) inner += w[j] * g_at(phi * z[i] + s * z[j]);
      cross += w[i] * g[i] * inner;
    }
    return (cross - mean * mean) / var;
  };
  // The mapped correlation increases with phi (a monotone map of a bivariate normal); bisect.
  double lo = -0.999, hi = 0.999;
  if (clamped <= mapped_corr(lo)) return lo;
  if (clamped >= mapped_corr(hi)) return hi;
  for (int it = 0; it < 30; ++it) {
    const double mid = 0.5 * (lo + hi);
    (mapped_corr(mid) < clamped ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::vector<double> GenerateIntervalRates(const RateProcess& process, uint64_t seed, size_t count) {
  std::vector<double> rates;
  rates.reserve(count);
  const double phi = GaussianLag1For(process.quantiles_mbit, process.lag1_autocorrelation);
  const double innovation = std::sqrt(1 - phi * phi);
  std::mt19937_64 rng(seed);
  std::vector<double> z(count);
  for (size_t i = 0; i < count; ++i) {
    // z_0 from the stationary distribution: no burn-in needed.
    z[i] = i == 0 ? StandardNormal(rng) : phi * z[i - 1] + innovation * StandardNormal(rng);
  }
  // By rank: the k-th smallest z (of n) gets Q(k / (n - 1)), so the series' empirical distribution is the
  // quantile function sampled evenly, whatever the seed (its mean and quantiles do not depend on chance; a
  // finite AR(1) sample's mean would wander by ~sd * sqrt((1 + phi) / ((1 - phi) n)), 10% for two minutes of a
  // strongly correlated trace). The seed only decides the order, which carries the autocorrelation; for large n
  // the rank is n * Phi(z), i.e. this is Q(Phi(z)).
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&z](size_t a, size_t b) { return z[a] < z[b]; });
  rates.assign(count, 0.0);
  for (size_t k = 0; k < count; ++k) {
    const double u = count > 1 ? static_cast<double>(k) / static_cast<double>(count - 1) : 0.5;
    rates[order[k]] = QuantileFunction(process.quantiles_mbit, u);
  }
  return rates;
}

absl::StatusOr<MahimahiTrace> RatesToTrace(const std::vector<double>& rates_mbit, uint64_t interval_ms,
                                           std::string path) {
  if (rates_mbit.empty() || interval_ms == 0) {
    return absl::InvalidArgumentError("a trace needs at least one interval of at least 1 ms");
  }
  // Count first, so that a process asking for more than a trace may hold is refused before anything is kept.
  std::vector<int64_t> per_ms(rates_mbit.size());
  long double total_millibits = 0;
  for (size_t i = 0; i < rates_mbit.size(); ++i) {
    if (!std::isfinite(rates_mbit[i]) || rates_mbit[i] < 0) {
      return absl::InvalidArgumentError(StrCat("interval ", i, ": rate ", rates_mbit[i], " Mbit/s is not >= 0"));
    }
    per_ms[i] = std::llround(rates_mbit[i] * 1e6);
    total_millibits += static_cast<long double>(per_ms[i]) * static_cast<long double>(interval_ms);
  }
  const long double opportunities = total_millibits / kPacketMillibits;
  if (opportunities > static_cast<long double>(kMaxGeneratedOpportunities)) {
    return absl::InvalidArgumentError(StrCat("the generated trace would hold ", static_cast<uint64_t>(opportunities),
                                             " delivery opportunities, more than ", kMaxGeneratedOpportunities,
                                             "; shorten duration_s (the trace repeats)"));
  }
  MahimahiTrace trace;
  trace.path = std::move(path);
  trace.opportunities_ms.reserve(static_cast<size_t>(opportunities) + 2);
  int64_t credit = 0;
  for (size_t i = 0; i < rates_mbit.size(); ++i) {
    const uint64_t base = i * interval_ms;
    for (uint64_t j = 0; j < interval_ms; ++j) {
      credit += per_ms[i];
      while (credit >= kPacketMillibits) {
        trace.opportunities_ms.push_back(base + j + 1);
        credit -= kPacketMillibits;
      }
    }
  }
  const uint64_t duration_ms = rates_mbit.size() * interval_ms;
  if (trace.opportunities_ms.empty() || trace.opportunities_ms.back() < duration_ms) {
    trace.opportunities_ms.push_back(duration_ms);
  }
  trace.period_ms = duration_ms;
  return trace;
}

absl::StatusOr<MahimahiTrace> GenerateTrace(const RateProcess& process) {
  if (absl::Status s = ValidateRateProcess(process); !s.ok()) return s;
  const uint64_t duration_ms = process.duration_s * 1000;
  const size_t count = static_cast<size_t>((duration_ms + process.interval_ms - 1) / process.interval_ms);
  const std::vector<double> rates = GenerateIntervalRates(process, process.seed, count);
  std::string path = StrCat("rate_process(seed ", process.seed, ", interval_ms ", process.interval_ms, ", duration_s ",
                            process.duration_s, ")");
  if (!process.source.empty()) path = StrCat(path, " from ", process.source);
  return RatesToTrace(rates, process.interval_ms, std::move(path));
}

std::string RateProcessToYamlFlow(const RateProcess& p) {
  std::string q;
  for (size_t i = 0; i < p.quantiles_mbit.size(); ++i) q = StrCat(q, i > 0 ? ", " : "", Short(p.quantiles_mbit[i]));
  return StrCat("{interval_ms: ", p.interval_ms, ", duration_s: ", p.duration_s,
                ", lag1_autocorrelation: ", Short(p.lag1_autocorrelation), ", quantiles_mbit: [", q,
                "], source: ", Quoted(p.source), ", seed: ", p.seed, "}");
}

}  // namespace fl::emulation
