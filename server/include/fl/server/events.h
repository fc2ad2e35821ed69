// Events that the gRPC reactors post to the round engine, and the replies the engine sends back.
//
// Reactors never decide anything: they parse, post an event and go back to gRPC. The engine thread owns
// every piece of federation state and answers through the callbacks carried by the events, which must only
// enqueue work for gRPC (Finish, StartWrite) and never block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <grpcpp/support/status.h>

#include "fl/instrumentation/records.h"
#include "fl/v1/federation.pb.h"

namespace fl::server {

// The server's side of one client's session stream.
class SessionChannel {
 public:
  virtual ~SessionChannel() = default;
  // Queues a message for the client; thread-safe and non-blocking. Dropped if the stream has ended.
  virtual void Send(fl::v1::ServerMessage message) = 0;
  // Ends the stream with `status` after the queued messages are written.
  virtual void Close(const grpc::Status& status) = 0;
  // When the reactor last received a message of this session (server monotonic ns; 0: none yet). Thread-safe.
  // Liveness is judged by this, not by when the engine got to the message: an engine that runs late must
  // not evict a session whose heartbeats arrived and wait in its queue.
  virtual int64_t last_received_ns() const { return 0; }
};

// The engine's handle on an admitted upload (service.cc): how far it got, and a way to end it. Lets the
// engine take the upload slot back from a stream that stalls or trickles (EngineConfig::upload_*) without
// an event per chunk.
class UploadHandle {
 public:
  virtual ~UploadHandle() = default;
  // Payload bytes received so far; thread-safe.
  virtual uint64_t bytes_received() const = 0;
  // When the last message of the upload arrived (server monotonic ns; 0: none since admission); thread-safe.
  virtual int64_t last_message_ns() const = 0;
  // Ends the upload with `status`: the reactor posts its UploadDoneEvent with `status` as the transfer error
  // (which frees the slot) and the client gets `status`. No-op once the upload is done. Thread-safe.
  virtual void Revoke(const grpc::Status& status) = 0;
};

// An encoded global model, immutable once published: downloads hold a reference while they stream it, so
// the engine can publish the next version without waiting for slow clients.
struct ModelPayload {
  uint64_t model_version = 0;
  uint64_t round = 0;
  fl::v1::ModelSpec spec;
  std::string codec;
  std::vector<uint8_t> bytes;  // one fl::core codec payload
  uint64_t checksum = 0;       // TransferChecksum64(bytes): the download trailer's checksum
};

struct JoinEvent {
  fl::v1::JoinRequest request;
  std::string peer;
  std::function<void(const grpc::Status&, const fl::v1::JoinResponse&)> reply;
  std::string cert_serial;  // the client certificate's serial over mutual TLS (empty in plaintext)
};

struct SessionOpenEvent {
  fl::v1::SessionHello hello;
  std::shared_ptr<SessionChannel> channel;
  std::string peer;
};

struct SessionMessageEvent {
  std::shared_ptr<SessionChannel> channel;
  fl::v1::ClientMessage message;
  int64_t received_server_ns = 0;
};

struct SessionClosedEvent {
  std::shared_ptr<SessionChannel> channel;
  // Set when the server closed the session for a limit (messages per second, unread messages, an unparsable
  // message): recorded as the client's session_closed event. Empty when the client or its link ended it.
  std::string limit_reason;
};

struct DownloadEvent {
  fl::v1::DownloadModelRequest request;
  std::function<void(const grpc::Status&, std::shared_ptr<const ModelPayload>)> reply;
  std::string peer;
};

// A download's last message (the trailer) was handed to the transport: the server's view of the downlink,
// from the request's arrival to then.
struct DownloadDoneEvent {
  std::string client_id;
  std::string task_id;
  int64_t started_server_ns = 0;
  int64_t done_server_ns = 0;
  uint64_t bytes = 0;
};

// The header of an upload arrived; the engine admits it (nullopt: go on reading chunks) or refuses it with
// a verdict the reactor returns at once. Admission may be deferred while the server's upload slots are all
// busy: the reactor reads no chunk until admitted, so gRPC flow control holds the client back and server
// memory stays bounded whatever the number of clients.
struct UploadStartEvent {
  fl::v1::UpdateHeader header;
  int64_t first_byte_server_ns = 0;
  // On admission `buffer` is a reused model-sized buffer (empty, with capacity) to receive the payload
  // into; it comes back in UploadDoneEvent::payload.
  std::function<void(std::optional<fl::v1::UploadUpdateResponse> refusal, std::vector<uint8_t> buffer)> admit;
  // Progress and revocation of the upload once admitted (may be null: then it is never revoked).
  std::shared_ptr<UploadHandle> handle;
  std::string peer;
};

// An admitted upload finished: every chunk arrived and the checksum matched (or `transfer_error` says
// what went wrong, e.g. the client cancelled). The engine validates, aggregates, and answers.
struct UploadDoneEvent {
  fl::v1::UpdateHeader header;
  std::vector<uint8_t> payload;
  int64_t first_byte_server_ns = 0;
  int64_t done_server_ns = 0;
  grpc::Status transfer_error;
  std::function<void(const fl::v1::UploadUpdateResponse&)> reply;
  std::shared_ptr<UploadHandle> handle;  // the UploadStartEvent's
};

struct LeaveEvent {
  fl::v1::LeaveRequest request;
  std::function<void(const grpc::Status&, const fl::v1::LeaveResponse&)> reply;
  std::string peer;
};

struct ShutdownEvent {
  std::string reason;
};

// A call the service refused for a security reason (revocation, identity, abuse limits): recorded in
// security_events and counted by reason (the service fills reason, peer, identity, claimed and detail).
struct SecurityRefusalEvent {
  instrumentation::SecurityEventRecord record;
};

// Certificate serials a reload of the revocation list found newly revoked: their clients' sessions are closed.
struct CertificatesRevokedEvent {
  std::set<std::string> serials;
};

using EngineEvent = std::variant<JoinEvent, SessionOpenEvent, SessionMessageEvent, SessionClosedEvent, DownloadEvent,
                                 DownloadDoneEvent, UploadStartEvent, UploadDoneEvent, LeaveEvent, ShutdownEvent,
                                 SecurityRefusalEvent, CertificatesRevokedEvent>;

}  // namespace fl::server
