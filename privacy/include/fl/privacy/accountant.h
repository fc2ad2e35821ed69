// The Rényi-DP accountant of the Poisson-subsampled Gaussian mechanism: what ε a federation has spent after T
// rounds in which each client takes part with probability q and the server adds Gaussian noise of multiplier σ
// (noise std σ·C on the sum of updates clipped to L2 norm C).
//
//   RDP of one step at order α (Mironov, Talwar, Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian
//   Mechanism"): RDP(α) = log(A_α)/(α−1), A_α by the binomial sum in log space for integer α and by the
//   two-sided erfc series for fractional α; q = 0 → 0, q = 1 → α/(2σ²), σ = 0 → +∞.
//   Composition: RDP adds over steps (T steps: T·RDP(α)), also across steps of different (q, σ).
//   RDP → (ε, δ) (Balle et al. 2020, Proposition 12 of arXiv:2004.00010 v4, as dp_accounting computes it):
//     ε = min_α [ RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1) ],
//   with ε = 0 where δ² + expm1(−RDP(α)) > 0 (the KL bound) and orders α ≤ 1.01 skipped (numerically unstable).
//
// Federated learning maps onto it with q = clients per round / population and one step per round.
//
// The order grid decides ε to the last digits. `OrderGrid::kTfPrivacy` is TensorFlow Privacy's
// compute_dp_sgd_privacy_lib.py grid, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, 5…63, 128, 256, 512: with it
// the values of TF Privacy's compute_dp_sgd_privacy_test.py come out exactly (q = 150/60000, σ = 1.3, T = 6000,
// δ = 1e-5 → ε = 0.7242234, order 19; see accountant_test.cc). `OrderGrid::kDpAccounting` is Google dp_accounting's
// default (1.1…10.9 by 0.1, 11…63, 128, 256, 512, 1024): finer near 1 and reaching 1024, but without 1.25, so its ε
// differs where the best order is small (the third reference value: order 1.25 there, 1.2 or 1.3 here).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::privacy {

enum class OrderGrid { kTfPrivacy, kDpAccounting };

// The orders of a grid, ascending.
std::vector<double> Orders(OrderGrid grid);
// "tf-privacy" / "dp-accounting" (the command line's names); an unknown name is an InvalidArgument listing both.
absl::StatusOr<OrderGrid> ParseOrderGrid(std::string_view name);
std::string_view OrderGridName(OrderGrid grid);

// The checks every entry point applies, each an InvalidArgument naming the value and what to do.
absl::Status CheckSamplingRate(double q);         // q in [0, 1]
absl::Status CheckNoiseMultiplier(double sigma);  // σ > 0 and finite (σ = 0 gives no privacy)
absl::Status CheckDelta(double delta);            // δ in (0, 1)

// RDP of one step of the Poisson-subsampled Gaussian mechanism at order α > 1. σ = 0 gives +∞ (no privacy: the
// accountant's entry points refuse it; this is the bare formula). Errors: q outside [0, 1], σ < 0, α ≤ 1.
absl::StatusOr<double> SubsampledGaussianRdp(double q, double sigma, double alpha);

// T·RDP(α) for every order.
absl::StatusOr<std::vector<double>> ComputeRdp(double q, double sigma, int64_t steps, std::span<const double> orders);

struct EpsilonAndOrder {
  double epsilon = 0;  // +∞ when no order gives a finite bound
  double order = 0;    // the order at which the minimum is reached
};

// The (ε, δ) conversion above, minimised over the orders. `rdp[i]` belongs to `orders[i]`.
absl::StatusOr<EpsilonAndOrder> EpsilonFromRdp(std::span<const double> orders, std::span<const double> rdp,
                                               double delta);

// ε and its best order after `steps` steps of (q, σ). Refuses σ = 0, q or δ out of range, steps < 1.
absl::StatusOr<EpsilonAndOrder> ComputeEpsilon(double sigma, double q, int64_t steps, double delta,
                                               OrderGrid grid = OrderGrid::kTfPrivacy);

struct NoiseSearch {
  OrderGrid grid = OrderGrid::kTfPrivacy;
  // The search gives up above this σ: a target that needs more noise is reported as unreachable.
  double max_noise_multiplier = 1e4;
  // Bisection stops when the bracket is narrower than this fraction of σ.
  double relative_tolerance = 1e-7;
};

// The smallest σ (to the tolerance, rounded up so that ε(σ) ≤ target) whose `steps` steps at rate q spend at most
// `target_epsilon` at `delta`, by bisection (ε falls as σ grows). Errors: ε ≤ 0 or not finite, δ or q out of range,
// steps < 1, and a target no σ ≤ max_noise_multiplier reaches (the message gives the ε that the cap reaches and what
// to change). q = 0 is refused too: it samples nobody, so every σ spends ε = 0 and there is nothing to search.
absl::StatusOr<double> NoiseForTarget(double target_epsilon, double delta, double q, int64_t steps,
                                      const NoiseSearch& search = {});

// The PrivacyLedger-style incremental accountant the round engine keeps: one step (q, σ) per round, ε(δ) and the
// best order readable after each. Not thread-safe (one owner: the engine's loop thread).
class RdpAccountant {
 public:
  explicit RdpAccountant(OrderGrid grid = OrderGrid::kTfPrivacy);
  // Custom orders, each > 1 and finite, at least one; an InvalidArgument otherwise.
  static absl::StatusOr<RdpAccountant> WithOrders(std::vector<double> orders);

  // An accountant that has already composed `steps` steps whose RDP per order is `rdp` (a ledger kept across a
  // restart: a checkpoint's orders(), rdp() and steps()). Refuses orders WithOrders refuses, a length mismatch,
  // an RDP that is negative or not a number, and steps < 0.
  static absl::StatusOr<RdpAccountant> Restore(std::vector<double> orders, std::vector<double> rdp, int64_t steps);
  // Composes `count` steps of the Poisson-subsampled Gaussian (q, σ). Refuses what ComputeEpsilon refuses; a
  // refused step leaves the accountant unchanged.
  absl::Status AddSteps(double q, double sigma, int64_t count = 1);

  absl::StatusOr<EpsilonAndOrder> Epsilon(double delta) const;
  // ε(δ) as it would be after AddSteps(q, σ, count), the accountant unchanged: a stop condition such as
  // `--dp-target-epsilon` asks it before a round, so that no round spends past the target.
  absl::StatusOr<EpsilonAndOrder> EpsilonIfAdded(double q, double sigma, double delta, int64_t count = 1) const;

  int64_t steps() const { return steps_; }
  std::span<const double> orders() const { return orders_; }
  std::span<const double> rdp() const { return rdp_; }

 private:
  explicit RdpAccountant(std::vector<double> orders);

  std::vector<double> orders_;
  std::vector<double> rdp_;
  int64_t steps_ = 0;
};

}  // namespace fl::privacy
