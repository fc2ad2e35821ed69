// The round engine's private core (server/src only): everything the engine's loop owns. RoundEngine (the public
// class in fl/server/round_engine.h) is a thin shell over it: it starts and stops the loop, posts events to it and
// reads what the loop publishes for other threads (RoundEngine::Published). Everything declared here is touched
// only by the loop thread (or a test's thread between RunUntilIdle calls).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/timeline.h"
#include "fl/rpc/event_loop.h"
#include "fl/server/round_engine.h"
#include "engine_model.h"
#include "engine_privacy.h"
#include "engine_registry.h"
#include "engine_transfers.h"

namespace fl::server {

class RoundEngine::Core {
 public:
  friend class fl::server::RoundEngineTestPeer;
  Core(EngineConfig config, instrumentation::RecordStore* records, StartPoint start, const rpc::Clock* clock,
       Published& published);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  void SetMetrics(instrumentation::ServerMetrics* metrics);
  void AddObserver(std::unique_ptr<EngineObserver> observer) { observers_.push_back(std::move(observer)); }
  absl::Status Start();
  absl::Status StartManual();
  size_t RunUntilIdle() { return loop_.RunUntilIdle(); }
  void Post(EngineEvent event) { loop_.Post(std::move(event)); }
  void Stop();
  size_t QueuedEvents() const { return loop_.queued(); }
  const EngineConfig& config() const { return config_; }
  const rpc::Clock& clock() const { return *clock_; }
  EngineState state() const { return state_; }

 private:
  using ClientInfo = engine::ClientInfo;  // engine_registry.h
  struct TaskInfo;
  struct RoundState;
  struct BufferState;

  absl::Status Prepare();
  void Handle(EngineEvent& event);
  // Moves to the state the transition table gives for `on` and tells the observers; true when it did. A missing
  // row is a bug of the engine (docs/architecture.md, "Errors and missing transitions"): logged critical, counted,
  // and the run ends as failed through the kInvariantBroken row; the caller must then stop what it was doing.
  [[nodiscard]] bool Fire(EngineTrigger on);
  // The row's effect, right after the state changed (EngineEffect).
  void Carry(EngineEffect effect);
  // EngineEffect::kEndRun, with the status and reason Finish left in ending_.
  void EndRun();
  struct Ending {
    instrumentation::ExperimentStatus status = instrumentation::ExperimentStatus::kFailed;
    std::string reason;
  };
  Ending ending_;
  void MissingTransition(EngineTrigger on);
  template <class F>
  void Notify(F&& f) {
    for (auto& o : observers_) f(*o);
  }
  int64_t NowNs() const { return clock_->NowNs(); }
  int64_t UnixMs() const { return clock_->UnixMs(); }
  // Timers (docs/round-engine.md, "Timers"): each re-arms itself while it has something to watch.
  void ArmHeartbeatCheck();
  void ArmUploadCheck();
  // The server's own stalls (engine_stalls.cc): a watchdog keeps the idle loop waking every half threshold; every
  // judgement (an event, a timer that judges, Advance) first calls CatchUpAfterStall, which moves every deadline
  // and liveness mark on by the time the loop did not run when that exceeds the threshold.
  void ArmStallWatchdog();
  void CatchUpAfterStall(int64_t now);
  void MoveDeadlinesOn(int64_t stall_ns, int64_t now);
  void ArmAt(rpc::TimerId& timer, int64_t when_ns);
  void CheckHeartbeats(int64_t now);
  void HandleJoin(JoinEvent& e);
  void HandleSessionOpen(SessionOpenEvent& e);
  void HandleSessionMessage(SessionMessageEvent& e);
  // The JoinRequest.capabilities this run needs of every client, each with the setting that needs it.
  std::vector<std::pair<std::string_view, std::string>> RequiredCapabilities() const;
  void HandleSessionClosed(SessionClosedEvent& e);
  void HandleDownload(DownloadEvent& e);
  void HandleDownloadDone(const DownloadDoneEvent& e);
  // Link-aware compression (engine_codecs.cc): the codec a client's next train task names, the decoder of the
  // codec a task named (the global model's), and the client's uplink rate measured from a finished upload.
  const std::string& UplinkCodecFor(const ClientInfo& client) const;
  const core::Codec& UplinkCodecOf(const TaskInfo& task) const;
  void NoteUplinkRate(const std::string& client_id, uint64_t payload_bytes, int64_t first_byte_ns, int64_t done_ns);
  // The task's client_rounds row as far as the server knows it: who, which attempt, when dispatched, and the
  // server's own view of the task's download when it saw one.
  instrumentation::ClientRoundRecord TaskRow(const TaskInfo& task) const;
  void HandleUploadStart(UploadStartEvent& e);
  void HandleUploadDone(UploadDoneEvent& e);
  void HandleLeave(LeaveEvent& e);
  void HandleShutdown(const ShutdownEvent& e);
  void HandleSecurityRefusal(SecurityRefusalEvent& e);
  void HandleCertificatesRevoked(const CertificatesRevokedEvent& e);
  // A refused call in security_events, and counted by the observers; `detail` is what the peer was told.
  void RecordSecurityRefusal(instrumentation::SecurityEventRecord record);
  // An unknown client id or a wrong session token (RecordSecurityRefusal, reason bad_token).
  void RecordBadToken(const std::string& peer, const std::string& client_id, std::string detail);

  // Moves the state machine forward as far as the current facts allow; also called on timer expiry.
  void Advance();
  // One step of Advance: true when the state moved back to kWaitingForClients and Advance should look again.
  bool AdvanceOnce();
  // A round's (or buffered step's) aggregator: the one the previous round used, reset, when there is one
  // (ReleaseRound keeps it), else a new one with the configured norm clip. A new weighted mean allocates and
  // zeroes two model-sized accumulators: at 25M parameters 200 MB of page faults on the engine thread before
  // the round's tasks can go out (measured: the clients started downloading ~100 ms after the dispatch).
  std::unique_ptr<core::Aggregator> TakeAggregator();
  // Ends current_ (if any), keeping its aggregator's memory for the next round.
  void ReleaseRound();
  void StartEvaluation();
  // Sends `task` to `client` (filling in the model and deadline fields) and opens it in the current round.
  void Dispatch(ClientInfo& client, fl::v1::Task task, uint32_t attempt);
  // Sends a clock-sync ping (the first half of the four-timestamp exchange, see fl/core/clock_sync.h).
  void SendPing(ClientInfo& client);
  void UpdateConnectedGauge();
  // The client's own uplink time (reported after the server's ack) into its client_rounds row.
  void RecordClientUplink(const ClientInfo& client, const std::string& task_id, const fl::v1::PhaseTiming& uplink);
  // Start of the first `phase` in `timings` on the server's timeline, if the client's clock offset is known.
  std::optional<double> PlacePhaseStart(const ClientInfo& client,
                                        const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                                        fl::v1::Phase phase) const;
  void CloseEvaluation();
  // The reports still due after the last round have arrived, or their grace ran out.
  bool Drained(int64_t now);
  // Ends the run: the table's row for `status` (shutdown, drained, gave up), or `via` when given.
  void Finish(instrumentation::ExperimentStatus status, std::string reason,
              std::optional<EngineTrigger> via = std::nullopt);

  absl::Status AdoptModel(core::ModelSpec spec, std::string model_name, std::vector<float> values,
                          uint64_t model_version);
  // Writes the checkpoint file of round_ (temporary file, fsync, rename) and returns its row, which the caller
  // records (with the round's commit); nullopt without --checkpoint-dir.
  absl::StatusOr<std::optional<instrumentation::CheckpointRecord>> WriteCheckpointFile();
  // The round-0 checkpoint of a fresh experiment's initial model (file and row; there is no round to commit).
  absl::Status WriteInitialCheckpoint();
  // Deletes checkpoint files older than the ones kept; only after the records of round_ are stored, so that
  // the checkpoint of the last round the records hold as committed is always on disk.
  void PruneOldCheckpoints();
  // Stores `record` (a round's or an evaluation's commit) and waits until it is in the database. An error when
  // it, or any record enqueued since the previous commit, could not be stored: the caller stops the
  // experiment (a records failure is never passed over: docs/round-engine.md, "Commit and resume").
  absl::Status StoreCommit(instrumentation::Record record);
  // Test hook (docs/round-engine.md): FL_SERVER_TEST_KILL_AT=<step>:<round> makes fl-server SIGKILL itself at
  // that commit step of that round, so that process tests can crash it at every step.
  void MaybeKillForTest(std::string_view step, uint64_t round) const;
  fl::v1::UploadUpdateResponse AcceptUpdate(UploadDoneEvent& e, TaskInfo* task);
  // What a train update of `client` for `task` may report (client_input.h), from what it declared at Join,
  // the task's configuration and what the server measured itself.
  UpdateBounds UpdateReportBounds(const ClientInfo& client, const TaskInfo& task, int64_t now_ns) const;
  // "" when every phase of `timings`, placed on the server's clock with the client's offset, lies between
  // `from_ns` (the dispatch) and `to_ns` (the report's arrival), with slack; else why not.
  std::string PhaseWindowProblem(const ClientInfo& client,
                                 const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
                                 int64_t from_ns, int64_t to_ns) const;
  // Closes `task` as rejected when its update's header is refused (before any payload byte), recording the
  // reason in its client_rounds row.
  void RejectAtHeader(TaskInfo& task, const fl::v1::UploadUpdateResponse& verdict);
  // While waiting for the initial model: when the client asked for it has not uploaded it within
  // initial_model_deadline_ms (or has gone), ask another connected client (its session is closed so that it
  // joins again, and the Join answer asks it).
  void ReaskInitialModelIfStalled(int64_t now_ns);
  // The client asked for the initial model lost the role to `next_client` (`why`): logged, its session
  // closed and the reason recorded as its left_reason.
  void AbandonInitialModelHolder(const std::string& holder_id, const std::string& next_client, std::string_view why);
  void DisconnectClient(ClientInfo& client, std::string_view why, grpc::StatusCode code = grpc::StatusCode::CANCELLED);
  // A per-client event that is not a client_rounds row: a refused report, a revoked upload, ... (client_events).
  void RecordClientEvent(const std::string& client_id, instrumentation::ClientEventKind kind,
                         std::optional<uint64_t> round, std::string task_id, std::string reason);
  void GrantUploadSlots();
  // Takes the slot back from admitted uploads that stalled or trickle below the minimum rate (config upload_*).
  void RevokeSlowUploads(int64_t now);
  // At the end of the run: which clients were not told (ClientsNotToldOfTheEnd), and telling them later.
  void NoteUntoldClients();
  void MarkTold(const std::string& client_id);
  // `at_deadline`: closed by its round's (buffered: its own) deadline, which an upload coming later is told.
  void CloseTaskAsDropped(TaskInfo& task, std::string_view why, bool at_deadline = false);
  // The answer to an upload for a task that is closed or past its deadline, saying why: its deadline passed
  // (and an earlier upload of it was revoked, when one was), it was cancelled, or it was dropped (the client
  // rejoined, its session ended, it reported a failure).
  fl::v1::UploadUpdateResponse ClosedTaskVerdict(const TaskInfo& task, int64_t now) const;
  // Tells the observers that the last committed round is done (`eval` when it was evaluated).
  void RoundDone(const std::optional<instrumentation::ServerMetrics::Evaluation>& eval);
  void Record(instrumentation::Record record);
  instrumentation::RoundRecord RoundRow(const RoundState& round, instrumentation::RoundStatus status) const;
  // Commits the stepped model (a round's, an aggregation step's) in the order --resume relies on: the checkpoint
  // file, then the round row, its client rows, `folded_rows` and the checkpoint's row as one unit; then prunes old
  // checkpoints and tells the observers. On a failure it undoes the step's counters, ends the experiment as failed
  // (naming the `unit` "round"/"aggregation step" and what `units` are committed) and returns false.
  bool CommitGlobalStep(RoundState& round, double aggregation_ms,
                        std::vector<instrumentation::ClientRoundRecord> folded_rows, std::string_view unit,
                        std::string_view units);
  std::vector<ClientInfo*> IdleConnectedClients();
  // The session index and the liveness list (docs/round-engine.md, "Fleets and overload"): every change of a
  // client's session goes through these, so that a message finds its client and the heartbeat check finds the
  // silent ones without a scan of all clients.
  void AttachSession(ClientInfo& client, std::shared_ptr<SessionChannel> channel);
  void DetachSession(ClientInfo& client);
  void HoldPlace(ClientInfo& client, int64_t seen_ns);  // into (or to the back of) the liveness list
  void ReleasePlace(ClientInfo& client);
  ClientInfo* ClientOfSession(const SessionChannel* channel);
  ClientInfo* Authenticate(const std::string& client_id, const std::string& token);
  struct Stragglers;  // engine_internal.h; SyncRounds holds it

  EngineConfig config_;
  const rpc::Clock* clock_;
  ServerTimeline timeline_;  // anchors every placed phase of this run on one wall-clock mapping
  instrumentation::RecordStore* records_;
  StartPoint start_;
  std::vector<std::unique_ptr<EngineObserver>> observers_;

  rpc::EventLoop<EngineEvent> loop_;
  rpc::TimerId heartbeat_timer_ = 0;
  rpc::TimerId upload_timer_ = 0;
  rpc::TimerId deadline_timer_ = 0;       // the open round's or evaluation's deadline
  rpc::TimerId initial_model_timer_ = 0;  // the asked client's --initial-model-deadline-ms
  rpc::TimerId drain_timer_ = 0;
  rpc::TimerId buffer_timer_ = 0;   // buffered: the earliest deadline of a train task out
  rpc::TimerId stall_timer_ = 0;    // the stall watchdog (engine_stalls.cc)
  int64_t stall_threshold_ns_ = 0;  // config stall_threshold_ms resolved at Prepare; 0: off
  int64_t loop_alive_ns_ = 0;       // when the engine last ran (CatchUpAfterStall)

  // ---- engine-thread state ----
  EngineState state_ = EngineState::kWaitingForModel;
  uint64_t missing_transitions_ = 0;  // MissingTransition: bugs met this run (logged critical)
  // Who is known, connected, idle and holding a place, least recently heard first (engine_registry.h).
  engine::ClientRegistry clients_;
  // Hostile peers (engine_clients.cc, docs/security.md): the budget of security_events rows and the clients that
  // joined but never had a task, oldest first. Made on first use; shared_ptr: complete only in engine_clients.cc.
  struct PeersState;
  std::shared_ptr<PeersState> peers_state_;
  PeersState& peers_state();
  // Writes the summary rows of refusals that were counted instead of recorded (due ones, or all of them).
  void WriteRefusalSummaries(bool all);
  // Forgets the oldest clients that never had a task and hold no place, past config_.max_idle_newcomers.
  void ForgetIdleNewcomers();
  // The server is full: frees a place for a Join from `peer` (client `name`) if its address holds less than its
  // share and another more (that one's oldest idle client is disconnected); false when it may not.
  bool YieldPlaceTo(const std::string& peer, const std::string& name);
  uint64_t joins_logged_ = 0;         // admissions logged at info level (the first few, then every 1000th)
  std::string initial_model_client_;  // client asked for the initial weights
  std::shared_ptr<const core::ModelSpec> pending_spec_;  // that client's spec, until its weights arrive
  std::string pending_model_name_;
  int64_t initial_model_asked_ns_ = 0;
  bool initial_model_upload_in_progress_ = false;  // its upload's header was admitted and it has not ended
  // The experiment's learning task: fixed by the first admitted client (or the resumed checkpoint).
  std::optional<core::Task> task_;
  // The weights, version, server optimizer, codecs, download payload and checkpoint file (engine_model.h).
  engine::GlobalModel model_;
  // Central differential privacy: clip norm, noise on the mean, the accountant (engine_privacy.h); off without it.
  engine::CentralDp dp_;
  std::string stop_reason_;  // why the run ends early in kDraining (the privacy budget); "" = all rounds committed
  uint64_t round_ = 0;       // last committed round
  std::unique_ptr<RoundState> current_;
  std::unique_ptr<core::Aggregator> spare_aggregator_;      // TakeAggregator / ReleaseRound
  std::map<std::string, std::unique_ptr<TaskInfo>> tasks_;  // open and recently closed, by task id
  uint32_t attempt_ = 1;
  uint32_t committed_attempt_ = 0;  // attempt that committed round_ (evaluations reference it)
  // Resumed after a crash during round_'s evaluation: evaluate round_ as soon as a client is idle, before the
  // next round (or before finishing when round_ was the last).
  bool evaluation_due_ = false;
  std::map<uint64_t, uint32_t> first_attempts_;  // StartPoint::first_attempts
  uint64_t task_counter_ = 0;
  // Upload slots, the receive buffers kept for them, and the watch that revokes a stalled or slow upload's slot
  // (engine_transfers.h); sized at Prepare.
  engine::UploadSlots uploads_{0};
  std::set<std::string> untold_;  // see ClientsNotToldOfTheEnd
  // Accepted updates whose client has not yet reported its own uplink time (task id -> round); waited on for
  // at most kUplinkReportGraceNs after the last round (kDraining), from drain_deadline_ns_ on.
  std::map<std::string, uint64_t> uplink_reports_due_;
  int64_t drain_deadline_ns_ = 0;
  static constexpr int64_t kUplinkReportGraceNs = 2'000'000'000;
  std::vector<float> scratch_;
  CommittedRound last_round_;  // the last committed round (its client_rows pointer is not kept)
  // The aggregation schedule (engine_schedule.h), made at construction from config_.aggregation: the shared paths
  // call it where they used to test the mode. Each implementation is nested here, so that it reaches the core.
  class AggregationSchedule;
  class SyncRounds;     // engine_schedule_sync.cc (with its state)
  class BufferedSteps;  // engine_buffered.cc (with its state)
  std::unique_ptr<AggregationSchedule> MakeSyncRounds();
  std::unique_ptr<AggregationSchedule> MakeBufferedSteps();
  std::unique_ptr<AggregationSchedule> schedule_;
  Published& published_;  // the end of the run and the counters other threads read (RoundEngine)
};

}  // namespace fl::server
