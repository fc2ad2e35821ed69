// A Prometheus /metrics endpoint as ServerMetrics and IslandMetrics start it: the HTTP exposer, the registry
// it serves, and the constant labels every family carries (the experiment id, which dashboards select by).
//
// Private to fl::instrumentation (src/, not include/).
#pragma once

#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"

namespace fl::instrumentation::internal {

class MetricsEndpoint {
 public:
  // Serves /metrics on `bind_address` (port 0 picks a free one). Unavailable, naming the address and the
  // flag to change, when it cannot listen there. `experiment`: the `experiment` label of every family; ""
  // for none.
  static absl::StatusOr<MetricsEndpoint> Start(const std::string& bind_address, const std::string& experiment);

  // Registers a family with the constant labels. Series are added by the caller (Family::Add).
  prometheus::Family<prometheus::Histogram>& Histograms(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Counter>& Counters(const std::string& name, const std::string& help);
  prometheus::Family<prometheus::Gauge>& Gauges(const std::string& name, const std::string& help);

  // The port it listens on (the chosen one when the address said 0).
  int port() const;

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer_;  // after the registry: stops serving before it goes
  prometheus::Labels constant_;
};

}  // namespace fl::instrumentation::internal
