#include "fl/instrumentation/server_metrics.h"

#include <exception>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "fl/core/str_cat.h"

namespace fl::instrumentation {
namespace {

// Durations from a millisecond (a loopback download of a small model) to five minutes (a Raspberry Pi
// training a round over 5G).
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};
}

std::string S(std::string_view v) { return std::string(v); }

}  // namespace

struct ServerMetrics::Impl {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Histogram>* phase = nullptr;
  prometheus::Histogram* round = nullptr;
  prometheus::Histogram* aggregation = nullptr;
  prometheus::Gauge* current_round = nullptr;
  prometheus::Gauge* connected = nullptr;
  prometheus::Family<prometheus::Counter>* bytes = nullptr;
  prometheus::Family<prometheus::Counter>* updates = nullptr;
};

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Start(const std::string& bind_address) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(bind_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(fl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what(),
                                             "; pick another --metrics-addr"));
  }
  auto& r = *impl->registry;
  impl->phase = &prometheus::BuildHistogram()
                     .Name("fl_client_phase_seconds")
                     .Help("Duration of one phase (downlink, train, eval, idle, uplink) of one client in one round")
                     .Register(r);
  impl->round = &prometheus::BuildHistogram()
                     .Name("fl_round_seconds")
                     .Help("Round duration, dispatch to commit, on the server")
                     .Register(r)
                     .Add({}, DurationBuckets());
  impl->aggregation = &prometheus::BuildHistogram()
                           .Name("fl_aggregation_seconds")
                           .Help("Finishing the aggregate and the server optimizer step, per round")
                           .Register(r)
                           .Add({}, DurationBuckets());
  impl->current_round = &prometheus::BuildGauge()
                             .Name("fl_current_round")
                             .Help("The last committed round")
                             .Register(r)
                             .Add({});
  impl->connected = &prometheus::BuildGauge()
                         .Name("fl_connected_clients")
                         .Help("Clients with an open session stream")
                         .Register(r)
                         .Add({});
  impl->bytes = &prometheus::BuildCounter()
                     .Name("fl_bytes_total")
                     .Help("Model and update payload bytes moved, by direction and link kind")
                     .Register(r);
  impl->updates = &prometheus::BuildCounter()
                       .Name("fl_updates_total")
                       .Help("Client updates by outcome (ok, late, dropped, rejected) and reject reason")
                       .Register(r);
  impl->exposer->RegisterCollectable(impl->registry);
  return std::unique_ptr<ServerMetrics>(new ServerMetrics(std::move(impl)));
}

ServerMetrics::ServerMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServerMetrics::~ServerMetrics() = default;

int ServerMetrics::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void ServerMetrics::ObservePhase(std::string_view phase, std::string_view link_kind, std::string_view device_class,
                                 std::string_view client, double seconds) {
  impl_->phase
      ->Add({{"phase", S(phase)}, {"link_kind", S(link_kind)}, {"device_class", S(device_class)}, {"client", S(client)}},
            DurationBuckets())
      .Observe(seconds);
}

void ServerMetrics::ObserveRound(double seconds) { impl_->round->Observe(seconds); }
void ServerMetrics::ObserveAggregation(double seconds) { impl_->aggregation->Observe(seconds); }
void ServerMetrics::SetCurrentRound(uint64_t round) { impl_->current_round->Set(static_cast<double>(round)); }
void ServerMetrics::SetConnectedClients(int64_t clients) { impl_->connected->Set(static_cast<double>(clients)); }

void ServerMetrics::AddBytes(std::string_view direction, std::string_view link_kind, uint64_t bytes) {
  impl_->bytes->Add({{"direction", S(direction)}, {"link_kind", S(link_kind)}}).Increment(static_cast<double>(bytes));
}

void ServerMetrics::CountUpdate(std::string_view outcome, std::string_view reason) {
  impl_->updates->Add({{"outcome", S(outcome)}, {"reason", S(reason)}}).Increment();
}

}  // namespace fl::instrumentation
