// FederatedClient: fl-client's side of the fl.v1 protocol.
//
// Joins, keeps the session stream, runs the tasks the server pushes (download → train or evaluate →
// upload or report), measures every phase with the monotonic clock, and reconnects with exponential
// backoff and jitter whenever the server or the link goes away. Refusals that retrying cannot fix (wrong
// model, unsupported protocol) end Run() with an error that says what to change.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "fl/client/client_metrics.h"
#include "fl/client/socket_binding.h"
#include "fl/training/trainer.h"
#include "fl/rpc/tls.h"
#include "fl/v1/common.pb.h"

namespace grpc {
class ClientContext;
}

namespace fl::client {

// Mutual TLS to the server (fl-client --tls-ca/--tls-cert/--tls-key): rpc/include/fl/rpc/tls.h.
using ClientTls = rpc::ClientTls;

struct ClientOptions {
  std::string server_address = "127.0.0.1:50051";
  std::string client_name;    // unique per experiment; [A-Za-z0-9._-]{1,64}
  fl::v1::DeviceInfo device;  // see DetectDevice
  fl::v1::LinkInfo link;
  std::string software_version;
  uint32_t max_chunk_bytes = 1u << 20;
  uint32_t join_timeout_ms = 10000;    // one Join attempt, including connecting
  uint32_t give_up_after_ms = 120000;  // no successful Join for this long: Run() fails
  uint32_t initial_backoff_ms = 200;
  uint32_t max_backoff_ms = 10000;
  uint64_t seed = 0;  // of the backoff jitter
  // Test flag: shifts every timestamp this client reports (pongs, phase starts) by this much, as if its
  // clock were set differently; the server's clock-offset estimate must find it.
  int64_t clock_skew_ns = 0;
  // The network interface and/or source address every connection to the server binds to (socket_binding.h).
  SocketBinding binding;
  // Where the session reports its phases, bytes, rounds and reconnects (fl-client --metrics-addr); not owned,
  // may be null.
  ClientMetrics* metrics = nullptr;
  // Absent: plaintext (the default for now). A file that cannot be read makes Run() fail at once.
  std::optional<ClientTls> tls;
  // Test hook (fl-client --secagg-drop-after-shares): abandon every secure round right after sending the shares,
  // as a client that drops after sharing keys (no masked upload, no unmask answer; the session stays up).
  bool secagg_drop_after_shares = false;
};

class FederatedClient {
 public:
  FederatedClient(ClientOptions options, training::Trainer* trainer);
  ~FederatedClient();
  FederatedClient(const FederatedClient&) = delete;
  FederatedClient& operator=(const FederatedClient&) = delete;

  // Runs until the server says the experiment finished (OK; also when a Join after a reconnect is answered
  // "experiment finished": the client was away at the end), a fatal refusal, giving up on an unreachable
  // server, or Stop() (Cancelled).
  absl::Status Run();
  // Thread-safe: ends Run() soon (cancels the session and the current task).
  void Stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::client
