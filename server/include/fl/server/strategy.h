// Strategies by the names users of Flower know, mapped onto the engine's aggregator + server optimizer.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "fl/server/round_engine.h"

namespace fl::server {

// Sets config->aggregator and config->optimizer for `strategy`:
//   fedavg, fedprox (FedAvg on the server; the proximal term is the clients', --proximal-mu > 0 required),
//   fedavgm, fedadam, fedyogi, fedadagrad, nesterov (weighted mean + that server optimizer; options after a
//   colon: "fedadam:lr=0.03,tau=1e-3"), fedmedian (coordinate-wise median), fedtrimmedavg[:beta].
// InvalidArgument naming the strategy and the valid names otherwise.
absl::Status ResolveStrategy(const std::string& strategy, EngineConfig* config);

}  // namespace fl::server
