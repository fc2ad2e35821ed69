// CurveZMQ for the ring (RingOptions::curve): the ZAP handler that admits only the ring's own members' public
// keys on the bound (PULL, CURVE server) side. libzmq asks a ZAP handler bound on inproc://zeromq.zap.01 in the
// socket's context about every CURVE handshake; without one it would accept any client key, so the handler is
// started before the socket binds and lives as long as the context's sockets.
#pragma once

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::diloco {

// Unavailable naming libzmq's version when it was built without CURVE (zmq_has("curve") is false).
absl::Status CheckCurveSupport();

// A 40-character Z85 key that decodes to 32 bytes (what zmq_z85_decode accepts).
bool IsZ85Key(const std::string& key);

class ZapAuthenticator {
 public:
  // Binds inproc://zeromq.zap.01 in `context` and answers on a thread of its own: status 200 for a CURVE
  // client whose public key (Z85) is in `allowed`, 400 otherwise.
  static absl::StatusOr<std::unique_ptr<ZapAuthenticator>> Start(zmq::context_t& context,
                                                                 std::set<std::string> allowed);
  ~ZapAuthenticator();  // stops the thread and closes the socket (before the context terminates)
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;

  // Handshakes refused so far, and the public key (Z85) of the last one: what a timeout of the ring reports.
  uint64_t refused() const { return refused_.load(); }
  std::string last_refused_key() const;

 private:
  ZapAuthenticator(zmq::socket_t socket, std::set<std::string> allowed);
  void Serve();

  zmq::socket_t socket_;
  const std::set<std::string> allowed_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  mutable fl::Mutex mu_;
  std::string last_refused_key_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace fl::diloco
