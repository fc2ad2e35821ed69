// Calls and session messages of islands, and the island state machine (IslandState), on the loop thread.
#include <algorithm>
#include <random>

#include <spdlog/spdlog.h>

#include "coordinator_core.h"
#include "coordinator_wire.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/instrumentation/island_records.h"

namespace fl::diloco {
namespace {

std::string RandomToken() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd());
  return instrumentation::HashHex(gen()) + instrumentation::HashHex(gen());
}

bool ValidIslandId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

int64_t MsToNs(uint32_t ms) { return static_cast<int64_t>(ms) * 1'000'000; }

}  // namespace

// ---- the island state machine ----

bool Coordinator::Core::Fire(Island& island, IslandTrigger trigger, const IslandCause& cause) {
  const std::optional<IslandTransitionRow> row = FindTransition(kIslandTransitions, island.state, trigger);
  if (!row.has_value()) {
    MissingTransition(fl::StrCat("island '", island.info.island_id, "' has no transition from ", Name(island.state),
                                 " on ", Name(trigger)));
    return false;
  }
  const IslandState from = island.state;
  island.state = row->to;
  if (IsEviction(trigger)) ++evictions_;
  Notify(&CoordinatorObserver::OnIsland,
         IslandChange{island.info, island.join_seq, from, island.state, trigger, cause.reason, UnixMs(), LiveCount(),
                      cause.source, cause.key, cause.epoch});
  const std::string& id = island.info.island_id;
  switch (row->effect) {
    case IslandEffect::kNone: break;
    case IslandEffect::kAnswerJoin: {
      Reply<fl::v1::IslandJoinResponse> reply = std::move(island.join_reply);
      island.join_reply = nullptr;
      island.last_seen_ns = NowNs();
      WatchHeartbeats(id, island.join_seq);
      reply(grpc::Status::OK, cause.answer);
      break;
    }
    case IslandEffect::kRefuseJoin: {
      Reply<fl::v1::IslandJoinResponse> reply = std::move(island.join_reply);
      island.join_reply = nullptr;
      if (reply) reply(cause.status, {});
      break;
    }
    case IslandEffect::kHoldState: syncs_[*cause.key].holders.push_back(id); break;
    case IslandEffect::kEvict:
    case IslandEffect::kRelease: {
      loop_.Cancel(island.heartbeat_timer);
      const std::string why = trigger == IslandTrigger::kLeft ? fl::StrCat("left: ", cause.reason) : cause.reason;
      if (std::shared_ptr<IslandSession> session = std::exchange(island.session, nullptr); session != nullptr) {
        if (row->effect == IslandEffect::kEvict) {
          fl::v1::IslandDown down;
          down.mutable_evicted()->set_reason(why);
          session->Send(down);
        }
        session->Close(grpc::Status::OK);
      }
      FailHeldBeginSyncs(island, EvictedError(id, why));
      break;
    }
    case IslandEffect::kShutdownSession: {
      loop_.Cancel(island.heartbeat_timer);
      if (std::shared_ptr<IslandSession> session = std::exchange(island.session, nullptr); session != nullptr) {
        fl::v1::IslandDown down;
        down.mutable_shutdown()->set_reason(cause.reason);
        session->Send(down);
        session->Close(grpc::Status::OK);
      }
      break;
    }
  }
  return true;
}

void Coordinator::Core::FailHeldBeginSyncs(const Island& island, const grpc::Status& status) {
  for (auto& [key, sync] : syncs_) {
    auto it = sync.arrived.find(island.info.island_id);
    if (it == sync.arrived.end()) continue;
    Reply<fl::v1::BeginSyncResponse> reply = std::move(it->second);
    sync.arrived.erase(it);
    reply(status, {});
  }
}

void Coordinator::Core::Evict(Island& island, IslandTrigger trigger, const std::string& reason) {
  if (island.state == IslandState::kGone) return;  // blamed or timed out twice: the first departure stands
  IslandCause cause;
  cause.reason = reason;
  cause.status = EvictedError(island.info.island_id, reason);
  Fire(island, trigger, cause);
}

Island* Coordinator::Core::Find(const std::string& id, const std::string& token, grpc::Status* error) {
  auto it = islands_.find(id);
  if (it == islands_.end() || it->second->token != token) {
    *error = CoordError(grpc::StatusCode::UNAUTHENTICATED, fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                        fl::StrCat("unknown island '", id, "' or session token"), "island_id",
                        "join again: the coordinator restarted or the island was replaced");
    return nullptr;
  }
  if (it->second->state == IslandState::kGone) {
    *error = EvictedError(id, "it was evicted or left");
    return nullptr;
  }
  if (it->second->state == IslandState::kWaiting) {
    *error = CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_MALFORMED,
                        fl::StrCat("island '", id, "' has not been admitted yet"), "", "wait for the Join answer");
    return nullptr;
  }
  return it->second.get();
}

// Heartbeats only move last_seen_ns; the one timer per island re-arms itself at the newest deadline when it
// fires early, so a heartbeat costs no timer work.
void Coordinator::Core::WatchHeartbeats(const std::string& id, uint64_t join_seq) {
  Island& island = *islands_.at(id);
  const int64_t timeout = MsToNs(opt_.heartbeat_timeout_ms);
  island.heartbeat_timer = loop_.At(island.last_seen_ns + timeout + 1, [this, id, join_seq, timeout] {
    auto it = islands_.find(id);
    if (it == islands_.end() || it->second->join_seq != join_seq || !IsLive(it->second->state)) return;
    Island& watched = *it->second;
    watched.heartbeat_timer = 0;
    if (NowNs() - watched.last_seen_ns > timeout) {
      Evict(watched, IslandTrigger::kHeartbeatLost, fl::StrCat("no heartbeat for ", opt_.heartbeat_timeout_ms, " ms"));
    } else {
      WatchHeartbeats(id, join_seq);
    }
  });
}

fl::v1::IslandJoinResponse Coordinator::Core::JoinResponse(const Island& island) const {
  fl::v1::IslandJoinResponse r;
  r.set_experiment_id(opt_.experiment_id);
  r.set_session_token(island.token);
  r.set_join_seq(island.join_seq);
  *r.mutable_schedule() = ToProto(opt_.schedule);
  r.set_heartbeat_interval_ms(opt_.heartbeat_interval_ms);
  return r;
}

// Answers held Joins once the first cohort is complete and no sync is in flight (a late joiner copies the
// state after the sync in flight, so it is never pointed at a state about to be superseded without it).
void Coordinator::Core::AnswerJoins() {
  std::vector<Island*> waiting;
  for (const auto& [id, island] : islands_) {
    if (island->state == IslandState::kWaiting) waiting.push_back(island.get());
  }
  if (waiting.empty()) return;
  if (run_ == RunState::kGatheringCohort) {
    // The transition's effect (kAdmitWaiting) calls back here in kRunning.
    if (waiting.size() >= opt_.min_islands) Fire(RunTrigger::kCohortComplete, {}, waiting.size());
    return;
  }
  if (!open_epochs_.empty()) return;
  std::sort(waiting.begin(), waiting.end(), [](const Island* a, const Island* b) { return a->join_seq < b->join_seq; });
  for (Island* island : waiting) {
    IslandCause cause;
    cause.answer = JoinResponse(*island);
    if (!last_committed_.has_value()) {
      Fire(*island, IslandTrigger::kAdmitted, cause);
      continue;
    }
    const Sync& committed = syncs_.at(*last_committed_);
    std::string holder;
    for (const std::string& id : committed.holders) {
      auto it = islands_.find(id);
      if (it != islands_.end() && it->second->state == IslandState::kActive) {
        holder = id;
        break;
      }
    }
    if (holder.empty()) {
      cause.reason = fl::StrCat("no live island holds the committed state of sync ", KeyText(*last_committed_));
      cause.status = CoordError(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_ADMISSION_REFUSED, cause.reason, "",
                                "the global state is lost with the islands that held it: restart the experiment");
      Fire(*island, IslandTrigger::kNoStateSource, cause);
      continue;
    }
    *cause.answer.mutable_state_source() = SourceProto(holder, committed.committed_hash, *last_committed_);
    const StateSource source = FromProto(cause.answer.state_source());
    cause.source = &source;
    cause.key = *last_committed_;
    island->resume_after = *last_committed_;
    Fire(*island, IslandTrigger::kAdmittedLate, cause);
  }
}

// ---- calls ----

void Coordinator::Core::OnJoin(JoinEvent& e) {
  const fl::v1::IslandJoinRequest& req = e.request;
  auto refuse = [&](grpc::StatusCode code, fl::v1::ErrorCode ecode, std::string msg, std::string field,
                    std::string hint) {
    e.reply(CoordError(code, ecode, std::move(msg), std::move(field), std::move(hint)), {});
  };
  if (Refusing()) {
    return refuse(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "the coordinator is shutting down",
                  "", "");
  }
  if (Over()) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("experiment ", opt_.experiment_id, " is over", failure_.empty() ? "" : ": ", failure_), "",
                  "start a new experiment");
  }
  if (req.protocol_version() != 1) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("protocol version ", req.protocol_version(), " is not supported (this coordinator: 1)"),
                  "protocol_version", "use fl-island and fl-coordinator of the same release");
  }
  if (!ValidIslandId(req.island_id())) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("island id '", req.island_id(), "' is invalid"), "island_id",
                  "use 1-64 characters of [A-Za-z0-9._-]");
  }
  if (req.data_endpoint().empty()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED, "data_endpoint is empty",
                  "data_endpoint", "pass the ZeroMQ endpoint the island leader binds, e.g. tcp://10.0.0.1:5555");
  }
  if (req.state_endpoint().empty()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED, "state_endpoint is empty",
                  "state_endpoint", "start a StateServer and pass its address");
  }
  if (req.num_ranks() == 0) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED, "num_ranks is 0", "num_ranks",
                  "an island has at least one rank");
  }
  // An island that syncs otherwise would fail the ring's first exchange (the ring's hello checks the modes too);
  // here it is refused before it is admitted, and the coordinator names both modes.
  if (const std::string mode = req.sync_mode().empty() ? "diloco" : req.sync_mode(); mode != opt_.schedule.sync_mode) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("island '", req.island_id(), "' syncs with mode '", mode,
                             "' but this coordinator's islands sync with '", opt_.schedule.sync_mode, "'"),
                  "sync_mode",
                  fl::StrCat("start every island with fl-island --mode ", opt_.schedule.sync_mode,
                             ", or a coordinator with --sync-mode ", mode, " for them"));
  }
  if (fingerprint_.has_value() && *fingerprint_ != req.model_fingerprint()) {
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
                  fl::StrCat("island '", req.island_id(), "' trains a model with fingerprint ",
                             core::FingerprintToHex(req.model_fingerprint()), " but the experiment's model has ",
                             core::FingerprintToHex(*fingerprint_)),
                  "model_fingerprint", "run every island with the same model (architecture and sizes)");
  }
  if (auto existing = islands_.find(req.island_id()); existing != islands_.end()) {
    Island& old = *existing->second;
    if (IsLive(old.state)) {
      return refuse(grpc::StatusCode::ALREADY_EXISTS, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("island '", req.island_id(), "' is still a member"), "island_id",
                    "Leave first, or wait until the coordinator notices the old session is gone "
                    "(--heartbeat-timeout-ms)");
    }
    if (old.state == IslandState::kWaiting) {
      Evict(old, IslandTrigger::kRejoin, "replaced by a new Join with the same id");
    }
  }
  int64_t present = 0;
  for (const auto& [id, island] : islands_) {
    if (island->state == IslandState::kGone) continue;
    ++present;
    if (island->info.data_endpoint == req.data_endpoint()) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                    fl::StrCat("data_endpoint ", req.data_endpoint(), " is already used by island '", id, "'"),
                    "data_endpoint", "every island leader binds its own endpoint");
    }
  }
  if (present >= static_cast<int64_t>(opt_.max_islands)) {
    return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("the experiment already has ", present, " islands (--max-islands)"), "", "");
  }
  if (!fingerprint_.has_value()) fingerprint_ = req.model_fingerprint();
  auto island = std::make_unique<Island>();
  island->info = FromProto(req);
  island->join_seq = next_join_seq_++;
  island->token = RandomToken();
  island->join_reply = std::move(e.reply);
  if (!e.cert_serial.empty()) island->cert_serials.insert(e.cert_serial);
  // Not a transition: the island starts in kWaiting; AnswerJoins (after this event) may admit it at once.
  spdlog::info("island '{}' asks to join ({} ranks, data {}, state {})", req.island_id(), req.num_ranks(),
               req.data_endpoint(), req.state_endpoint());
  islands_[req.island_id()] = std::move(island);
}

void Coordinator::Core::OnBeginSync(BeginSyncEvent& e) {
  const fl::v1::BeginSyncRequest& req = e.request;
  auto fail = [&](const grpc::Status& status) { e.reply(status, {}); };
  if (Refusing()) {
    return fail(CoordError(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "shutting down"));
  }
  grpc::Status error;
  Island* island = Find(req.island_id(), req.session_token(), &error);
  if (island == nullptr) return fail(error);
  const SyncKey key = FromProto(req.key());
  const std::string& id = req.island_id();
  if (key.fragment >= opt_.schedule.num_fragments) {
    return fail(CoordError(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("fragment ", key.fragment, " is out of range: the schedule has ",
                                      opt_.schedule.num_fragments, " fragment(s)"),
                           "key.fragment"));
  }
  if (run_ == RunState::kFailed) {
    return fail(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_INTERNAL, failure_));
  }
  if (FinalKey().has_value() && *FinalKey() < key) {
    return fail(
        CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                   fl::StrCat("sync ", KeyText(key), " is past the schedule's last sync ", KeyText(*FinalKey())), "key",
                   "Leave: the experiment is complete"));
  }
  if (island->state == IslandState::kLoading) {
    return fail(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                           fl::StrCat("island '", id, "' has not reported StateLoaded yet"), "",
                           "copy the state from the source of the Join answer, verify it, then ReportStateLoaded"));
  }
  if (island->state == IslandState::kRepairing) {
    return fail(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                           fl::StrCat("island '", id, "' must repair its state to sync ", KeyText(*island->repair_key),
                                      " before the next sync"),
                           "", "FetchState from the verdict's source, then ReportStateLoaded"));
  }
  const bool is_retry = island->last_begun.has_value() && *island->last_begun == key && island->retry_allowed;
  if (island->resume_after.has_value() && !(*island->resume_after < key)) {
    return fail(CoordError(
        grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
        fl::StrCat("sync ", KeyText(key), " is not after the island's state ", KeyText(*island->resume_after)), "key",
        "continue the schedule after the state's sync"));
  }
  if (island->last_begun.has_value() && !(*island->last_begun < key) && !is_retry) {
    return fail(CoordError(
        grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
        fl::StrCat("sync ", KeyText(key), " is not after the island's previous sync ", KeyText(*island->last_begun)),
        "key", "sync keys must increase; repeat one only after a RETRY verdict"));
  }
  Sync& sync = syncs_[key];
  if (sync.state == SyncState::kCommitted) {
    const std::string why = fl::StrCat("sync ", KeyText(key), " was committed without it");
    Evict(*island, IslandTrigger::kMissedBarrier, why);
    return fail(EvictedError(id, why));
  }
  if (sync.state == SyncState::kExchanging) {
    const Epoch& open = open_epochs_.at(*sync.open_epoch);
    if (std::find(open.info.members.begin(), open.info.members.end(), id) == open.info.members.end()) {
      const std::string why = fl::StrCat("sync ", KeyText(key), " went ahead without it");
      Evict(*island, IslandTrigger::kMissedBarrier, why);
      return fail(EvictedError(id, why));
    }
    return fail(
        CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                   fl::StrCat("island '", id, "' already holds epoch ", open.info.number, " of sync ", KeyText(key)),
                   "", "report SyncDone or SyncFailed for it first"));
  }
  island->last_begun = key;
  island->retry_allowed = false;
  if (sync.state == SyncState::kIdle) Fire(key, sync, SyncTrigger::kFirstArrival);
  sync.arrived[id] = std::move(e.reply);
}

void Coordinator::Core::OnReport(const std::string& id, const std::string& token, uint64_t epoch_number,
                                 const SyncKey& key, Report report) {
  auto fail = [&](const grpc::Status& status) { report.reply(status, {}); };
  if (Refusing()) {
    return fail(CoordError(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "shutting down"));
  }
  grpc::Status error;
  Island* island = Find(id, token, &error);
  if (island == nullptr) return fail(error);
  auto it = open_epochs_.find(epoch_number);
  if (it == open_epochs_.end()) {
    return fail(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                           fl::StrCat("epoch ", epoch_number, " is not open (resolved already, or never formed)"),
                           "epoch"));
  }
  Epoch& epoch = it->second;
  if (epoch.info.key != key || !epoch.join_seq.contains(id) || epoch.join_seq.at(id) != island->join_seq) {
    return fail(CoordError(
        grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_WRONG_ROUND,
        fl::StrCat("island '", id, "' is not a member of epoch ", epoch_number, " of sync ", KeyText(key)), "epoch"));
  }
  if (epoch.reports.contains(id)) {
    return fail(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_MALFORMED,
                           fl::StrCat("island '", id, "' already reported epoch ", epoch_number), "epoch"));
  }
  if (epoch.reports.empty()) {
    // --report-timeout-ms counts from the epoch's first report.
    epoch.report_timer =
        loop_.After(MsToNs(opt_.report_timeout_ms) + 1, [this, epoch_number] { CheckReports(epoch_number); });
  }
  report.unix_ms = UnixMs();
  const bool failed = !report.done;
  const std::string vanished = report.vanished;
  const std::string reason = report.reason;
  epoch.reports.emplace(id, std::move(report));
  if (auto b = epoch.pending_blames.find(id); b != epoch.pending_blames.end()) {
    spdlog::info("epoch {}: island '{}', blamed by '{}', reported the epoch itself: alive, kept", epoch_number, id,
                 b->second.by);
    loop_.Cancel(b->second.timer);
    epoch.pending_blames.erase(b);
  }
  if (!failed) return;
  spdlog::warn("epoch {}: island '{}' reports a failed exchange{}: {}", epoch_number, id,
               vanished.empty() ? "" : fl::StrCat(" (blames '", vanished, "')"), reason);
  auto v = islands_.find(vanished);
  if (!vanished.empty() && vanished != id && v != islands_.end() && epoch.join_seq.contains(vanished) &&
      v->second->join_seq == epoch.join_seq.at(vanished) && !epoch.reports.contains(vanished)) {
    Blame(epoch, vanished, id,
          fl::StrCat("island '", id, "' reported it vanished during epoch ", epoch_number, ": ", reason));
  }
}

void Coordinator::Core::OnStateLoaded(StateLoadedEvent& e) {
  const fl::v1::StateLoadedRequest& req = e.request;
  grpc::Status error;
  Island* island = Find(req.island_id(), req.session_token(), &error);
  if (island == nullptr) return e.reply(error, {});
  const SyncKey key = FromProto(req.key());
  auto c = syncs_.find(key);
  if (c == syncs_.end() || c->second.state != SyncState::kCommitted) {
    return e.reply(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                              fl::StrCat("sync ", KeyText(key), " has not been committed"), "key"),
                   {});
  }
  const uint64_t committed_hash = c->second.committed_hash;
  if (committed_hash != req.state_hash()) {
    return e.reply(CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_CHECKSUM_MISMATCH,
                              fl::StrCat("island '", req.island_id(), "' loaded a state with hash ",
                                         instrumentation::HashHex(req.state_hash()), " but sync ", KeyText(key),
                                         " committed ", instrumentation::HashHex(committed_hash)),
                              "state_hash", "fetch the state again (FetchState verifies the hash) or Rejoin"),
                   {});
  }
  IslandCause cause;
  cause.key = key;
  if (island->state == IslandState::kLoading && island->resume_after == key) {
    Fire(*island, IslandTrigger::kStateLoaded, cause);
  } else if (island->state == IslandState::kRepairing && island->repair_key == key) {
    island->repair_key.reset();
    cause.epoch = island->repair_epoch;
    Fire(*island, IslandTrigger::kRepaired, cause);
  }
  fl::v1::StateLoadedResponse response;
  response.set_committed_hash(committed_hash);
  e.reply(grpc::Status::OK, response);
}

void Coordinator::Core::OnLeave(LeaveEvent& e) {
  grpc::Status error;
  Island* island = Find(e.request.island_id(), e.request.session_token(), &error);
  if (island == nullptr) return e.reply(error, {});
  fl::v1::IslandLeaveResponse response;
  response.set_join_seq(island->join_seq);
  Evict(*island, IslandTrigger::kLeft, e.request.reason());
  e.reply(grpc::Status::OK, response);
}

// ---- session messages ----

void Coordinator::Core::OnSessionOpened(SessionOpenedEvent& e) {
  grpc::Status error;
  Island* island = Find(e.hello.island_id(), e.hello.session_token(), &error);
  if (island == nullptr) {
    e.session->Close(error);
    return;
  }
  if (island->session != nullptr && island->session != e.session) {
    island->session->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a new session"));
  }
  island->session = std::move(e.session);
  island->last_seen_ns = NowNs();
  if (!e.cert_serial.empty()) island->cert_serials.insert(e.cert_serial);
}

void Coordinator::Core::OnHeartbeat(const HeartbeatEvent& e) {
  auto it = islands_.find(e.island_id);
  if (it != islands_.end() && it->second->token == e.session_token) it->second->last_seen_ns = NowNs();
}

void Coordinator::Core::OnSessionClosed(const SessionClosedEvent& e) {
  auto it = islands_.find(e.island_id);
  if (it == islands_.end() || it->second->token != e.session_token || it->second->session != e.session) return;
  it->second->session = nullptr;
  Evict(*it->second, IslandTrigger::kSessionClosed, "its session stream closed");
}

// The service refuses every later call of a revoked certificate; an island that is in already is evicted here
// (its session told why and closed, its held BeginSyncs answered "rejoin"), as one that failed, so that it does not
// keep its place in the ring or the barriers. Its rejoin is then refused by the service, and fl-island exits.
void Coordinator::Core::OnCertificatesRevoked(const CertificatesRevokedEvent& e) {
  for (auto& [id, island] : islands_) {
    if (island->state == IslandState::kGone) continue;
    auto serial = std::find_if(island->cert_serials.begin(), island->cert_serials.end(),
                               [&](const std::string& s) { return e.serials.contains(s); });
    if (serial == island->cert_serials.end()) continue;
    const std::string why =
        fl::StrCat("the certificate of island '", id, "' (serial ", *serial, ") was revoked (", e.crl_file, ")");
    IslandCause cause;
    cause.reason = why;
    // A held Join (kRefuseJoin) is answered as the service answers the revoked certificate's calls: final.
    cause.status = CoordError(grpc::StatusCode::PERMISSION_DENIED, fl::v1::ERROR_CODE_ADMISSION_REFUSED, why, "",
                              "ask the operator for a new island certificate (fl-provision add-island --force)");
    Fire(*island, IslandTrigger::kCertificateRevoked, cause);
  }
}

}  // namespace fl::diloco
