// Barriers, epochs and verdicts: the sync state machine (SyncState) and its deadlines, on the loop thread.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "coordinator_core.h"
#include "coordinator_wire.h"
#include "fl/core/str_cat.h"

namespace fl::diloco {
namespace {

int64_t MsToNs(uint32_t ms) { return static_cast<int64_t>(ms) * 1'000'000; }

}  // namespace

bool Coordinator::Core::Fire(const SyncKey& key, Sync& sync, SyncTrigger trigger, const EpochInfo* epoch,
                             const EpochResolution* resolution) {
  const std::optional<SyncTransitionRow> row = FindTransition(kSyncTransitions, sync.state, trigger);
  if (!row.has_value()) {
    MissingTransition(
        fl::StrCat("sync ", KeyText(key), " has no transition from ", Name(sync.state), " on ", Name(trigger)));
    return false;
  }
  const SyncState from = sync.state;
  sync.state = row->to;
  Notify(&CoordinatorObserver::OnSync, SyncChange{key, from, sync.state, trigger, epoch, resolution, last_committed_});
  switch (row->effect) {
    case SyncEffect::kNone: break;
    case SyncEffect::kArmBarrierDeadline: {
      const int64_t started = NowNs();
      sync.gather_started_ns = started;
      sync.barrier_timer =
          loop_.At(started + MsToNs(opt_.barrier_timeout_ms) + 1, [this, key, started] { CheckBarrier(key, started); });
      break;
    }
    case SyncEffect::kSendPlans: SendPlans(key, sync, *epoch); break;
    case SyncEffect::kSendVerdicts:
      SendVerdicts(key, sync, open_epochs_.at(epoch->number), *resolution, trigger == SyncTrigger::kGaveUp);
      break;
    case SyncEffect::kAnswerUnavailable: {
      const grpc::Status status = CoordError(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN,
                                             fl::StrCat("coordinator: ", shutdown_reason_));
      loop_.Cancel(sync.barrier_timer);
      for (auto& [id, reply] : std::exchange(sync.arrived, {})) reply(status, {});
      if (std::optional<uint64_t> open = std::exchange(sync.open_epoch, std::nullopt); open.has_value()) {
        Epoch& e = open_epochs_.at(*open);
        loop_.Cancel(e.report_timer);
        for (auto& [id, b] : e.pending_blames) loop_.Cancel(b.timer);
        for (auto& [id, report] : e.reports) report.reply(status, {});
      }
      break;
    }
  }
  return true;
}

// Islands the barrier of `key` waits for: every live island whose state is older than `key`.
std::set<std::string> Coordinator::Core::ExpectedAt(const SyncKey& key) const {
  std::set<std::string> expected;
  for (const auto& [id, island] : islands_) {
    if (!IsLive(island->state)) continue;
    if (island->resume_after.has_value() && !(*island->resume_after < key)) continue;
    expected.insert(id);
  }
  return expected;
}

bool Coordinator::Core::MemberLive(const Epoch& epoch, const std::string& id) const {
  auto island = islands_.find(id);
  return island != islands_.end() && island->second->state != IslandState::kGone &&
         island->second->join_seq == epoch.join_seq.at(id);
}

fl::v1::StateSource Coordinator::Core::SourceProto(const std::string& island_id, uint64_t hash,
                                                   const SyncKey& key) const {
  fl::v1::StateSource s;
  s.set_island_id(island_id);
  s.set_endpoint(islands_.at(island_id)->info.state_endpoint);
  s.set_expected_hash(hash);
  *s.mutable_key() = ToProto(key);
  return s;
}

// Forms every barrier whose expected islands all arrived; resolves every epoch whose members all reported or
// left. Repeats until nothing changes (one can unblock another), then answers the Joins that may go ahead.
void Coordinator::Core::Settle() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (auto& [key, sync] : syncs_) {
      if (sync.state != SyncState::kGathering) continue;
      const std::set<std::string> expected = ExpectedAt(key);
      bool all = !sync.arrived.empty();
      for (const std::string& id : expected) all = all && sync.arrived.contains(id);
      if (all) {
        Form(key, sync);
        changed = true;
      } else if (sync.arrived.empty()) {
        loop_.Cancel(sync.barrier_timer);
        Fire(key, sync, SyncTrigger::kArrivalsGone);
      }
    }
    for (auto it = open_epochs_.begin(); it != open_epochs_.end();) {
      Epoch& epoch = it->second;
      bool all = true;
      for (const std::string& id : epoch.info.members) {
        all = all && (!MemberLive(epoch, id) || epoch.reports.contains(id));
      }
      if (all) {
        Resolve(epoch);
        it = open_epochs_.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  AnswerJoins();
}

void Coordinator::Core::Form(const SyncKey& key, Sync& sync) {
  std::vector<const Island*> members;
  for (const auto& [id, reply] : sync.arrived) members.push_back(islands_.at(id).get());
  std::sort(members.begin(), members.end(), [](const Island* a, const Island* b) { return a->join_seq < b->join_seq; });
  Epoch epoch;
  epoch.info.number = next_epoch_++;
  epoch.info.key = key;
  epoch.info.attempt = sync.attempts++;
  epoch.info.formed_unix_ms = UnixMs();
  epoch.info.barrier_ms = static_cast<double>(NowNs() - sync.gather_started_ns) / 1e6;
  for (const Island* m : members) {
    epoch.info.members.push_back(m->info.island_id);
    epoch.info.join_seqs.push_back(m->join_seq);
    epoch.join_seq[m->info.island_id] = m->join_seq;
  }
  loop_.Cancel(sync.barrier_timer);
  sync.open_epoch = epoch.info.number;
  last_epoch_ = epoch.info.number;
  auto [it, inserted] = open_epochs_.emplace(epoch.info.number, std::move(epoch));
  Fire(key, sync, SyncTrigger::kBarrierComplete, &it->second.info);
}

void Coordinator::Core::SendPlans(const SyncKey& key, Sync& sync, const EpochInfo& epoch) {
  fl::v1::BeginSyncResponse plan;
  plan.set_epoch(epoch.number);
  plan.set_attempt(epoch.attempt);
  *plan.mutable_key() = ToProto(key);
  for (const std::string& id : epoch.members) {
    fl::v1::IslandRingMember* rm = plan.add_members();
    rm->set_island_id(id);
    rm->set_data_endpoint(islands_.at(id)->info.data_endpoint);
  }
  std::map<std::string, Reply<fl::v1::BeginSyncResponse>> arrived = std::exchange(sync.arrived, {});
  for (uint32_t i = 0; i < epoch.members.size(); ++i) {
    fl::v1::BeginSyncResponse mine = plan;
    mine.set_self_index(i);
    arrived.at(epoch.members[i])(grpc::Status::OK, mine);
  }
}

// The majority among live members that applied the result (ties: the member first in ring order), and what
// every member reported and is told. Changes nothing.
EpochResolution Coordinator::Core::Decide(const Epoch& epoch, const Sync& sync, bool* give_up) const {
  auto applied_live = [&](const std::string& id) -> const Report* {
    auto r = epoch.reports.find(id);
    if (r == epoch.reports.end() || !r->second.done || !MemberLive(epoch, id)) return nullptr;
    return &r->second;
  };
  std::map<uint64_t, int> votes;
  for (const std::string& id : epoch.info.members) {
    if (const Report* r = applied_live(id)) ++votes[r->hash];
  }
  EpochResolution res;
  for (const std::string& id : epoch.info.members) {
    const Report* r = applied_live(id);
    if (r != nullptr && votes[r->hash] > res.agreeing) {
      res.agreeing = votes[r->hash];
      res.committed_hash = r->hash;
    }
  }
  std::string source;
  for (const std::string& id : epoch.info.members) {
    const Report* r = applied_live(id);
    if (r != nullptr && r->hash == res.committed_hash) {
      source = id;
      break;
    }
  }
  const bool commit = res.committed_hash.has_value();
  *give_up = !commit && sync.attempts >= opt_.max_sync_attempts;
  res.outcome = commit ? EpochOutcome::kCommitted : EpochOutcome::kRetried;
  if (*give_up) {
    res.reason = failure_.empty() ? fl::StrCat("sync ", KeyText(epoch.info.key), " failed in ", sync.attempts,
                                               " epochs (--max-sync-attempts)")
                                  : failure_;
  } else if (!commit) {
    res.reason = "no member applied the exchange";
  }
  res.resolved_unix_ms = UnixMs();
  for (size_t i = 0; i < epoch.info.members.size(); ++i) {
    const std::string& id = epoch.info.members[i];
    MemberResult m;
    m.island_id = id;
    m.join_seq = epoch.join_seq.at(id);
    m.ring_index = i;
    auto r = epoch.reports.find(id);
    if (r == epoch.reports.end()) {
      m.outcome = MemberOutcome::kMissing;
      m.verdict = MemberVerdict::kEvicted;
      res.members.push_back(std::move(m));
      continue;
    }
    const Report& rep = r->second;
    m.reported = true;
    m.applied = rep.done;
    m.stats = rep.stats;
    m.reported_unix_ms = rep.unix_ms;
    if (rep.done) {
      m.state_hash = rep.hash;
      m.outcome = (commit && rep.hash == *res.committed_hash) ? MemberOutcome::kApplied : MemberOutcome::kMismatch;
    } else {
      m.outcome = MemberOutcome::kFailed;
      m.failure_reason = rep.reason;
      m.vanished_island = rep.vanished;
    }
    if (!MemberLive(epoch, id)) {
      m.verdict = MemberVerdict::kEvicted;
    } else if (!commit) {
      m.verdict = MemberVerdict::kRetry;  // also when giving up: the answer is then the failure
    } else if (rep.done && rep.hash == *res.committed_hash) {
      m.verdict = MemberVerdict::kCommit;
    } else {
      m.verdict = MemberVerdict::kRepair;
      m.repair_source = source;
    }
    res.members.push_back(std::move(m));
  }
  return res;
}

void Coordinator::Core::Resolve(Epoch& epoch) {
  const SyncKey key = epoch.info.key;
  Sync& sync = syncs_[key];
  loop_.Cancel(epoch.report_timer);
  for (auto& [id, b] : epoch.pending_blames) loop_.Cancel(b.timer);
  bool give_up = false;
  const EpochResolution res = Decide(epoch, sync, &give_up);
  if (give_up && failure_.empty()) {
    failure_ = res.reason;
    Fire(RunTrigger::kSyncGaveUp, failure_);
  }
  for (const MemberResult& m : res.members) hash_mismatches_ += m.mismatched() ? 1 : 0;
  const bool commit = res.committed_hash.has_value();
  if (commit) {
    sync.committed_hash = *res.committed_hash;
    if (!last_committed_.has_value() || *last_committed_ < key) last_committed_ = key;
  }
  sync.open_epoch.reset();  // the verdicts' effect finds the epoch by its number (erased by Settle after this)
  Fire(key, sync,
       commit ? SyncTrigger::kMajorityApplied : (give_up ? SyncTrigger::kGaveUp : SyncTrigger::kNobodyApplied),
       &epoch.info, &res);
  if (commit && FinalKey().has_value() && key == *FinalKey() && run_ == RunState::kRunning) {
    Fire(RunTrigger::kLastSyncCommitted, {}, 0, key);
  }
}

void Coordinator::Core::SendVerdicts(const SyncKey& key, Sync& sync, Epoch& epoch, const EpochResolution& res,
                                     bool give_up) {
  for (const MemberResult& m : res.members) {
    if (!m.reported) continue;  // gone before it reported: nobody to answer
    const std::string& id = m.island_id;
    fl::v1::SyncVerdict verdict;
    grpc::Status status = grpc::Status::OK;
    switch (m.verdict) {
      case MemberVerdict::kEvicted: status = EvictedError(id, "it was evicted during the sync"); break;
      case MemberVerdict::kRetry:
        if (give_up) {
          status = CoordError(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_INTERNAL, failure_, "",
                              "check the islands' data-plane connectivity and restart the experiment");
        } else {
          verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_RETRY);
          islands_.at(id)->retry_allowed = true;
        }
        break;
      case MemberVerdict::kCommit:
        verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_COMMIT);
        verdict.set_majority_hash(*res.committed_hash);
        sync.holders.push_back(id);
        break;
      case MemberVerdict::kRepair: {
        verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_REPAIR);
        verdict.set_majority_hash(*res.committed_hash);
        *verdict.mutable_source() = SourceProto(m.repair_source, *res.committed_hash, key);
        Island& island = *islands_.at(id);
        island.repair_key = key;
        island.repair_epoch = epoch.info.number;
        const StateSource source = FromProto(verdict.source());
        IslandCause cause;
        cause.source = &source;
        cause.key = key;
        cause.epoch = epoch.info.number;
        Fire(island, IslandTrigger::kRepairOrdered, cause);
        break;
      }
    }
    epoch.reports.at(id).reply(status, verdict);
  }
}

void Coordinator::Core::AbandonOpenEpochs(const std::string& reason) {
  for (auto& [key, sync] : syncs_) {
    if (sync.state == SyncState::kGathering) {
      Fire(key, sync, SyncTrigger::kShutdown);
    } else if (sync.state == SyncState::kExchanging) {
      const Epoch& epoch = open_epochs_.at(*sync.open_epoch);
      EpochResolution res;
      res.outcome = EpochOutcome::kAbandoned;
      res.reason = fl::StrCat("shutdown: ", reason);
      res.resolved_unix_ms = UnixMs();
      Fire(key, sync, SyncTrigger::kShutdown, &epoch.info, &res);
    }
  }
  open_epochs_.clear();
}

// ---- deadlines (timers on the loop; each checks that what it watches is still there) ----

void Coordinator::Core::Blame(Epoch& epoch, const std::string& blamed, const std::string& by, const std::string& why) {
  if (epoch.info.attempt != 0 || opt_.blame_grace_ms == 0) {
    Evict(*islands_.at(blamed), IslandTrigger::kVanished, why);
    return;
  }
  // The first blame stands; its island has --blame-grace-ms to report the epoch itself.
  auto [b, inserted] = epoch.pending_blames.emplace(blamed, Epoch::Blame{by, why, 0});
  if (!inserted) return;
  const uint64_t number = epoch.info.number;
  b->second.timer =
      loop_.After(MsToNs(opt_.blame_grace_ms) + 1, [this, number, blamed] { CheckBlame(number, blamed); });
}

void Coordinator::Core::CheckBarrier(const SyncKey& key, int64_t gather_started_ns) {
  auto it = syncs_.find(key);
  if (it == syncs_.end() || it->second.state != SyncState::kGathering ||
      it->second.gather_started_ns != gather_started_ns) {
    return;  // formed, abandoned, or a later attempt's barrier
  }
  it->second.barrier_timer = 0;
  for (const std::string& id : ExpectedAt(key)) {
    if (it->second.arrived.contains(id)) continue;
    Evict(*islands_.at(id), IslandTrigger::kMissedBarrier,
          fl::StrCat("did not reach the barrier of sync ", KeyText(key), " within ", opt_.barrier_timeout_ms, " ms"));
  }
}

void Coordinator::Core::CheckReports(uint64_t epoch_number) {
  auto it = open_epochs_.find(epoch_number);
  if (it == open_epochs_.end()) return;
  Epoch& epoch = it->second;
  epoch.report_timer = 0;
  for (const std::string& id : epoch.info.members) {
    if (epoch.reports.contains(id) || !MemberLive(epoch, id)) continue;
    Evict(*islands_.at(id), IslandTrigger::kMissedReport,
          fl::StrCat("did not report epoch ", epoch_number, " within ", opt_.report_timeout_ms,
                     " ms of the first report"));
  }
}

void Coordinator::Core::CheckBlame(uint64_t epoch_number, const std::string& blamed) {
  auto it = open_epochs_.find(epoch_number);
  if (it == open_epochs_.end()) return;
  Epoch& epoch = it->second;
  auto b = epoch.pending_blames.find(blamed);
  if (b == epoch.pending_blames.end()) return;
  const std::string why =
      fl::StrCat(b->second.reason, " (and did not report the epoch itself within ", opt_.blame_grace_ms, " ms)");
  epoch.pending_blames.erase(b);
  if (!epoch.reports.contains(blamed) && MemberLive(epoch, blamed)) {
    Evict(*islands_.at(blamed), IslandTrigger::kVanished, why);
  }
}

}  // namespace fl::diloco
