#include "peer_guard.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/pki/revocation.h"
#include "fl/proto/convert.h"
#include "fl/server/client_input.h"

namespace fl::server {
namespace {

using instrumentation::SecurityRefusal;

// The bucket maps keep an entry per key seen; past this many, full (idle) buckets are dropped, so that a peer
// cycling through names or addresses cannot grow them without bound.
constexpr size_t kMaxIdleBuckets = 4096;

grpc::Status Limited(std::string message, std::string hint) {
  return proto::ToGrpcStatus(
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      proto::MakeError(fl::v1::ERROR_CODE_RATE_LIMITED, std::move(message), "", std::move(hint)));
}

double Burst(double rate) { return std::max(2 * rate, 5.0); }

}  // namespace

bool RefusalRows::Admit(const instrumentation::SecurityEventRecord& record, int64_t now_ns) {
  const std::string host = PeerHost(record.peer);
  if (!global_.has_value()) global_.emplace(kGlobalRowsPerS, kGlobalRowBurst, now_ns);
  if (peers_.size() >= kMaxIdleBuckets && peers_.count(host) == 0) {
    std::erase_if(peers_, [&](const auto& kv) { return kv.second.FullAt(now_ns); });
  }
  // The peer's token first: a flooding address spends its own budget, not the one every peer shares. Past
  // kMaxIdleBuckets busy addresses a new one gets no bucket (and so no row): its refusals are counted.
  if (peers_.size() < kMaxIdleBuckets || peers_.count(host) != 0) {
    TokenBucket& peer = peers_.try_emplace(host, 1.0 / kRowIntervalS, kRowBurst, now_ns).first->second;
    if (peer.Take(now_ns) && global_->Take(now_ns)) return true;
  }
  const bool apart = counted_.size() < kMaxCountedKeys || counted_.count({host, record.reason}) != 0;
  const std::pair<std::string, instrumentation::SecurityRefusal> key(apart ? host : std::string(1, '*'), record.reason);
  Summary& s = counted_[key];
  if (s.suppressed == 0) {
    s.host = key.first;
    s.reason = record.reason;
    s.first_ns = now_ns;
  }
  ++s.suppressed;
  s.last_ns = now_ns;
  s.last = record;
  return false;
}

std::vector<RefusalRows::Summary> RefusalRows::TakeSummaries(int64_t now_ns, bool all) {
  std::vector<Summary> due;
  for (auto it = counted_.begin(); it != counted_.end();) {
    if (all || now_ns - it->second.first_ns >= kSummaryIntervalS * 1'000'000'000) {
      due.push_back(std::move(it->second));
      it = counted_.erase(it);
    } else {
      ++it;
    }
  }
  return due;
}

instrumentation::SecurityEventRecord RefusalRows::SummaryRow(const Summary& summary) {
  instrumentation::SecurityEventRecord row = summary.last;
  const double span_s = static_cast<double>(summary.last_ns - summary.first_ns) / 1e9;
  row.detail = fl::StrCat(
      "summary: ", summary.suppressed, " more ", instrumentation::SecurityRefusalName(summary.reason),
      " refusal(s) of ", summary.host == "*" ? std::string("several addresses") : summary.host, " in ",
      absl::StrFormat("%.1f", span_s), " s were not recorded one by one (security_events rows are limited to ",
      static_cast<int>(kRowBurst), " at once per address, then one every ", static_cast<int>(kRowIntervalS),
      " s); the last was told: ", summary.last.detail);
  return row;
}

std::string PeerHost(std::string_view peer) {
  for (std::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (peer.substr(0, scheme.size()) != scheme) continue;
    std::string_view rest = peer.substr(scheme.size());
    const size_t colon = rest.rfind(':');
    return std::string(colon == std::string_view::npos ? rest : rest.substr(0, colon));
  }
  return std::string(peer);
}

PeerIdentity IdentifyPeer(const grpc::CallbackServerContext& ctx) {
  PeerIdentity who;
  who.peer = ctx.peer();
  who.host = PeerHost(who.peer);
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return who;
  for (const grpc::string_ref& pem : auth->FindPropertyValues("x509_pem_cert")) {
    absl::StatusOr<pki::PeerCertificate> cert = pki::ParsePeerCertificate(std::string_view(pem.data(), pem.size()));
    if (!cert.ok()) {
      // gRPC verified this certificate a moment ago; a parse failure here is OpenSSL disagreeing with itself.
      spdlog::error("cannot read the verified certificate of {}: {}", LogSafe(who.peer, 64),
                    std::string(cert.status().message()));
      continue;
    }
    who.authenticated = true;
    who.name = cert->name;
    who.serial_hex = cert->serial_hex;
    who.island = cert->kind == pki::Kind::kIsland;
  }
  return who;
}

Refusal WrongIdentity(const PeerIdentity& who, std::string_view claimed, std::string_view what) {
  return Refusal{
      SecurityRefusal::kWrongIdentity,
      proto::ToGrpcStatus(grpc::StatusCode::PERMISSION_DENIED,
                          proto::MakeError(fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                                           fl::StrCat("the client certificate is for \"", who.name, "\" but ", what,
                                                      " acts for client \"", LogSafe(claimed, 64), "\""),
                                           "client_id", "a client acts only for itself: use its own Join"))};
}

PeerLimits::PeerLimits(const EngineConfig& config) : config_(config) {}

bool PeerLimits::TakeToken(std::map<std::string, TokenBucket>& buckets, const std::string& key, double rate,
                           int64_t now_ns) {
  if (rate <= 0) return true;  // this limit is off
  if (buckets.size() >= kMaxIdleBuckets && buckets.count(key) == 0) {
    std::erase_if(buckets, [&](const auto& kv) { return kv.second.FullAt(now_ns); });
  }
  return buckets.try_emplace(key, rate, Burst(rate), now_ns).first->second.Take(now_ns);
}

std::optional<Refusal> PeerLimits::TakeJoin(const PeerIdentity& who, int64_t now_ns) {
  fl::MutexLock lock(mu_);
  if (!TakeToken(peer_joins_, who.host, config_.join_per_s_per_peer, now_ns)) {
    return Refusal{SecurityRefusal::kJoinRate,
                   Limited(fl::StrCat("more than ", config_.join_per_s_per_peer, " Joins per second from ", who.host,
                                      " (limit --join-per-s-per-peer)"),
                           "retry after a backoff (fl-client does)")};
  }
  if (who.authenticated && !TakeToken(identity_joins_, who.name, config_.join_per_s_per_identity, now_ns)) {
    return Refusal{SecurityRefusal::kJoinRate,
                   Limited(fl::StrCat("more than ", config_.join_per_s_per_identity, " Joins per second of client \"",
                                      who.name, "\" (limit --join-per-s-per-identity)"),
                           "retry after a backoff (fl-client does)")};
  }
  return std::nullopt;
}

std::optional<Refusal> PeerLimits::Acquire(Stream stream, const PeerIdentity& who) {
  const bool session = stream == Stream::kSession;
  const uint32_t peer_limit = session ? config_.max_sessions_per_peer : config_.max_uploads_per_peer;
  const uint32_t identity_limit = session ? config_.max_sessions_per_identity : config_.max_uploads_per_identity;
  const std::string_view what = session ? "session streams" : "uploads";
  const SecurityRefusal reason = session ? SecurityRefusal::kSessionLimit : SecurityRefusal::kUploadLimit;
  auto count = [&](Counts& c) -> uint32_t& { return session ? c.sessions : c.uploads; };
  auto open = [&](std::map<std::string, Counts>& m, const std::string& key) -> uint32_t {
    auto it = m.find(key);
    return it == m.end() ? 0 : count(it->second);
  };
  const std::string_view flag = session ? "sessions" : "uploads";
  fl::MutexLock lock(mu_);
  if (const uint32_t n = open(peer_streams_, who.host); peer_limit != 0 && n >= peer_limit) {
    return Refusal{
        reason, Limited(fl::StrCat(who.host, " already has ", n, " open ", what, " (limit --max-", flag, "-per-peer)"),
                        "close the ones it has first")};
  }
  if (who.authenticated) {
    if (const uint32_t n = open(identity_streams_, who.name); identity_limit != 0 && n >= identity_limit) {
      return Refusal{reason, Limited(fl::StrCat("client \"", who.name, "\" already has ", n, " open ", what,
                                                " (limit --max-", flag, "-per-identity)"),
                                     "one client runs one session and one upload at a time")};
    }
    ++count(identity_streams_[who.name]);
  }
  ++count(peer_streams_[who.host]);
  return std::nullopt;
}

void PeerLimits::Release(Stream stream, const PeerIdentity& who) {
  const bool session = stream == Stream::kSession;
  fl::MutexLock lock(mu_);
  auto drop = [&](std::map<std::string, Counts>& m, const std::string& key) {
    auto it = m.find(key);
    if (it == m.end()) return;
    uint32_t& n = session ? it->second.sessions : it->second.uploads;
    if (n > 0) --n;
    if (it->second.sessions == 0 && it->second.uploads == 0) m.erase(it);
  };
  drop(peer_streams_, who.host);
  if (who.authenticated) drop(identity_streams_, who.name);
}

CallGuard::CallGuard(RoundEngine* engine, const pki::RevocationWatcher* revocation)
    : engine_(engine), revocation_(revocation), limits_(engine->config()) {}

std::optional<Refusal> CallGuard::CheckUsable(const PeerIdentity& who) const {
  if (who.island) {
    return Refusal{
        SecurityRefusal::kWrongIdentity,
        proto::ToGrpcStatus(grpc::StatusCode::PERMISSION_DENIED,
                            proto::MakeError(fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                                             fl::StrCat("the certificate of \"", who.name,
                                                        "\" is an island's (fl-island://), not a client's"),
                                             "", "give fl-client a client certificate (fl-provision add-client)"))};
  }
  if (!who.authenticated || revocation_ == nullptr || !revocation_->IsRevoked(who.serial_hex)) return std::nullopt;
  return Refusal{
      SecurityRefusal::kRevokedCertificate,
      proto::ToGrpcStatus(grpc::StatusCode::PERMISSION_DENIED,
                          proto::MakeError(fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                                           fl::StrCat("the certificate of \"", who.name, "\" (serial ", who.serial_hex,
                                                      ") is revoked (", revocation_->options().crl_file, ")"),
                                           "", "ask the operator for a new certificate (fl-provision)"))};
}

std::optional<Refusal> CallGuard::CheckJoin(const PeerIdentity& who, std::string_view claimed) const {
  if (!who.authenticated) return std::nullopt;  // plaintext: there is no identity to check the name against
  if (std::optional<Refusal> r = CheckUsable(who); r.has_value()) return r;
  if (who.name == claimed) return std::nullopt;
  return Refusal{
      SecurityRefusal::kNameMismatch,
      proto::ToGrpcStatus(
          grpc::StatusCode::PERMISSION_DENIED,
          proto::MakeError(fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                           fl::StrCat("client certificate is for \"", who.name, "\" but the Join is for client_name \"",
                                      LogSafe(claimed, 64), "\""),
                           "client_name", "join with the name in this client's certificate (fl-client --name)"))};
}

std::optional<Refusal> CallGuard::CheckActingFor(const PeerIdentity& who, std::string_view acting_for,
                                                 std::string_view what) const {
  if (!who.authenticated) return std::nullopt;
  if (std::optional<Refusal> r = CheckUsable(who); r.has_value()) return r;
  if (who.name == acting_for) return std::nullopt;
  return WrongIdentity(who, acting_for, what);
}

grpc::Status CallGuard::Refuse(const PeerIdentity& who, std::string_view claimed, const Refusal& refusal) const {
  // Logged by the engine with its row, within the peer's budget of rows (RefusalRows): not here, once per call.
  instrumentation::SecurityEventRecord record;
  record.reason = refusal.reason;
  record.peer = who.peer;
  record.identity = who.name;
  record.claimed = LogSafe(claimed, 128);
  record.detail = refusal.status.error_message();
  engine_->Post(SecurityRefusalEvent{std::move(record)});
  return refusal.status;
}

}  // namespace fl::server
