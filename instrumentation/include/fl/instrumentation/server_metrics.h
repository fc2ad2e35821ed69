// Live metrics of fl-server for Prometheus (prometheus-cpp), served on /metrics.
//
// Label sets are small and bounded: phase, link kind, device class, client id (the experiment's clients),
// update outcome and reject reason. Never a round number: the current round is a gauge's value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fl::instrumentation {

class ServerMetrics {
 public:
  // Serves /metrics on `bind_address` ("127.0.0.1:9464"; port 0 picks a free one). Unavailable, naming the
  // address, when it cannot bind.
  static absl::StatusOr<std::unique_ptr<ServerMetrics>> Start(const std::string& bind_address);
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

 private:
  struct Impl;
  explicit ServerMetrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::instrumentation
