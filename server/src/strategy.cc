#include "fl/server/strategy.h"

#include "fl/core/str_cat.h"

namespace fl::server {

absl::Status ResolveStrategy(const std::string& strategy, EngineConfig* config) {
  const std::string name = strategy.substr(0, strategy.find(':'));
  const std::string args = strategy.find(':') == std::string::npos ? "" : strategy.substr(strategy.find(':') + 1);
  config->aggregator = "mean";
  if (name == "fedavg" || name == "fedprox") {
    config->optimizer = strategy == name ? "fedavg" : fl::StrCat("fedavg:", args);
    if (name == "fedprox" && config->train.proximal_mu() <= 0) {
      return absl::InvalidArgumentError("--strategy=fedprox needs --proximal-mu > 0 (e.g. 0.01)");
    }
  } else if (name == "fedavgm" || name == "fedadam" || name == "fedyogi" || name == "fedadagrad" ||
             name == "nesterov") {
    config->optimizer = strategy;
  } else if (name == "fedmedian") {
    config->aggregator = "median";
    config->optimizer = "fedavg";
  } else if (name == "fedtrimmedavg") {
    config->aggregator = fl::StrCat("trimmed_mean:", args.empty() ? "0.2" : args);
    config->optimizer = "fedavg";
  } else {
    return absl::InvalidArgumentError(fl::StrCat(
        "--strategy=", strategy,
        " is not known; use one of fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad, "
        "fedmedian, fedtrimmedavg[:beta], nesterov (optimizer options after a colon, e.g. fedadam:lr=0.03)"));
  }
  return absl::OkStatus();
}

}  // namespace fl::server
