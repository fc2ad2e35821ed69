// The round engine: one state machine that runs a federated experiment, on one rpc::EventLoop thread.
//
// States, and the events that move between them, are the transition table in round_engine.cc
// (EngineTransitions(), mirrored in docs/round-engine.md, and a test keeps the two equal):
//   kWaitingForModel   no global model yet; the first admitted client is asked for its initial weights
//   kWaitingForClients fewer connected idle clients than min_available; selection and dispatch start a round,
//                      a committed round's evaluation starts here too
//   kCollecting        train tasks out; updates are validated and streamed into the aggregate as they arrive;
//                      on the last answer or the deadline: commit, or record the attempt as failed and retry,
//                      or give up
//   kEvaluating        evaluate tasks out; on the last answer or the deadline the results are stored
//   kDraining          every round committed; the last clients' uplink reports are waited for (briefly)
//   kFinished          clients told, records closed; Wait() returns
//   kBuffering         buffered aggregation (FedBuff): train tasks keep --concurrency clients busy, each buffer
//                      of updates is one step
//   kUnmasking         secure aggregation: the round's masked uploads are summed; the survivors' shares are awaited
//                      to remove the masks, then the commit (or a failed attempt, the model untouched)
// A shutdown in any state records the open round as aborted, tells every client, and finishes.
//
// RoundEngine is a thin shell over a private core (server/src/engine_core.h, docs/architecture.md "The round
// engine"): everything the core owns is touched only by its loop thread; reactors talk to it through EngineEvents,
// and what other threads read (the result, a few counters) is published in RoundEngine::Published.
// Time comes from an injected rpc::Clock: deadlines, heartbeats and upload progress are loop timers, so tests
// drive them with a ManualClock and RunUntilIdle() instead of sleeping. Records of commits are part of the
// transition (a round is committed only when its records are stored); metrics and the console table are
// EngineObservers of what happened.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/mutex.h"
#include "fl/core/task.h"
#include "fl/core/tensor_spec.h"
#include "fl/server/checkpoint.h"
#include "fl/server/client_input.h"
#include "fl/server/engine_config.h"
#include "fl/server/events.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/server_metrics.h"
#include "fl/rpc/clock.h"
#include "fl/server/selection.h"

namespace fl::server {

// kBuffering: buffered aggregation only (clients train continuously; updates fill the buffer of the next step).
enum class EngineState {
  kWaitingForModel,
  kWaitingForClients,
  kCollecting,
  kEvaluating,
  kDraining,
  kFinished,
  kBuffering,
  kUnmasking  // secure aggregation: the round's masked uploads are in; the survivors' shares remove the masks
};
std::string_view EngineStateName(EngineState state);

// What moves the engine from one state to another.
enum class EngineTrigger {
  kInitialModelAdopted,  // the asked client's weights arrived and passed validation
  kRoundStarted,         // enough idle clients: selected and dispatched
  kRoundCommitted,       // aggregated, stepped, checkpointed, and the round's records stored
  kRoundFailed,          // too few accepted updates by the deadline; the round is retried
  kEvaluationStarted,    // a committed round (or a resumed one whose evaluation was lost) is evaluated
  kEvaluationStored,     // the evaluation's results and figures stored
  kAllRoundsCommitted,   // the last round is committed (and evaluated if due)
  kDrained,              // the last uplink reports arrived, or their grace ran out
  kGaveUp,               // failed: attempts exhausted, a server step, checkpoint or records failure
  kShutdown,             // SIGINT/SIGTERM or the server destroyed
  // Buffered aggregation only (engine_buffered.cc):
  kBufferingStarted,  // enough clients connected (and no evaluation due): train tasks keep --concurrency busy
  kStepApplied,       // the buffer's updates aggregated, stepped, checkpointed, and the step's records stored
  kStepFailed,        // no client could fill the buffer (every one waits for the step) and it holds no update
  kModelLoaded,       // the start point's checkpoint (--initial-model, or --resume's round) adopted at Start
  kBudgetSpent,       // the next round would spend more than --dp-target-epsilon: no further round
  kUnmaskStarted,     // secure aggregation: the masked upload closed with enough survivors; their shares are asked
  // A path of the engine that the table lacks (a bug, never a client's doing): logged critical, the run fails.
  // Every state but kFinished has this row, so that the failure itself goes through the table.
  kInvariantBroken,
};
std::string_view EngineTriggerName(EngineTrigger trigger);

// What the engine does to the outside world on entering a state, carried out by Fire() right after the state
// changed (the islands coordinator's shape: coordinator_states.h). The work that decides whether a transition
// happens at all (an aggregate, a server step, a checkpoint, a records commit: each can fail and then fires
// another trigger) is done before Fire by the handler; records, metrics and log lines are the observers' (they
// see every transition), not effects.
enum class EngineEffect : uint8_t {
  kNone,
  kArmDeadline,    // arm the timer at the open round's (or evaluation's) deadline
  kOpenStep,       // open the buffered step: its aggregator, counters and start time
  kArmDrainGrace,  // arm the grace for the last uplink reports (kUplinkReportGrace from now)
  kEndRun,         // cancel every timer, tell every connected client (Shutdown) and let its session go, refuse the
                   // uploads waiting for a slot, store the status, publish the result
};
std::string_view EngineEffectName(EngineEffect effect);

// One row of the transition table: in `from`, `on` leads to `to`, and Fire carries out `effect`; `effects` says
// in words what the handler did to get there and what the effect does.
struct EngineTransition {
  EngineState from;
  EngineTrigger on;
  EngineState to;
  EngineEffect effect;
  std::string_view effects;
};
// Every allowed transition. Any other (state, trigger) pair is a bug of the engine: the core logs it as critical
// and ends the run as failed (docs/architecture.md, "Errors and missing transitions"); it never aborts fl-server.
std::span<const EngineTransition> EngineTransitions();
// The state `on` leads to from `from`, or nullopt when the table has no such row.
std::optional<EngineState> NextEngineState(EngineState from, EngineTrigger on);

// What a run ended as.
struct EngineResult {
  std::string experiment_id;
  instrumentation::ExperimentStatus status = instrumentation::ExperimentStatus::kRunning;
  std::string reason;
  uint64_t rounds_committed = 0;
  std::string_view status_name() const { return instrumentation::ExperimentStatusName(status); }
};

// A committed round as the observers see it.
struct CommittedRound {
  uint64_t round = 0;
  uint32_t attempt = 0;
  uint32_t accepted = 0;
  std::optional<double> train_loss;
  double duration_ms = 0;
  double aggregation_ms = 0;
  std::optional<double> dp_epsilon;  // ε spent so far (central differential privacy; none without it)
  const std::vector<instrumentation::ClientRoundRecord>* client_rows = nullptr;  // valid during the call
};

// Watches what the engine does, on the engine's thread; must not block. Metrics (instrumentation::ServerMetrics)
// and the console table are observers; a test can add its own.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  virtual void OnTransition(EngineState /*from*/, EngineTrigger /*on*/, EngineState /*to*/) {}
  virtual void OnConnectedClients(int64_t /*connected*/) {}
  // A train task of the open round closed: accepted, late, dropped or rejected (`reason`: the rejection's
  // short name, "" otherwise). `row` is its client_rounds row; `client` what the client declared at Join.
  virtual void OnUpdateOutcome(instrumentation::ClientOutcome /*outcome*/, std::string_view /*reason*/,
                               const instrumentation::ClientRoundRecord& /*row*/,
                               const fl::v1::JoinRequest& /*client*/) {}
  virtual void OnRoundCommitted(const CommittedRound& /*round*/) {}
  // A call refused for a security reason (security_events).
  virtual void OnSecurityRefusal(instrumentation::SecurityRefusal /*reason*/) {}
  virtual void OnEvaluationStored(uint64_t /*round*/, const instrumentation::ServerMetrics::Evaluation& /*figures*/) {}
  // The last thing that happens to a committed round: after its evaluation, or at the commit when it is not
  // evaluated (`figures` empty then, or when no client's result counted).
  virtual void OnRoundDone(const CommittedRound& /*round*/, core::Task /*task*/,
                           const std::optional<instrumentation::ServerMetrics::Evaluation>& /*figures*/) {}
};

// Live Prometheus metrics as an observer.
std::unique_ptr<EngineObserver> MakeMetricsObserver(instrumentation::ServerMetrics* metrics);
// The per-round table a person watches in the terminal (stdout); `steps`: rows are aggregation steps (buffered).
std::unique_ptr<EngineObserver> MakeConsoleTable(bool steps = false);

class RoundEngineTestPeer;  // tests only (server/test/engine_core_test.cc): reaches the core's Fire

class RoundEngine {
 public:
  // Where a run starts: fresh, from an initial-model checkpoint, or resuming an experiment.
  struct StartPoint {
    std::optional<Checkpoint> checkpoint;  // initial model, or the last committed round's when resuming
    bool resume = false;                   // continue experiment checkpoint->experiment_id after its round
    uint32_t first_attempt = 1;            // attempt number for the next round (after aborted attempts)
    // Resuming: the attempt that committed the checkpoint's round (its evaluation rows reference it), and
    // whether that round's evaluation was due but never recorded (fl-server died during it): it is redone
    // before the next round.
    uint32_t committed_attempt = 0;
    bool redo_evaluation = false;
    // --resume-from-round: the rounds committed after the checkpoint's round are re-run; their committed
    // attempts are recorded as aborted with this reason before anything else (RoundsSupersededUpdate).
    bool supersede_later_rounds = false;
    std::string supersede_reason;
    // The first attempt number of later rounds that already have rows (re-run after --resume-from-round), so
    // that a re-run attempt never reuses a recorded (round, attempt).
    std::map<uint64_t, uint32_t> first_attempts;
  };
  // `records` may be null (no records); `clock` null: the system clock.
  RoundEngine(EngineConfig config, instrumentation::RecordStore* records, StartPoint start,
              const rpc::Clock* clock = nullptr);
  ~RoundEngine();
  RoundEngine(const RoundEngine&) = delete;
  RoundEngine& operator=(const RoundEngine&) = delete;

  // Live metrics to update (optional; set before Start): adds a metrics observer.
  void SetMetrics(instrumentation::ServerMetrics* metrics);
  // Observers (set before Start); the engine owns them. The console table is added by default (config
  // print_table).
  void AddObserver(std::unique_ptr<EngineObserver> observer);
  // Validates the configuration and starts the engine thread.
  absl::Status Start();
  // Tests: validates and prepares like Start() but starts no thread; the caller runs the loop with
  // RunUntilIdle() (on a ManualClock, after moving it).
  absl::Status StartManual();
  // Tests with StartManual(): handles queued events and due timers on the calling thread until none is left.
  size_t RunUntilIdle();
  // Thread-safe, non-blocking.
  void Post(EngineEvent event);
  // Blocks until the engine finished (all rounds, failure or shutdown). The engine thread keeps answering
  // events (with "shutting down") until Stop(), so that in-flight RPCs can complete.
  EngineResult Wait();
  // Ends the engine thread; call after the gRPC server has shut down.
  void Stop();
  // After the run ended: admitted clients that were not told so (their session was gone at the end, e.g. a
  // client stopped or cut off, and they have not joined or opened a session since). fl-server keeps
  // answering for a while (--linger-s) while this is not 0, so that such a client learns that the experiment
  // is over instead of retrying Join until it gives up. Thread-safe.
  size_t ClientsNotToldOfTheEnd() const { return published_.untold.load(); }
  // Thread-safe load signals for the service's Join path: events waiting for the loop, and whether new Joins
  // are shed now (queued() above config max_engine_queue).
  size_t QueuedEvents() const;
  bool ShedJoins() const;
  // The service shed a Join (ShedJoins): counted here and in fl_joins_shed_total. Callable from any thread.
  void NoteShedJoin() {
    published_.shed_joins.fetch_add(1, std::memory_order_relaxed);
    if (published_.metrics != nullptr) published_.metrics->CountShedJoin();
  }
  uint64_t shed_joins() const { return published_.shed_joins.load(std::memory_order_relaxed); }
  // Clients holding a place now (see EngineConfig::max_sessions); thread-safe, updated by the loop.
  size_t PlacesHeld() const { return published_.places_held.load(std::memory_order_relaxed); }

  const EngineConfig& config() const;
  const rpc::Clock& clock() const;
  // The result once finished (thread-safe); nullopt while running.
  std::optional<EngineResult> result() const;
  // Engine thread (or a test between RunUntilIdle calls) only.
  EngineState state() const;

 private:
  friend class RoundEngineTestPeer;
  // The loop's state and work (server/src/engine_core.h): touched only by the loop thread.
  class Core;
  // What the loop publishes for other threads: the end of the run, and counters read by the service's threads.
  struct Published {
    mutable fl::Mutex mu;
    fl::CondVar cv;
    bool done ABSL_GUARDED_BY(mu) = false;
    EngineResult result ABSL_GUARDED_BY(mu);  // final once done
    std::atomic<size_t> places_held{0};       // Core's places held (PlacesHeld)
    std::atomic<size_t> untold{0};            // ClientsNotToldOfTheEnd
    std::atomic<uint64_t> shed_joins{0};
    instrumentation::ServerMetrics* metrics = nullptr;  // SetMetrics (before Start); read by NoteShedJoin
  };
  Published published_;
  std::unique_ptr<Core> core_;
};

}  // namespace fl::server
