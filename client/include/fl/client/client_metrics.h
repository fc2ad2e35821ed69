// Live metrics of one fl-client for Prometheus (prometheus-cpp), served on /metrics (`fl-client --metrics-addr`).
//
// The client's own view of its rounds, next to the server's view in fl-server's /metrics: the server sees a
// phase when the client reports it; this endpoint shows it the moment it ends, and also what the server never
// hears of (reconnects, downloads of tasks that later failed).
//
// Label sets are bounded: the constant labels (client, link kind, device class) are fixed for the process,
// `experiment` is the id of the experiment the client last joined (one per run), `phase` and `direction` are
// small fixed sets. Never a round number: the model version is a gauge's value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fl::client {

struct ClientMetricsLabels {
  std::string client;        // the client's name
  std::string link_kind;     // ethernet, wifi, 5g, other
  std::string device_class;  // e.g. rpi4, x86
};

// Thread-safe: the session's worker thread observes, the main thread sets the experiment and counts reconnects,
// the exposer's thread serialises.
class ClientMetrics {
 public:
  // Serves /metrics on `bind_address` ("127.0.0.1:9465"; port 0 picks a free one). Unavailable, naming the
  // address, when it cannot bind; InvalidArgument when a label is empty.
  static absl::StatusOr<std::unique_ptr<ClientMetrics>> Start(const std::string& bind_address,
                                                              const ClientMetricsLabels& labels);
  ~ClientMetrics();
  ClientMetrics(const ClientMetrics&) = delete;
  ClientMetrics& operator=(const ClientMetrics&) = delete;

  int port() const;

  // The experiment joined (JoinResponse.experiment_id); labels everything observed from now on.
  void SetExperiment(std::string_view experiment_id);
  // One phase of one task as the client measured it: "downlink", "train", "eval" or "uplink". `bytes` moved in
  // that phase (downlink: received, uplink: sent) are added to fl_client_local_bytes_total by direction.
  void ObservePhase(std::string_view phase, double seconds, uint64_t bytes = 0);
  // A train task whose update the server accepted.
  void CountRoundCompleted();
  // A session that ended without the experiment finishing, after which the client joins again.
  void CountReconnect();
  // The global model version last downloaded.
  void SetModelVersion(uint64_t version);

 private:
  struct Impl;
  explicit ClientMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::client
