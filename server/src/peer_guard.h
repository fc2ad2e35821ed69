// Who is calling, and the limits that keep one peer or one identity from taking the server for itself
// (docs/security.md, "Identity" and "Abuse limits"). Checked by the gRPC reactors (service.cc) before anything
// reaches the round engine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "fl/instrumentation/records.h"
#include "fl/pki/revocation_watcher.h"
#include "fl/server/round_engine.h"

namespace fl::server {

// A token bucket: `rate` tokens a second on average, at most `burst` at once, full when made. One for the
// session message limit (service.cc) and the join rates (PeerLimits). Not thread-safe.
class TokenBucket {
 public:
  TokenBucket(double rate, double burst, int64_t now_ns = 0)
      : rate_(rate), burst_(burst), tokens_(burst), last_ns_(now_ns) {}
  // Takes a token at `now_ns` (monotonic); false when none is left.
  bool Take(int64_t now_ns) {
    tokens_ = Level(now_ns);
    last_ns_ = now_ns;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }
  // Full again at `now_ns`: idle long enough that forgetting it changes nothing.
  bool FullAt(int64_t now_ns) const { return Level(now_ns) >= burst_; }

 private:
  double Level(int64_t now_ns) const {
    return std::min(burst_, tokens_ + static_cast<double>(now_ns - last_ns_) * 1e-9 * rate_);
  }
  double rate_;
  double burst_;
  double tokens_;
  int64_t last_ns_;
};

// How many security_events rows refusals may write (docs/security.md, "Security events"). Each refusal costs the
// server a row, so a peer that sends thousands of forged calls a second could fill the disk with them: rows are
// written while the peer's address has tokens (a burst of kRowBurst, then one every kRowIntervalS), and while all
// peers together have some (kGlobalRowBurst, then kGlobalRowsPerS); beyond that a refusal is only counted, and each
// (address, reason) that had refusals counted writes ONE summary row with their number, the time span and what
// the last one was told, at most every kSummaryIntervalS (and at the end of the experiment). Every refusal is
// still counted in fl_security_refusals_total. The row budget of 64 at once covers every honest burst the tests
// and the defaults produce (a rate-limited join storm of one client, a revocation of a few); its steady rate keeps
// one flooding address at about 12 rows a minute plus one summary per reason.
// Not thread-safe: the round engine's loop owns it.
class RefusalRows {
 public:
  static constexpr double kRowBurst = 64;
  static constexpr double kRowIntervalS = 5;
  static constexpr double kGlobalRowBurst = 512;
  static constexpr double kGlobalRowsPerS = 2;
  static constexpr int64_t kSummaryIntervalS = 10;
  // Distinct (address, reason) keys whose suppressed refusals are counted one by one; past it, under address "*".
  static constexpr size_t kMaxCountedKeys = 1024;

  struct Summary {
    std::string host;  // the address whose refusals were counted ("*": several, past kMaxCountedKeys)
    instrumentation::SecurityRefusal reason{};
    uint64_t suppressed = 0;
    int64_t first_ns = 0, last_ns = 0;          // monotonic: the first and the last refusal counted
    instrumentation::SecurityEventRecord last;  // the last refusal counted, as it would have been recorded
  };

  // True: write `record`'s row. False: it is counted toward its (address, reason) summary instead.
  bool Admit(const instrumentation::SecurityEventRecord& record, int64_t now_ns);
  // The summaries due at `now_ns` (counting began kSummaryIntervalS ago or more), or every one when `all`;
  // each is forgotten once returned.
  std::vector<Summary> TakeSummaries(int64_t now_ns, bool all);
  // The row of a summary: the reason, address, identity and claim of its last refusal, and a detail saying how
  // many refusals it stands for.
  static instrumentation::SecurityEventRecord SummaryRow(const Summary& summary);

 private:
  std::map<std::string, TokenBucket> peers_;
  std::optional<TokenBucket> global_;
  std::map<std::pair<std::string, instrumentation::SecurityRefusal>, Summary> counted_;
};

// The caller of one gRPC call.
struct PeerIdentity {
  std::string peer;            // gRPC's peer string, e.g. "ipv4:10.0.0.7:50514"
  std::string host;            // the peer's address without its port: the key of the per-peer limits
  bool authenticated = false;  // mutual TLS with a certificate the CA issued
  std::string name;            // the certificate's identity (fl-client://<name>, else its CN); empty in plaintext
  std::string serial_hex;      // the certificate's serial, checked against the revocation list
  bool island = false;         // an island's certificate (fl-island://): never a client's identity
};

// Reads the identity from the call's TLS auth context (nothing but the peer address over plaintext).
PeerIdentity IdentifyPeer(const grpc::CallbackServerContext& ctx);

// "ipv4:1.2.3.4:5" -> "1.2.3.4", "ipv6:[::1]:5" -> "[::1]"; anything else (unix sockets) whole.
std::string PeerHost(std::string_view peer);

// A call refused for a security reason: what the peer is told, and what the records say.
struct Refusal {
  instrumentation::SecurityRefusal reason;
  grpc::Status status;
};

// The refusal of a call whose certificate names another client than the one the call acts for.
Refusal WrongIdentity(const PeerIdentity& who, std::string_view claimed, std::string_view what);

// Join rates and concurrent sessions and uploads, per peer address and (over mutual TLS) per certificate
// identity. Thread-safe: the reactors call it from gRPC's threads.
class PeerLimits {
 public:
  enum class Stream { kSession, kUpload };

  explicit PeerLimits(const EngineConfig& config);

  // A Join from `who` at `now_ns` (monotonic): nullopt when both its peer's and its identity's rates allow it.
  std::optional<Refusal> TakeJoin(const PeerIdentity& who, int64_t now_ns);
  // A session or upload stream of `who` starts: nullopt and the slot is held until Release, or the refusal.
  std::optional<Refusal> Acquire(Stream stream, const PeerIdentity& who);
  void Release(Stream stream, const PeerIdentity& who);

 private:
  struct Counts {
    uint32_t sessions = 0;
    uint32_t uploads = 0;
  };
  bool TakeToken(std::map<std::string, TokenBucket>& buckets, const std::string& key, double rate, int64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EngineConfig& config_;
  fl::Mutex mu_;
  std::map<std::string, TokenBucket> peer_joins_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, TokenBucket> identity_joins_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counts> peer_streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Counts> identity_streams_ ABSL_GUARDED_BY(mu_);
};

// The checks every call of the federation service makes, in one place: revocation, identity, limits. A refusal is
// recorded (security_events, and the fl_security_refusals_total counter) through the engine.
class CallGuard {
 public:
  // `revocation` may be null (plaintext, or mutual TLS without --tls-crl).
  CallGuard(RoundEngine* engine, const pki::RevocationWatcher* revocation);

  // A Join: the certificate is not revoked, is a client's, and names `claimed` (the request's client_name).
  std::optional<Refusal> CheckJoin(const PeerIdentity& who, std::string_view claimed) const;
  // A call acting for client `acting_for` (a session, a download, an upload, a leave): over mutual TLS the
  // certificate is not revoked and is that client's. `what` names the call in the message.
  std::optional<Refusal> CheckActingFor(const PeerIdentity& who, std::string_view acting_for,
                                        std::string_view what) const;
  // Records the refusal and returns the status to finish the call with.
  grpc::Status Refuse(const PeerIdentity& who, std::string_view claimed, const Refusal& refusal) const;

  PeerLimits& limits() { return limits_; }
  RoundEngine* engine() const { return engine_; }

 private:
  // Not revoked, and a client's certificate (an island's cannot act as a client).
  std::optional<Refusal> CheckUsable(const PeerIdentity& who) const;

  RoundEngine* engine_;
  const pki::RevocationWatcher* revocation_;
  PeerLimits limits_;
};

}  // namespace fl::server
