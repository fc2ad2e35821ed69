// Live metrics of fl-server for Prometheus (prometheus-cpp), served on /metrics.
//
// Label sets are small and bounded: phase, link kind, device class, client id (the experiment's clients),
// update outcome and reject reason. Never a round number: the current round is a gauge's value.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/instrumentation/records.h"

namespace fl::instrumentation {

class ServerMetrics {
 public:
  // Serves /metrics on `bind_address` ("127.0.0.1:9464"; port 0 picks a free one). Unavailable, naming the
  // address, when it cannot bind. A non-empty `experiment` (the experiment id) is a constant label
  // `experiment` on every metric, so that dashboards can tell experiments apart.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Start(const std::string& bind_address,
                                                              const std::string& experiment = "");
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  int port() const;

  // One phase of one client in one round ("downlink", "train", "eval", "idle", "uplink").
  void ObservePhase(std::string_view phase, std::string_view link_kind, std::string_view device_class,
                    std::string_view client, double seconds);
  void ObserveRound(double seconds);
  void ObserveAggregation(double seconds);
  void SetCurrentRound(uint64_t round);
  void SetConnectedClients(int64_t clients);
  // direction: "down" (server to client) or "up".
  void AddBytes(std::string_view direction, std::string_view link_kind, uint64_t bytes);
  // outcome: "ok", "late", "dropped", "rejected"; reason: "" unless rejected.
  void CountUpdate(std::string_view outcome, std::string_view reason);
  // fl_security_refusals_total{reason}: every reason starts at 0.
  void CountSecurityRefusal(SecurityRefusal reason);
  // fl_joins_shed_total: a Join answered RESOURCE_EXHAUSTED with a retry-after because the engine was behind
  // (--max-engine-queue). Starts at 0. Callable from any thread.
  void CountShedJoin();
  // At a round's commit, with its client rows: counts the round's straggler, fl_round_straggler_total{client,
  // phase}. The straggler is the accepted client whose update arrived last (the last kOk row: rows are in
  // arrival order); its phase is the one most above the round's median for that phase, else its longest one
  // (the definition fl-report uses).
  void CountStraggler(const std::vector<ClientRoundRecord>& rows);
  // Mean local training loss of the committed round.
  void SetTrainLoss(double loss);
  // ε spent so far at the configured δ (central differential privacy; docs/privacy.md).
  void SetPrivacyEpsilon(double epsilon);
  // The global model's evaluation (client results weighted by examples): fl_eval_loss always, and the
  // figures of the experiment's task: fl_eval_accuracy (classification; next-token's token accuracy),
  // fl_eval_mae (regression), fl_eval_perplexity (next-token). A figure the task does not have gets no series
  // rather than a made-up 0.
  struct Evaluation {
    double loss = 0;
    std::optional<double> accuracy;
    std::optional<double> mae;
    std::optional<double> perplexity;
  };
  void SetEvaluation(const Evaluation& evaluation);

 private:
  struct Impl;
  explicit ServerMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::instrumentation
