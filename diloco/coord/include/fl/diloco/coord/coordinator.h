// The islands coordinator: fl.v1.Islands, served by `fl-coordinator` (see docs/diloco-coordinator.md). It
// admits islands, fixes the ring order (admission order) and the outer-step schedule (its flags; identical for
// every island), runs one membership barrier per sync, compares the islands' state hashes after every sync and
// orders repairs, and tells late joiners where to copy the global state from. It never sees parameters: only
// ids, endpoints, hashes and measurements.
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
//
// Threading: one event loop (rpc::EventLoop) owns all state. gRPC reactors parse and Post() events
// (coordinator_events.h); the loop thread handles them one at a time, runs the deadlines as timers on the
// injected clock, and answers the calls. The states and their transition tables are in coordinator_states.h;
// records, metrics and log lines are observers of the transitions (coordinator_observer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/service_type.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fl/diloco/coord/coordinator_client.h"
#include "fl/diloco/coord/coordinator_events.h"
#include "fl/diloco/coord/coordinator_observer.h"
#include "fl/rpc/clock.h"
#include "fl/rpc/tls.h"

namespace fl::pki {
class RevocationWatcher;
}  // namespace fl::pki

namespace fl::instrumentation {
class IslandRecordWriter;
class IslandMetrics;
}  // namespace fl::instrumentation

namespace fl::diloco {

struct CoordinatorOptions {
  std::string experiment_id;  // "" = generated ("<name>-<utc time>-<random>")
  std::string experiment_name = "islands";
  IslandSchedule schedule;
  uint32_t min_islands = 1;                   // Join answers are held until this many islands joined
  uint32_t max_islands = 64;                  // more live islands are refused
  std::optional<uint64_t> model_fingerprint;  // unset: the first admitted island's fingerprint is the model's
  uint32_t heartbeat_interval_ms = 1000;      // told to islands
  uint32_t heartbeat_timeout_ms = 10000;      // no heartbeat for this long: the island is evicted
  uint32_t barrier_timeout_ms = 600000;       // BeginSync barrier, from its first arrival (> fetch + H steps)
  uint32_t report_timeout_ms = 600000;        // SyncDone/SyncFailed, from an epoch's first report
  uint32_t max_sync_attempts = 10;            // epochs of one key before the experiment fails
  // A member blamed for a failed exchange is evicted only if it has not reported the epoch itself within
  // this long (its own report proves it alive: the failure was the connection, not the island). Applies to
  // the first attempt of a sync; from the second attempt on a blame evicts at once, so that a pair that
  // keeps failing cannot loop. 0 = evict on the blame.
  uint32_t blame_grace_ms = 2000;
  std::string software_version;  // recorded

  // fl-coordinator --tls-crl: fl-provision's ca/crl.pem, verified against crl_ca_file (--tls-client-ca) and
  // reloaded when it changes (checked every crl_reload_ms). "" = no revocation check. Every call whose
  // certificate is on the list is refused PERMISSION_DENIED (only calls over mutual TLS carry one), and a reload
  // that revokes the certificate of a live island evicts it (trigger certificate_revoked).
  std::string crl_file;
  std::string crl_ca_file;
  uint32_t crl_reload_ms = 1000;

  // The clock of every deadline (heartbeats, barrier, reports, blame grace) and of the records' timestamps.
  const rpc::Clock* clock = rpc::SystemClock::Get();
  // true: the coordinator runs its event loop on a thread of its own. false: whoever created it drives the
  // loop with Coordinator::RunUntilIdle() (deterministic tests on an rpc::ManualClock; the gRPC service is
  // then of no use, as nothing would handle its events).
  bool own_thread = true;
  // Observers besides the records, metrics and log ones (tests); they must outlive the coordinator.
  std::vector<CoordinatorObserver*> observers;

  // InvalidArgument naming the field, its value and the valid range.
  absl::Status Validate() const;
};

// What the coordinator knows, for tests and logs.
struct CoordinatorSnapshot {
  std::vector<std::string> members;    // live members (admitted and not loading), in ring order
  std::vector<std::string> loading;    // late joiners copying the state
  std::vector<std::string> connected;  // live islands whose session stream is open (hello received), by id
  uint64_t last_epoch = 0;
  std::optional<SyncKey> last_committed;
  uint64_t hash_mismatches = 0;  // members whose hash differed from the majority, all syncs
  uint64_t evictions = 0;        // departures other than refusals and the shutdown (leaving counts)
  bool finished = false;         // the last sync of the schedule committed
  std::string failure;           // set when the experiment failed (too many attempts of one sync)
};

class Coordinator {
 public:
  // `records` and `metrics` may be null (not recorded / not exported); they must outlive the coordinator.
  // With crl_file: a list that cannot be loaded or is not signed by crl_ca_file is an error naming the file.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options,
                                                             instrumentation::IslandRecordWriter* records,
                                                             instrumentation::IslandMetrics* metrics);
  ~Coordinator();  // Shutdown("coordinator destroyed")
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The gRPC service (fl.v1.Islands) to register on a server.
  grpc::Service* service();
  // With a revocation list (options().crl_file): checks its file now instead of at the next period (tests);
  // true when a changed list was loaded (its newly revoked islands are evicted by the loop after this returns).
  bool ReloadRevocationList();
  const CoordinatorOptions& options() const;

  // Tells every session, refuses later calls and fails every waiting call with Unavailable; returns once the
  // loop did so. Idempotent. Not from an observer.
  void Shutdown(const std::string& reason);
  // Waits until the schedule's last sync committed and no island is left (or the experiment failed, or
  // Shutdown), at most `timeout`. True when that happened. Without own_thread: runs the loop until idle and
  // answers at once.
  bool WaitDone(absl::Duration timeout);
  // The state once every event posted before the call, and every deadline due on the clock by then, has been
  // handled (a query through the loop). Not from an observer.
  CoordinatorSnapshot Snapshot() const;

  // Hands an event to the loop; any thread. The gRPC service posts one per call and stream message.
  void Post(CoordinatorEvent event);
  // Without own_thread: handles every queued event and due timer on the calling thread until none is left.
  // Returns the number of loop turns that did something.
  size_t RunUntilIdle();

 private:
  friend class CoordinatorTestPeer;  // tests only (missing_row_test.cc): fires a trigger the paths never fire
  class Core;
  Coordinator(std::unique_ptr<Core> core, std::unique_ptr<pki::RevocationWatcher> revocation);
  std::unique_ptr<Core> core_;
  std::unique_ptr<pki::RevocationWatcher> revocation_;  // its thread posts to core_: destroyed before it
  std::unique_ptr<grpc::Service> service_;
};

// Starts a gRPC server (the project's settings: keepalive, message sizes, reflection) for `coordinator`.
// Stop in this order: coordinator->Shutdown(reason) (answers every held call), server->Shutdown(deadline),
// destroy the server, then the coordinator (its reactors call into the coordinator until the server is gone).
struct RunningCoordinatorServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
// With `tls` (fl-coordinator --tls-cert/--tls-key/--tls-client-ca) only mutual TLS is served: an island must
// present a certificate from that CA, and every call naming an island_id must come from the certificate whose
// fl-island://<name> URI SAN is that id (PERMISSION_DENIED otherwise; a client's fl-client:// certificate is no
// island's). Without it (--insecure), plaintext and no check. The revocation list, when there is one, is the
// coordinator's (CoordinatorOptions::crl_file).
absl::StatusOr<RunningCoordinatorServer> StartCoordinatorServer(
    Coordinator* coordinator, const std::string& listen_address,
    const std::optional<rpc::ServerTls>& tls = std::nullopt);

}  // namespace fl::diloco
