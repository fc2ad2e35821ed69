#include "fl/emulation/kernel_link.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/shaper.h"
#include "fl/sys/process.h"

namespace fl::emulation {
namespace {

using fl::sys::RunCommand;

constexpr char kNetnsPrefix[] = "fle_";
constexpr char kLinkPrefix[] = "fle";
// The /30s of the links come from 10.213.0.0/16 (16384 links); a host address in use marks its /30 taken.
constexpr uint32_t kPoolBase = (10u << 24) | (213u << 16);
constexpr uint32_t kPoolSubnets = 1u << 14;
constexpr char kLockPath[] = "/run/fl-emulation.lock";

std::atomic<int> g_next_index{0};

std::string Hex(uint64_t v) {
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}

std::string Ipv4(uint32_t a) { return StrCat(a >> 24, ".", (a >> 16) & 255, ".", (a >> 8) & 255, ".", a & 255); }

bool ProcessAlive(int pid) { return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM); }

// Serialises address allocation and setup across processes (parallel test runs).
class FileLock {
 public:
  FileLock() {
    fd_ = open(kLockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) {
      flock(fd_, LOCK_UN);
      close(fd_);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Parses "fle<pid hex>_<index hex><side>" (links) or "fle_<pid hex>_<index hex>" (namespaces) -> pid.
std::optional<int> OwnerPid(const std::string& name, bool netns) {
  const std::string prefix = netns ? kNetnsPrefix : kLinkPrefix;
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  std::string rest = name.substr(prefix.size());
  const size_t us = rest.find('_');
  if (us == std::string::npos || us == 0) return std::nullopt;
  const std::string pid_hex = rest.substr(0, us);
  std::string tail = rest.substr(us + 1);
  if (!netns) {
    if (tail.size() < 2) return std::nullopt;
    const char side = tail.back();
    if (side != 'h' && side != 'n' && side != 'p' && side != 'q') return std::nullopt;
    tail.pop_back();
  }
  for (const std::string* s : {&pid_hex, static_cast<const std::string*>(&tail)}) {
    if (s->empty() || s->find_first_not_of("0123456789abcdef") != std::string::npos) return std::nullopt;
  }
  return static_cast<int>(std::stoul(pid_hex, nullptr, 16));
}

// The /30 indices whose host address is in use on this host.
absl::StatusOr<std::set<uint32_t>> UsedSubnets() {
  auto out = RunCommand({"ip", "-o", "-4", "addr", "show"});
  if (!out.ok()) return out.status();
  std::set<uint32_t> used;
  std::istringstream in(*out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t p = line.find(" inet ");
    if (p == std::string::npos) continue;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (std::sscanf(line.c_str() + p + 6, "%u.%u.%u.%u", &a, &b, &c, &d) != 4) continue;
    const uint32_t addr = (a << 24) | (b << 16) | (c << 8) | d;
    if ((addr & 0xFFFF0000u) == kPoolBase) used.insert((addr & 0xFFFFu) >> 2);
  }
  return used;
}

}  // namespace

std::string KernelLinkNetnsName(int pid, int index) {
  return StrCat(kNetnsPrefix, Hex(static_cast<uint64_t>(pid)), "_", Hex(static_cast<uint64_t>(index)));
}

std::string KernelLinkInterfaceName(int pid, int index, char side) {
  // At most 15 characters (IFNAMSIZ - 1): "fle" + 6 hex pid + "_" + up to 4 hex index + side.
  return StrCat(kLinkPrefix, Hex(static_cast<uint64_t>(pid)), "_", Hex(static_cast<uint64_t>(index) & 0xFFFF),
                std::string(1, side));
}

absl::StatusOr<NetemSupport> DetectNetem() {
  static std::mutex mu;
  static std::optional<NetemSupport> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (cached) return *cached;
  const int pid = static_cast<int>(getpid());
  const int index = g_next_index.fetch_add(1);
  const std::string a = KernelLinkInterfaceName(pid, index, 'p');
  const std::string b = KernelLinkInterfaceName(pid, index, 'q');
  if (auto s = RunCommand({"ip", "link", "add", a, "type", "veth", "peer", "name", b}); !s.ok()) {
    return absl::PermissionDeniedError(
        StrCat("cannot probe for netem (creating a veth pair needs root): ", ToStd(s.status().message())));
  }
  NetemSupport result;
  auto tc = RunCommand({"tc", "qdisc", "add", "dev", a, "root", "netem", "delay", "1ms"});
  result.available = tc.ok();
  result.detail = tc.ok() ? std::string("tc accepted a netem qdisc on a probe veth")
                          : StrCat("tc refused a netem qdisc on a probe veth: ", ToStd(tc.status().message()));
  if (auto s = RunCommand({"ip", "link", "del", a}); !s.ok()) {
    spdlog::warn("netem probe: could not remove {}: {}", a, s.status().message());
  }
  cached = result;
  if (result.available) {
    spdlog::info("kernel link emulation: the kernel has netem; delay and jitter use netem");
  } else {
    spdlog::warn(
        "kernel link emulation: this kernel has no netem ({}); delay and jitter come from the userspace "
        "delay line, the rate from HTB",
        result.detail);
  }
  return result;
}

absl::StatusOr<std::unique_ptr<KernelLink>> KernelLink::Create(KernelLinkOptions options) {
  if (geteuid() != 0) {
    return absl::PermissionDeniedError(
        "the kernel link backend needs root (network namespaces, veth, tc); run as root or use the userspace "
        "backend");
  }
  std::unique_ptr<KernelLink> link(new KernelLink());
  if (auto s = link->Setup(options); !s.ok()) {
    if (auto d = link->Destroy(); !d.ok()) spdlog::warn("kernel link cleanup after a failed setup: {}", d.message());
    return s;
  }
  return link;
}

absl::Status KernelLink::Setup(const KernelLinkOptions& options) {
  const int pid = static_cast<int>(getpid());
  const int index = g_next_index.fetch_add(1);
  netns_ = KernelLinkNetnsName(pid, index);
  host_if_ = KernelLinkInterfaceName(pid, index, 'h');
  ns_if_ = KernelLinkInterfaceName(pid, index, 'n');
  {
    FileLock lock;
    if (auto s = RunCommand({"ip", "netns", "add", netns_}); !s.ok()) return s.status();
    netns_created_ = true;
    if (auto s = RunCommand({"ip", "link", "add", host_if_, "type", "veth", "peer", "name", ns_if_, "netns", netns_});
        !s.ok()) {
      return s.status();
    }
    veth_created_ = true;
    auto used = UsedSubnets();
    if (!used.ok()) return used.status();
    uint32_t subnet = 0;
    while (subnet < kPoolSubnets && used->count(subnet) > 0) ++subnet;
    if (subnet == kPoolSubnets) {
      return absl::ResourceExhaustedError("no free /30 left in 10.213.0.0/16 for another kernel link");
    }
    host_ip_ = Ipv4(kPoolBase + subnet * 4 + 1);
    ns_ip_ = Ipv4(kPoolBase + subnet * 4 + 2);
    const std::vector<std::vector<std::string>> steps = {
        {"ip", "addr", "add", StrCat(host_ip_, "/30"), "dev", host_if_},
        {"ip", "link", "set", host_if_, "up"},
        {"ip", "-n", netns_, "addr", "add", StrCat(ns_ip_, "/30"), "dev", ns_if_},
        {"ip", "-n", netns_, "link", "set", ns_if_, "up"},
        {"ip", "-n", netns_, "link", "set", "lo", "up"},
        {"ip", "-n", netns_, "route", "add", "default", "via", host_ip_},
    };
    for (const auto& step : steps) {
      if (auto s = RunCommand(step); !s.ok()) return s.status();
    }
  }
  const LinkProfile& p = options.profile;
  const bool wants_netem = p.uplink.HasDelay() || p.downlink.HasDelay() || p.uplink.loss > 0 || p.downlink.loss > 0;
  bool use_netem = false;
  if (wants_netem && options.allow_netem) {
    auto netem = DetectNetem();
    if (!netem.ok()) return netem.status();
    use_netem = netem->available;
  }
  netem_used_ = use_netem;
  if (!use_netem && (p.uplink.loss > 0 || p.downlink.loss > 0)) {
    spdlog::warn("link {}: packet loss ({} up, {} down) is not emulated without netem", p.name, p.uplink.loss,
                 p.downlink.loss);
  }
  // Downlink (server -> client) leaves the host through the host side; uplink leaves the namespace.
  if (auto s = ShapeEgress(false, host_if_, p.downlink, use_netem); !s.ok()) return s;
  if (auto s = ShapeEgress(true, ns_if_, p.uplink, use_netem); !s.ok()) return s;

  // The relay does what the kernel does not: delay and jitter without netem, and trace replay.
  auto relay_direction = [use_netem](const LinkDirection& d) {
    LinkDirection r;
    if (d.has_trace) {
      r.has_trace = true;
      r.trace = d.trace;
      r.queue_limit_bytes = d.queue_limit_bytes;
    }
    if (!use_netem) {
      r.delay_ms = d.delay_ms;
      r.jitter_ms = d.jitter_ms;
    }
    return r;
  };
  RelayOptions ro;
  ro.listen_addr = StrCat(host_ip_, ":0");
  ro.target_addr = options.target_addr;
  ro.uplink = relay_direction(p.uplink);
  ro.downlink = relay_direction(p.downlink);
  ro.uplink_buffer_bytes = DefaultBufferLimit(p.uplink);
  ro.downlink_buffer_bytes = DefaultBufferLimit(p.downlink);
  ro.seed = options.seed;
  ro.name = StrCat("link ", netns_);
  auto relay = ShapingRelay::Start(ro);
  if (!relay.ok()) return relay.status();
  relay_ = *std::move(relay);
  spdlog::info("link {} ({}): namespace {} at {}, clients connect to {} -> {}{}", p.name, p.source, netns_, ns_ip_,
               client_target(), options.target_addr, use_netem ? " (netem delay)" : " (userspace delay line)");
  return absl::OkStatus();
}

absl::Status KernelLink::ShapeEgress(bool in_netns, const std::string& dev, const LinkDirection& d, bool use_netem) {
  std::vector<std::string> tc = {"tc"};
  if (in_netns) tc = {"tc", "-n", netns_};
  auto run = [&tc](std::vector<std::string> args) {
    std::vector<std::string> argv = tc;
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv).status();
  };
  std::vector<std::string> netem;
  if (use_netem && (d.HasDelay() || d.loss > 0)) {
    netem = {"netem", "delay", StrCat(d.delay_ms, "ms")};
    if (d.jitter_ms > 0) netem.push_back(StrCat(d.jitter_ms, "ms"));
    if (d.loss > 0) {
      netem.push_back("loss");
      netem.push_back(StrCat(d.loss * 100.0, "%"));
    }
    netem.push_back("limit");
    netem.push_back("10000");
  }
  if (d.has_trace || d.rate_bps <= 0) {
    // No kernel rate shaping (unlimited, or the relay replays the trace).
    if (netem.empty()) return absl::OkStatus();
    std::vector<std::string> args = {"qdisc", "add", "dev", dev, "root"};
    args.insert(args.end(), netem.begin(), netem.end());
    return run(args);
  }
  const auto rate = StrCat(static_cast<uint64_t>(d.rate_bps), "bit");
  const auto burst = StrCat(static_cast<uint64_t>(DirectionShaper::BurstBytes(d.rate_bps)));
  if (auto s = run({"qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"}); !s.ok()) return s;
  if (auto s = run({"class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate,
                    "burst", burst, "cburst", burst, "quantum", "60000"});
      !s.ok()) {
    return s;
  }
  if (!netem.empty()) {
    std::vector<std::string> args = {"qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:"};
    args.insert(args.end(), netem.begin(), netem.end());
    return run(args);
  }
  if (d.queue_limit_bytes > 0) {
    return run(
        {"qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "bfifo", "limit", StrCat(d.queue_limit_bytes)});
  }
  return absl::OkStatus();
}

KernelLink::~KernelLink() {
  if (auto s = Destroy(); !s.ok()) spdlog::warn("kernel link {}: cleanup: {}", netns_, s.message());
}

absl::Status KernelLink::Destroy() {
  absl::Status first = absl::OkStatus();
  if (relay_) {
    relay_->Stop();
    relay_.reset();
  }
  if (veth_created_) {
    // Deleting one end removes the pair and the qdiscs on both. Done before the namespace goes, because a
    // namespace is torn down asynchronously and its veth end would linger for a moment.
    auto s = RunCommand({"ip", "link", "del", host_if_});
    if (!s.ok() && RunCommand({"ip", "link", "show", host_if_}).ok()) first.Update(s.status());
    veth_created_ = false;
  }
  if (netns_created_) {
    if (auto s = RunCommand({"ip", "netns", "del", netns_}); !s.ok()) first.Update(s.status());
    netns_created_ = false;
  }
  return first;
}

std::string KernelLink::client_target() const { return relay_ ? StrCat(host_ip_, ":", relay_->port()) : std::string(); }

std::vector<std::string> KernelLink::WrapCommand(const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"ip", "netns", "exec", netns_};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

absl::Status KernelLink::RunInNamespace(const std::function<void()>& fn) const {
  absl::Status status = absl::OkStatus();
  const std::string path = StrCat("/run/netns/", netns_);
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

absl::StatusOr<int> CleanupStaleKernelLinks() {
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
    const auto owner = OwnerPid(name, false);
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
    const auto owner = OwnerPid(name, true);
    if (!owner || ProcessAlive(*owner)) continue;
    if (auto s = RunCommand({"ip", "netns", "del", name}); !s.ok()) return s.status();
    ++removed;
    spdlog::info("removed stale namespace {} (process {} is gone)", name, *owner);
  }
  return removed;
}

}  // namespace fl::emulation
