// The round engine against one hostile peer (issue 27; docs/security.md, "Abuse limits"): the budget of
// security_events rows (and their summaries), the clients that joined and never had a task (forgotten past a bound),
// and fair places when the server is full (an address holding more than its share yields its oldest idle place).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/server/round_engine.h"
#include "engine_internal.h"
#include "engine_peers.h"
#include "peer_guard.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

RoundEngine::Core::PeersState& RoundEngine::Core::peers_state() {
  if (peers_state_ == nullptr) peers_state_ = std::make_shared<PeersState>();
  return *peers_state_;
}

bool RoundEngine::Core::YieldPlaceTo(const std::string& peer, const std::string& name) {
  // Fair admission under contention (issue 27: one address re-joining 8 names a second kept every place, and an
  // honest newcomer from elsewhere was refused 12 times of 12). The server is full; each address holding places,
  // the newcomer's included, is entitled to max_sessions / addresses of them. A newcomer whose address holds
  // fewer than that takes a place from the address holding the most, if that one holds more than its share: its
  // least recently heard client without an open task is disconnected (a session closed RESOURCE_EXHAUSTED, fl-client
  // joins again later). Thousands of sessions from one address (virtual clients, fleet_load) are untouched while
  // the server has room, and while no other address asks for its share. O(places), only when the server is full.
  const std::string host = PeerHost(peer);
  std::unordered_map<std::string, size_t> held;
  held.reserve(64);
  held[host];  // the newcomer's address counts as one that asks, with what it holds
  for (const ClientInfo* c : clients_.places()) ++held[PeerHost(c->peer)];
  const size_t share = std::max<size_t>(1, config_.max_sessions / held.size());
  if (held[host] >= share) return false;
  auto hog =
      std::max_element(held.begin(), held.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  if (hog->second <= share) return false;
  for (ClientInfo* c : clients_.places()) {  // least recently heard first
    if (!c->open_task.empty() || c->id == initial_model_client_ || PeerHost(c->peer) != hog->first) continue;
    const std::string why =
        fl::StrCat("the server is full (--max-sessions=", config_.max_sessions, ") and ", LogSafe(hog->first, 64),
                   " holds ", hog->second, " of its places, more than its share of ", share, " among ", held.size(),
                   " addresses: this idle session yields its place to client '", LogSafe(name, 64), "' from ",
                   LogSafe(host, 64), "; join again later");
    spdlog::info("client '{}' from {}: {}", c->id, LogSafe(c->peer, 64), why);
    RecordClientEvent(c->id, instrumentation::ClientEventKind::kSessionClosed, std::nullopt, "", why);
    DisconnectClient(*c, why, grpc::StatusCode::RESOURCE_EXHAUSTED);
    return true;
  }
  return false;
}

void RoundEngine::Core::ForgetIdleNewcomers() {
  if (peers_state_ == nullptr || peers_state_->idle_newcomers.size() <= config_.max_idle_newcomers) return;
  // Past the bound, the oldest idle newcomers are forgotten: their memory and their clients row (and its
  // client_events). One that joins again is admitted as a new client; one the server still waits on for the
  // initial model, or with an open task (none: it never had one), is kept.
  PeersState& peers = peers_state();
  for (auto it = peers.idle_newcomers.begin();
       peers.idle_newcomers.size() > config_.max_idle_newcomers && it != peers.idle_newcomers.end();) {
    ClientInfo& c = **it;
    if (c.id == initial_model_client_ || c.session != nullptr || c.holds_place || !c.open_task.empty()) {
      ++it;
      continue;
    }
    peers.idle_position.erase(&c);
    it = peers.idle_newcomers.erase(it);
    spdlog::debug("forgot client '{}': it never had a task and more than {} such clients are idle", c.id,
                  config_.max_idle_newcomers);
    untold_.erase(c.id);
    Record(instrumentation::ClientForgottenRecord{config_.experiment_id, c.id});
    ++peers.forgotten;
    clients_.Forget(c.id);  // last: `c` is gone after this
  }
}

void RoundEngine::Core::RecordSecurityRefusal(instrumentation::SecurityEventRecord record) {
  record.experiment_id = config_.experiment_id;
  record.at_unix_ms = UnixMs();
  const instrumentation::SecurityRefusal reason = record.reason;
  // Every refusal is counted; its row (and log line) only within the peer's budget (RefusalRows): a peer sending
  // thousands of forged calls a second must not fill the disk with records or logs. The rest go out as summaries.
  const int64_t now = NowNs();
  if (peers_state().refusal_rows.Admit(record, now)) {
    spdlog::warn(
        "refused a call from {} ({}): {}", LogSafe(record.peer, 64),
        record.identity.empty() ? std::string("plaintext") : fl::StrCat("certificate \"", record.identity, "\""),
        LogSafe(record.detail, 600));
    Record(std::move(record));
  }
  Notify([&](EngineObserver& o) { o.OnSecurityRefusal(reason); });
  WriteRefusalSummaries(/*all=*/false);
}

void RoundEngine::Core::WriteRefusalSummaries(bool all) {
  if (peers_state_ == nullptr) return;
  for (const RefusalRows::Summary& summary : peers_state_->refusal_rows.TakeSummaries(NowNs(), all)) {
    instrumentation::SecurityEventRecord row = RefusalRows::SummaryRow(summary);
    row.experiment_id = config_.experiment_id;
    row.at_unix_ms = UnixMs();
    spdlog::warn("refused {} more calls from {} ({}) without recording each: {}", summary.suppressed,
                 summary.host == "*" ? std::string("several addresses") : LogSafe(summary.host, 64),
                 instrumentation::SecurityRefusalName(summary.reason), LogSafe(row.detail, 600));
    Record(std::move(row));
  }
}

}  // namespace fl::server
