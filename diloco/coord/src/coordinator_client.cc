#include "fl/diloco/coord/coordinator_client.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "coordinator_wire.h"
#include "fl/core/clock.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/v1/islands.grpc.pb.h"

namespace fl::diloco {
namespace {

// gRPC status -> absl::Status with the coordinator's ErrorDetail message and hint.
absl::Status FromGrpc(const grpc::Status& status, std::string_view call) {
  if (status.ok()) return absl::OkStatus();
  const fl::v1::ErrorDetail detail = proto::ErrorFromGrpcStatus(status);
  std::string message = detail.message().empty() ? status.error_message() : detail.message();
  if (!detail.hint().empty()) message = fl::StrCat(message, " (", detail.hint(), ")");
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), fl::StrCat(call, ": ", message));
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const std::optional<rpc::ClientTls>& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = rpc::ChannelCredentials(tls);
  if (!creds.ok()) return creds.status();
  return grpc::CreateCustomChannel(address, *creds, proto::SessionChannelArguments());
}

// A connection that got to the coordinator's port and then failed the handshake (gRPC's UNAVAILABLE text),
// as opposed to a coordinator not listening yet ("Connection refused"), which is worth waiting for.
bool HandshakeFailed(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  std::string m = status.error_message();
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  for (std::string_view sign :
       {"handshake", "ssl", "tls", "certificate", "socket closed", "connection reset", "end of tcp stream"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return false;
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

// One unary call on `stub` with `timeout` as its deadline.
template <class Request, class Response>
grpc::Status Call(fl::v1::Islands::Stub& stub,
                  grpc::Status (fl::v1::Islands::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                  const Request& req, Response* resp, absl::Duration timeout) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  return (stub.*method)(&ctx, req, resp);
}

}  // namespace

bool IsRejoinNeeded(const absl::Status& status) {
  return status.code() == absl::StatusCode::kAborted || status.code() == absl::StatusCode::kUnauthenticated;
}

std::string VanishedMemberFromError(const absl::Status& ring_error, const SyncPlan& plan) {
  const std::string_view message = fl::ToStd(ring_error.message());
  for (size_t i = 0; i < plan.members.size(); ++i) {
    if (i == plan.self_index) continue;
    if (message.find(fl::StrCat("'", plan.members[i].id, "'")) != std::string_view::npos) return plan.members[i].id;
  }
  return "";
}

struct CoordinatorClient::Impl {
  CoordinatorClientOptions options;
  std::string address;
  IslandJoinRequest request;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<fl::v1::Islands::Stub> stub;

  mutable fl::Mutex mu;
  Assignment assignment;  // written under mu; assignment() hands out a reference (read it between calls)
  std::string token ABSL_GUARDED_BY(mu);
  bool evicted ABSL_GUARDED_BY(mu) = false;
  std::string eviction_reason ABSL_GUARDED_BY(mu);

  // The session stream: written by the heartbeat thread (after the hello), read by the reader thread.
  fl::Mutex session_mu;
  fl::CondVar session_cv;
  bool stop_session ABSL_GUARDED_BY(session_mu) = false;
  std::unique_ptr<grpc::ClientContext> session_ctx ABSL_GUARDED_BY(session_mu);
  std::unique_ptr<grpc::ClientReaderWriter<fl::v1::IslandUp, fl::v1::IslandDown>> stream;
  std::thread reader;
  std::thread heartbeat;

  void MarkEvicted(const std::string& reason) {
    fl::MutexLock lock(mu);
    evicted = true;
    eviction_reason = reason;
  }

  absl::Status Check(const grpc::Status& status, std::string_view call) {
    absl::Status s = FromGrpc(status, call);
    if (IsRejoinNeeded(s)) MarkEvicted(std::string(s.message()));
    return s;
  }

  // A request of this island's current session (its id and session token set).
  template <class Request>
  Request SessionRequest() const {
    Request req;
    fl::MutexLock lock(mu);
    req.set_island_id(request.island_id);
    req.set_session_token(token);
    return req;
  }

  // What SyncDone and SyncFailed both carry: the session, the epoch and sync of `plan`, and the measurements.
  template <class Request>
  Request SyncReport(const SyncPlan& plan, const SyncStats& stats) const {
    Request req = SessionRequest<Request>();
    req.set_epoch(plan.epoch);
    *req.mutable_key() = ToProto(plan.key);
    *req.mutable_stats() = ToProto(stats);
    return req;
  }

  // A unary call with the RPC timeout.
  template <class Request, class Response>
  grpc::Status Call(grpc::Status (fl::v1::Islands::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                    const Request& req, Response* resp) {
    return diloco::Call(*stub, method, req, resp, options.rpc_timeout);
  }

  absl::Status StartSession(uint32_t heartbeat_interval_ms) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    auto s = stub->Session(ctx.get());
    fl::v1::IslandUp hello;
    {
      fl::MutexLock lock(mu);
      hello.mutable_hello()->set_island_id(request.island_id);
      hello.mutable_hello()->set_session_token(token);
    }
    if (!s->Write(hello)) {
      ctx->TryCancel();
      return FromGrpc(s->Finish(), "opening the island session");
    }
    {
      fl::MutexLock lock(session_mu);
      stop_session = false;
      session_ctx = std::move(ctx);
      stream = std::move(s);
    }
    reader = std::thread([this] {
      fl::v1::IslandDown down;
      while (stream->Read(&down)) {
        if (down.has_evicted()) MarkEvicted(fl::StrCat("evicted by the coordinator: ", down.evicted().reason()));
        if (down.has_shutdown()) MarkEvicted(fl::StrCat("the coordinator shut down: ", down.shutdown().reason()));
      }
    });
    if (options.send_heartbeats) {
      heartbeat = std::thread([this, heartbeat_interval_ms] {
        for (;;) {
          {
            fl::MutexLock lock(session_mu);
            if (session_cv.WaitFor(session_mu, std::chrono::milliseconds(heartbeat_interval_ms),
                                   [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(session_mu) { return stop_session; })) {
              return;
            }
          }
          fl::v1::IslandUp beat;
          beat.mutable_heartbeat()->set_sent_island_ns(NowNs());
          if (!stream->Write(beat)) return;  // the stream is gone; the reader sees why
        }
      });
    }
    return absl::OkStatus();
  }

  void StopSession() {
    {
      fl::MutexLock lock(session_mu);
      if (stream == nullptr) return;
      stop_session = true;
      session_cv.NotifyAll();
      session_ctx->TryCancel();
    }
    if (heartbeat.joinable()) heartbeat.join();
    if (reader.joinable()) reader.join();
    (void)stream->Finish();
    fl::MutexLock lock(session_mu);
    stream.reset();
    session_ctx.reset();
  }

  absl::StatusOr<Assignment> Join() {
    fl::v1::IslandJoinRequest req = ToProto(request);
    fl::v1::IslandJoinResponse resp;
    // Islands may start before the coordinator: a refused connection is retried until connect_timeout. (Not
    // wait_for_ready: it would also wait out a failing TLS handshake, which never heals, for the whole timeout.)
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(options.connect_timeout);
    const std::string what = fl::StrCat("joining ", address, " as '", request.island_id, "'");
    grpc::Status status;
    int handshake_failures = 0;
    auto backoff = std::chrono::milliseconds(50);
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - std::chrono::steady_clock::now()));
      status = stub->Join(&ctx, req, &resp);
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE || std::chrono::steady_clock::now() >= deadline) break;
      // A handshake that fails three times in a row is a configuration error, not a coordinator starting up.
      handshake_failures = HandshakeFailed(status) ? handshake_failures + 1 : 0;
      if (handshake_failures >= 3) {
        return absl::UnavailableError(fl::StrCat(
            what, ": ",
            options.tls.has_value() ? "the TLS handshake with the coordinator failed ("
                                    : "the coordinator closed every plaintext connection (",
            status.error_message(), "); ",
            options.tls.has_value()
                ? "check that --tls-ca is the CA that issued the coordinator's certificate (and names the host "
                  "dialled), that --tls-cert/--tls-key are this island's from the same CA (fl-provision "
                  "add-island), and that the coordinator runs with --tls-cert/--tls-key/--tls-client-ca"
                : "it probably serves mutual TLS: run fl-island with --tls-ca, --tls-cert and --tls-key "
                  "(fl-provision add-island, docs/security.md)"));
      }
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    if (!status.ok()) return FromGrpc(status, what);  // PERMISSION_DENIED (the certificate's name) included
    Assignment a;
    a.experiment_id = resp.experiment_id();
    a.join_seq = resp.join_seq();
    a.schedule = FromProto(resp.schedule());
    if (resp.has_state_source()) a.state_source = FromProto(resp.state_source());
    a.heartbeat_interval_ms = resp.heartbeat_interval_ms();
    {
      fl::MutexLock lock(mu);
      token = resp.session_token();
      assignment = a;
      evicted = false;
      eviction_reason.clear();
    }
    if (absl::Status s = StartSession(std::max<uint32_t>(a.heartbeat_interval_ms, 1)); !s.ok()) return s;
    return a;
  }

  absl::StatusOr<Verdict> ToVerdict(const grpc::Status& status, const fl::v1::SyncVerdict& v, std::string_view call) {
    if (absl::Status s = Check(status, call); !s.ok()) return s;
    Verdict verdict;
    switch (v.kind()) {
      case fl::v1::SYNC_VERDICT_KIND_COMMIT: verdict.kind = VerdictKind::kCommit; break;
      case fl::v1::SYNC_VERDICT_KIND_REPAIR: verdict.kind = VerdictKind::kRepair; break;
      case fl::v1::SYNC_VERDICT_KIND_RETRY: verdict.kind = VerdictKind::kRetry; break;
      default:
        return absl::InternalError(
            fl::StrCat(call, ": the coordinator sent verdict kind ", static_cast<int>(v.kind())));
    }
    if (v.has_source()) verdict.source = FromProto(v.source());
    verdict.majority_hash = v.majority_hash();
    return verdict;
  }
};

CoordinatorClient::CoordinatorClient(CoordinatorClientOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
}

CoordinatorClient::~CoordinatorClient() { impl_->StopSession(); }

absl::StatusOr<Assignment> CoordinatorClient::Connect(const std::string& server_address,
                                                      const IslandJoinRequest& request) {
  impl_->StopSession();
  {
    fl::MutexLock lock(impl_->mu);
    impl_->address = server_address;
    impl_->request = request;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(server_address, impl_->options.tls);
  if (!channel.ok()) return channel.status();
  impl_->channel = *std::move(channel);
  impl_->stub = fl::v1::Islands::NewStub(impl_->channel);
  return impl_->Join();
}

absl::StatusOr<Assignment> CoordinatorClient::Rejoin() {
  if (impl_->stub == nullptr) return absl::FailedPreconditionError("Rejoin before Connect");
  // Leave first so that the coordinator does not see two live sessions of one island (it refuses a Join
  // for an island that is still a member); an island already evicted gets an error here, which is fine.
  (void)Leave("rejoin");
  impl_->StopSession();
  return impl_->Join();
}

absl::StatusOr<SyncPlan> CoordinatorClient::BeginSync(SyncKey key) {
  auto req = impl_->SessionRequest<fl::v1::BeginSyncRequest>();
  *req.mutable_key() = ToProto(key);
  fl::v1::BeginSyncResponse resp;
  absl::Status s = impl_->Check(impl_->Call(&fl::v1::Islands::Stub::BeginSync, req, &resp),
                                fl::StrCat("BeginSync(step ", key.step, ", fragment ", key.fragment, ")"));
  if (!s.ok()) return s;
  SyncPlan plan;
  plan.epoch = resp.epoch();
  plan.attempt = resp.attempt();
  plan.key = FromProto(resp.key());
  for (const auto& m : resp.members()) plan.members.push_back(RingMember{m.island_id(), m.data_endpoint()});
  plan.self_index = resp.self_index();
  if (plan.self_index >= plan.members.size() || plan.members[plan.self_index].id != req.island_id()) {
    return absl::InternalError(fl::StrCat("BeginSync: the coordinator's plan does not place '", req.island_id(),
                                          "' at index ", plan.self_index));
  }
  return plan;
}

absl::StatusOr<Verdict> CoordinatorClient::ReportSyncDone(const SyncPlan& plan, uint64_t state_hash,
                                                          const SyncStats& stats) {
  auto req = impl_->SyncReport<fl::v1::SyncDoneRequest>(plan, stats);
  req.set_state_hash(state_hash);
  fl::v1::SyncVerdict resp;
  grpc::Status status = impl_->Call(&fl::v1::Islands::Stub::SyncDone, req, &resp);
  return impl_->ToVerdict(status, resp, fl::StrCat("SyncDone(epoch ", plan.epoch, ")"));
}

absl::StatusOr<Verdict> CoordinatorClient::ReportSyncFailed(const SyncPlan& plan, const absl::Status& error,
                                                            const std::string& vanished_island,
                                                            const SyncStats& stats) {
  auto req = impl_->SyncReport<fl::v1::SyncFailedRequest>(plan, stats);
  req.set_reason(std::string(error.ToString()));
  req.set_vanished_island_id(vanished_island);
  fl::v1::SyncVerdict resp;
  grpc::Status status = impl_->Call(&fl::v1::Islands::Stub::SyncFailed, req, &resp);
  return impl_->ToVerdict(status, resp, fl::StrCat("SyncFailed(epoch ", plan.epoch, ")"));
}

absl::Status CoordinatorClient::ReportStateLoaded(SyncKey key, uint64_t state_hash) {
  auto req = impl_->SessionRequest<fl::v1::StateLoadedRequest>();
  *req.mutable_key() = ToProto(key);
  req.set_state_hash(state_hash);
  fl::v1::StateLoadedResponse resp;
  return impl_->Check(impl_->Call(&fl::v1::Islands::Stub::StateLoaded, req, &resp), "StateLoaded");
}

absl::Status CoordinatorClient::Leave(const std::string& reason) {
  if (impl_->stub == nullptr) return absl::FailedPreconditionError("Leave before Connect");
  auto req = impl_->SessionRequest<fl::v1::IslandLeaveRequest>();
  req.set_reason(reason);
  fl::v1::IslandLeaveResponse resp;
  absl::Status s = FromGrpc(Call(*impl_->stub, &fl::v1::Islands::Stub::Leave, req, &resp, absl::Seconds(30)), "Leave");
  impl_->StopSession();
  return s;
}

bool CoordinatorClient::evicted() const {
  fl::MutexLock lock(impl_->mu);
  return impl_->evicted;
}

std::string CoordinatorClient::eviction_reason() const {
  fl::MutexLock lock(impl_->mu);
  return impl_->eviction_reason;
}

const Assignment& CoordinatorClient::assignment() const { return impl_->assignment; }
const std::string& CoordinatorClient::island_id() const { return impl_->request.island_id; }

}  // namespace fl::diloco
