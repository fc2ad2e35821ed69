// The kernel link emulator (needs root): one network namespace per client, joined to the host by a veth
// pair on a /30 of its own, with the link's rate shaped by HTB on each side's egress (the namespace side
// for the uplink, the host side for the downlink) and the delay by netem where the kernel has it.
//
// Where the kernel has no netem (this build machine's does not), the delay and jitter come from a
// userspace delay line: the ShapingRelay that the client reaches at client_target() delays each
// direction but leaves the rate to the kernel. With netem the relay only forwards. Either way a client in
// the namespace connects to client_target(), which forwards to the target (e.g. the server on 127.0.0.1).
// Trace-driven directions are shaped by the relay too (tc cannot replay a Mahimahi trace).
//
// Everything created (namespace, veth pair, qdiscs, relay) is removed by the destructor, and by Create()
// itself when a step fails. Names carry the prefix "fle_" (namespaces) / "fle" (links) and the owning
// process id, so parallel runs never collide and CleanupStaleKernelLinks() can remove what a crashed run
// left behind.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/emulation/link_profile.h"
#include "fl/emulation/shaping_relay.h"

namespace fl::emulation {

struct NetemSupport {
  bool available = false;
  std::string detail;  // how it was decided ("tc: Error: Specified qdisc kind is unknown." ...)
};
// Probes once per process by adding a netem qdisc to a throwaway veth pair (needs root); cached.
absl::StatusOr<NetemSupport> DetectNetem();

struct KernelLinkOptions {
  LinkProfile profile;
  std::string target_addr;  // host:port the client's connections are forwarded to, e.g. 127.0.0.1:50051
  uint64_t seed = 1;
  bool allow_netem = true;  // false forces the userspace delay line even where netem exists
};

class KernelLink {
 public:
  static absl::StatusOr<std::unique_ptr<KernelLink>> Create(KernelLinkOptions options);
  ~KernelLink();  // tears everything down; errors are logged
  KernelLink(const KernelLink&) = delete;
  KernelLink& operator=(const KernelLink&) = delete;

  const std::string& netns() const { return netns_; }
  const std::string& host_interface() const { return host_if_; }
  const std::string& netns_interface() const { return ns_if_; }
  const std::string& host_ip() const { return host_ip_; }  // the host side of the /30
  const std::string& netns_ip() const { return ns_ip_; }   // the namespace side
  // What a client inside the namespace connects to ("10.x.y.1:port").
  std::string client_target() const;
  bool netem_used() const { return netem_used_; }
  RelayStats relay_stats() const { return relay_ ? relay_->stats() : RelayStats{}; }

  // {"ip", "netns", "exec", <netns>, argv...}: start it with any process launcher to run argv inside.
  std::vector<std::string> WrapCommand(const std::vector<std::string>& argv) const;
  // Runs `fn` on a thread that has joined the namespace (sockets it opens live there).
  absl::Status RunInNamespace(const std::function<void()>& fn) const;

  // Removes everything now (the destructor calls it); returns the first error. Idempotent.
  absl::Status Destroy();

 private:
  KernelLink() = default;
  absl::Status Setup(const KernelLinkOptions& options);
  absl::Status ShapeEgress(bool in_netns, const std::string& dev, const LinkDirection& d, bool use_netem);

  std::string netns_;
  std::string host_if_;
  std::string ns_if_;
  std::string host_ip_;
  std::string ns_ip_;
  bool netns_created_ = false;
  bool veth_created_ = false;
  bool netem_used_ = false;
  std::unique_ptr<ShapingRelay> relay_;
};

// Removes namespaces and links with our prefix whose owning process is gone. Returns how many
// namespaces/links it removed.
absl::StatusOr<int> CleanupStaleKernelLinks();

// The names a link made by process `pid` as its `index`-th link gets (exposed for the stale-cleanup test).
std::string KernelLinkNetnsName(int pid, int index);
std::string KernelLinkInterfaceName(int pid, int index, char side);  // side 'h' (host) or 'n' (netns)

}  // namespace fl::emulation
