#include "metrics_endpoint.h"

#include <exception>

#include "fl/core/str_cat.h"

namespace fl::instrumentation::internal {

absl::StatusOr<MetricsEndpoint> MetricsEndpoint::Start(const std::string& bind_address, const std::string& experiment) {
  MetricsEndpoint endpoint;
  try {
    endpoint.exposer_ = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        fl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what(), "; pick another --metrics-addr"));
  }
  if (!experiment.empty()) endpoint.constant_["experiment"] = experiment;
  // The exposer collects at scrape time, so families registered from here on are served too.
  endpoint.exposer_->RegisterCollectable(endpoint.registry_);
  return endpoint;
}

prometheus::Family<prometheus::Histogram>& MetricsEndpoint::Histograms(const std::string& name,
                                                                       const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Labels(constant_).Register(*registry_);
}

prometheus::Family<prometheus::Counter>& MetricsEndpoint::Counters(const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Labels(constant_).Register(*registry_);
}

prometheus::Family<prometheus::Gauge>& MetricsEndpoint::Gauges(const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Labels(constant_).Register(*registry_);
}

int MetricsEndpoint::port() const {
  const auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace fl::instrumentation::internal
