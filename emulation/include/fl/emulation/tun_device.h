// TUN devices for the packet backend (docs/testbed.md, "TUN devices and namespaces"): a layer-3 virtual
// interface whose packets a process reads and writes as whole IP packets through a file descriptor. The
// packet backend puts one in a client's network namespace and one on the host per emulated link and moves
// packets between them through a PacketLink.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::emulation {

// What the packet backend needs from this machine: /dev/net/tun that opens, root or CAP_NET_ADMIN, the `ip`
// command, network namespaces. OK when all are there; otherwise a FailedPrecondition naming each missing
// piece ("the packet backend cannot run here: no /dev/net/tun (...); not root and no CAP_NET_ADMIN").
absl::Status PacketBackendSupport();

// The TCP congestion controls the kernel offers (/proc/sys/net/ipv4/tcp_available_congestion_control, e.g.
// {"reno", "cubic", "bbr"}); an error if the file cannot be read.
absl::StatusOr<std::vector<std::string>> DetectCongestionControls();

class TunDevice {
 public:
  // Creates the TUN interface `name` (IFF_TUN | IFF_NO_PI: reads and writes are bare IP packets) in the
  // network namespace of the calling thread (a thread that setns'd into a namespace makes it there), with a
  // non-blocking, close-on-exec file descriptor. The interface exists while this object does. `name` is at
  // most 15 characters (IFNAMSIZ - 1), else InvalidArgument naming it.
  static absl::StatusOr<std::unique_ptr<TunDevice>> Open(std::string_view name);
  ~TunDevice();
  TunDevice(const TunDevice&) = delete;
  TunDevice& operator=(const TunDevice&) = delete;

  const std::string& name() const { return name_; }
  int fd() const { return fd_; }

  // Reads one IP packet into `packet` (resized to it). False when none is waiting (EAGAIN); an error otherwise.
  absl::StatusOr<bool> Read(std::vector<uint8_t>* packet);
  // Writes one IP packet. False when the kernel had no room (EAGAIN/ENOBUFS: the packet is dropped, as a full
  // interface queue would); an error otherwise.
  absl::StatusOr<bool> Write(const uint8_t* data, size_t size);

 private:
  TunDevice(std::string name, int fd) : name_(std::move(name)), fd_(fd) {}
  std::string name_;
  int fd_ = -1;
  std::vector<uint8_t> scratch_;  // one read's room, allocated once
};

}  // namespace fl::emulation
