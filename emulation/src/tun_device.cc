#include "fl/emulation/tun_device.h"

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fl/core/str_cat.h"
#include "fl/sys/process.h"

namespace fl::emulation {
namespace {

constexpr char kTunPath[] = "/dev/net/tun";
constexpr int kCapNetAdmin = 12;  // linux/capability.h's CAP_NET_ADMIN

// Whether the effective capability set (/proc/self/status CapEff) has CAP_NET_ADMIN.
bool HasNetAdmin() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> kCapNetAdmin) & 1;
  }
  return false;
}

}  // namespace

absl::Status PacketBackendSupport() {
  std::vector<std::string> missing;
  if (access(kTunPath, F_OK) != 0) {
    missing.push_back(StrCat("no ", kTunPath, " (load the tun module, or give a container the device)"));
  } else {
    const int fd = open(kTunPath, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      missing.push_back(StrCat("cannot open ", kTunPath, ": ", std::strerror(errno)));
    } else {
      close(fd);
    }
  }
  if (geteuid() != 0 && !HasNetAdmin()) missing.push_back("not root and no CAP_NET_ADMIN");
  if (auto ip = fl::sys::RunCommand({"ip", "-V"}); !ip.ok()) {
    missing.push_back(StrCat("no working `ip` command (iproute2): ", ToStd(ip.status().message())));
  }
  if (access("/proc/self/ns/net", F_OK) != 0) {
    missing.push_back("network namespaces unavailable (no /proc/self/ns/net: a kernel without CONFIG_NET_NS)");
  }
  if (missing.empty()) return absl::OkStatus();
  std::string list;
  for (const std::string& m : missing) list += (list.empty() ? "" : "; ") + m;
  return absl::FailedPreconditionError(
      StrCat("the packet backend cannot run here: ", list, ". Use the userspace or kernel backend instead"));
}

absl::StatusOr<std::vector<std::string>> DetectCongestionControls() {
  constexpr char kPath[] = "/proc/sys/net/ipv4/tcp_available_congestion_control";
  std::ifstream in(kPath);
  if (!in) return absl::NotFoundError(StrCat("cannot read ", kPath));
  std::vector<std::string> out;
  std::string name;
  while (in >> name) out.push_back(name);
  return out;
}

absl::StatusOr<std::unique_ptr<TunDevice>> TunDevice::Open(std::string_view name) {
  if (name.empty() || name.size() >= IFNAMSIZ) {
    return absl::InvalidArgumentError(StrCat("TUN device name '", name, "' has ", name.size(),
                                             " characters; an interface name has 1 to ", IFNAMSIZ - 1));
  }
  const int fd = open(kTunPath, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(StrCat("cannot open ", kTunPath, ": ", std::strerror(errno),
                                                " (the packet backend needs it; see PacketBackendSupport)"));
  }
  struct ifreq ifr;
  std::memset(&ifr, 0, sizeof(ifr));
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::memcpy(ifr.ifr_name, name.data(), name.size());
  // The interface is made in the network namespace of the thread that opened /dev/net/tun: this one.
  if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(StrCat("TUNSETIFF ", name, ": ", std::strerror(err)));
  }
  return std::unique_ptr<TunDevice>(new TunDevice(std::string(name), fd));
}

TunDevice::~TunDevice() {
  // A TUN that is not persistent disappears with its last file descriptor.
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<bool> TunDevice::Read(std::vector<uint8_t>* packet) {
  // Without IFF_VNET_HDR the kernel hands over no offloaded super-packets: one read is one packet of at most
  // the MTU, well under 64 KiB. Read into room kept for it, then copy just the packet's bytes out.
  if (scratch_.empty()) scratch_.resize(65536);
  const ssize_t n = read(fd_, scratch_.data(), scratch_.size());
  if (n < 0) {
    packet->clear();
    if (errno == EAGAIN || errno == EINTR) return false;
    return absl::InternalError(StrCat("read from TUN ", name_, ": ", std::strerror(errno)));
  }
  packet->assign(scratch_.begin(), scratch_.begin() + n);
  return true;
}

absl::StatusOr<bool> TunDevice::Write(const uint8_t* data, size_t size) {
  const ssize_t n = write(fd_, data, size);
  if (n < 0) {
    if (errno == EAGAIN || errno == ENOBUFS || errno == EINTR) return false;
    return absl::InternalError(StrCat("write to TUN ", name_, ": ", std::strerror(errno)));
  }
  return true;
}

}  // namespace fl::emulation
