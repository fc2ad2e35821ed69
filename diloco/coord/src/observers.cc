// The coordinator's own observers of its transitions: the records (SQLite, schema v5 tables islands,
// island_epochs, island_syncs), the Prometheus metrics, and the log lines.
#include <spdlog/spdlog.h>

#include "coordinator_core.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/instrumentation/island_metrics.h"
#include "fl/instrumentation/island_records.h"

namespace fl::diloco {
namespace {

class RecordsObserver final : public CoordinatorObserver {
 public:
  RecordsObserver(instrumentation::IslandRecordWriter* records, std::string experiment_id)
      : records_(records), experiment_id_(std::move(experiment_id)) {}

  void OnIsland(const IslandChange& c) override {
    if (c.from == IslandState::kWaiting && IsLive(c.to)) {
      instrumentation::IslandRecord rec;
      rec.experiment_id = experiment_id_;
      rec.join_seq = static_cast<int64_t>(c.join_seq);
      rec.island_id = c.island.island_id;
      rec.data_endpoint = c.island.data_endpoint;
      rec.state_endpoint = c.island.state_endpoint;
      rec.num_ranks = c.island.num_ranks;
      rec.model_fingerprint = core::FingerprintToHex(c.island.model_fingerprint);
      rec.software_version = c.island.software_version;
      rec.device_class = c.island.device_class;
      rec.accelerator = c.island.accelerator;
      rec.joined_unix_ms = c.unix_ms;
      if (c.source != nullptr) {
        rec.late_join = true;
        rec.state_source_island = c.source->island_id;
        rec.state_source_step = static_cast<int64_t>(c.source->key.step);
        rec.state_source_fragment = c.source->key.fragment;
      }
      Record(std::move(rec));
    } else if (IsLive(c.from) && c.to == IslandState::kGone) {
      const std::string reason = c.trigger == IslandTrigger::kLeft       ? fl::StrCat("left: ", c.reason)
                                 : c.trigger == IslandTrigger::kShutdown ? fl::StrCat("shutdown: ", c.reason)
                                                                         : fl::StrCat("evicted: ", c.reason);
      Record(instrumentation::IslandLeftRecord{experiment_id_, static_cast<int64_t>(c.join_seq), c.unix_ms, reason});
    } else if (c.trigger == IslandTrigger::kRepaired) {
      Record(instrumentation::IslandRepairedRecord{experiment_id_, static_cast<int64_t>(c.epoch), c.island.island_id,
                                                   c.unix_ms});
    }
  }

  void OnSync(const SyncChange& c) override {
    if (c.resolution == nullptr || c.epoch == nullptr) return;
    const EpochInfo& epoch = *c.epoch;
    const EpochResolution& res = *c.resolution;
    instrumentation::IslandEpochRecord er;
    er.experiment_id = experiment_id_;
    er.epoch = static_cast<int64_t>(epoch.number);
    er.step = static_cast<int64_t>(epoch.key.step);
    er.fragment = epoch.key.fragment;
    er.attempt = epoch.attempt;
    er.members = epoch.members;
    er.outcome = std::string(Name(res.outcome));
    er.committed_hash = res.committed_hash.has_value() ? instrumentation::HashHex(*res.committed_hash) : "";
    er.barrier_ms = epoch.barrier_ms;
    er.formed_unix_ms = epoch.formed_unix_ms;
    er.resolved_unix_ms = res.resolved_unix_ms;
    er.reason = res.reason;
    std::vector<instrumentation::IslandSyncRecord> rows;
    for (const MemberResult& m : res.members) {
      instrumentation::IslandSyncRecord row;
      row.experiment_id = experiment_id_;
      row.epoch = er.epoch;
      row.island_id = m.island_id;
      row.join_seq = static_cast<int64_t>(m.join_seq);
      row.step = er.step;
      row.fragment = er.fragment;
      row.ring_index = static_cast<int64_t>(m.ring_index);
      row.outcome = std::string(Name(m.outcome));
      row.verdict = std::string(Name(m.verdict));
      row.repair_source = m.repair_source;
      if (m.reported) {
        row.inner_compute_ms = m.stats.inner_compute_seconds * 1e3;
        row.exchange_ms = m.stats.exchange_seconds * 1e3;
        row.wait_ms = m.stats.wait_seconds * 1e3;
        row.bytes_sent = static_cast<int64_t>(m.stats.bytes_sent);
        row.bytes_received = static_cast<int64_t>(m.stats.bytes_received);
        row.inner_steps = static_cast<int64_t>(m.stats.inner_steps);
        row.reported_unix_ms = m.reported_unix_ms;
        if (m.applied) {
          row.state_hash = instrumentation::HashHex(m.state_hash);
          ++er.num_applied;
        } else {
          row.failure_reason = m.failure_reason;
          row.vanished_island = m.vanished_island;
          ++er.num_failed;
        }
        if (m.mismatched()) ++er.num_mismatched;
      }
      rows.push_back(std::move(row));
    }
    Record(std::move(er));
    for (auto& row : rows) Record(std::move(row));
  }

 private:
  void Record(instrumentation::IslandRecordVariant record) {
    if (absl::Status s = records_->Enqueue(std::move(record)); !s.ok()) {
      spdlog::warn("island records: {}", s.message());
    }
  }

  instrumentation::IslandRecordWriter* records_;
  const std::string experiment_id_;
};

class MetricsObserver final : public CoordinatorObserver {
 public:
  explicit MetricsObserver(instrumentation::IslandMetrics* metrics) : metrics_(metrics) {}

  void OnIsland(const IslandChange& c) override {
    metrics_->SetMembers(c.live_islands);
    if (IsLive(c.from) && c.to == IslandState::kGone && IsEviction(c.trigger)) {
      metrics_->CountEviction(c.island.island_id, DepartureLabel(c.trigger));
    }
    if (c.trigger == IslandTrigger::kStateLoaded) metrics_->CountStateLoaded(c.island.island_id, "late_join");
    if (c.trigger == IslandTrigger::kRepaired) metrics_->CountStateLoaded(c.island.island_id, "repair");
  }

  void OnSync(const SyncChange& c) override {
    if (c.trigger == SyncTrigger::kBarrierComplete && c.epoch != nullptr) metrics_->SetLastEpoch(c.epoch->number);
    if (c.resolution == nullptr || c.resolution->outcome == EpochOutcome::kAbandoned) return;
    for (const MemberResult& m : c.resolution->members) {
      if (!m.reported) continue;
      if (m.mismatched()) metrics_->CountHashMismatch(m.island_id);
      metrics_->ObserveSync(m.island_id, Name(m.outcome),
                            {m.stats.inner_compute_seconds, m.stats.exchange_seconds, m.stats.wait_seconds,
                             m.stats.bytes_sent, m.stats.bytes_received});
    }
    metrics_->ObserveEpoch(Name(c.resolution->outcome), c.epoch->barrier_ms / 1e3);
    if (c.resolution->outcome == EpochOutcome::kCommitted && c.last_committed.has_value()) {
      metrics_->SetCommitted(c.last_committed->step, c.last_committed->fragment);
    }
  }

 private:
  instrumentation::IslandMetrics* metrics_;
};

class LogObserver final : public CoordinatorObserver {
 public:
  void OnRun(const RunChange& c) override {
    spdlog::debug("experiment: {} --{}--> {}", Name(c.from), Name(c.trigger), Name(c.to));
    switch (c.trigger) {
      case RunTrigger::kCohortComplete: spdlog::info("first cohort of {} island(s) complete", c.cohort); break;
      case RunTrigger::kLastSyncCommitted:
        spdlog::info("the schedule's last sync {} committed", KeyText(*c.key));
        break;
      case RunTrigger::kSyncGaveUp: spdlog::error("{}", c.reason); break;
      case RunTrigger::kShutdown: break;
    }
  }

  void OnIsland(const IslandChange& c) override {
    const std::string& id = c.island.island_id;
    spdlog::debug("island '{}': {} --{}--> {}", id, Name(c.from), Name(c.trigger), Name(c.to));
    switch (c.trigger) {
      case IslandTrigger::kAdmitted:
        spdlog::info("island '{}' admitted (ring position by join order {})", id, c.join_seq);
        break;
      case IslandTrigger::kAdmittedLate:
        spdlog::info("island '{}' joins late: copies the state after sync {} from '{}'", id, KeyText(*c.key),
                     c.source->island_id);
        break;
      case IslandTrigger::kNoStateSource: spdlog::warn("island '{}' refused: {}", id, c.reason); break;
      case IslandTrigger::kStateLoaded:
        spdlog::info("island '{}' loaded the state after sync {}: member from the next sync on", id, KeyText(*c.key));
        break;
      case IslandTrigger::kRepaired:
        spdlog::info("island '{}' repaired its state to sync {}", id, KeyText(*c.key));
        break;
      case IslandTrigger::kLeft: spdlog::info("island '{}' leaves: {}", id, c.reason); break;
      case IslandTrigger::kRepairOrdered:
      case IslandTrigger::kShutdown:
        break;  // the epoch's resolution says why; the shutdown is logged by whoever asked for it
      case IslandTrigger::kRejoin:
      case IslandTrigger::kSessionClosed:
      case IslandTrigger::kHeartbeatLost:
      case IslandTrigger::kVanished:
      case IslandTrigger::kMissedBarrier:
      case IslandTrigger::kMissedReport:
      case IslandTrigger::kCertificateRevoked:
        spdlog::warn("island '{}' leaves the membership: {}", id, c.reason);
        break;
    }
  }

  void OnSync(const SyncChange& c) override {
    spdlog::debug("sync {}: {} --{}--> {}", KeyText(c.key), Name(c.from), Name(c.trigger), Name(c.to));
    if (c.epoch == nullptr) return;
    const EpochInfo& epoch = *c.epoch;
    switch (c.trigger) {
      case SyncTrigger::kBarrierComplete:
        spdlog::info("epoch {}: sync {} attempt {} with {} island(s)", epoch.number, KeyText(c.key), epoch.attempt,
                     epoch.members.size());
        break;
      case SyncTrigger::kMajorityApplied: {
        const EpochResolution& res = *c.resolution;
        for (const MemberResult& m : res.members) {
          if (!m.mismatched()) continue;
          spdlog::error(
              "epoch {} sync {}: island '{}' holds state hash {} but the majority holds {}: "
              "ordered to repair from '{}'",
              epoch.number, KeyText(c.key), m.island_id, instrumentation::HashHex(m.state_hash),
              instrumentation::HashHex(*res.committed_hash), m.repair_source);
        }
        spdlog::info("epoch {}: sync {} committed with hash {} ({} of {} members agree)", epoch.number, KeyText(c.key),
                     instrumentation::HashHex(*res.committed_hash), res.agreeing, epoch.members.size());
        break;
      }
      case SyncTrigger::kNobodyApplied:
      case SyncTrigger::kGaveUp:
        spdlog::warn("epoch {}: sync {} failed for every member; the next BeginSync forms a new epoch", epoch.number,
                     KeyText(c.key));
        break;
      default: break;
    }
  }
};

}  // namespace

std::unique_ptr<CoordinatorObserver> MakeRecordsObserver(instrumentation::IslandRecordWriter* records,
                                                         std::string experiment_id) {
  return std::make_unique<RecordsObserver>(records, std::move(experiment_id));
}

std::unique_ptr<CoordinatorObserver> MakeMetricsObserver(instrumentation::IslandMetrics* metrics) {
  return std::make_unique<MetricsObserver>(metrics);
}

std::unique_ptr<CoordinatorObserver> MakeLogObserver() { return std::make_unique<LogObserver>(); }

}  // namespace fl::diloco
