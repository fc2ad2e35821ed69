#include "fl/client/client_metrics.h"

#include <exception>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"

namespace fl::client {
namespace {

// The same buckets as fl-server's phase histograms (instrumentation/src/server_metrics.cc), so that the two
// views of a phase can be compared bucket by bucket: a millisecond to five minutes.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};
}

}  // namespace

struct ClientMetrics::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Histogram>* phase = nullptr;
  prometheus::Family<prometheus::Counter>* bytes = nullptr;
  prometheus::Family<prometheus::Counter>* rounds = nullptr;
  prometheus::Family<prometheus::Counter>* reconnects = nullptr;
  prometheus::Family<prometheus::Gauge>* model_version = nullptr;
  fl::Mutex mu;
  std::string experiment ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<ClientMetrics>> ClientMetrics::Start(const std::string& bind_address,
                                                                    const ClientMetricsLabels& labels) {
  for (const auto& [name, value] : {std::pair{"client", &labels.client}, std::pair{"link_kind", &labels.link_kind},
                                    std::pair{"device_class", &labels.device_class}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(fl::StrCat("client metrics: the '", name, "' label is empty"));
    }
  }
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        fl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what(), "; pick another --metrics-addr"));
  }
  const prometheus::Labels constant = {
      {"client", labels.client}, {"link_kind", labels.link_kind}, {"device_class", labels.device_class}};
  auto& r = *impl->registry;
  impl->phase = &prometheus::BuildHistogram()
                     .Name("fl_client_local_phase_seconds")
                     .Help("Duration of one phase (downlink, train, eval, uplink) of one task, on the client's clock")
                     .Labels(constant)
                     .Register(r);
  impl->bytes = &prometheus::BuildCounter()
                     .Name("fl_client_local_bytes_total")
                     .Help("Model (down) and update (up) payload bytes this client moved")
                     .Labels(constant)
                     .Register(r);
  impl->rounds = &prometheus::BuildCounter()
                      .Name("fl_client_rounds_completed_total")
                      .Help("Train tasks whose update the server accepted")
                      .Labels(constant)
                      .Register(r);
  impl->reconnects = &prometheus::BuildCounter()
                          .Name("fl_client_reconnects_total")
                          .Help("Sessions that ended before the experiment finished and were joined again")
                          .Labels(constant)
                          .Register(r);
  impl->model_version = &prometheus::BuildGauge()
                             .Name("fl_client_model_version")
                             .Help("The global model version this client last downloaded")
                             .Labels(constant)
                             .Register(r);
  impl->exposer->RegisterCollectable(impl->registry);
  return std::unique_ptr<ClientMetrics>(new ClientMetrics(std::move(impl)));
}

ClientMetrics::ClientMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClientMetrics::~ClientMetrics() = default;

int ClientMetrics::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void ClientMetrics::SetExperiment(std::string_view experiment_id) {
  fl::MutexLock lock(impl_->mu);
  if (impl_->experiment == experiment_id) return;
  impl_->experiment = std::string(experiment_id);
  // Counters start at zero for the new experiment, so that rate() and increase() see them from the start
  // and dashboards show "no reconnects" rather than "no data".
  impl_->rounds->Add({{"experiment", impl_->experiment}});
  impl_->reconnects->Add({{"experiment", impl_->experiment}});
}

void ClientMetrics::ObservePhase(std::string_view phase, double seconds, uint64_t bytes) {
  fl::MutexLock lock(impl_->mu);
  impl_->phase->Add({{"experiment", impl_->experiment}, {"phase", std::string(phase)}}, DurationBuckets())
      .Observe(seconds);
  if (phase == "downlink" || phase == "uplink") {
    impl_->bytes->Add({{"experiment", impl_->experiment}, {"direction", phase == "downlink" ? "down" : "up"}})
        .Increment(static_cast<double>(bytes));
  }
}

void ClientMetrics::CountRoundCompleted() {
  fl::MutexLock lock(impl_->mu);
  impl_->rounds->Add({{"experiment", impl_->experiment}}).Increment();
}

void ClientMetrics::CountReconnect() {
  fl::MutexLock lock(impl_->mu);
  impl_->reconnects->Add({{"experiment", impl_->experiment}}).Increment();
}

void ClientMetrics::SetModelVersion(uint64_t version) {
  fl::MutexLock lock(impl_->mu);
  impl_->model_version->Add({{"experiment", impl_->experiment}}).Set(static_cast<double>(version));
}

}  // namespace fl::client
