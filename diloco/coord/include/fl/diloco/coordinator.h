// The islands coordinator: fl.v1.Islands, served by `fl-server --mode islands` (see
// docs/diloco-coordinator.md). It admits islands, fixes the ring order (admission order) and the
// outer-step schedule (its flags; identical for every island), runs one membership barrier per sync,
// compares the islands' state hashes after every sync and orders repairs, and tells late joiners where to
// copy the global state from. It never sees parameters: only ids, endpoints, hashes and measurements.
//
// Membership rules (the whole protocol is in coordinator_client.h):
//   - an island is a member from its admission (fresh start) or from its StateLoaded (late joiner);
//   - it stops being one when it leaves, its session stream closes, its heartbeats stop for
//     heartbeat_timeout_ms, another member reports it vanished during an exchange (and it does not report
//     that epoch itself within blame_grace_ms: a blamed island that answers is alive, and on the first
//     attempt of a sync it is kept and the sync retried with it), it misses a barrier
//     (barrier_timeout_ms after the first arrival) or a report deadline (report_timeout_ms after the first
//     report of its epoch). It is then "evicted": it must join again and copy the state;
//   - the barrier of sync k waits for every member, and for late joiners whose state is older than k;
//   - an epoch is resolved when every member reported (or is gone). If at least one live member applied
//     it, the sync is committed with the majority hash of those members (ties: the hash of the member
//     first in ring order); members with another hash, and members whose exchange failed, are told to
//     repair from a live holder of that hash. If nobody applied it, every reporter is told to retry and
//     the next BeginSync of that key forms a new epoch without the evicted islands.
// Threading: one mutex guards all state; gRPC callback reactors and one timer thread take it briefly and
// finish RPCs after releasing it. Nothing blocks under the lock except enqueuing records.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fl/diloco/coordinator_client.h"

namespace fl::instrumentation {
class IslandRecordWriter;
class IslandMetrics;
}  // namespace fl::instrumentation

namespace fl::diloco {

struct CoordinatorOptions {
  std::string experiment_id;                // "" = generated ("<name>-<utc time>-<random>")
  std::string experiment_name = "islands";
  IslandSchedule schedule;
  uint32_t min_islands = 1;                 // Join answers are held until this many islands joined
  uint32_t max_islands = 64;                // more live islands are refused
  std::optional<uint64_t> model_fingerprint;  // unset: the first admitted island's fingerprint is the model's
  uint32_t heartbeat_interval_ms = 1000;    // told to islands
  uint32_t heartbeat_timeout_ms = 10000;    // no heartbeat for this long: the island is evicted
  uint32_t barrier_timeout_ms = 600000;     // BeginSync barrier, from its first arrival (> fetch + H steps)
  uint32_t report_timeout_ms = 600000;      // SyncDone/SyncFailed, from an epoch's first report
  uint32_t max_sync_attempts = 10;          // epochs of one key before the experiment fails
  // A member blamed for a failed exchange is evicted only if it has not reported the epoch itself within
  // this long (its own report proves it alive: the failure was the connection, not the island). Applies to
  // the first attempt of a sync; from the second attempt on a blame evicts at once, so that a pair that
  // keeps failing cannot loop. 0 = evict on the blame.
  uint32_t blame_grace_ms = 2000;
  std::string software_version;             // recorded

  // InvalidArgument naming the field, its value and the valid range.
  absl::Status Validate() const;
};

// What the coordinator knows, for tests and logs.
struct CoordinatorSnapshot {
  std::vector<std::string> members;  // live members (admitted and not loading), in ring order
  std::vector<std::string> loading;  // late joiners copying the state
  uint64_t last_epoch = 0;
  std::optional<SyncKey> last_committed;
  uint64_t hash_mismatches = 0;      // members whose hash differed from the majority, all syncs
  uint64_t evictions = 0;
  bool finished = false;             // the last sync of the schedule committed
  std::string failure;               // set when the experiment failed (too many attempts of one sync)
};

class Coordinator {
 public:
  // `records` and `metrics` may be null (not recorded / not exported); they must outlive the coordinator.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             instrumentation::IslandRecordWriter* records,
                                                             instrumentation::IslandMetrics* metrics);
  ~Coordinator();  // Shutdown("coordinator destroyed")
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The gRPC service (fl.v1.Islands) to register on a server.
  grpc::Service* service();
  const CoordinatorOptions& options() const;

  // Tells every session, refuses later calls and fails every waiting call with Unavailable. Idempotent.
  void Shutdown(const std::string& reason);
  // Waits until the schedule's last sync committed and no island is left (or the experiment failed, or
  // Shutdown), at most `timeout`. True when that happened.
  bool WaitDone(absl::Duration timeout);
  CoordinatorSnapshot Snapshot() const;

 private:
  struct State;
  class Service;
  explicit Coordinator(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  std::unique_ptr<Service> service_;
};

// Starts a gRPC server (the project's settings: keepalive, message sizes, reflection) for `coordinator`.
// Stop in this order: coordinator->Shutdown(reason) (answers every held call), server->Shutdown(deadline),
// destroy the server, then the coordinator (its reactors call into the coordinator until the server is gone).
struct RunningCoordinatorServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
absl::StatusOr<RunningCoordinatorServer> StartCoordinatorServer(Coordinator* coordinator,
                                                                const std::string& listen_address);

// fl-server --mode islands: true when argv holds "--mode islands" or "--mode=islands".
bool IslandsModeRequested(int argc, char** argv);
// The whole fl-server islands mode: parses its own flags (see --mode islands --help), opens the records
// and metrics, serves until the schedule finished and every island left, or SIGINT/SIGTERM. Exit code.
int RunCoordinatorMain(int argc, char** argv);

}  // namespace fl::diloco
