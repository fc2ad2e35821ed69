#include "fl/diloco/coordinator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"

#include "fl/core/clock.h"
#include "fl/core/codec.h"
#include "fl/core/fragment_plan.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "coordinator_wire.h"
#include "fl/instrumentation/island_metrics.h"
#include "fl/instrumentation/island_records.h"
#include "fl/proto/convert.h"
#include "fl/rpc/grpc_server.h"
#include "fl/rpc/stream_outbox.h"
#include "fl/v1/islands.grpc.pb.h"

namespace fl::diloco {
namespace {

using Effect = std::function<void()>;
using VerdictReply = std::function<void(const grpc::Status&, const fl::v1::SyncVerdict&)>;
using PlanReply = std::function<void(const grpc::Status&, const fl::v1::BeginSyncResponse&)>;
using JoinReply = std::function<void(const grpc::Status&, const fl::v1::IslandJoinResponse&)>;

grpc::Status Error(grpc::StatusCode code, fl::v1::ErrorCode error_code, std::string message, std::string field = "",
                   std::string hint = "") {
  return wire::ToGrpcStatus(code, wire::MakeError(error_code, std::move(message), std::move(field), std::move(hint)));
}

grpc::Status Evicted(const std::string& island, const std::string& reason) {
  return Error(grpc::StatusCode::ABORTED, fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
               fl::StrCat("island '", island, "' is no longer a member: ", reason), "",
               "join again (CoordinatorClient::Rejoin) and copy the state from the peer it names");
}

std::string KeyText(const SyncKey& key) { return fl::StrCat("(step ", key.step, ", fragment ", key.fragment, ")"); }

std::string RandomToken() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowNs()));
  return instrumentation::HashHex(gen()) + instrumentation::HashHex(gen());
}

bool ValidIslandId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
           c == '.';
  });
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// The coordinator's handle on one session stream; outlives the reactor (detached in OnDone).
using SessionChannel = rpc::StreamOutbox<fl::v1::IslandUp, fl::v1::IslandDown>;

enum class Phase { kWaiting, kLoading, kActive, kGone };

struct Island {
  IslandJoinRequest info;
  uint64_t join_seq = 0;
  std::string token;
  Phase phase = Phase::kWaiting;
  JoinReply join_reply;                 // while kWaiting
  std::optional<SyncKey> resume_after;  // late joiner: the state it copies includes this sync
  std::optional<SyncKey> last_begun;
  bool retry_allowed = false;           // told to retry last_begun
  std::optional<SyncKey> repair_key;    // told to repair to the state after this sync
  uint64_t repair_epoch = 0;
  int64_t last_seen_ns = 0;
  std::shared_ptr<SessionChannel> session;
  bool late_join = false;
};

struct Report {
  bool done = false;
  uint64_t hash = 0;
  SyncStats stats;
  std::string reason;
  std::string vanished;
  int64_t unix_ms = 0;
  VerdictReply reply;
};

struct Epoch {
  uint64_t number = 0;
  SyncKey key;
  uint32_t attempt = 0;
  std::vector<std::string> members;  // ring order
  std::map<std::string, uint64_t> join_seq;
  std::map<std::string, Report> reports;
  int64_t formed_unix_ms = 0;
  int64_t first_report_ns = 0;
  double barrier_ms = 0;
  struct Blame {
    int64_t at_ns = 0;
    std::string by;
    std::string reason;
  };
  std::map<std::string, Blame> pending_blames;  // blamed member -> first blame, waiting for its own report
};

struct Sync {
  uint32_t attempts = 0;  // epochs formed so far
  bool gathering = false;
  int64_t gather_started_ns = 0;
  std::map<std::string, PlanReply> arrived;
  std::optional<uint64_t> open_epoch;  // formed, not resolved
};

struct Committed {
  uint64_t hash = 0;
  std::vector<std::string> holders;  // islands told to commit or that loaded it, in that order
};

}  // namespace

struct Coordinator::State {
  CoordinatorOptions opt;
  instrumentation::IslandRecordWriter* records = nullptr;
  instrumentation::IslandMetrics* metrics = nullptr;

  mutable std::mutex mu;
  std::condition_variable cv;  // timer wakeups and WaitDone
  std::vector<Effect> effects;  // run after releasing mu
  bool shutdown = false;
  std::string shutdown_reason;
  std::optional<uint64_t> fingerprint;
  uint64_t next_join_seq = 1;
  uint64_t next_epoch = 1;
  bool cohort_started = false;
  std::map<std::string, std::shared_ptr<Island>> islands;
  std::map<SyncKey, Sync> syncs;
  std::map<uint64_t, Epoch> open_epochs;
  std::map<SyncKey, Committed> committed;
  std::optional<SyncKey> last_committed;
  uint64_t last_epoch = 0;
  uint64_t hash_mismatches = 0;
  uint64_t evictions = 0;
  bool finished = false;
  std::string failure;
  std::thread timer;

  // ---- helpers (mu held) ----

  void Record(instrumentation::IslandRecordVariant record) {
    if (records == nullptr) return;
    if (absl::Status s = records->Enqueue(std::move(record)); !s.ok()) {
      spdlog::warn("island records: {}", s.message());
    }
  }

  void RunEffects(std::unique_lock<std::mutex>& lock) {
    std::vector<Effect> run;
    run.swap(effects);
    lock.unlock();
    for (Effect& e : run) e();
    lock.lock();
  }

  bool Live(const Island& island) const { return island.phase == Phase::kLoading || island.phase == Phase::kActive; }

  std::shared_ptr<Island> Find(const std::string& id, const std::string& token, grpc::Status* error) {
    auto it = islands.find(id);
    if (it == islands.end() || it->second->token != token) {
      *error = Error(grpc::StatusCode::UNAUTHENTICATED, fl::v1::ERROR_CODE_UNKNOWN_CLIENT,
                     fl::StrCat("unknown island '", id, "' or session token"), "island_id",
                     "join again: the coordinator restarted or the island was replaced");
      return nullptr;
    }
    if (it->second->phase == Phase::kGone) {
      *error = Evicted(id, "it was evicted or left");
      return nullptr;
    }
    if (it->second->phase == Phase::kWaiting) {
      *error = Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_MALFORMED,
                     fl::StrCat("island '", id, "' has not been admitted yet"), "", "wait for the Join answer");
      return nullptr;
    }
    return it->second;
  }

  int64_t LiveCount() const {
    int64_t n = 0;
    for (const auto& [id, island] : islands) n += Live(*island) ? 1 : 0;
    return n;
  }

  void UpdateGauges() {
    if (metrics == nullptr) return;
    metrics->SetMembers(LiveCount());
  }

  std::optional<SyncKey> FinalKey() const {
    if (opt.schedule.total_outer_steps == 0) return std::nullopt;
    return SyncKey{opt.schedule.total_outer_steps - 1, opt.schedule.num_fragments - 1};
  }

  // `label` is a bounded metric label; `reason` is free text for logs and records.
  void Evict(Island& island, const std::string& label, const std::string& reason) {
    if (island.phase == Phase::kGone) return;
    const bool was_waiting = island.phase == Phase::kWaiting;
    island.phase = Phase::kGone;
    ++evictions;
    if (label != "left") spdlog::warn("island '{}' leaves the membership: {}", island.info.island_id, reason);
    if (island.join_reply) {
      JoinReply reply = std::move(island.join_reply);
      island.join_reply = nullptr;
      grpc::Status status = Evicted(island.info.island_id, reason);
      effects.push_back([reply, status] { reply(status, {}); });
    }
    if (island.session != nullptr) {
      std::shared_ptr<SessionChannel> session = island.session;
      island.session = nullptr;
      fl::v1::IslandDown down;
      down.mutable_evicted()->set_reason(reason);
      const bool notify = label != "left" && label != "session_closed";
      effects.push_back([session, down, notify] {
        if (notify) session->Send(down);
        session->Close(grpc::Status::OK);
      });
    }
    for (auto& [key, sync] : syncs) {
      auto it = sync.arrived.find(island.info.island_id);
      if (it == sync.arrived.end()) continue;
      PlanReply reply = std::move(it->second);
      sync.arrived.erase(it);
      grpc::Status status = Evicted(island.info.island_id, reason);
      effects.push_back([reply, status] { reply(status, {}); });
    }
    if (!was_waiting) {
      Record(instrumentation::IslandLeftRecord{opt.experiment_id, static_cast<int64_t>(island.join_seq), UnixMs(),
                                               fl::StrCat(label == "left" ? "" : "evicted: ", reason)});
      if (metrics != nullptr) metrics->CountEviction(island.info.island_id, label);
    }
  }

  // Islands the barrier of `key` waits for: every live island whose state is older than `key`.
  std::set<std::string> ExpectedAt(const SyncKey& key) const {
    std::set<std::string> expected;
    for (const auto& [id, island] : islands) {
      if (!Live(*island)) continue;
      if (island->resume_after.has_value() && !(*island->resume_after < key)) continue;
      expected.insert(id);
    }
    return expected;
  }

  void Form(const SyncKey& key, Sync& sync) {
    std::vector<std::shared_ptr<Island>> members;
    for (const auto& [id, reply] : sync.arrived) members.push_back(islands.at(id));
    std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a->join_seq < b->join_seq; });
    Epoch epoch;
    epoch.number = next_epoch++;
    epoch.key = key;
    epoch.attempt = sync.attempts++;
    epoch.formed_unix_ms = UnixMs();
    epoch.barrier_ms = Ms(NowNs() - sync.gather_started_ns);
    fl::v1::BeginSyncResponse plan;
    plan.set_epoch(epoch.number);
    plan.set_attempt(epoch.attempt);
    plan.mutable_key()->set_step(key.step);
    plan.mutable_key()->set_fragment(key.fragment);
    for (const auto& m : members) {
      epoch.members.push_back(m->info.island_id);
      epoch.join_seq[m->info.island_id] = m->join_seq;
      fl::v1::IslandRingMember* rm = plan.add_members();
      rm->set_island_id(m->info.island_id);
      rm->set_data_endpoint(m->info.data_endpoint);
    }
    for (uint32_t i = 0; i < members.size(); ++i) {
      fl::v1::BeginSyncResponse mine = plan;
      mine.set_self_index(i);
      PlanReply reply = std::move(sync.arrived.at(members[i]->info.island_id));
      effects.push_back([reply, mine] { reply(grpc::Status::OK, mine); });
    }
    spdlog::info("epoch {}: sync {} attempt {} with {} island(s)", epoch.number, KeyText(key), epoch.attempt,
                 members.size());
    sync.arrived.clear();
    sync.gathering = false;
    sync.open_epoch = epoch.number;
    last_epoch = epoch.number;
    if (metrics != nullptr) metrics->SetLastEpoch(epoch.number);
    open_epochs.emplace(epoch.number, std::move(epoch));
  }

  // Forms every barrier whose expected islands all arrived; resolves every epoch whose members all
  // reported or left. Repeats until nothing changes (one can unblock another).
  void Settle() {
    bool changed = true;
    while (changed) {
      changed = false;
      for (auto& [key, sync] : syncs) {
        if (!sync.gathering) continue;
        const std::set<std::string> expected = ExpectedAt(key);
        bool all = !sync.arrived.empty();
        for (const std::string& id : expected) all = all && sync.arrived.contains(id);
        if (all) {
          Form(key, sync);
          changed = true;
        } else if (sync.arrived.empty()) {
          sync.gathering = false;  // everyone who had arrived was evicted
        }
      }
      for (auto it = open_epochs.begin(); it != open_epochs.end();) {
        Epoch& epoch = it->second;
        bool all = true;
        for (const std::string& id : epoch.members) {
          auto island = islands.find(id);
          const bool gone = island == islands.end() || island->second->phase == Phase::kGone ||
                            island->second->join_seq != epoch.join_seq.at(id);
          all = all && (gone || epoch.reports.contains(id));
        }
        if (all) {
          Resolve(epoch);
          it = open_epochs.erase(it);
          changed = true;
        } else {
          ++it;
        }
      }
    }
    AnswerJoins();
    UpdateGauges();
    cv.notify_all();
  }

  bool MemberLive(const Epoch& epoch, const std::string& id) const {
    auto island = islands.find(id);
    return island != islands.end() && island->second->phase != Phase::kGone &&
           island->second->join_seq == epoch.join_seq.at(id);
  }

  fl::v1::StateSource SourceProto(const std::string& island_id, uint64_t hash, const SyncKey& key) const {
    fl::v1::StateSource s;
    s.set_island_id(island_id);
    s.set_endpoint(islands.at(island_id)->info.state_endpoint);
    s.set_expected_hash(hash);
    s.mutable_key()->set_step(key.step);
    s.mutable_key()->set_fragment(key.fragment);
    return s;
  }

  void Resolve(Epoch& epoch) {
    Sync& sync = syncs[epoch.key];
    sync.open_epoch.reset();
    // The majority among live members that applied the result; ties go to the member first in ring order.
    std::map<uint64_t, int> votes;
    std::optional<uint64_t> majority;
    int best = 0;
    for (const std::string& id : epoch.members) {
      auto r = epoch.reports.find(id);
      if (r == epoch.reports.end() || !r->second.done || !MemberLive(epoch, id)) continue;
      ++votes[r->second.hash];
    }
    for (const std::string& id : epoch.members) {
      auto r = epoch.reports.find(id);
      if (r == epoch.reports.end() || !r->second.done || !MemberLive(epoch, id)) continue;
      if (votes[r->second.hash] > best) {
        best = votes[r->second.hash];
        majority = r->second.hash;
      }
    }
    std::string source;
    if (majority.has_value()) {
      for (const std::string& id : epoch.members) {
        auto r = epoch.reports.find(id);
        if (r != epoch.reports.end() && r->second.done && r->second.hash == *majority && MemberLive(epoch, id)) {
          source = id;
          break;
        }
      }
    }
    const bool commit = majority.has_value();
    const bool give_up = !commit && sync.attempts >= opt.max_sync_attempts;
    if (give_up && failure.empty()) {
      failure = fl::StrCat("sync ", KeyText(epoch.key), " failed in ", sync.attempts, " epochs (--max-sync-attempts)");
      spdlog::error("{}", failure);
    }
    instrumentation::IslandEpochRecord er;
    er.experiment_id = opt.experiment_id;
    er.epoch = static_cast<int64_t>(epoch.number);
    er.step = static_cast<int64_t>(epoch.key.step);
    er.fragment = epoch.key.fragment;
    er.attempt = epoch.attempt;
    er.members = epoch.members;
    er.outcome = commit ? "committed" : "retried";
    er.committed_hash = commit ? instrumentation::HashHex(*majority) : "";
    er.barrier_ms = epoch.barrier_ms;
    er.formed_unix_ms = epoch.formed_unix_ms;
    er.resolved_unix_ms = UnixMs();
    std::vector<instrumentation::IslandSyncRecord> rows;
    Committed* c = nullptr;
    if (commit) {
      c = &committed[epoch.key];
      c->hash = *majority;
    }
    for (size_t i = 0; i < epoch.members.size(); ++i) {
      const std::string& id = epoch.members[i];
      auto r = epoch.reports.find(id);
      instrumentation::IslandSyncRecord row;
      row.experiment_id = opt.experiment_id;
      row.epoch = er.epoch;
      row.island_id = id;
      row.join_seq = static_cast<int64_t>(epoch.join_seq.at(id));
      row.step = er.step;
      row.fragment = er.fragment;
      row.ring_index = static_cast<int64_t>(i);
      const bool live = MemberLive(epoch, id);
      fl::v1::SyncVerdict verdict;
      grpc::Status status = grpc::Status::OK;
      if (r == epoch.reports.end()) {
        row.outcome = "missing";
        row.verdict = "evicted";
      } else {
        const Report& rep = r->second;
        row.inner_compute_ms = rep.stats.inner_compute_seconds * 1e3;
        row.exchange_ms = rep.stats.exchange_seconds * 1e3;
        row.wait_ms = rep.stats.wait_seconds * 1e3;
        row.bytes_sent = static_cast<int64_t>(rep.stats.bytes_sent);
        row.bytes_received = static_cast<int64_t>(rep.stats.bytes_received);
        row.inner_steps = static_cast<int64_t>(rep.stats.inner_steps);
        row.reported_unix_ms = rep.unix_ms;
        if (rep.done) {
          row.state_hash = instrumentation::HashHex(rep.hash);
          row.outcome = (commit && rep.hash == *majority) ? "applied" : "mismatch";
        } else {
          row.outcome = "failed";
          row.failure_reason = rep.reason;
          row.vanished_island = rep.vanished;
        }
        if (!live) {
          row.verdict = "evicted";
          status = Evicted(id, "it was evicted during the sync");
        } else if (give_up) {
          row.verdict = "retry";
          status = Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_INTERNAL, failure, "",
                         "check the islands' data-plane connectivity and restart the experiment");
        } else if (!commit) {
          row.verdict = "retry";
          verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_RETRY);
          islands.at(id)->retry_allowed = true;
        } else if (rep.done && rep.hash == *majority) {
          row.verdict = "commit";
          verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_COMMIT);
          verdict.set_majority_hash(*majority);
          c->holders.push_back(id);
        } else {
          row.verdict = "repair";
          row.repair_source = source;
          verdict.set_kind(fl::v1::SYNC_VERDICT_KIND_REPAIR);
          verdict.set_majority_hash(*majority);
          *verdict.mutable_source() = SourceProto(source, *majority, epoch.key);
          Island& island = *islands.at(id);
          island.repair_key = epoch.key;
          island.repair_epoch = epoch.number;
          if (rep.done) {
            ++hash_mismatches;
            ++er.num_mismatched;
            spdlog::error("epoch {} sync {}: island '{}' holds state hash {} but the majority holds {}: "
                          "ordered to repair from '{}'",
                          epoch.number, KeyText(epoch.key), id, instrumentation::HashHex(rep.hash),
                          instrumentation::HashHex(*majority), source);
            if (metrics != nullptr) metrics->CountHashMismatch(id);
          }
        }
        if (rep.done) ++er.num_applied; else ++er.num_failed;
        if (metrics != nullptr) {
          metrics->ObserveSync(id, row.outcome,
                               {rep.stats.inner_compute_seconds, rep.stats.exchange_seconds, rep.stats.wait_seconds,
                                rep.stats.bytes_sent, rep.stats.bytes_received});
        }
        VerdictReply reply = rep.reply;
        effects.push_back([reply, status, verdict] { reply(status, verdict); });
      }
      rows.push_back(std::move(row));
    }
    if (!commit) er.reason = give_up ? failure : "no member applied the exchange";
    Record(std::move(er));
    for (auto& row : rows) Record(std::move(row));
    if (metrics != nullptr) metrics->ObserveEpoch(commit ? "committed" : "retried", epoch.barrier_ms / 1e3);
    if (commit) {
      if (!last_committed.has_value() || *last_committed < epoch.key) last_committed = epoch.key;
      if (metrics != nullptr) metrics->SetCommitted(last_committed->step, last_committed->fragment);
      spdlog::info("epoch {}: sync {} committed with hash {} ({} of {} members agree)", epoch.number,
                   KeyText(epoch.key), instrumentation::HashHex(*majority), best, epoch.members.size());
      if (FinalKey().has_value() && epoch.key == *FinalKey()) {
        finished = true;
        spdlog::info("the schedule's last sync {} committed", KeyText(epoch.key));
      }
    } else {
      spdlog::warn("epoch {}: sync {} failed for every member; the next BeginSync forms a new epoch",
                   epoch.number, KeyText(epoch.key));
    }
  }

  fl::v1::IslandJoinResponse JoinResponse(const Island& island) const {
    fl::v1::IslandJoinResponse r;
    r.set_experiment_id(opt.experiment_id);
    r.set_session_token(island.token);
    r.set_join_seq(island.join_seq);
    *r.mutable_schedule() = ToProto(opt.schedule);
    r.set_heartbeat_interval_ms(opt.heartbeat_interval_ms);
    return r;
  }

  // Answers held Joins once the first cohort is complete and no sync is in flight.
  void AnswerJoins() {
    std::vector<std::shared_ptr<Island>> waiting;
    for (const auto& [id, island] : islands) {
      if (island->phase == Phase::kWaiting) waiting.push_back(island);
    }
    if (waiting.empty()) return;
    if (!cohort_started) {
      if (waiting.size() < opt.min_islands) return;
      cohort_started = true;
      spdlog::info("first cohort of {} island(s) complete", waiting.size());
    }
    if (!open_epochs.empty()) return;  // a late joiner copies the state after the sync in flight
    std::sort(waiting.begin(), waiting.end(), [](const auto& a, const auto& b) { return a->join_seq < b->join_seq; });
    for (const auto& island : waiting) {
      fl::v1::IslandJoinResponse response = JoinResponse(*island);
      instrumentation::IslandRecord rec;
      rec.experiment_id = opt.experiment_id;
      rec.join_seq = static_cast<int64_t>(island->join_seq);
      rec.island_id = island->info.island_id;
      rec.data_endpoint = island->info.data_endpoint;
      rec.state_endpoint = island->info.state_endpoint;
      rec.num_ranks = island->info.num_ranks;
      rec.model_fingerprint = core::FingerprintToHex(island->info.model_fingerprint);
      rec.software_version = island->info.software_version;
      rec.device_class = island->info.device_class;
      rec.accelerator = island->info.accelerator;
      rec.joined_unix_ms = UnixMs();
      if (last_committed.has_value()) {
        const Committed& c = committed.at(*last_committed);
        std::string source;
        for (const std::string& holder : c.holders) {
          auto it = islands.find(holder);
          if (it != islands.end() && it->second->phase == Phase::kActive && !it->second->repair_key.has_value()) {
            source = holder;
            break;
          }
        }
        if (source.empty()) {
          JoinReply reply = std::move(island->join_reply);
          island->join_reply = nullptr;
          island->phase = Phase::kGone;
          grpc::Status status = Error(
              grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
              fl::StrCat("no live island holds the committed state of sync ", KeyText(*last_committed)), "",
              "the global state is lost with the islands that held it: restart the experiment");
          effects.push_back([reply, status] { reply(status, {}); });
          continue;
        }
        *response.mutable_state_source() = SourceProto(source, c.hash, *last_committed);
        island->phase = Phase::kLoading;
        island->resume_after = *last_committed;
        island->late_join = true;
        rec.late_join = true;
        rec.state_source_island = source;
        rec.state_source_step = static_cast<int64_t>(last_committed->step);
        rec.state_source_fragment = last_committed->fragment;
        spdlog::info("island '{}' joins late: copies the state after sync {} from '{}'", island->info.island_id,
                     KeyText(*last_committed), source);
      } else {
        island->phase = Phase::kActive;
        spdlog::info("island '{}' admitted (ring position by join order {})", island->info.island_id,
                     island->join_seq);
      }
      island->last_seen_ns = NowNs();
      Record(std::move(rec));
      JoinReply reply = std::move(island->join_reply);
      island->join_reply = nullptr;
      effects.push_back([reply, response] { reply(grpc::Status::OK, response); });
    }
  }

  // ---- RPC handlers (mu held) ----

  void Join(const fl::v1::IslandJoinRequest& req, JoinReply reply) {
    auto refuse = [&](grpc::StatusCode code, fl::v1::ErrorCode ecode, std::string msg, std::string field,
                      std::string hint) {
      grpc::Status status = Error(code, ecode, std::move(msg), std::move(field), std::move(hint));
      effects.push_back([reply, status] { reply(status, {}); });
    };
    if (shutdown) {
      return refuse(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "the coordinator is shutting down",
                    "", "");
    }
    if (finished || !failure.empty()) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("experiment ", opt.experiment_id, " is over", failure.empty() ? "" : ": ", failure),
                    "", "start a new experiment");
    }
    if (req.protocol_version() != 1) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("protocol version ", req.protocol_version(), " is not supported (this coordinator: 1)"),
                    "protocol_version", "use fl-island and fl-server of the same release");
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
    if (fingerprint.has_value() && *fingerprint != req.model_fingerprint()) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
                    fl::StrCat("island '", req.island_id(), "' trains a model with fingerprint ",
                               core::FingerprintToHex(req.model_fingerprint()), " but the experiment's model has ",
                               core::FingerprintToHex(*fingerprint)),
                    "model_fingerprint", "run every island with the same model (architecture and sizes)");
    }
    auto existing = islands.find(req.island_id());
    if (existing != islands.end()) {
      Island& old = *existing->second;
      if (Live(old)) {
        return refuse(grpc::StatusCode::ALREADY_EXISTS, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                      fl::StrCat("island '", req.island_id(), "' is still a member"), "island_id",
                      "Leave first, or wait until the coordinator notices the old session is gone "
                      "(--heartbeat-timeout-ms)");
      }
      if (old.phase == Phase::kWaiting) Evict(old, "rejoin", "replaced by a new Join with the same id");
    }
    int64_t live = 0;
    for (const auto& [id, island] : islands) {
      if (island->phase == Phase::kGone) continue;
      ++live;
      if (island->info.data_endpoint == req.data_endpoint()) {
        return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                      fl::StrCat("data_endpoint ", req.data_endpoint(), " is already used by island '", id, "'"),
                      "data_endpoint", "every island leader binds its own endpoint");
      }
    }
    if (live >= static_cast<int64_t>(opt.max_islands)) {
      return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("the experiment already has ", live, " islands (--max-islands)"), "", "");
    }
    if (!fingerprint.has_value()) fingerprint = req.model_fingerprint();
    auto island = std::make_shared<Island>();
    island->info = FromProto(req);
    island->join_seq = next_join_seq++;
    island->token = RandomToken();
    island->phase = Phase::kWaiting;
    island->join_reply = std::move(reply);
    islands[req.island_id()] = island;
    spdlog::info("island '{}' asks to join ({} ranks, data {}, state {})", req.island_id(), req.num_ranks(),
                 req.data_endpoint(), req.state_endpoint());
  }

  void BeginSync(const fl::v1::BeginSyncRequest& req, PlanReply reply) {
    auto fail = [&](const grpc::Status& status) { effects.push_back([reply, status] { reply(status, {}); }); };
    if (shutdown) return fail(Error(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "shutting down"));
    grpc::Status error;
    std::shared_ptr<Island> island = Find(req.island_id(), req.session_token(), &error);
    if (island == nullptr) return fail(error);
    const SyncKey key{req.key().step(), req.key().fragment()};
    const std::string& id = req.island_id();
    if (key.fragment >= opt.schedule.num_fragments) {
      return fail(Error(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                        fl::StrCat("fragment ", key.fragment, " is out of range: the schedule has ",
                                   opt.schedule.num_fragments, " fragment(s)"),
                        "key.fragment"));
    }
    if (!failure.empty()) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_INTERNAL, failure));
    }
    if (FinalKey().has_value() && *FinalKey() < key) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("sync ", KeyText(key), " is past the schedule's last sync ", KeyText(*FinalKey())),
                        "key", "Leave: the experiment is complete"));
    }
    if (island->phase == Phase::kLoading) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("island '", id, "' has not reported StateLoaded yet"), "",
                        "copy the state from the source of the Join answer, verify it, then ReportStateLoaded"));
    }
    if (island->repair_key.has_value()) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("island '", id, "' must repair its state to sync ", KeyText(*island->repair_key),
                                   " before the next sync"),
                        "", "FetchState from the verdict's source, then ReportStateLoaded"));
    }
    const bool is_retry = island->last_begun.has_value() && *island->last_begun == key && island->retry_allowed;
    if (island->resume_after.has_value() && !(*island->resume_after < key)) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("sync ", KeyText(key), " is not after the island's state ",
                                   KeyText(*island->resume_after)),
                        "key", "continue the schedule after the state's sync"));
    }
    if (island->last_begun.has_value() && !(*island->last_begun < key) && !is_retry) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("sync ", KeyText(key), " is not after the island's previous sync ",
                                   KeyText(*island->last_begun)),
                        "key", "sync keys must increase; repeat one only after a RETRY verdict"));
    }
    if (committed.contains(key)) {
      Evict(*island, "missed_barrier", fl::StrCat("sync ", KeyText(key), " was committed without it"));
      return fail(Evicted(id, fl::StrCat("sync ", KeyText(key), " was committed without it")));
    }
    Sync& sync = syncs[key];
    if (sync.open_epoch.has_value()) {
      const Epoch& open = open_epochs.at(*sync.open_epoch);
      if (std::find(open.members.begin(), open.members.end(), id) == open.members.end()) {
        Evict(*island, "missed_barrier", fl::StrCat("sync ", KeyText(key), " went ahead without it"));
        return fail(Evicted(id, fl::StrCat("sync ", KeyText(key), " went ahead without it")));
      }
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("island '", id, "' already holds epoch ", open.number, " of sync ", KeyText(key)),
                        "", "report SyncDone or SyncFailed for it first"));
    }
    island->last_begun = key;
    island->retry_allowed = false;
    if (!sync.gathering) {
      sync.gathering = true;
      sync.gather_started_ns = NowNs();
    }
    sync.arrived[id] = std::move(reply);
  }

  void OnReport(const std::string& id, const std::string& token, uint64_t epoch_number, const SyncKey& key,
              struct Report report) {
    VerdictReply reply = report.reply;
    auto fail = [&](const grpc::Status& status) { effects.push_back([reply, status] { reply(status, {}); }); };
    if (shutdown) return fail(Error(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, "shutting down"));
    grpc::Status error;
    std::shared_ptr<Island> island = Find(id, token, &error);
    if (island == nullptr) return fail(error);
    auto it = open_epochs.find(epoch_number);
    if (it == open_epochs.end()) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("epoch ", epoch_number, " is not open (resolved already, or never formed)"),
                        "epoch"));
    }
    Epoch& epoch = it->second;
    if (epoch.key != key || !epoch.join_seq.contains(id) || epoch.join_seq.at(id) != island->join_seq) {
      return fail(Error(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("island '", id, "' is not a member of epoch ", epoch_number, " of sync ",
                                   KeyText(key)),
                        "epoch"));
    }
    if (epoch.reports.contains(id)) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_MALFORMED,
                        fl::StrCat("island '", id, "' already reported epoch ", epoch_number), "epoch"));
    }
    if (epoch.reports.empty()) epoch.first_report_ns = NowNs();
    report.unix_ms = UnixMs();
    const bool failed = !report.done;
    const std::string vanished = report.vanished;
    const std::string reason = report.reason;
    epoch.reports.emplace(id, std::move(report));
    if (auto b = epoch.pending_blames.find(id); b != epoch.pending_blames.end()) {
      spdlog::info("epoch {}: island '{}', blamed by '{}', reported the epoch itself: alive, kept", epoch_number,
                   id, b->second.by);
      epoch.pending_blames.erase(b);
    }
    if (failed) {
      spdlog::warn("epoch {}: island '{}' reports a failed exchange{}: {}", epoch_number, id,
                   vanished.empty() ? "" : fl::StrCat(" (blames '", vanished, "')"), reason);
      auto v = islands.find(vanished);
      if (!vanished.empty() && vanished != id && v != islands.end() && epoch.join_seq.contains(vanished) &&
          v->second->join_seq == epoch.join_seq.at(vanished) && !epoch.reports.contains(vanished)) {
        const std::string why =
            fl::StrCat("island '", id, "' reported it vanished during epoch ", epoch_number, ": ", reason);
        if (epoch.attempt == 0 && opt.blame_grace_ms > 0) {
          epoch.pending_blames.emplace(vanished, Epoch::Blame{NowNs(), id, why});  // Tick decides
        } else {
          Evict(*v->second, "vanished", why);
        }
      }
    }
  }

  void StateLoaded(const fl::v1::StateLoadedRequest& req,
                   std::function<void(const grpc::Status&, const fl::v1::StateLoadedResponse&)> reply) {
    auto fail = [&](const grpc::Status& status) { effects.push_back([reply, status] { reply(status, {}); }); };
    grpc::Status error;
    std::shared_ptr<Island> island = Find(req.island_id(), req.session_token(), &error);
    if (island == nullptr) return fail(error);
    const SyncKey key{req.key().step(), req.key().fragment()};
    auto c = committed.find(key);
    if (c == committed.end()) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_WRONG_ROUND,
                        fl::StrCat("sync ", KeyText(key), " has not been committed"), "key"));
    }
    if (c->second.hash != req.state_hash()) {
      return fail(Error(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_CHECKSUM_MISMATCH,
                        fl::StrCat("island '", req.island_id(), "' loaded a state with hash ",
                                   instrumentation::HashHex(req.state_hash()), " but sync ", KeyText(key),
                                   " committed ", instrumentation::HashHex(c->second.hash)),
                        "state_hash", "fetch the state again (FetchState verifies the hash) or Rejoin"));
    }
    const std::string& id = req.island_id();
    if (island->phase == Phase::kLoading && island->resume_after == key) {
      island->phase = Phase::kActive;
      c->second.holders.push_back(id);
      if (metrics != nullptr) metrics->CountStateLoaded(id, "late_join");
      spdlog::info("island '{}' loaded the state after sync {}: member from the next sync on", id, KeyText(key));
    } else if (island->repair_key == key) {
      island->repair_key.reset();
      c->second.holders.push_back(id);
      Record(instrumentation::IslandRepairedRecord{opt.experiment_id, static_cast<int64_t>(island->repair_epoch), id,
                                                   UnixMs()});
      if (metrics != nullptr) metrics->CountStateLoaded(id, "repair");
      spdlog::info("island '{}' repaired its state to sync {}", id, KeyText(key));
    }
    fl::v1::StateLoadedResponse response;
    response.set_committed_hash(c->second.hash);
    effects.push_back([reply, response] { reply(grpc::Status::OK, response); });
  }

  void Leave(const fl::v1::IslandLeaveRequest& req,
             std::function<void(const grpc::Status&, const fl::v1::IslandLeaveResponse&)> reply) {
    grpc::Status error;
    std::shared_ptr<Island> island = Find(req.island_id(), req.session_token(), &error);
    if (island == nullptr) {
      effects.push_back([reply, error] { reply(error, {}); });
      return;
    }
    fl::v1::IslandLeaveResponse response;
    response.set_join_seq(island->join_seq);
    spdlog::info("island '{}' leaves: {}", req.island_id(), req.reason());
    Evict(*island, "left", fl::StrCat("left: ", req.reason()));
    effects.push_back([reply, response] { reply(grpc::Status::OK, response); });
  }

  void SessionOpened(const fl::v1::IslandHello& hello, const std::shared_ptr<SessionChannel>& channel,
                     std::string* bound_token) {
    grpc::Status error;
    std::shared_ptr<Island> island = Find(hello.island_id(), hello.session_token(), &error);
    if (island == nullptr) {
      effects.push_back([channel, error] { channel->Close(error); });
      return;
    }
    if (island->session != nullptr && island->session != channel) {
      std::shared_ptr<SessionChannel> old = island->session;
      effects.push_back([old] { old->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a new session")); });
    }
    island->session = channel;
    island->last_seen_ns = NowNs();
    *bound_token = hello.session_token();
  }

  void Heartbeat(const std::string& id, const std::string& token) {
    auto it = islands.find(id);
    if (it != islands.end() && it->second->token == token) it->second->last_seen_ns = NowNs();
  }

  void SessionClosed(const std::string& id, const std::string& token, const std::shared_ptr<SessionChannel>& channel) {
    auto it = islands.find(id);
    if (it == islands.end() || it->second->token != token || it->second->session != channel) return;
    it->second->session = nullptr;
    Evict(*it->second, "session_closed", "its session stream closed");
  }

  void Tick() {
    const int64_t now = NowNs();
    for (auto& [id, island] : islands) {
      if (!Live(*island)) continue;
      if (now - island->last_seen_ns > static_cast<int64_t>(opt.heartbeat_timeout_ms) * 1000000) {
        Evict(*island, "heartbeat", fl::StrCat("no heartbeat for ", opt.heartbeat_timeout_ms, " ms"));
      }
    }
    for (auto& [key, sync] : syncs) {
      if (!sync.gathering || now - sync.gather_started_ns <= static_cast<int64_t>(opt.barrier_timeout_ms) * 1000000) {
        continue;
      }
      for (const std::string& id : ExpectedAt(key)) {
        if (sync.arrived.contains(id)) continue;
        Evict(*islands.at(id), "missed_barrier",
              fl::StrCat("did not reach the barrier of sync ", KeyText(key), " within ", opt.barrier_timeout_ms, " ms"));
      }
    }
    for (auto& [number, epoch] : open_epochs) {
      for (auto b = epoch.pending_blames.begin(); b != epoch.pending_blames.end();) {
        if (now - b->second.at_ns <= static_cast<int64_t>(opt.blame_grace_ms) * 1000000) {
          ++b;
          continue;
        }
        if (!epoch.reports.contains(b->first) && MemberLive(epoch, b->first)) {
          Evict(*islands.at(b->first), "vanished",
                fl::StrCat(b->second.reason, " (and did not report the epoch itself within ", opt.blame_grace_ms,
                           " ms)"));
        }
        b = epoch.pending_blames.erase(b);
      }
    }
    for (auto& [number, epoch] : open_epochs) {
      if (epoch.first_report_ns == 0 ||
          now - epoch.first_report_ns <= static_cast<int64_t>(opt.report_timeout_ms) * 1000000) {
        continue;
      }
      for (const std::string& id : epoch.members) {
        if (epoch.reports.contains(id) || !MemberLive(epoch, id)) continue;
        Evict(*islands.at(id), "missed_report",
              fl::StrCat("did not report epoch ", number, " within ", opt.report_timeout_ms, " ms of the first report"));
      }
    }
  }

  void Shutdown(const std::string& reason) {
    if (shutdown) return;
    shutdown = true;
    shutdown_reason = reason;
    const grpc::Status status =
        Error(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN, fl::StrCat("coordinator: ", reason));
    for (auto& [id, island] : islands) {
      if (island->join_reply) {
        JoinReply reply = std::move(island->join_reply);
        island->join_reply = nullptr;
        effects.push_back([reply, status] { reply(status, {}); });
      }
      if (island->session != nullptr) {
        std::shared_ptr<SessionChannel> session = island->session;
        island->session = nullptr;
        fl::v1::IslandDown down;
        down.mutable_shutdown()->set_reason(reason);
        effects.push_back([session, down] {
          session->Send(down);
          session->Close(grpc::Status::OK);
        });
      }
      if (Live(*island)) {
        Record(instrumentation::IslandLeftRecord{opt.experiment_id, static_cast<int64_t>(island->join_seq), UnixMs(),
                                                 fl::StrCat("shutdown: ", reason)});
      }
      island->phase = Phase::kGone;
    }
    for (auto& [key, sync] : syncs) {
      for (auto& [id, reply] : sync.arrived) {
        PlanReply r = std::move(reply);
        effects.push_back([r, status] { r(status, {}); });
      }
      sync.arrived.clear();
      sync.gathering = false;
    }
    for (auto& [number, epoch] : open_epochs) {
      for (auto& [id, report] : epoch.reports) {
        VerdictReply r = report.reply;
        effects.push_back([r, status] { r(status, {}); });
      }
      instrumentation::IslandEpochRecord er;
      er.experiment_id = opt.experiment_id;
      er.epoch = static_cast<int64_t>(number);
      er.step = static_cast<int64_t>(epoch.key.step);
      er.fragment = epoch.key.fragment;
      er.attempt = epoch.attempt;
      er.members = epoch.members;
      er.outcome = "abandoned";
      er.barrier_ms = epoch.barrier_ms;
      er.formed_unix_ms = epoch.formed_unix_ms;
      er.resolved_unix_ms = UnixMs();
      er.reason = fl::StrCat("shutdown: ", reason);
      Record(std::move(er));
    }
    open_epochs.clear();
    UpdateGauges();
    cv.notify_all();
  }

  bool DoneLocked() const {
    if (shutdown || !failure.empty()) return true;
    return finished && LiveCount() == 0;
  }
};

// ---- gRPC service ----

class Coordinator::Service final : public fl::v1::Islands::CallbackService {
 public:
  explicit Service(State* state) : state_(state) {}

  template <class F>
  void Locked(F&& f) {
    std::unique_lock lock(state_->mu);
    f(*state_);
    state_->Settle();
    state_->RunEffects(lock);
  }

  // A unary call answered later by the state: `call(state, reply)` runs under the lock and hands `reply` on;
  // the reply copies the answer into gRPC's response and finishes the call.
  template <class Response, class F>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, Response* response, F&& call) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    std::function<void(const grpc::Status&, const Response&)> reply =
        [reactor, response](const grpc::Status& status, const Response& r) {
          *response = r;
          reactor->Finish(status);
        };
    Locked([&](State& s) { call(s, std::move(reply)); });
    return reactor;
  }

  // SyncDone and SyncFailed: a member's report on an epoch, answered with its verdict once the epoch resolves.
  template <class Request>
  grpc::ServerUnaryReactor* ReportSync(grpc::CallbackServerContext* ctx, const Request& request,
                                       fl::v1::SyncVerdict* response, struct Report report) {
    report.stats = FromProto(request.stats());
    return Unary(ctx, response, [&](State& s, VerdictReply reply) {
      report.reply = std::move(reply);
      s.OnReport(request.island_id(), request.session_token(), request.epoch(),
                 SyncKey{request.key().step(), request.key().fragment()}, std::move(report));
    });
  }

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const fl::v1::IslandJoinRequest* request,
                                 fl::v1::IslandJoinResponse* response) override {
    return Unary(ctx, response, [&](State& s, JoinReply reply) { s.Join(*request, std::move(reply)); });
  }

  class SessionReactor final : public grpc::ServerBidiReactor<fl::v1::IslandUp, fl::v1::IslandDown> {
   public:
    explicit SessionReactor(Service* service)
        : service_(service), channel_(std::make_shared<SessionChannel>(this)) {
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        channel_->Close(grpc::Status::OK);
        return;
      }
      if (island_id_.empty()) {
        if (in_.kind_case() != fl::v1::IslandUp::kHello) {
          channel_->Close(Error(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                                "the first message on an island session must be an IslandHello", "hello"));
          return;
        }
        std::string token;
        service_->Locked([&](State& s) { s.SessionOpened(in_.hello(), channel_, &token); });
        if (!token.empty()) {
          island_id_ = in_.hello().island_id();
          token_ = token;
        }
      } else if (in_.kind_case() == fl::v1::IslandUp::kHeartbeat) {
        std::lock_guard lock(service_->state_->mu);
        service_->state_->Heartbeat(island_id_, token_);
      }
      StartRead(&in_);
    }
    void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }
    void OnDone() override {
      channel_->Detach();
      if (!island_id_.empty()) {
        service_->Locked([&](State& s) { s.SessionClosed(island_id_, token_, channel_); });
      }
      delete this;
    }

   private:
    Service* service_;
    std::shared_ptr<SessionChannel> channel_;
    fl::v1::IslandUp in_;
    std::string island_id_;
    std::string token_;
  };

  grpc::ServerBidiReactor<fl::v1::IslandUp, fl::v1::IslandDown>* Session(grpc::CallbackServerContext*) override {
    return new SessionReactor(this);
  }

  grpc::ServerUnaryReactor* BeginSync(grpc::CallbackServerContext* ctx, const fl::v1::BeginSyncRequest* request,
                                      fl::v1::BeginSyncResponse* response) override {
    return Unary(ctx, response, [&](State& s, PlanReply reply) { s.BeginSync(*request, std::move(reply)); });
  }

  grpc::ServerUnaryReactor* SyncDone(grpc::CallbackServerContext* ctx, const fl::v1::SyncDoneRequest* request,
                                     fl::v1::SyncVerdict* response) override {
    struct Report report;
    report.done = true;
    report.hash = request->state_hash();
    return ReportSync(ctx, *request, response, std::move(report));
  }

  grpc::ServerUnaryReactor* SyncFailed(grpc::CallbackServerContext* ctx, const fl::v1::SyncFailedRequest* request,
                                       fl::v1::SyncVerdict* response) override {
    struct Report report;
    report.done = false;
    report.reason = request->reason();
    report.vanished = request->vanished_island_id();
    return ReportSync(ctx, *request, response, std::move(report));
  }

  grpc::ServerUnaryReactor* StateLoaded(grpc::CallbackServerContext* ctx, const fl::v1::StateLoadedRequest* request,
                                        fl::v1::StateLoadedResponse* response) override {
    return Unary(ctx, response, [&](State& s, auto reply) { s.StateLoaded(*request, std::move(reply)); });
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const fl::v1::IslandLeaveRequest* request,
                                  fl::v1::IslandLeaveResponse* response) override {
    return Unary(ctx, response, [&](State& s, auto reply) { s.Leave(*request, std::move(reply)); });
  }

 private:
  State* state_;
};

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
    return bad("--overlap-steps", schedule.overlap_steps,
               fl::StrCat("must be below --inner-steps / --fragments (", schedule.inner_steps / schedule.num_fragments,
                          ")"));
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
  if (min_islands < 1) return bad("--min-islands", min_islands, "must be at least 1");
  if (max_islands < min_islands) return bad("--max-islands", max_islands, "must be at least --min-islands");
  if (heartbeat_interval_ms == 0) return bad("--heartbeat-interval-ms", 0, "must be positive");
  if (heartbeat_timeout_ms <= heartbeat_interval_ms) {
    return bad("--heartbeat-timeout-ms", heartbeat_timeout_ms, "must exceed --heartbeat-interval-ms");
  }
  if (barrier_timeout_ms == 0) return bad("--barrier-timeout-ms", 0, "must be positive");
  if (report_timeout_ms == 0) return bad("--report-timeout-ms", 0, "must be positive");
  if (max_sync_attempts == 0) return bad("--max-sync-attempts", 0, "must be at least 1");
  if (experiment_id.empty()) return absl::InvalidArgumentError("experiment_id is empty");
  return absl::OkStatus();
}

Coordinator::Coordinator(std::unique_ptr<State> state)
    : state_(std::move(state)), service_(std::make_unique<Service>(state_.get())) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options,
                                                                 instrumentation::IslandRecordWriter* records,
                                                                 instrumentation::IslandMetrics* metrics) {
  if (options.experiment_id.empty()) {
    options.experiment_id = fl::StrCat(options.experiment_name, "-", UnixMs(), "-", RandomToken().substr(0, 6));
  }
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto state = std::make_unique<State>();
  state->opt = std::move(options);
  state->records = records;
  state->metrics = metrics;
  state->fingerprint = state->opt.model_fingerprint;
  if (metrics != nullptr) metrics->SetMembers(0);
  State* raw = state.get();
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(state)));
  raw->timer = std::thread([raw] {
    std::unique_lock lock(raw->mu);
    const auto period = std::chrono::milliseconds(
        std::clamp<uint32_t>(std::min(raw->opt.heartbeat_interval_ms, raw->opt.barrier_timeout_ms) / 4, 5, 250));
    while (!raw->shutdown) {
      raw->cv.wait_for(lock, period);
      if (raw->shutdown) break;
      raw->Tick();
      raw->Settle();
      raw->RunEffects(lock);
    }
  });
  return coordinator;
}

Coordinator::~Coordinator() {
  Shutdown("coordinator destroyed");
  if (state_->timer.joinable()) state_->timer.join();
}

grpc::Service* Coordinator::service() { return service_.get(); }
const CoordinatorOptions& Coordinator::options() const { return state_->opt; }

void Coordinator::Shutdown(const std::string& reason) {
  std::unique_lock lock(state_->mu);
  state_->Shutdown(reason);
  state_->RunEffects(lock);
}

bool Coordinator::WaitDone(absl::Duration timeout) {
  std::unique_lock lock(state_->mu);
  return state_->cv.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return state_->DoneLocked(); });
}

CoordinatorSnapshot Coordinator::Snapshot() const {
  std::lock_guard lock(state_->mu);
  CoordinatorSnapshot snap;
  std::vector<std::shared_ptr<Island>> live;
  for (const auto& [id, island] : state_->islands) {
    if (island->phase == Phase::kActive) live.push_back(island);
    if (island->phase == Phase::kLoading) snap.loading.push_back(id);
  }
  std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) { return a->join_seq < b->join_seq; });
  for (const auto& island : live) snap.members.push_back(island->info.island_id);
  snap.last_epoch = state_->last_epoch;
  snap.last_committed = state_->last_committed;
  snap.hash_mismatches = state_->hash_mismatches;
  snap.evictions = state_->evictions;
  snap.finished = state_->finished;
  snap.failure = state_->failure;
  return snap;
}

absl::StatusOr<RunningCoordinatorServer> StartCoordinatorServer(Coordinator* coordinator,
                                                                const std::string& listen_address) {
  auto running = rpc::StartGrpcServer(coordinator->service(), listen_address);
  if (!running.ok()) return running.status();
  return RunningCoordinatorServer{std::move(running->server), running->port};
}

}  // namespace fl::diloco
