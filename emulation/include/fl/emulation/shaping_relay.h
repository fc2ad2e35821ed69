// The userspace link emulator: a TCP relay that shapes each direction of every connection it forwards.
//
// A client connects to the relay instead of the server; the relay connects to the target and copies bytes
// both ways, each direction through its own DirectionShaper (token bucket or trace, then a delay line that
// never reorders bytes). One thread runs an epoll loop for all connections of the relay. No root needed.
//
//   auto relay = ShapingRelay::Start({.listen_addr = "127.0.0.1:0", .target_addr = "127.0.0.1:50051",
//                                     .uplink = profile.uplink, .downlink = profile.downlink, .seed = 7});
//   fl-client --server 127.0.0.1:<(*relay)->port()> ...
//
// The relay terminates TCP on both sides (like a performance-enhancing proxy), so the end points' TCP sees
// the loopback round trip, not the emulated one; rate, delay and jitter of the byte stream are emulated,
// packet loss is not (a lost packet cannot be expressed inside a TCP byte stream).
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"

namespace fl::emulation {

struct RelayOptions {
  std::string listen_addr = "127.0.0.1:0";  // host:port (IPv4, [IPv6] or a name); port 0 picks a free one
  std::string target_addr;                  // where each accepted connection is forwarded
  LinkDirection uplink;                     // client -> target
  LinkDirection downlink;                   // target -> client
  // The most bytes the relay holds per direction of a connection (bottleneck queue + delay line + bytes
  // waiting for the receiver); 0 = DefaultBufferLimit(direction). The kernel backend, whose relay only
  // delays, sets it from the real link rate so that the relay does not absorb seconds of traffic.
  uint64_t uplink_buffer_bytes = 0;
  uint64_t downlink_buffer_bytes = 0;
  uint64_t seed = 1;  // jitter samples; each connection derives its own
  // How long (ms after accepting a client) the relay keeps retrying, every 100 ms, a target that refuses
  // the connection, holding the client's connection open meanwhile. 0 = close the client's connection at
  // the first refusal (it sees an immediate EOF). Set it when the target may start after its clients
  // (islands bind their ring endpoint lazily): ZeroMQ treats an accepted connection that drops as a peer
  // that vanished, whereas a direct connection to a port not yet bound is silently retried.
  int64_t connect_retry_ms = 0;
  std::string name = "relay";  // for log lines
};

// The bottleneck queue plus twice the bytes in flight over the delay (delay + jitter) at the nominal rate,
// plus 256 KiB of slack; 64 MiB when the rate is unlimited.
uint64_t DefaultBufferLimit(const LinkDirection& direction);

struct RelayStats {
  uint64_t uplink_bytes = 0;    // delivered to the target
  uint64_t downlink_bytes = 0;  // delivered to the clients
  uint64_t connections_accepted = 0;
  uint64_t connections_active = 0;
  uint64_t connect_failures = 0;  // target refused or unreachable past the retry budget (client's connection closed)
};

class ShapingRelay {
 public:
  // Binds, listens and starts the relay thread; fails on a bad address or a port in use.
  static absl::StatusOr<std::unique_ptr<ShapingRelay>> Start(RelayOptions options);
  ~ShapingRelay();  // Stop()
  ShapingRelay(const ShapingRelay&) = delete;
  ShapingRelay& operator=(const ShapingRelay&) = delete;

  int port() const { return port_; }
  // "host:port" that clients connect to (the listen host with the bound port).
  std::string address() const;
  // Stops accepting, closes every connection (bytes still in the emulated link are dropped), joins the
  // thread. Idempotent.
  void Stop();
  RelayStats stats() const;

  class Loop;  // the epoll loop (shaping_relay.cc)

 private:
  ShapingRelay() = default;

  RelayOptions options_;
  std::string listen_host_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
};

// "host:port" -> sockaddr via getaddrinfo (numeric or names; "[::1]:5" for IPv6). Exposed for the kernel
// backend and tests.
struct SocketAddress {
  int family = 0;
  socklen_t length = 0;
  sockaddr_storage storage{};
};
absl::StatusOr<SocketAddress> ResolveAddress(const std::string& host_port);

}  // namespace fl::emulation
