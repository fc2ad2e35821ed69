// A fleet of emulated clients in one process, speaking fl-server's real protocol (Join, the Session stream
// with heartbeats and clock pongs, DownloadModel, UploadUpdate, evaluation results) for thousands of sessions
// on a few threads: gRPC's callback API for Joins and sessions, a small pool of workers for the transfers of a
// tiny model. Used by bench/fleet_load (docs/performance.md, "Fleets") and by its test. Plaintext channels: the
// server runs with --insecure for the load test.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace fl::bench {

struct FleetOptions {
  std::string address;                // fl-server's host:port
  uint32_t sessions = 1000;           // clients: NAME_PREFIX-0 .. NAME_PREFIX-(sessions-1)
  std::string name_prefix = "fleet";  // names must be unique per server
  uint32_t channels = 8;              // HTTP/2 connections the sessions are spread over
  uint32_t workers = 2;               // threads that download and upload for tasks
  uint32_t join_window_ms = 1000;     // the Joins are spread evenly over this window (0: all at once)
  uint32_t model_values = 16;         // the tiny model: one fp32 tensor of this many values
  uint64_t seed = 1;
};

// What happened so far (every field counted since Start).
struct FleetStats {
  uint64_t joins_sent = 0;
  uint64_t admitted = 0;        // Joins answered admitted (first admissions, not retries)
  uint64_t join_retried = 0;    // Joins answered RESOURCE_EXHAUSTED and retried after the retry-after
  uint64_t join_failed = 0;     // Joins answered with another error (not retried)
  uint64_t sessions_open = 0;   // sessions whose SessionWelcome arrived and that have not ended
  uint64_t sessions_ended = 0;  // sessions the server (or the link) ended before Stop()
  uint64_t heartbeats = 0;
  uint64_t pongs = 0;
  uint64_t train_tasks = 0;
  uint64_t eval_tasks = 0;
  uint64_t updates_accepted = 0;  // uploads answered ACCEPTED
  uint64_t updates_other = 0;     // uploads answered otherwise, or failed in transfer
  uint64_t shutdowns = 0;         // Shutdown messages received
  int64_t first_join_ns = 0;      // steady clock
  int64_t last_admitted_ns = 0;
  int64_t last_welcome_ns = 0;
};

class Fleet {
 public:
  explicit Fleet(FleetOptions options);
  ~Fleet();  // Stop()
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Starts the join storm (returns at once; the Joins go out over join_window_ms).
  absl::Status Start();
  // Waits until every session has its SessionWelcome, or `timeout_ms` passes (DeadlineExceeded with the
  // counts).
  absl::Status WaitAllOpen(int64_t timeout_ms);
  // Waits until `updates` uploads in total were answered (accepted or not), or the timeout.
  absl::Status WaitUpdates(uint64_t updates, int64_t timeout_ms);
  FleetStats stats() const;
  // Cancels every session and call; waits for gRPC to finish them. Idempotent.
  void Stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::bench
