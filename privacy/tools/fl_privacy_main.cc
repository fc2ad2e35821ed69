// fl-privacy: the RDP accountant from the command line (docs/privacy.md, "Differential privacy").
//
//   fl-privacy epsilon --noise-multiplier σ --sampling-rate q --steps T --delta δ [--orders tf-privacy|dp-accounting]
//       prints the ε that T rounds of the Poisson-subsampled Gaussian mechanism spend, and the best RDP order
//   fl-privacy noise --target-epsilon ε --sampling-rate q --steps T --delta δ [--orders ...] [--max-noise σ]
//       prints the smallest noise multiplier σ that keeps ε at or below the target, and the ε it spends
//
// In federated learning q = clients per round / population and T = rounds. Output lines are `key: value`.
// Exit codes: 0 done; 1 the values were refused (the message says which and what to do) or the target cannot be
// met; 2 bad usage.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"
#include "fl/privacy/accountant.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "fl-privacy: " << fl::ToStd(status.message()) << "\n";
  return 1;
}

std::string Number(double x) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.12g", x);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fl-privacy: ε of the Poisson-subsampled Gaussian mechanism (RDP accountant), or σ for a target ε"};
  app.require_subcommand(1, 1);

  double sigma = 0, q = 0, delta = 0, target = 0, max_noise = 1e4;
  int64_t steps = 0;
  std::string orders = "tf-privacy";
  const std::string orders_help =
      "RDP order grid: tf-privacy (TF Privacy's 1.25 … 512, which reproduces its published values) or "
      "dp-accounting (dp_accounting's 1.1 … 1024)";

  // The schedule both subcommands account: q, T, δ and the order grid.
  auto add_schedule = [&](CLI::App* sub, const char* q_help) {
    sub->add_option("--sampling-rate", q, q_help)->required();
    sub->add_option("--steps", steps, "T: rounds (one step per round)")->required();
    sub->add_option("--delta", delta, "δ, in (0, 1)")->required();
    sub->add_option("--orders", orders, orders_help);
  };
  CLI::App* epsilon = app.add_subcommand("epsilon", "print ε and the best RDP order of a schedule");
  epsilon->add_option("--noise-multiplier", sigma, "σ: noise std / clipping norm")->required();
  add_schedule(epsilon, "q: clients per round / population, in [0, 1]");

  CLI::App* noise = app.add_subcommand("noise", "print the smallest σ whose schedule spends at most a target ε");
  noise->add_option("--target-epsilon", target, "ε to reach, > 0")->required();
  add_schedule(noise, "q: clients per round / population, in (0, 1]");
  noise->add_option("--max-noise", max_noise, "give up above this σ (the target is then unreachable)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every usage error exits 2 (CLI11's own codes vary by error kind).
    return app.exit(e) == 0 ? 0 : 2;
  }

  auto grid = fl::privacy::ParseOrderGrid(orders);
  if (!grid.ok()) return Fail(grid.status());

  if (*epsilon) {
    auto result = fl::privacy::ComputeEpsilon(sigma, q, steps, delta, *grid);
    if (!result.ok()) return Fail(result.status());
    std::cout << "epsilon: " << Number(result->epsilon) << "\norder: " << Number(result->order) << "\n";
    return 0;
  }
  fl::privacy::NoiseSearch search;
  search.grid = *grid;
  search.max_noise_multiplier = max_noise;
  auto found = fl::privacy::NoiseForTarget(target, delta, q, steps, search);
  if (!found.ok()) return Fail(found.status());
  auto spent = fl::privacy::ComputeEpsilon(*found, q, steps, delta, *grid);
  if (!spent.ok()) return Fail(spent.status());
  std::cout << "noise_multiplier: " << Number(*found) << "\nepsilon: " << Number(spent->epsilon)
            << "\norder: " << Number(spent->order) << "\n";
  return 0;
}
