#include "fl/instrumentation/server_metrics.h"

#include <algorithm>
#include <optional>

#include "fl/instrumentation/record_columns.h"
#include "metrics_endpoint.h"

namespace fl::instrumentation {
namespace {

// Durations from a millisecond (a loopback download of a small model) to five minutes (a Raspberry Pi
// training a round over 5G).
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300};
}

std::string S(std::string_view v) { return std::string(v); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A phase of a client round, with the client's view of the uplink when it was reported in time, else the
// server's (the client reports its own only after the server's ack).
std::optional<double> PhaseMs(const ClientRoundRecord& r, int phase) {
  switch (phase) {
    case 0: return r.downlink_ms;
    case 1: return r.train_ms;
    case 2: return r.eval_ms;
    default: return r.uplink_ms.has_value() ? r.uplink_ms : r.uplink_server_ms;
  }
}
constexpr const char* kPhaseNames[] = {"downlink", "train", "eval", "uplink"};

}  // namespace

struct ServerMetrics::Impl {
  explicit Impl(internal::MetricsEndpoint e) : endpoint(std::move(e)) {}

  internal::MetricsEndpoint endpoint;
  prometheus::Family<prometheus::Histogram>* phase = nullptr;
  prometheus::Histogram* round = nullptr;
  prometheus::Histogram* aggregation = nullptr;
  prometheus::Gauge* current_round = nullptr;
  prometheus::Gauge* connected = nullptr;
  prometheus::Family<prometheus::Counter>* bytes = nullptr;
  prometheus::Family<prometheus::Counter>* updates = nullptr;
  prometheus::Family<prometheus::Counter>* stragglers = nullptr;
  prometheus::Family<prometheus::Counter>* security_refusals = nullptr;
  prometheus::Counter* joins_shed = nullptr;
  // Families without a series until the first value: a loss or accuracy of 0 before any round would lie.
  prometheus::Family<prometheus::Gauge>* train_loss = nullptr;
  prometheus::Family<prometheus::Gauge>* dp_epsilon = nullptr;
  prometheus::Family<prometheus::Gauge>* eval_loss = nullptr;
  prometheus::Family<prometheus::Gauge>* eval_accuracy = nullptr;
  prometheus::Family<prometheus::Gauge>* eval_mae = nullptr;
  prometheus::Family<prometheus::Gauge>* eval_perplexity = nullptr;
};

absl::StatusOr<std::unique_ptr<ServerMetrics>> ServerMetrics::Start(const std::string& bind_address,
                                                                    const std::string& experiment) {
  absl::StatusOr<internal::MetricsEndpoint> endpoint = internal::MetricsEndpoint::Start(bind_address, experiment);
  if (!endpoint.ok()) return endpoint.status();
  auto impl = std::make_unique<Impl>(*std::move(endpoint));
  internal::MetricsEndpoint& e = impl->endpoint;
  impl->phase = &e.Histograms("fl_client_phase_seconds",
                              "Duration of one phase (downlink, train, eval, idle, uplink) of one client in one round");
  impl->round =
      &e.Histograms("fl_round_seconds", "Round duration, dispatch to commit, on the server").Add({}, DurationBuckets());
  impl->aggregation =
      &e.Histograms("fl_aggregation_seconds", "Finishing the aggregate and the server optimizer step, per round")
           .Add({}, DurationBuckets());
  impl->current_round = &e.Gauges("fl_current_round", "The last committed round").Add({});
  impl->connected = &e.Gauges("fl_connected_clients", "Clients with an open session stream").Add({});
  impl->bytes = &e.Counters("fl_bytes_total", "Model and update payload bytes moved, by direction and link kind");
  impl->updates =
      &e.Counters("fl_updates_total", "Client updates by outcome (ok, late, dropped, rejected) and reject reason");
  // Every outcome starts at zero, so that "no late updates" reads as 0 on a dashboard rather than no data.
  for (const char* outcome : {"ok", "late", "dropped", "rejected"})
    impl->updates->Add({{"outcome", outcome}, {"reason", ""}});
  impl->stragglers = &e.Counters("fl_round_straggler_total",
                                 "Committed rounds whose last accepted update came from this client, by the phase "
                                 "that made it late");
  // By reason only: the peer address of each refusal is in the records (security_events), not a label, whose
  // values a hostile peer could multiply without bound.
  impl->security_refusals =
      &e.Counters("fl_security_refusals_total",
                  "Calls refused for a security reason (name_mismatch, wrong_identity, revoked_certificate, "
                  "bad_token, join_rate, session_limit, upload_limit, stream_deadline, secagg); each is a "
                  "security_events row, "
                  "or counted in a summary row past the address's budget of rows");
  for (SecurityRefusal r : EnumTraits<SecurityRefusal>::kValues)
    impl->security_refusals->Add({{"reason", std::string(SecurityRefusalName(r))}});
  // Load shedding is not a security refusal (nobody misbehaved: the server was behind), so it has its own counter.
  impl->joins_shed = &e.Counters("fl_joins_shed_total",
                                 "Joins answered RESOURCE_EXHAUSTED with a retry-after because the round engine's "
                                 "queue was above --max-engine-queue (load shedding)")
                          .Add({});
  impl->train_loss = &e.Gauges("fl_train_loss", "Mean local training loss of the last committed round");
  impl->dp_epsilon =
      &e.Gauges("fl_dp_epsilon", "Differential privacy: epsilon spent so far at the configured delta (RDP accountant)");
  impl->eval_loss =
      &e.Gauges("fl_eval_loss", "Loss of the global model on the clients' test data at the last evaluation");
  impl->eval_accuracy = &e.Gauges("fl_eval_accuracy",
                                  "Accuracy (0..1) of the global model on the clients' test data at the last "
                                  "evaluation (classification; the token accuracy for next-token)");
  impl->eval_mae = &e.Gauges("fl_eval_mae",
                             "Mean absolute error of the global (regression) model on the clients' "
                             "test data at the last evaluation");
  impl->eval_perplexity = &e.Gauges("fl_eval_perplexity",
                                    "Perplexity, exp(mean token cross-entropy), of the global (next-token) model "
                                    "on the clients' test data at the last evaluation");
  return std::unique_ptr<ServerMetrics>(new ServerMetrics(std::move(impl)));
}

ServerMetrics::ServerMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServerMetrics::~ServerMetrics() = default;

int ServerMetrics::port() const { return impl_->endpoint.port(); }

void ServerMetrics::ObservePhase(std::string_view phase, std::string_view link_kind, std::string_view device_class,
                                 std::string_view client, double seconds) {
  impl_->phase
      ->Add(
          {{"phase", S(phase)}, {"link_kind", S(link_kind)}, {"device_class", S(device_class)}, {"client", S(client)}},
          DurationBuckets())
      .Observe(seconds);
  // Every client that reports a phase has straggler counts from zero: "never the straggler" is a figure.
  for (const char* p : kPhaseNames) impl_->stragglers->Add({{"client", S(client)}, {"phase", p}});
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

void ServerMetrics::CountShedJoin() { impl_->joins_shed->Increment(); }

void ServerMetrics::CountSecurityRefusal(SecurityRefusal reason) {
  impl_->security_refusals->Add({{"reason", std::string(SecurityRefusalName(reason))}}).Increment();
}

void ServerMetrics::CountStraggler(const std::vector<ClientRoundRecord>& rows) {
  std::vector<const ClientRoundRecord*> accepted;
  for (const auto& row : rows) {
    if (row.outcome == ClientOutcome::kOk) accepted.push_back(&row);
  }
  if (accepted.empty()) return;
  const ClientRoundRecord& last = *accepted.back();
  int best = -1, longest_phase = -1;
  double best_excess = 0, longest = -1;
  for (int p = 0; p < 4; ++p) {
    const std::optional<double> mine = PhaseMs(last, p);
    if (!mine.has_value()) continue;
    std::vector<double> all;
    for (const ClientRoundRecord* row : accepted) {
      if (auto v = PhaseMs(*row, p); v.has_value()) all.push_back(*v);
    }
    if (const double excess = *mine - Median(all); excess > best_excess) {
      best_excess = excess;
      best = p;
    }
    if (*mine > longest) {
      longest = *mine;
      longest_phase = p;
    }
  }
  if (best < 0) best = longest_phase;
  impl_->stragglers->Add({{"client", last.client_id}, {"phase", best < 0 ? "unknown" : kPhaseNames[best]}}).Increment();
}

void ServerMetrics::SetTrainLoss(double loss) { impl_->train_loss->Add({}).Set(loss); }

void ServerMetrics::SetPrivacyEpsilon(double epsilon) { impl_->dp_epsilon->Add({}).Set(epsilon); }

void ServerMetrics::SetEvaluation(const Evaluation& evaluation) {
  impl_->eval_loss->Add({}).Set(evaluation.loss);
  if (evaluation.accuracy.has_value()) impl_->eval_accuracy->Add({}).Set(*evaluation.accuracy);
  if (evaluation.mae.has_value()) impl_->eval_mae->Add({}).Set(*evaluation.mae);
  if (evaluation.perplexity.has_value()) impl_->eval_perplexity->Add({}).Set(*evaluation.perplexity);
}

}  // namespace fl::instrumentation
