// What the two namespace-making backends share (internal to fl_emulation): the kernel backend
// (kernel_link.cc: veth pairs, "fle" names, 10.213.0.0/16) and the packet backend (packet_network.cc: TUN
// devices, "flp" names, 10.214.0.0/16). Names carry the owning process id so that parallel runs never
// collide and a later run can remove what a crashed one left; addresses come from a /16 pool, one /30 per
// link, allocated under a host-wide file lock from the addresses in use.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::emulation::netns {

// Serialises address allocation and setup across processes (parallel test runs, several experiments).
// Held for the time between choosing a /30 and putting its host address on an interface.
class FileLock {
 public:
  FileLock();
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

std::string Hex(uint64_t v);
std::string Ipv4(uint32_t address);
// True when `pid` names a process (ours to signal or not).
bool ProcessAlive(int pid);

// How one backend names what it makes: namespaces "<netns_prefix><pid hex>_<index hex>", interfaces
// "<link_prefix><pid hex>_<index hex><side>" with side one of `sides`.
struct Naming {
  std::string_view netns_prefix;  // "fle_"
  std::string_view link_prefix;   // "fle"
  std::string_view sides;         // "hnpq"
};
// The kernel backend's veth pairs (host 'h', namespace 'n'; 'p'/'q' the netem probe) and the packet backend's
// TUN devices (host 'h', namespace 'n'; a TUN in a namespace goes with it, one on the host with its fd).
inline constexpr Naming kKernelNaming{"fle_", "fle", "hnpq"};
inline constexpr Naming kPacketNaming{"flp_", "flp", "hn"};
std::string NetnsName(const Naming& naming, int pid, int index);
// At most 15 characters (IFNAMSIZ - 1): prefix (3) + up to 6 hex digits of pid + "_" + up to 4 hex + side.
std::string InterfaceName(const Naming& naming, int pid, int index, char side);
// The owning pid of a namespace (netns = true) or interface name of this naming; nullopt if not one.
std::optional<int> OwnerPid(const Naming& naming, const std::string& name, bool netns);

// A /30 pool: 10.<second_octet>.0.0/16, 16384 links. The caller holds a FileLock until the host address
// of the returned /30 is on an interface (that is what marks it taken for the next caller).
struct Subnet {
  std::string host_ip;  // .1 of the /30
  std::string peer_ip;  // .2 of the /30 (the namespace side)
};
absl::StatusOr<Subnet> AllocateSubnet(int second_octet);

// {"ip", "netns", "exec", <netns>, argv...}.
std::vector<std::string> WrapCommand(const std::string& netns, const std::vector<std::string>& argv);
// Runs `fn` on a new thread that has joined /run/netns/<netns> (sockets and devices it makes live there);
// the rest of the process stays in the host namespace.
absl::Status RunInNamespace(const std::string& netns, const std::function<void()>& fn);

// Removes the namespaces and interfaces of `naming` whose owning process is gone; returns how many.
absl::StatusOr<int> CleanupStale(const Naming& naming);

}  // namespace fl::emulation::netns
