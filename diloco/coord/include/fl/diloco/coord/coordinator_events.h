// What reaches the islands coordinator's event loop (rpc::EventLoop<CoordinatorEvent>): one event per call or
// stream message. The gRPC reactors only parse a message and Post() the event with a reply function; the loop
// thread owns all state and answers through that function (from the loop thread, at once or when the barrier or
// epoch it waits for resolves). Tests post these events themselves (Coordinator::Post) and run the loop on a
// ManualClock (Coordinator::RunUntilIdle): no gRPC, no threads, no sleeps.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <variant>

#include <grpcpp/grpcpp.h>

#include "fl/v1/islands.pb.h"

namespace fl::diloco {

// Answers one unary call; called exactly once, on the loop thread.
template <class Response>
using Reply = std::function<void(const grpc::Status&, const Response&)>;

// The coordinator's end of one island's session stream (the gRPC one wraps rpc::StreamOutbox). Thread-safe;
// Send and Close never block; both are dropped once the stream ended.
class IslandSession {
 public:
  virtual ~IslandSession() = default;
  virtual void Send(const fl::v1::IslandDown& message) = 0;
  // Finishes the stream with `status` after what was sent.
  virtual void Close(const grpc::Status& status) = 0;
};

struct JoinEvent {
  fl::v1::IslandJoinRequest request;
  Reply<fl::v1::IslandJoinResponse> reply;
  // The serial of the caller's certificate (upper-case hex) when the coordinator checks a revocation list
  // (--tls-crl); "" otherwise. A reload that revokes it evicts the island.
  std::string cert_serial = {};
};
struct BeginSyncEvent {
  fl::v1::BeginSyncRequest request;
  Reply<fl::v1::BeginSyncResponse> reply;
};
struct SyncDoneEvent {
  fl::v1::SyncDoneRequest request;
  Reply<fl::v1::SyncVerdict> reply;
};
struct SyncFailedEvent {
  fl::v1::SyncFailedRequest request;
  Reply<fl::v1::SyncVerdict> reply;
};
struct StateLoadedEvent {
  fl::v1::StateLoadedRequest request;
  Reply<fl::v1::StateLoadedResponse> reply;
};
struct LeaveEvent {
  fl::v1::IslandLeaveRequest request;
  Reply<fl::v1::IslandLeaveResponse> reply;
};
// The first message of a session stream (the reactor refuses a stream that starts with anything else).
struct SessionOpenedEvent {
  fl::v1::IslandHello hello;
  std::shared_ptr<IslandSession> session;
  std::string cert_serial = {};  // as JoinEvent's: the certificate the stream was opened with
};
struct HeartbeatEvent {
  std::string island_id;
  std::string session_token;
};
// The stream ended (the island's side closed it, its connection broke, or the coordinator finished it).
struct SessionClosedEvent {
  std::string island_id;
  std::string session_token;
  std::shared_ptr<IslandSession> session;
};
// A reload of the revocation list (--tls-crl) found these serials newly revoked (the watcher's thread posts it).
struct CertificatesRevokedEvent {
  std::set<std::string> serials;
  std::string crl_file;
};
struct ShutdownEvent {
  std::string reason;
};
// Runs `fn` on the loop thread (Snapshot() and Shutdown() wait on the loop this way).
struct CallOnLoop {
  std::function<void()> fn;
};

using CoordinatorEvent = std::variant<JoinEvent, BeginSyncEvent, SyncDoneEvent, SyncFailedEvent, StateLoadedEvent,
                                      LeaveEvent, SessionOpenedEvent, HeartbeatEvent, SessionClosedEvent,
                                      CertificatesRevokedEvent, ShutdownEvent, CallOnLoop>;

}  // namespace fl::diloco
