// The coordinator's state and its handling of events, owned by one event loop (private to diloco/coord).
//
// Everything here runs on the loop thread (or, without own_thread, on the thread that calls RunUntilIdle):
// no member is shared with another thread except the published `done` flag. The three state machines of
// coordinator_states.h move only through Fire(); each Fire looks the transition up in its table, refuses one
// that is not there, tells the observers, then carries out the row's effect.
//
// Files: coordinator_core.cc (the loop, the run machine, snapshots), island_events.cc (calls and session
// messages, the island machine), sync_epochs.cc (barriers, epochs, verdicts and their deadlines, the sync
// machine).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/impl/service_type.h>

#include "absl/base/thread_annotations.h"
#include "coordinator_wire.h"
#include "fl/core/mutex.h"
#include "fl/diloco/coord/coordinator.h"
#include "fl/diloco/coord/coordinator_events.h"
#include "fl/diloco/coord/coordinator_observer.h"
#include "fl/diloco/coord/coordinator_states.h"
#include "fl/proto/convert.h"
#include "fl/rpc/event_loop.h"

namespace fl::diloco {

struct Island {
  IslandJoinRequest info;
  uint64_t join_seq = 0;
  std::string token;
  IslandState state = IslandState::kWaiting;
  Reply<fl::v1::IslandJoinResponse> join_reply;  // while kWaiting
  std::optional<SyncKey> resume_after;           // late joiner: the state it copies includes this sync
  std::optional<SyncKey> last_begun;
  bool retry_allowed = false;         // told to retry last_begun
  std::optional<SyncKey> repair_key;  // kRepairing: the sync whose state it must copy
  uint64_t repair_epoch = 0;
  int64_t last_seen_ns = 0;
  rpc::TimerId heartbeat_timer = 0;
  std::shared_ptr<IslandSession> session;
  // With a revocation list: the serials of the certificates it joined and opened its session with (one and the
  // same unless it was given a new certificate meanwhile); revoking either evicts it.
  std::set<std::string> cert_serials;
};

struct Report {
  bool done = false;
  uint64_t hash = 0;
  SyncStats stats;
  std::string reason;
  std::string vanished;
  int64_t unix_ms = 0;
  Reply<fl::v1::SyncVerdict> reply;
};

struct Epoch {
  EpochInfo info;
  std::map<std::string, uint64_t> join_seq;
  std::map<std::string, Report> reports;
  rpc::TimerId report_timer = 0;  // armed by the first report
  struct Blame {
    std::string by;
    std::string reason;
    rpc::TimerId timer = 0;
  };
  std::map<std::string, Blame> pending_blames;  // blamed member -> first blame, waiting for its own report
};

struct Sync {
  SyncState state = SyncState::kIdle;
  uint32_t attempts = 0;  // epochs formed so far
  int64_t gather_started_ns = 0;
  rpc::TimerId barrier_timer = 0;
  std::map<std::string, Reply<fl::v1::BeginSyncResponse>> arrived;
  std::optional<uint64_t> open_epoch;  // kExchanging
  uint64_t committed_hash = 0;         // kCommitted
  std::vector<std::string> holders;    // kCommitted: told to commit or loaded it, in that order
};

// Why an island transition happens, and what its effect needs.
struct IslandCause {
  std::string reason;                   // departures: why; refusals: the message
  grpc::Status status;                  // kRefuseJoin: the answer
  fl::v1::IslandJoinResponse answer;    // kAnswerJoin: the answer
  const StateSource* source = nullptr;  // kAdmittedLate, kRepairOrdered
  std::optional<SyncKey> key;
  uint64_t epoch = 0;
};

class Coordinator::Core {
 public:
  friend class CoordinatorTestPeer;  // tests only (missing_row_test.cc)
  Core(CoordinatorOptions options, std::vector<std::unique_ptr<CoordinatorObserver>> owned);
  ~Core();

  const CoordinatorOptions& options() const { return opt_; }
  void Post(CoordinatorEvent event) { loop_.Post(std::move(event)); }
  size_t RunUntilIdle() { return loop_.RunUntilIdle(); }
  void Start();  // own_thread: the loop's thread
  void Stop();
  // On the loop thread: the state now.
  CoordinatorSnapshot SnapshotNow() const;
  // On the loop thread: runs `fn` after every timer due at the clock's current reading, then settled.
  void AfterDueTimers(std::function<void()> fn);
  bool OnLoopThread() const { return std::this_thread::get_id() == loop_thread_; }
  // Any thread: whether WaitDone's condition held at the end of the last loop turn.
  bool WaitPublishedDone(absl::Duration timeout);

 private:
  // ---- loop (coordinator_core.cc) ----
  void Handle(CoordinatorEvent& event);
  void AfterTurn();
  void PublishDone();
  bool Done() const;
  const rpc::Clock& clock() const { return *opt_.clock; }
  int64_t NowNs() const { return opt_.clock->NowNs(); }
  int64_t UnixMs() const { return opt_.clock->UnixMs(); }
  std::optional<SyncKey> FinalKey() const;
  int64_t LiveCount() const;

  // ---- the run machine (coordinator_core.cc) ----
  bool Fire(RunTrigger trigger, std::string_view reason = {}, size_t cohort = 0, std::optional<SyncKey> key = {});
  // A (state, trigger) pair one of the three tables lacks (`what` names it): logged critical, the run fails
  // (docs/architecture.md, "Errors and missing transitions"). Every Fire calls it on a missing row.
  void MissingTransition(const std::string& what);
  void OnShutdown(const std::string& reason);
  bool Refusing() const { return run_ == RunState::kShutDown; }
  bool Over() const { return run_ == RunState::kFinished || run_ == RunState::kFailed; }

  // ---- calls and session messages; the island machine (island_events.cc) ----
  void OnJoin(JoinEvent& e);
  void OnBeginSync(BeginSyncEvent& e);
  void OnReport(const std::string& id, const std::string& token, uint64_t epoch_number, const SyncKey& key,
                Report report);
  void OnStateLoaded(StateLoadedEvent& e);
  void OnLeave(LeaveEvent& e);
  void OnSessionOpened(SessionOpenedEvent& e);
  void OnHeartbeat(const HeartbeatEvent& e);
  void OnSessionClosed(const SessionClosedEvent& e);
  void OnCertificatesRevoked(const CertificatesRevokedEvent& e);
  bool Fire(Island& island, IslandTrigger trigger, const IslandCause& cause = {});
  void FailHeldBeginSyncs(const Island& island, const grpc::Status& status);
  void Evict(Island& island, IslandTrigger trigger, const std::string& reason);
  Island* Find(const std::string& id, const std::string& token, grpc::Status* error);
  void AnswerJoins();
  void WatchHeartbeats(const std::string& id, uint64_t join_seq);
  fl::v1::IslandJoinResponse JoinResponse(const Island& island) const;

  // ---- barriers, epochs, verdicts; the sync machine (sync_epochs.cc) ----
  bool Fire(const SyncKey& key, Sync& sync, SyncTrigger trigger, const EpochInfo* epoch = nullptr,
            const EpochResolution* resolution = nullptr);
  void Settle();
  std::set<std::string> ExpectedAt(const SyncKey& key) const;
  void Form(const SyncKey& key, Sync& sync);
  void Resolve(Epoch& epoch);
  EpochResolution Decide(const Epoch& epoch, const Sync& sync, bool* give_up) const;
  void SendPlans(const SyncKey& key, Sync& sync, const EpochInfo& epoch);
  void SendVerdicts(const SyncKey& key, Sync& sync, Epoch& epoch, const EpochResolution& resolution, bool give_up);
  void AbandonOpenEpochs(const std::string& reason);
  bool MemberLive(const Epoch& epoch, const std::string& id) const;
  fl::v1::StateSource SourceProto(const std::string& island_id, uint64_t hash, const SyncKey& key) const;
  void Blame(Epoch& epoch, const std::string& blamed, const std::string& by, const std::string& why);
  void CheckBarrier(const SyncKey& key, int64_t gather_started_ns);
  void CheckReports(uint64_t epoch_number);
  void CheckBlame(uint64_t epoch_number, const std::string& blamed);

  template <class Change>
  void Notify(void (CoordinatorObserver::*on)(const Change&), const Change& change) {
    for (CoordinatorObserver* o : observers_) (o->*on)(change);
  }

  CoordinatorOptions opt_;
  std::vector<std::unique_ptr<CoordinatorObserver>> owned_observers_;
  std::vector<CoordinatorObserver*> observers_;

  RunState run_ = RunState::kGatheringCohort;
  std::string failure_;          // kFailed: why
  std::string shutdown_reason_;  // kShutDown: why
  std::optional<uint64_t> fingerprint_;
  uint64_t next_join_seq_ = 1;
  uint64_t next_epoch_ = 1;
  std::map<std::string, std::unique_ptr<Island>> islands_;
  std::map<SyncKey, Sync> syncs_;
  std::map<uint64_t, Epoch> open_epochs_;
  std::optional<SyncKey> last_committed_;
  uint64_t last_epoch_ = 0;
  uint64_t hash_mismatches_ = 0;
  uint64_t evictions_ = 0;

  std::thread::id loop_thread_;
  mutable fl::Mutex done_mu_;
  fl::CondVar done_cv_;
  bool done_ ABSL_GUARDED_BY(done_mu_) = false;

  rpc::EventLoop<CoordinatorEvent> loop_;  // last: destroyed (stopped) first
};

// The errors the coordinator answers with (every one an ErrorDetail with a hint).
grpc::Status CoordError(grpc::StatusCode code, fl::v1::ErrorCode error_code, std::string message,
                        std::string field = "", std::string hint = "");
grpc::Status EvictedError(const std::string& island, const std::string& reason);
std::string KeyText(const SyncKey& key);

// The observers every coordinator has (observers.cc); `records` / `metrics` may be null (none then).
std::unique_ptr<CoordinatorObserver> MakeRecordsObserver(instrumentation::IslandRecordWriter* records,
                                                         std::string experiment_id);
std::unique_ptr<CoordinatorObserver> MakeMetricsObserver(instrumentation::IslandMetrics* metrics);
std::unique_ptr<CoordinatorObserver> MakeLogObserver();

// The gRPC service fl.v1.Islands (service.cc): parses every call and stream message and posts its event.
// With `revocation` (may be null; must outlive the service) every call whose certificate it lists is refused.
std::unique_ptr<grpc::Service> MakeIslandsService(std::function<void(CoordinatorEvent)> post,
                                                  const pki::RevocationWatcher* revocation);

}  // namespace fl::diloco
