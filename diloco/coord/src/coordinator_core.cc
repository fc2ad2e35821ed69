// The coordinator's loop, the experiment's state machine (RunState), snapshots, and the public Coordinator.
#include <algorithm>
#include <future>
#include <random>
#include <type_traits>

#include <spdlog/spdlog.h>

#include "coordinator_core.h"
#include "fl/core/codec.h"
#include "fl/core/fragment_plan.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/island_metrics.h"
#include "fl/instrumentation/island_records.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/proto/convert.h"
#include "fl/rpc/grpc_server.h"

namespace fl::diloco {

grpc::Status CoordError(grpc::StatusCode code, fl::v1::ErrorCode error_code, std::string message, std::string field,
                        std::string hint) {
  return proto::ToGrpcStatus(code, proto::MakeError(error_code, std::move(message), std::move(field), std::move(hint)));
}

grpc::Status EvictedError(const std::string& island, const std::string& reason) {
  return CoordError(grpc::StatusCode::ABORTED, fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                    fl::StrCat("island '", island, "' is no longer a member: ", reason), "",
                    "join again (CoordinatorClient::Rejoin) and copy the state from the peer it names");
}

std::string KeyText(const SyncKey& key) { return fl::StrCat("(step ", key.step, ", fragment ", key.fragment, ")"); }

// ---- the loop ----

Coordinator::Core::Core(CoordinatorOptions options, std::vector<std::unique_ptr<CoordinatorObserver>> owned)
    : opt_(std::move(options)),
      owned_observers_(std::move(owned)),
      loop_(
          opt_.clock, [this](CoordinatorEvent& e) { Handle(e); }, [this] { AfterTurn(); }) {
  for (const auto& o : owned_observers_) observers_.push_back(o.get());
  for (CoordinatorObserver* o : opt_.observers) observers_.push_back(o);
  fingerprint_ = opt_.model_fingerprint;
  loop_thread_ = std::this_thread::get_id();  // without own_thread the caller's thread runs the loop
}

Coordinator::Core::~Core() { Stop(); }

void Coordinator::Core::Start() {
  std::promise<std::thread::id> started;
  std::future<std::thread::id> id = started.get_future();
  loop_.Start([&started] { started.set_value(std::this_thread::get_id()); });
  loop_thread_ = id.get();  // before anyone can ask OnLoopThread() from another thread
}

void Coordinator::Core::Stop() { loop_.Stop(); }

void Coordinator::Core::Handle(CoordinatorEvent& event) {
  std::visit(
      [this](auto& e) {
        using E = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<E, JoinEvent>) {
          OnJoin(e);
        } else if constexpr (std::is_same_v<E, BeginSyncEvent>) {
          OnBeginSync(e);
        } else if constexpr (std::is_same_v<E, SyncDoneEvent>) {
          Report report;
          report.done = true;
          report.hash = e.request.state_hash();
          report.stats = FromProto(e.request.stats());
          report.reply = std::move(e.reply);
          OnReport(e.request.island_id(), e.request.session_token(), e.request.epoch(), FromProto(e.request.key()),
                   std::move(report));
        } else if constexpr (std::is_same_v<E, SyncFailedEvent>) {
          Report report;
          report.done = false;
          report.reason = e.request.reason();
          report.vanished = e.request.vanished_island_id();
          report.stats = FromProto(e.request.stats());
          report.reply = std::move(e.reply);
          OnReport(e.request.island_id(), e.request.session_token(), e.request.epoch(), FromProto(e.request.key()),
                   std::move(report));
        } else if constexpr (std::is_same_v<E, StateLoadedEvent>) {
          OnStateLoaded(e);
        } else if constexpr (std::is_same_v<E, LeaveEvent>) {
          OnLeave(e);
        } else if constexpr (std::is_same_v<E, SessionOpenedEvent>) {
          OnSessionOpened(e);
        } else if constexpr (std::is_same_v<E, HeartbeatEvent>) {
          OnHeartbeat(e);
        } else if constexpr (std::is_same_v<E, SessionClosedEvent>) {
          OnSessionClosed(e);
        } else if constexpr (std::is_same_v<E, CertificatesRevokedEvent>) {
          OnCertificatesRevoked(e);
        } else if constexpr (std::is_same_v<E, ShutdownEvent>) {
          OnShutdown(e.reason);
        } else {
          static_assert(std::is_same_v<E, CallOnLoop>);
          e.fn();
        }
      },
      event);
  // After every event (not only every turn), as the barriers and epochs it completed may complete others.
  Settle();
}

void Coordinator::Core::AfterTurn() {
  Settle();  // after timers: the evictions they made may complete a barrier or an epoch
  PublishDone();
}

bool Coordinator::Core::Done() const {
  if (run_ == RunState::kShutDown || run_ == RunState::kFailed) return true;
  return run_ == RunState::kFinished && LiveCount() == 0;
}

void Coordinator::Core::PublishDone() {
  const bool done = Done();
  fl::MutexLock lock(done_mu_);
  if (done == done_) return;
  done_ = done;
  done_cv_.NotifyAll();
}

bool Coordinator::Core::WaitPublishedDone(absl::Duration timeout) {
  fl::MutexLock lock(done_mu_);
  return done_cv_.WaitFor(done_mu_, absl::ToChronoNanoseconds(timeout),
                          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu_) { return done_; });
}

std::optional<SyncKey> Coordinator::Core::FinalKey() const {
  if (opt_.schedule.total_outer_steps == 0) return std::nullopt;
  return SyncKey{opt_.schedule.total_outer_steps - 1, opt_.schedule.num_fragments - 1};
}

int64_t Coordinator::Core::LiveCount() const {
  int64_t n = 0;
  for (const auto& [id, island] : islands_) n += IsLive(island->state) ? 1 : 0;
  return n;
}

CoordinatorSnapshot Coordinator::Core::SnapshotNow() const {
  CoordinatorSnapshot snap;
  std::vector<const Island*> members;
  for (const auto& [id, island] : islands_) {
    if (island->state == IslandState::kActive || island->state == IslandState::kRepairing) {
      members.push_back(island.get());
    }
    if (island->state == IslandState::kLoading) snap.loading.push_back(id);
    if (IsLive(island->state) && island->session != nullptr) snap.connected.push_back(id);
  }
  std::sort(members.begin(), members.end(), [](const Island* a, const Island* b) { return a->join_seq < b->join_seq; });
  for (const Island* island : members) snap.members.push_back(island->info.island_id);
  snap.last_epoch = last_epoch_;
  snap.last_committed = last_committed_;
  snap.hash_mismatches = hash_mismatches_;
  snap.evictions = evictions_;
  const std::optional<SyncKey> final_key = FinalKey();
  if (final_key.has_value()) {
    auto it = syncs_.find(*final_key);
    snap.finished = it != syncs_.end() && it->second.state == SyncState::kCommitted;
  }
  snap.failure = failure_;
  return snap;
}

void Coordinator::Core::AfterDueTimers(std::function<void()> fn) {
  // A timer due now runs after every timer due earlier or set earlier for the same time (rpc::TimerQueue order).
  loop_.At(NowNs(), [this, fn = std::move(fn)] {
    Settle();
    fn();
  });
}

// ---- the experiment's state machine ----

bool Coordinator::Core::Fire(RunTrigger trigger, std::string_view reason, size_t cohort, std::optional<SyncKey> key) {
  const std::optional<RunTransitionRow> row = FindTransition(kRunTransitions, run_, trigger);
  if (!row.has_value()) {
    // The failure paths themselves (gave up, shut down) only log: MissingTransition ends the run through them.
    const std::string what = fl::StrCat("the experiment has no transition from ", Name(run_), " on ", Name(trigger));
    if (trigger == RunTrigger::kSyncGaveUp || trigger == RunTrigger::kShutdown) {
      spdlog::critical("coordinator: {}: refused (a bug)", what);
    } else {
      MissingTransition(what);
    }
    return false;
  }
  const RunState from = run_;
  run_ = row->to;
  Notify(&CoordinatorObserver::OnRun, RunChange{from, run_, trigger, reason, cohort, key});
  switch (row->effect) {
    case RunEffect::kNone: break;
    case RunEffect::kAdmitWaiting: AnswerJoins(); break;
    case RunEffect::kShutDown: {
      const grpc::Status status = CoordError(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN,
                                             fl::StrCat("coordinator: ", reason));
      IslandCause cause;
      cause.reason = std::string(reason);
      cause.status = status;
      for (auto& [id, island] : islands_) {
        if (island->state != IslandState::kGone) Fire(*island, IslandTrigger::kShutdown, cause);
      }
      AbandonOpenEpochs(std::string(reason));
      break;
    }
  }
  return true;
}

void Coordinator::Core::MissingTransition(const std::string& what) {
  // The same policy as fl-server's round engine (docs/architecture.md, "Errors and missing transitions"): a pair
  // the tables lack is a bug, never an island's doing. It is logged critical and the run ends as failed with the
  // pair as its reason (islands learn it at their next call); the process is not aborted, and it does not carry
  // on as if nothing had happened.
  spdlog::critical("coordinator: {}: a bug", what);
  if (Over() || Refusing()) return;  // the run has ended already
  if (failure_.empty()) failure_ = fl::StrCat("internal error: ", what, " (a bug; see the coordinator's log)");
  // From kRunning (or kFinished) the run fails; before the cohort formed there is no failed row: it shuts down.
  Fire(run_ == RunState::kGatheringCohort ? RunTrigger::kShutdown : RunTrigger::kSyncGaveUp, failure_);
}

void Coordinator::Core::OnShutdown(const std::string& reason) {
  if (run_ == RunState::kShutDown) return;  // idempotent
  shutdown_reason_ = reason;
  Fire(RunTrigger::kShutdown, reason);
}

// ---- Coordinator ----

absl::Status CoordinatorOptions::Validate() const {
  auto bad = [](std::string_view field, const auto& value, std::string_view range) {
    return absl::InvalidArgumentError(fl::StrCat(field, " = ", value, " is invalid: ", range));
  };
  if (schedule.inner_steps == 0) return bad("--inner-steps", schedule.inner_steps, "must be at least 1");
  if (schedule.num_fragments == 0) return bad("--fragments", schedule.num_fragments, "must be at least 1");
  if (schedule.inner_steps % schedule.num_fragments != 0) {
    return bad("--fragments", schedule.num_fragments,
               fl::StrCat("must divide --inner-steps (", schedule.inner_steps, ")"));
  }
  if (schedule.overlap_steps >= schedule.inner_steps / schedule.num_fragments) {
    return bad(
        "--overlap-steps", schedule.overlap_steps,
        fl::StrCat("must be below --inner-steps / --fragments (", schedule.inner_steps / schedule.num_fragments, ")"));
  }
  if (auto strategy = core::ParseFragmentStrategy(schedule.fragment_strategy); !strategy.ok()) {
    return bad("--fragment-strategy", schedule.fragment_strategy, fl::ToStd(strategy.status().message()));
  }
  if (auto codec = core::MakeCodec(schedule.codec); !codec.ok()) {
    return bad("--codec", schedule.codec, fl::ToStd(codec.status().message()));
  }
  if (auto outer = core::MakeServerOptimizer(schedule.outer_optimizer, 1); !outer.ok()) {
    return bad("--outer-optimizer", schedule.outer_optimizer, fl::ToStd(outer.status().message()));
  }
  if (schedule.connections_per_peer < 1 || schedule.connections_per_peer > 16) {
    return bad("--connections-per-peer", schedule.connections_per_peer, "must be in [1, 16]");
  }
  if (schedule.exchange_timeout_ms == 0) return bad("--exchange-timeout-ms", 0, "must be positive");
  if (schedule.sync_mode != "diloco" && schedule.sync_mode != "onebit-adam") {
    return bad("--sync-mode", schedule.sync_mode, "use diloco or onebit-adam");
  }
  if (schedule.sync_mode == "onebit-adam" && (schedule.num_fragments != 1 || schedule.overlap_steps != 0)) {
    return bad("--fragments", schedule.num_fragments,
               fl::StrCat("onebit-adam exchanges every step: its sync is a membership window of --inner-steps steps, "
                          "with one fragment and no overlap (--fragments 1 --overlap-steps 0; --overlap-steps is ",
                          schedule.overlap_steps, ")"));
  }
  if (min_islands < 1) return bad("--min-islands", min_islands, "must be at least 1");
  if (max_islands < min_islands) return bad("--max-islands", max_islands, "must be at least --min-islands");
  if (heartbeat_interval_ms == 0) return bad("--heartbeat-interval-ms", 0, "must be positive");
  if (heartbeat_timeout_ms <= heartbeat_interval_ms) {
    return bad("--heartbeat-timeout-ms", heartbeat_timeout_ms, "must exceed --heartbeat-interval-ms");
  }
  if (barrier_timeout_ms == 0) return bad("--barrier-timeout-ms", 0, "must be positive");
  if (report_timeout_ms == 0) return bad("--report-timeout-ms", 0, "must be positive");
  if (max_sync_attempts == 0) return bad("--max-sync-attempts", 0, "must be at least 1");
  if (!crl_file.empty() && crl_ca_file.empty()) {
    return absl::InvalidArgumentError(
        fl::StrCat("--tls-crl ", crl_file, " needs the CA that signed it: give --tls-client-ca (mutual TLS)"));
  }
  if (crl_reload_ms < 50 || crl_reload_ms > 3'600'000) {
    return bad("--tls-crl-reload-ms", crl_reload_ms, "must be in [50, 3600000]");
  }
  if (experiment_id.empty()) return absl::InvalidArgumentError("experiment_id is empty");
  if (clock == nullptr) {
    return absl::InvalidArgumentError("clock is null: leave it at rpc::SystemClock::Get() or pass a test clock");
  }
  return absl::OkStatus();
}

Coordinator::Coordinator(std::unique_ptr<Core> core, std::unique_ptr<pki::RevocationWatcher> revocation)
    : core_(std::move(core)),
      revocation_(std::move(revocation)),
      service_(MakeIslandsService([core = core_.get()](CoordinatorEvent e) { core->Post(std::move(e)); },
                                  revocation_.get())) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 instrumentation::IslandRecordWriter* records,
                                                                 instrumentation::IslandMetrics* metrics) {
  // spdlog's default logger is a lazily created static inside the uninstrumented libspdlog: made by the loop
  // thread's first log line while this thread logs a revocation reload, TSan cannot see the static's guard and
  // reports a race (as RoundEngine's constructor says). Made here, before the loop and watcher threads start.
  spdlog::default_logger_raw();
  if (options.experiment_id.empty() && options.clock != nullptr) {
    std::random_device rd;
    const uint64_t random = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    options.experiment_id = fl::StrCat(options.experiment_name, "-", options.clock->UnixMs(), "-",
                                       instrumentation::HashHex(random).substr(0, 6));
  }
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::vector<std::unique_ptr<CoordinatorObserver>> owned;
  owned.push_back(MakeLogObserver());
  if (records != nullptr) owned.push_back(MakeRecordsObserver(records, options.experiment_id));
  if (metrics != nullptr) {
    metrics->SetMembers(0);
    owned.push_back(MakeMetricsObserver(metrics));
  }
  const bool own_thread = options.own_thread;
  const pki::RevocationWatcher::Options crl{options.crl_file, options.crl_ca_file, options.crl_reload_ms};
  auto core = std::make_unique<Core>(std::move(options), std::move(owned));
  std::unique_ptr<pki::RevocationWatcher> revocation;
  if (!crl.crl_file.empty()) {
    // The watcher's thread only posts to the loop; the loop evicts the islands of the revoked serials.
    auto watcher = pki::RevocationWatcher::Start(
        crl, [core = core.get(), file = crl.crl_file](const std::set<std::string>& serials) {
          core->Post(CertificatesRevokedEvent{serials, file});
        });
    if (!watcher.ok()) return watcher.status();
    revocation = *std::move(watcher);
  }
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(core), std::move(revocation)));
  if (own_thread) coordinator->core_->Start();
  return coordinator;
}

Coordinator::~Coordinator() {
  revocation_.reset();  // no reload may post to the loop once it stops
  Shutdown("coordinator destroyed");
  core_->Stop();
}

grpc::Service* Coordinator::service() { return service_.get(); }
bool Coordinator::ReloadRevocationList() { return revocation_ != nullptr && revocation_->ReloadIfChanged(); }
const CoordinatorOptions& Coordinator::options() const { return core_->options(); }
void Coordinator::Post(CoordinatorEvent event) { core_->Post(std::move(event)); }
size_t Coordinator::RunUntilIdle() { return core_->RunUntilIdle(); }

void Coordinator::Shutdown(const std::string& reason) {
  if (!core_->options().own_thread || core_->OnLoopThread()) {
    core_->Post(ShutdownEvent{reason});
    if (!core_->options().own_thread) core_->RunUntilIdle();
    return;
  }
  std::promise<void> handled;
  core_->Post(ShutdownEvent{reason});
  core_->Post(CallOnLoop{[&handled] { handled.set_value(); }});
  handled.get_future().wait();
}

bool Coordinator::WaitDone(absl::Duration timeout) {
  if (!core_->options().own_thread) {
    core_->RunUntilIdle();
    return core_->WaitPublishedDone(absl::ZeroDuration());
  }
  return core_->WaitPublishedDone(timeout);
}

CoordinatorSnapshot Coordinator::Snapshot() const {
  if (!core_->options().own_thread || core_->OnLoopThread()) return core_->SnapshotNow();
  // Through the loop, and behind the deadlines already due: after a test moved a ManualClock, the snapshot shows
  // what those deadlines did.
  std::promise<CoordinatorSnapshot> answer;
  core_->Post(CallOnLoop{
      [this, &answer] { core_->AfterDueTimers([this, &answer] { answer.set_value(core_->SnapshotNow()); }); }});
  return answer.get_future().get();
}

absl::StatusOr<RunningCoordinatorServer> StartCoordinatorServer(Coordinator* coordinator,
                                                                const std::string& listen_address,
                                                                const std::optional<rpc::ServerTls>& tls) {
  auto running = rpc::StartGrpcServer(coordinator->service(), listen_address, tls);
  if (!running.ok()) return running.status();
  return RunningCoordinatorServer{std::move(running->server), running->port};
}

}  // namespace fl::diloco
