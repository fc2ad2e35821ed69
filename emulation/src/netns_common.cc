#include "netns_common.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "fl/core/str_cat.h"
#include "fl/sys/process.h"

namespace fl::emulation::netns {
namespace {

using fl::sys::RunCommand;

constexpr char kLockPath[] = "/run/fl-emulation.lock";
constexpr uint32_t kPoolSubnets = 1u << 14;  // /30s in a /16

}  // namespace

FileLock::FileLock() {
  fd_ = open(kLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ >= 0) flock(fd_, LOCK_EX);
}

FileLock::~FileLock() {
  if (fd_ >= 0) {
    flock(fd_, LOCK_UN);
    close(fd_);
  }
}

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}

std::string Ipv4(uint32_t a) { return StrCat(a >> 24, ".", (a >> 16) & 255, ".", (a >> 8) & 255, ".", a & 255); }

bool ProcessAlive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

std::string NetnsName(const Naming& naming, int pid, int index) {
  return StrCat(naming.netns_prefix, Hex(static_cast<uint64_t>(pid)), "_", Hex(static_cast<uint64_t>(index)));
}

std::string InterfaceName(const Naming& naming, int pid, int index, char side) {
  return StrCat(naming.link_prefix, Hex(static_cast<uint64_t>(pid)), "_", Hex(static_cast<uint64_t>(index) & 0xFFFF),
                std::string(1, side));
}

std::optional<int> OwnerPid(const Naming& naming, const std::string& name, bool netns) {
  const std::string_view prefix = netns ? naming.netns_prefix : naming.link_prefix;
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const std::string rest = name.substr(prefix.size());
  const size_t us = rest.find('_');
  if (us == std::string::npos || us == 0) return std::nullopt;
  const std::string pid_hex = rest.substr(0, us);
  std::string tail = rest.substr(us + 1);
  if (!netns) {
    if (tail.size() < 2) return std::nullopt;
    if (naming.sides.find(tail.back()) == std::string_view::npos) return std::nullopt;
    tail.pop_back();
  }
  for (const std::string* s : {&pid_hex, static_cast<const std::string*>(&tail)}) {
    if (s->empty() || s->size() > 8 || s->find_first_not_of("0123456789abcdef") != std::string::npos) {
      return std::nullopt;
    }
  }
  return static_cast<int>(std::stoul(pid_hex, nullptr, 16));
}

absl::StatusOr<Subnet> AllocateSubnet(int second_octet) {
  const uint32_t base = (10u << 24) | (static_cast<uint32_t>(second_octet) << 16);
  auto out = RunCommand({"ip", "-o", "-4", "addr", "show"});
  if (!out.ok()) return out.status();
  // A host address in use (in the host namespace, where every link's .1 lives) marks its /30 taken.
  std::set<uint32_t> used;
  std::istringstream in(*out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find(" inet ");
    if (p == std::string::npos) continue;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (std::sscanf(line.c_str() + p + 6, "%u.%u.%u.%u", &a, &b, &c, &d) != 4) continue;
    const uint32_t addr = (a << 24) | (b << 16) | (c << 8) | d;
    if ((addr & 0xFFFF0000u) == base) used.insert((addr & 0xFFFFu) >> 2);
  }
  uint32_t subnet = 0;
  while (subnet < kPoolSubnets && used.count(subnet) > 0) ++subnet;
  if (subnet == kPoolSubnets) {
    return absl::ResourceExhaustedError(StrCat("no free /30 left in 10.", second_octet,
                                               ".0.0/16 for another emulated link (16384 in use); remove "
                                               "stale ones with `fl-link cleanup`"));
  }
  return Subnet{Ipv4(base + subnet * 4 + 1), Ipv4(base + subnet * 4 + 2)};
}

std::vector<std::string> WrapCommand(const std::string& netns, const std::vector<std::string>& argv) {
  std::vector<std::string> out = {"ip", "netns", "exec", netns};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status RunInNamespace(const std::string& netns, const std::function<void()>& fn) {
  absl::Status status = absl::OkStatus();
  const std::string path = StrCat("/run/netns/", netns);
  std::thread t([&] {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      status = absl::NotFoundError(StrCat("cannot open ", path, ": ", std::strerror(errno)));
      return;
    }
    // setns on this thread only: the rest of the process stays in the host namespace.
    const int rc = setns(fd, CLONE_NEWNET);
    const int err = errno;
    close(fd);
    if (rc != 0) {
      status = absl::InternalError(StrCat("setns(", path, "): ", std::strerror(err)));
      return;
    }
    fn();
  });
  t.join();
  return status;
}

absl::StatusOr<int> CleanupStale(const Naming& naming) {
  FileLock lock;
  int removed = 0;
  auto links = RunCommand({"ip", "-o", "link", "show"});
  if (!links.ok()) return links.status();
  std::istringstream lin(*links);
  std::string line;
  while (std::getline(lin, line)) {
    // "12: fle1a2b_0h@if11: <BROADCAST,..."
    const size_t a = line.find(": ");
    if (a == std::string::npos) continue;
    const size_t b = line.find_first_of("@:", a + 2);
    if (b == std::string::npos) continue;
    const std::string name = line.substr(a + 2, b - a - 2);
    const auto owner = OwnerPid(naming, name, false);
    if (!owner || ProcessAlive(*owner)) continue;
    // Its peer may already be gone with an earlier deletion in this loop; only a remaining link is an error.
    auto s = RunCommand({"ip", "link", "del", name});
    if (s.ok()) {
      ++removed;
      spdlog::info("removed stale link {} (process {} is gone)", name, *owner);
    } else if (RunCommand({"ip", "link", "show", name}).ok()) {
      return s.status();
    }
  }
  auto namespaces = RunCommand({"ip", "netns", "list"});
  if (!namespaces.ok()) return namespaces.status();
  std::istringstream nin(*namespaces);
  while (std::getline(nin, line)) {
    const std::string name = line.substr(0, line.find(' '));
    const auto owner = OwnerPid(naming, name, true);
    if (!owner || ProcessAlive(*owner)) continue;
    if (auto s = RunCommand({"ip", "netns", "del", name}); !s.ok()) return s.status();
    ++removed;
    spdlog::info("removed stale namespace {} (process {} is gone)", name, *owner);
  }
  return removed;
}

}  // namespace fl::emulation::netns
