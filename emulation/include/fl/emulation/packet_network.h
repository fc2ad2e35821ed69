// The packet backend's data plane (docs/testbed.md, "TUN devices and namespaces"): one network namespace a
// client process runs in, joined to the host by one or more emulated links. A link is a pair of TUN
// devices, "flp<pid>_<i>n" in the namespace (10.214.x.2/30, the namespace's routes to the host side) and
// "flp<pid>_<i>h" on the host (10.214.x.1/30), and an event-loop thread that moves every IP packet read from
// one through a PacketLink (the uplink for namespace -> host, the downlink for host -> namespace) and writes
// it to the other when the link lets it leave. A server listening on 0.0.0.0:port on the host is reached
// from the namespace at host_ip(link):port: the kernels' own TCP (or UDP, ICMP) runs end to end across the
// emulated link, nothing terminates it.
//
// Virtual clients (several identities in one process) get one link per instance, each instance connecting to
// its own link's host address.
//
// Needs root (or CAP_NET_ADMIN), /dev/net/tun, the `ip` command and network namespaces: Create refuses with
// PacketBackendSupport()'s list of what is missing. Everything made is removed by Destroy (the destructor
// calls it), and by Create/AddLink themselves when a step fails. Names carry the owning process id;
// CleanupStaleKernelLinks (`fl-link cleanup`) removes what a crashed run left.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/emulation/link_profile.h"
#include "fl/emulation/packet_link.h"
#include "fl/emulation/tun_device.h"

namespace fl::emulation {

struct PacketNamespaceOptions {
  std::string label;  // for logs ("client-3")
  // "" = the kernel's default; else set inside the namespace: it must be in tcp_available_congestion_control
  // and, for a namespace other than the host's, in tcp_allowed_congestion_control (refused otherwise).
  std::string tcp_congestion;
  uint64_t seed = 1;  // each link direction's RNG is derived from it
};

// A TCP congestion control a packet namespace can take: offered by the kernel
// (tcp_available_congestion_control) and, for a namespace other than the host's, allowed by the host
// (tcp_allowed_congestion_control). The refusal names what is missing and the command that fixes it.
absl::Status CheckNamespaceCongestionControl(const std::string& name);

class PacketNamespace {
 public:
  static absl::StatusOr<std::unique_ptr<PacketNamespace>> Create(PacketNamespaceOptions options);
  ~PacketNamespace();
  PacketNamespace(const PacketNamespace&) = delete;
  PacketNamespace& operator=(const PacketNamespace&) = delete;

  // Adds a link with `profile` (validated by PacketLink::Create; the error names the field, "uplink.loss",
  // the value and what is allowed); returns its index (0, 1, ...). Only before Start().
  absl::StatusOr<int> AddLink(const LinkProfile& profile);
  // What a client in the namespace connects to: host_ip(link):server_port.
  const std::string& host_ip(int link) const;
  // The namespace side's address of the link.
  const std::string& netns_ip(int link) const;
  // The link's TUN interfaces: on the host ("flp<pid>_<i>h") and in the namespace ("flp<pid>_<i>n").
  const std::string& host_interface(int link) const;
  const std::string& netns_interface(int link) const;
  const std::string& netns() const { return netns_; }
  int link_count() const { return static_cast<int>(links_.size()); }

  // Starts the event-loop thread (epoll over every TUN fd and a timerfd armed at the links' next event, on
  // CLOCK_MONOTONIC in ns). Each link's clock (a trace's first period) starts here.
  absl::Status Start();
  // A thread-safe snapshot of one direction's counters (uplink: namespace -> host).
  PacketLinkStats stats(int link, bool uplink) const;

  // {"ip", "netns", "exec", <netns>, argv...}: start it with any process launcher to run argv inside.
  std::vector<std::string> WrapCommand(const std::vector<std::string>& argv) const;
  // Runs `fn` on a thread that has joined the namespace (sockets it opens live there).
  absl::Status RunInNamespace(const std::function<void()>& fn) const;

  // Stops the thread, closes the TUNs (which removes them) and deletes the namespace; returns the first
  // error. Idempotent.
  absl::Status Destroy();

 private:
  struct Link;
  PacketNamespace() = default;
  absl::Status Setup(const PacketNamespaceOptions& options);
  // One of a link's names or addresses; "" for an index that names no link.
  const std::string& LinkField(int link, std::string Link::*field) const;
  void Loop();

  PacketNamespaceOptions options_;
  std::string netns_;
  bool netns_created_ = false;
  std::vector<std::unique_ptr<Link>> links_;  // fixed once started
  std::thread thread_;
  int epoll_fd_ = -1;
  int timer_fd_ = -1;
  int stop_fd_ = -1;                                        // an eventfd that wakes the loop to stop
  mutable fl::Mutex mu_;                                    // the links' schedulers, between the loop and stats()
  std::vector<PacketLink> uplinks_ ABSL_GUARDED_BY(mu_);    // one per link, namespace -> host
  std::vector<PacketLink> downlinks_ ABSL_GUARDED_BY(mu_);  // host -> namespace
};

}  // namespace fl::emulation
