// The RDP accountant (accountant.h). The log-space arithmetic follows Mironov, Talwar and Zhang 2019 §3.3 as TF
// Privacy and dp_accounting implement it, so that the reference values come out to their last digits; binomial
// coefficients are accumulated term by term (no lgamma: glibc's writes the global signgam, a data race when two
// threads account at once).
#include "fl/privacy/accountant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "fl/core/str_cat.h"

namespace fl::privacy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(x) + exp(y)).
double LogAdd(double x, double y) {
  const double a = std::min(x, y);
  const double b = std::max(x, y);
  if (a == -kInf) return b;
  return std::log1p(std::exp(a - b)) + b;
}

// log(exp(x) − exp(y)), x ≥ y.
absl::StatusOr<double> LogSub(double x, double y) {
  if (x < y) {
    return absl::InternalError(
        StrCat("RDP series: log-subtraction would be negative (", x, " < ", y, "); report this (q, σ, order)"));
  }
  if (y == -kInf) return x;
  if (x == y) return -kInf;
  // expm1 overflows past about 709; the difference is then x itself to double precision.
  if (x - y > 700) return x;
  return std::log(std::expm1(x - y)) + y;
}

// log(erfc(x)) without underflow: erfc(25) ≈ 8e-274 is still a normal double; past it the asymptotic (Laurent)
// series of log erfc at infinity, whose first omitted term is below 1e-13 there.
double LogErfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  const double x2 = x * x;
  const double inv2 = 1.0 / x2;
  return -0.5 * std::log(M_PI) - std::log(x) - x2 - 0.5 * inv2 + 0.625 * inv2 * inv2 -
         37.0 / 24.0 * inv2 * inv2 * inv2 + 353.0 / 64.0 * inv2 * inv2 * inv2 * inv2;
}

// log(A_α) for integer α ≥ 2: A_α = Σ_i C(α,i) q^i (1−q)^(α−i) exp((i²−i)/(2σ²)).
double LogAInt(double q, double sigma, int64_t alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  double log_a = -kInf;
  double log_binom = 0;  // log C(α, i)
  for (int64_t i = 0; i <= alpha; ++i) {
    const double di = static_cast<double>(i);
    const double s =
        log_binom + di * log_q + static_cast<double>(alpha - i) * log_1mq + (di * di - di) / (2 * sigma * sigma);
    log_a = LogAdd(log_a, s);
    log_binom += std::log(static_cast<double>(alpha - i)) - std::log(di + 1);
  }
  return log_a;
}

// log(A_α) for fractional α: the integral split at z0 = σ² log(1/q − 1) + 1/2 into two series with erfc weights,
// summed until both terms fall below e^−30.
absl::StatusOr<double> LogAFrac(double q, double sigma, double alpha) {
  const double log_q = std::log(q);
  const double log_1mq = std::log1p(-q);
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  double log_a0 = -kInf;
  double log_a1 = -kInf;
  double coef = 1;  // C(α, i), real-valued: its sign alternates once i > α
  for (int64_t i = 0;; ++i) {
    const double di = static_cast<double>(i);
    const double j = alpha - di;
    const double log_coef = std::log(std::abs(coef));
    const double log_t0 = log_coef + di * log_q + j * log_1mq;
    const double log_t1 = log_coef + j * log_q + di * log_1mq;
    const double log_e0 = std::log(0.5) + LogErfc((di - z0) / (M_SQRT2 * sigma));
    const double log_e1 = std::log(0.5) + LogErfc((z0 - j) / (M_SQRT2 * sigma));
    const double log_s0 = log_t0 + (di * di - di) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    if (coef > 0) {
      log_a0 = LogAdd(log_a0, log_s0);
      log_a1 = LogAdd(log_a1, log_s1);
    } else {
      auto a0 = LogSub(log_a0, log_s0);
      if (!a0.ok()) return a0.status();
      auto a1 = LogSub(log_a1, log_s1);
      if (!a1.ok()) return a1.status();
      log_a0 = *a0;
      log_a1 = *a1;
    }
    coef *= (alpha - di) / (di + 1);
    if (std::max(log_s0, log_s1) < -30) break;
  }
  return LogAdd(log_a0, log_a1);
}

absl::Status CheckSteps(int64_t steps) {
  if (steps < 1) {
    return absl::InvalidArgumentError(
        StrCat("steps ", steps, " is not a number of rounds; give at least 1 (one step per round)"));
  }
  return absl::OkStatus();
}

absl::Status CheckOrders(std::span<const double> orders) {
  if (orders.empty()) return absl::InvalidArgumentError("no RDP orders given; give at least one order above 1");
  for (double a : orders) {
    if (!(a > 1) || !std::isfinite(a)) {
      return absl::InvalidArgumentError(StrCat("RDP order ", a, " is not a finite number above 1; remove it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<double> Orders(OrderGrid grid) {
  std::vector<double> orders;
  switch (grid) {
    case OrderGrid::kTfPrivacy:
      // tensorflow/privacy, tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_lib.py:
      // [1.25, 1.5, 1.75, 2., 2.25, 2.5, 3., 3.5, 4., 4.5] + list(range(5, 64)) + [128, 256, 512].
      orders = {1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5};
      for (int a = 5; a < 64; ++a) orders.push_back(a);
      break;
    case OrderGrid::kDpAccounting:
      // dp_accounting's default: [1 + x / 10. for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024].
      for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
      for (int a = 11; a < 64; ++a) orders.push_back(a);
      break;
  }
  for (double a : {128.0, 256.0, 512.0}) orders.push_back(a);
  if (grid == OrderGrid::kDpAccounting) orders.push_back(1024);
  return orders;
}

absl::StatusOr<OrderGrid> ParseOrderGrid(std::string_view name) {
  if (name == "tf-privacy") return OrderGrid::kTfPrivacy;
  if (name == "dp-accounting") return OrderGrid::kDpAccounting;
  return absl::InvalidArgumentError(
      StrCat("order grid '", name, "' is unknown; use tf-privacy (1.25 … 512) or dp-accounting (1.1 … 1024)"));
}

std::string_view OrderGridName(OrderGrid grid) {
  return grid == OrderGrid::kTfPrivacy ? "tf-privacy" : "dp-accounting";
}

absl::Status CheckSamplingRate(double q) {
  if (!(q >= 0 && q <= 1)) {
    return absl::InvalidArgumentError(
        StrCat("sampling rate q = ", q, " is not a probability; give clients per round / population, in [0, 1]"));
  }
  return absl::OkStatus();
}

absl::Status CheckNoiseMultiplier(double sigma) {
  if (sigma == 0) {
    return absl::InvalidArgumentError(
        "noise multiplier σ = 0 gives no privacy (ε is infinite); give σ > 0, e.g. 1.0, or turn DP off");
  }
  if (!(sigma > 0) || !std::isfinite(sigma)) {
    return absl::InvalidArgumentError(
        StrCat("noise multiplier σ = ", sigma, " is not a positive number; give σ > 0, e.g. 1.0"));
  }
  return absl::OkStatus();
}

absl::Status CheckDelta(double delta) {
  if (!(delta > 0 && delta < 1)) {
    return absl::InvalidArgumentError(
        StrCat("δ = ", delta, " is outside (0, 1); give a small probability, below 1/population (e.g. 1e-5)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> SubsampledGaussianRdp(double q, double sigma, double alpha) {
  if (auto s = CheckSamplingRate(q); !s.ok()) return s;
  if (!(sigma >= 0)) return absl::InvalidArgumentError(StrCat("noise multiplier σ = ", sigma, " is negative"));
  if (!(alpha > 1)) return absl::InvalidArgumentError(StrCat("RDP order ", alpha, " is not above 1"));
  if (std::isinf(alpha) || sigma == 0) return kInf;
  if (q == 0) return 0.0;
  if (q == 1) return alpha / (2 * sigma * sigma);
  if (alpha == std::floor(alpha)) return LogAInt(q, sigma, static_cast<int64_t>(alpha)) / (alpha - 1);
  auto log_a = LogAFrac(q, sigma, alpha);
  if (!log_a.ok()) return log_a.status();
  return *log_a / (alpha - 1);
}

absl::StatusOr<std::vector<double>> ComputeRdp(double q, double sigma, int64_t steps, std::span<const double> orders) {
  if (steps < 0) return CheckSteps(steps);
  std::vector<double> rdp;
  rdp.reserve(orders.size());
  for (double a : orders) {
    auto one = SubsampledGaussianRdp(q, sigma, a);
    if (!one.ok()) return one.status();
    rdp.push_back(*one * static_cast<double>(steps));
  }
  return rdp;
}

absl::StatusOr<EpsilonAndOrder> EpsilonFromRdp(std::span<const double> orders, std::span<const double> rdp,
                                               double delta) {
  if (auto s = CheckDelta(delta); !s.ok()) return s;
  if (auto s = CheckOrders(orders); !s.ok()) return s;
  if (orders.size() != rdp.size()) {
    return absl::InvalidArgumentError(
        StrCat(orders.size(), " orders but ", rdp.size(), " RDP values; give one value per order"));
  }
  EpsilonAndOrder best{kInf, orders[0]};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i];
    double r = rdp[i];
    // RDP is non-negative; the log-space sums can land a rounding error below zero for tiny q.
    if (r < 0 && r > -1e-9) r = 0;
    if (!(r >= 0)) return absl::InvalidArgumentError(StrCat("RDP value ", r, " at order ", a, " is negative"));
    double eps;
    if (delta * delta + std::expm1(-r) > 0) {
      eps = 0;  // the KL bound δ ≤ sqrt(1 − exp(−RDP)) already gives ε = 0
    } else if (a > 1.01) {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    } else {
      eps = kInf;  // the bound is numerically unstable as α → 1
    }
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

absl::StatusOr<EpsilonAndOrder> ComputeEpsilon(double sigma, double q, int64_t steps, double delta, OrderGrid grid) {
  if (auto s = CheckNoiseMultiplier(sigma); !s.ok()) return s;
  if (auto s = CheckSamplingRate(q); !s.ok()) return s;
  if (auto s = CheckSteps(steps); !s.ok()) return s;
  if (auto s = CheckDelta(delta); !s.ok()) return s;
  const std::vector<double> orders = Orders(grid);
  auto rdp = ComputeRdp(q, sigma, steps, orders);
  if (!rdp.ok()) return rdp.status();
  return EpsilonFromRdp(orders, *rdp, delta);
}

absl::StatusOr<double> NoiseForTarget(double target_epsilon, double delta, double q, int64_t steps,
                                      const NoiseSearch& search) {
  if (!(target_epsilon > 0) || !std::isfinite(target_epsilon)) {
    return absl::InvalidArgumentError(
        StrCat("target ε = ", target_epsilon, " cannot be met: give a finite ε > 0 (e.g. 1, 4 or 8)"));
  }
  if (auto s = CheckSamplingRate(q); !s.ok()) return s;
  if (q == 0) {
    return absl::InvalidArgumentError(
        "sampling rate q = 0 samples nobody: every σ spends ε = 0; give clients per round / population");
  }
  if (auto s = CheckSteps(steps); !s.ok()) return s;
  if (auto s = CheckDelta(delta); !s.ok()) return s;
  if (!(search.max_noise_multiplier > 0) || !(search.relative_tolerance > 0)) {
    return absl::InvalidArgumentError("the noise search needs a positive cap and tolerance");
  }
  auto epsilon_at = [&](double sigma) -> absl::StatusOr<double> {
    auto e = ComputeEpsilon(sigma, q, steps, delta, search.grid);
    if (!e.ok()) return e.status();
    return e->epsilon;
  };
  auto at_cap = epsilon_at(search.max_noise_multiplier);
  if (!at_cap.ok()) return at_cap.status();
  if (*at_cap > target_epsilon) {
    return absl::InvalidArgumentError(
        StrCat("target ε = ", target_epsilon, " at δ = ", delta, " over ", steps, " steps at q = ", q,
               " is unreachable: even σ = ", search.max_noise_multiplier, " spends ε = ", *at_cap,
               " (the order grid's largest order bounds ε from below); raise the target ε or δ, or run fewer rounds"));
  }
  // Bracket: ε(lo) > target ≥ ε(hi). ε grows without bound as σ → 0, so halving finds lo.
  double hi = std::min(1.0, search.max_noise_multiplier);
  double lo = hi;
  for (;;) {
    auto e = epsilon_at(hi);
    if (!e.ok()) return e.status();
    if (*e <= target_epsilon) break;
    lo = hi;
    hi = std::min(hi * 2, search.max_noise_multiplier);
  }
  if (lo == hi) {
    for (;;) {
      lo /= 2;
      if (lo < 1e-6) return hi;  // a target met by (almost) no noise: report the smallest σ tried
      auto e = epsilon_at(lo);
      if (!e.ok()) return e.status();
      if (*e > target_epsilon) break;
      hi = lo;
    }
  }
  while (hi - lo > search.relative_tolerance * hi) {
    const double mid = 0.5 * (lo + hi);
    auto e = epsilon_at(mid);
    if (!e.ok()) return e.status();
    (*e <= target_epsilon ? hi : lo) = mid;
  }
  return hi;
}

RdpAccountant::RdpAccountant(OrderGrid grid) : RdpAccountant(Orders(grid)) {}

RdpAccountant::RdpAccountant(std::vector<double> orders) : orders_(std::move(orders)), rdp_(orders_.size(), 0.0) {}

absl::StatusOr<RdpAccountant> RdpAccountant::WithOrders(std::vector<double> orders) {
  if (auto s = CheckOrders(orders); !s.ok()) return s;
  std::sort(orders.begin(), orders.end());
  return RdpAccountant(std::move(orders));
}

absl::StatusOr<RdpAccountant> RdpAccountant::Restore(std::vector<double> orders, std::vector<double> rdp,
                                                     int64_t steps) {
  if (auto s = CheckOrders(orders); !s.ok()) return s;
  if (!std::is_sorted(orders.begin(), orders.end())) {
    return absl::InvalidArgumentError("restored orders must be ascending, as orders() gives them");
  }
  if (rdp.size() != orders.size()) {
    return absl::InvalidArgumentError(
        StrCat("restored RDP has ", rdp.size(), " values for ", orders.size(), " orders; they must match"));
  }
  for (size_t i = 0; i < rdp.size(); ++i) {
    // +∞ is a legitimate RDP (σ = 0 is refused, but a huge order at q = 1 may overflow); NaN or negative is not.
    if (std::isnan(rdp[i]) || rdp[i] < 0) {
      return absl::InvalidArgumentError(
          StrCat("restored RDP at order ", orders[i], " is ", rdp[i], "; it must be a number >= 0"));
    }
  }
  if (steps < 0) return absl::InvalidArgumentError(StrCat("restored steps ", steps, " must be >= 0"));
  RdpAccountant a(std::move(orders));
  a.rdp_ = std::move(rdp);
  a.steps_ = steps;
  return a;
}

absl::Status RdpAccountant::AddSteps(double q, double sigma, int64_t count) {
  if (auto s = CheckNoiseMultiplier(sigma); !s.ok()) return s;
  if (auto s = CheckSamplingRate(q); !s.ok()) return s;
  if (auto s = CheckSteps(count); !s.ok()) return s;
  auto rdp = ComputeRdp(q, sigma, count, orders_);
  if (!rdp.ok()) return rdp.status();
  for (size_t i = 0; i < rdp_.size(); ++i) rdp_[i] += (*rdp)[i];
  steps_ += count;
  return absl::OkStatus();
}

absl::StatusOr<EpsilonAndOrder> RdpAccountant::Epsilon(double delta) const {
  return EpsilonFromRdp(orders_, rdp_, delta);
}

absl::StatusOr<EpsilonAndOrder> RdpAccountant::EpsilonIfAdded(double q, double sigma, double delta,
                                                              int64_t count) const {
  RdpAccountant copy = *this;
  if (auto s = copy.AddSteps(q, sigma, count); !s.ok()) return s;
  return copy.Epsilon(delta);
}

}  // namespace fl::privacy
