// Live metrics of the islands coordinator (fl-coordinator) for Prometheus, on /metrics.
//
// Labels are small and bounded: island id (the first `max_island_labels` distinct ids; later ones are
// counted under island="other"), direction, outcome, eviction reason. Never a step, fragment or epoch
// number: the latest ones are gauge values.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fl::instrumentation {

// What one island reported for one sync (seconds, bytes), as the coordinator received it.
struct IslandSyncObservation {
  double inner_compute_seconds = 0;
  double exchange_seconds = 0;
  double wait_seconds = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class IslandMetrics {
 public:
  // Serves /metrics on `bind_address` ("127.0.0.1:0" picks a free port). Unavailable, naming the address,
  // when it cannot bind. `experiment`, when not empty, is a constant label of every series.
  static absl::StatusOr<std::unique_ptr<IslandMetrics>> Start(const std::string& bind_address,
                                                              const std::string& experiment = "",
                                                              size_t max_island_labels = 64);
  ~IslandMetrics();
  IslandMetrics(const IslandMetrics&) = delete;
  IslandMetrics& operator=(const IslandMetrics&) = delete;

  int port() const;

  // One island's report on one sync; outcome: "applied", "mismatch", "failed".
  void ObserveSync(std::string_view island, std::string_view outcome, const IslandSyncObservation& observation);
  // An island's state hash differed from the majority after a sync (a repair was ordered).
  void CountHashMismatch(std::string_view island);
  // A repair or late join finished with the committed hash.
  void CountStateLoaded(std::string_view island, std::string_view why);  // why: "repair", "late_join"
  // An island left the membership; reason: "left", "session_closed", "heartbeat", "vanished",
  // "missed_barrier", "missed_report", "rejoin".
  void CountEviction(std::string_view island, std::string_view reason);
  // An epoch was resolved; outcome: "committed", "retried".
  void ObserveEpoch(std::string_view outcome, double barrier_seconds);
  void SetMembers(int64_t members);
  void SetLastEpoch(uint64_t epoch);
  void SetCommitted(uint64_t step, uint32_t fragment);

 private:
  struct Impl;
  explicit IslandMetrics(std::unique_ptr<Impl> impl);
  std::string IslandLabel(std::string_view island);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::instrumentation
