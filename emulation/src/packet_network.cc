#include "fl/emulation/packet_network.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/sys/process.h"
#include "netns_common.h"

namespace fl::emulation {
namespace {

using fl::sys::RunCommand;

// The packet backend's /30s come from 10.214.0.0/16 (the kernel backend's from 10.213.0.0/16).
constexpr int kPoolOctet = 214;
constexpr uint64_t kStopTag = ~uint64_t{0};
constexpr uint64_t kTimerTag = ~uint64_t{0} - 1;

std::atomic<int> g_next_netns{0};
std::atomic<int> g_next_link{0};

constexpr char kAllowedPath[] = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

std::string Join(const std::vector<std::string>& names, const char* sep = ", ") {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : sep) + n;
  return out.empty() ? std::string("nothing") : out;
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Each direction of each link draws from its own RNG, derived from the namespace's seed.
uint64_t DirectionSeed(uint64_t seed, int link, bool uplink) {
  return seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(link) * 2 + (uplink ? 0 : 1);
}

// Router solicitations and MLD reports would cross the emulated link as the client's own traffic does and
// muddle its counters; the links carry IPv4 only. Written through /proc/sys, which resolves in the network
// namespace of the calling thread.
absl::Status DisableIpv6(const std::string& interface) {
  const std::string path = StrCat("/proc/sys/net/ipv6/conf/", interface, "/disable_ipv6");
  std::ofstream out(path);
  if (!out) return absl::OkStatus();  // a kernel without IPv6: nothing to disable
  out << "1\n";
  out.close();
  if (!out) return absl::InternalError(StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

struct PacketNamespace::Link {
  LinkProfile profile;
  std::string host_if;
  std::string ns_if;
  std::string host_ip;
  std::string ns_ip;
  std::unique_ptr<TunDevice> host_tun;  // on the host: what the namespace sends comes out here
  std::unique_ptr<TunDevice> ns_tun;    // in the namespace
};

absl::Status CheckNamespaceCongestionControl(const std::string& name) {
  auto available = DetectCongestionControls();
  if (!available.ok()) return available.status();
  if (std::find(available->begin(), available->end(), name) == available->end()) {
    return absl::InvalidArgumentError(
        StrCat("TCP congestion control '", name, "' is not available in this kernel; available: ", Join(*available),
               " (tcp_available_congestion_control); load its module (modprobe tcp_", name, ") or choose another"));
  }
  // A namespace other than the host's may only take what the host allows (the sysctl would fail with EPERM).
  std::ifstream in(kAllowedPath);
  std::vector<std::string> allowed;
  for (std::string n; in >> n;) allowed.push_back(n);
  if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
    const std::string listed = Join(allowed);
    allowed.push_back(name);
    return absl::FailedPreconditionError(
        StrCat("TCP congestion control '", name,
               "' is available but a network namespace may not take it: ", kAllowedPath, " lists ", listed,
               "; allow it on the host with `sysctl -w "
               "net.ipv4.tcp_allowed_congestion_control=\"",
               Join(allowed, " "), "\"`"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PacketNamespace>> PacketNamespace::Create(PacketNamespaceOptions options) {
  if (auto s = PacketBackendSupport(); !s.ok()) return s;
  if (!options.tcp_congestion.empty()) {
    if (auto s = CheckNamespaceCongestionControl(options.tcp_congestion); !s.ok()) return s;
  }
  std::unique_ptr<PacketNamespace> ns(new PacketNamespace());
  ns->options_ = options;
  if (auto s = ns->Setup(options); !s.ok()) {
    if (auto d = ns->Destroy(); !d.ok()) spdlog::warn("packet namespace cleanup after a failed setup: {}", d.message());
    return s;
  }
  return ns;
}

absl::Status PacketNamespace::Setup(const PacketNamespaceOptions& options) {
  netns_ = netns::NetnsName(netns::kPacketNaming, static_cast<int>(getpid()), g_next_netns.fetch_add(1));
  if (auto s = RunCommand({"ip", "netns", "add", netns_}); !s.ok()) return s.status();
  netns_created_ = true;
  if (auto s = RunCommand({"ip", "-n", netns_, "link", "set", "lo", "up"}); !s.ok()) return s.status();
  if (!options.tcp_congestion.empty()) {
    // Namespaced since Linux 4.15: this namespace's connections only.
    auto s = RunCommand(
        WrapCommand({"sysctl", "-q", "-w", StrCat("net.ipv4.tcp_congestion_control=", options.tcp_congestion)}));
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PacketNamespace::AddLink(const LinkProfile& profile) {
  if (thread_.joinable()) {
    return absl::FailedPreconditionError(StrCat("packet namespace ", netns_, ": AddLink after Start"));
  }
  const int link = static_cast<int>(links_.size());
  // Validation first, before anything is made: the errors name "uplink.<field>" / "downlink.<field>".
  auto up = PacketLink::Create(profile.uplink, DirectionSeed(options_.seed, link, true), NowNs(), "uplink");
  if (!up.ok()) return up.status();
  auto down = PacketLink::Create(profile.downlink, DirectionSeed(options_.seed, link, false), NowNs(), "downlink");
  if (!down.ok()) return down.status();

  auto l = std::make_unique<Link>();
  l->profile = profile;
  const int pid = static_cast<int>(getpid());
  const int index = g_next_link.fetch_add(1);
  l->host_if = netns::InterfaceName(netns::kPacketNaming, pid, index, 'h');
  l->ns_if = netns::InterfaceName(netns::kPacketNaming, pid, index, 'n');
  {
    // Held until the host address is on the host TUN: that marks the /30 taken for the next allocation.
    netns::FileLock lock;
    auto subnet = netns::AllocateSubnet(kPoolOctet);
    if (!subnet.ok()) return subnet.status();
    l->host_ip = subnet->host_ip;
    l->ns_ip = subnet->peer_ip;
    auto host_tun = TunDevice::Open(l->host_if);
    if (!host_tun.ok()) return host_tun.status();
    l->host_tun = *std::move(host_tun);
    absl::Status opened = absl::OkStatus();
    absl::Status ran = RunInNamespace([&] {
      auto t = TunDevice::Open(l->ns_if);
      if (!t.ok()) {
        opened = t.status();
        return;
      }
      l->ns_tun = *std::move(t);
      opened = DisableIpv6(l->ns_if);
    });
    if (!ran.ok()) return ran;
    if (!opened.ok()) return opened;  // l's TUNs close with it, which removes them
    if (auto s = DisableIpv6(l->host_if); !s.ok()) return s;
    // Reverse-path filtering needs no change: the host TUN carries the /30 whose .2 is every packet's
    // source, so the route back to the source is through the interface the packet came in on (strict mode
    // passes, loose mode too).
    // A TUN device queues what the kernel sends through it until the event loop reads it, in a ring of
    // txqueuelen packets (500 by default) whose overflow is dropped silently: a link's only queue must be its
    // PacketLink's (the profile's), so the ring is made deep enough never to be the one that drops: with the
    // default, 0.2-1.3% of a 20,000 packets/s UDP stream over the lossless ethernet profile went missing in 4 of
    // 6 calibration runs (no socket, softnet or link counter saw them), with 10,000 in none of 5.
    constexpr char kTxQueueLen[] = "10000";
    std::vector<std::vector<std::string>> steps = {
        {"ip", "addr", "add", StrCat(l->host_ip, "/30"), "dev", l->host_if},
        {"ip", "link", "set", l->host_if, "mtu", "1500", "txqueuelen", kTxQueueLen, "up"},
        {"ip", "-n", netns_, "addr", "add", StrCat(l->ns_ip, "/30"), "dev", l->ns_if},
        {"ip", "-n", netns_, "link", "set", l->ns_if, "mtu", "1500", "txqueuelen", kTxQueueLen, "up"},
    };
    // The first link also carries the namespace's default route (each link's host address is on its own /30).
    if (link == 0) steps.push_back({"ip", "-n", netns_, "route", "add", "default", "via", l->host_ip, "dev", l->ns_if});
    for (const auto& step : steps) {
      if (auto s = RunCommand(step); !s.ok()) return s.status();
    }
  }
  {
    MutexLock lock(mu_);
    uplinks_.push_back(*std::move(up));
    downlinks_.push_back(*std::move(down));
  }
  spdlog::info("packet namespace {} ({}): link {} ({}), {} <-> {} over {}/{}", netns_, options_.label, link,
               profile.name, l->ns_ip, l->host_ip, l->ns_if, l->host_if);
  links_.push_back(std::move(l));
  return link;
}

const std::string& PacketNamespace::LinkField(int link, std::string Link::*field) const {
  static const std::string kNone;  // an index that names no link
  return link >= 0 && link < link_count() ? (*links_[link]).*field : kNone;
}

const std::string& PacketNamespace::host_ip(int link) const { return LinkField(link, &Link::host_ip); }

const std::string& PacketNamespace::netns_ip(int link) const { return LinkField(link, &Link::ns_ip); }

const std::string& PacketNamespace::host_interface(int link) const { return LinkField(link, &Link::host_if); }

const std::string& PacketNamespace::netns_interface(int link) const { return LinkField(link, &Link::ns_if); }

absl::Status PacketNamespace::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError(StrCat("packet namespace ", netns_, " already started"));
  if (links_.empty()) return absl::FailedPreconditionError(StrCat("packet namespace ", netns_, " has no link"));
  {
    // The links' clocks (a trace's first period) start now; the draws are the same as a fresh link's.
    MutexLock lock(mu_);
    const int64_t now = NowNs();
    for (int i = 0; i < link_count(); ++i) {
      auto up = PacketLink::Create(links_[i]->profile.uplink, DirectionSeed(options_.seed, i, true), now, "uplink");
      auto down =
          PacketLink::Create(links_[i]->profile.downlink, DirectionSeed(options_.seed, i, false), now, "downlink");
      if (!up.ok()) return up.status();
      if (!down.ok()) return down.status();
      uplinks_[i] = *std::move(up);
      downlinks_[i] = *std::move(down);
    }
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || timer_fd_ < 0 || stop_fd_ < 0) {
    return absl::InternalError(StrCat("packet namespace ", netns_, ": epoll/timerfd/eventfd: ", std::strerror(errno)));
  }
  auto watch = [this](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(StrCat("packet namespace ", netns_, ": epoll_ctl: ", std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  if (auto s = watch(stop_fd_, kStopTag); !s.ok()) return s;
  if (auto s = watch(timer_fd_, kTimerTag); !s.ok()) return s;
  for (int i = 0; i < link_count(); ++i) {
    // Tag: link * 2 + 0 for the namespace TUN (uplink traffic), + 1 for the host TUN (downlink).
    if (auto s = watch(links_[i]->ns_tun->fd(), static_cast<uint64_t>(i) * 2); !s.ok()) return s;
    if (auto s = watch(links_[i]->host_tun->fd(), static_cast<uint64_t>(i) * 2 + 1); !s.ok()) return s;
  }
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

namespace {

// Packets must leave when their link lets them, also while the host is busy (the clients' training, fl-server's
// aggregation): under the default scheduler a 4-client run left thousands of packets more than 1 ms late, up to
// 42 ms (packet-links.tsv's max_late_us), which a 24 ms round trip cannot absorb. The loop sleeps in epoll almost
// all the time, so a low real-time priority costs the other threads little and takes the wake-up delay out of the
// link; the kernel's real-time throttling (sched_rt_runtime_us) still leaves the others their share should it ever
// spin. Where that is not permitted, the highest nice value the caller may take; else as it is.
std::string RaiseLoopPriority() {
  sched_param rt{};
  rt.sched_priority = 10;
  if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt) == 0) return "SCHED_FIFO 10";
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  for (int nice = -20; nice < 0; nice += 5) {
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0) return StrCat("nice ", nice);
  }
  return "the default priority (no permission to raise it)";
}

}  // namespace

void PacketNamespace::Loop() {
  const std::string priority = RaiseLoopPriority();
  spdlog::debug("packet namespace {}: event loop at {}", netns_, priority);
  std::vector<epoll_event> events(2 * links_.size() + 2);
  std::vector<uint8_t> buffer;
  std::vector<Packet> out;
  bool warned = false;
  auto warn_once = [&](const absl::Status& s) {
    if (!warned) spdlog::warn("packet namespace {}: {}", netns_, s.message());
    warned = true;
  };
  while (true) {
    const int n = epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("packet namespace {}: epoll_wait: {}; the links stop", netns_, std::strerror(errno));
      return;
    }
    MutexLock lock(mu_);
    for (int e = 0; e < n; ++e) {
      const uint64_t tag = events[e].data.u64;
      if (tag == kStopTag) return;
      if (tag == kTimerTag) {
        uint64_t expirations = 0;
        (void)!read(timer_fd_, &expirations, sizeof(expirations));
        continue;
      }
      const size_t link = tag / 2;
      const bool uplink = tag % 2 == 0;
      TunDevice& from = uplink ? *links_[link]->ns_tun : *links_[link]->host_tun;
      PacketLink& pl = uplink ? uplinks_[link] : downlinks_[link];
      while (true) {
        auto got = from.Read(&buffer);
        if (!got.ok()) {
          warn_once(got.status());
          break;
        }
        if (!*got) break;
        pl.Offer(NowNs(), std::move(buffer));
        buffer = {};
      }
    }
    const int64_t now = NowNs();
    int64_t next = std::numeric_limits<int64_t>::max();
    for (size_t i = 0; i < links_.size(); ++i) {
      for (const bool uplink : {true, false}) {
        PacketLink& pl = uplink ? uplinks_[i] : downlinks_[i];
        TunDevice& to = uplink ? *links_[i]->host_tun : *links_[i]->ns_tun;
        out.clear();
        pl.Deliver(now, &out);
        for (const Packet& p : out) {
          // A full interface queue (false) drops the packet, as a real one would.
          if (auto w = to.Write(p.bytes.data(), p.bytes.size()); !w.ok()) warn_once(w.status());
        }
        next = std::min(next, pl.NextEventNs());
      }
    }
    itimerspec spec{};
    if (next != std::numeric_limits<int64_t>::max()) {
      // Absolute on CLOCK_MONOTONIC; a time already past fires at once (never 0, which would disarm).
      const int64_t at = std::max<int64_t>(next, 1);
      spec.it_value.tv_sec = at / 1'000'000'000;
      spec.it_value.tv_nsec = at % 1'000'000'000;
    }
    timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
  }
}

PacketLinkStats PacketNamespace::stats(int link, bool uplink) const {
  MutexLock lock(mu_);
  if (link < 0 || link >= static_cast<int>(uplinks_.size())) return PacketLinkStats{};
  return uplink ? uplinks_[link].stats() : downlinks_[link].stats();
}

std::vector<std::string> PacketNamespace::WrapCommand(const std::vector<std::string>& argv) const {
  return netns::WrapCommand(netns_, argv);
}

absl::Status PacketNamespace::RunInNamespace(const std::function<void()>& fn) const {
  return netns::RunInNamespace(netns_, fn);
}

PacketNamespace::~PacketNamespace() {
  if (auto s = Destroy(); !s.ok()) spdlog::warn("packet namespace {}: cleanup: {}", netns_, s.message());
}

absl::Status PacketNamespace::Destroy() {
  absl::Status first = absl::OkStatus();
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int* fd : {&epoll_fd_, &timer_fd_, &stop_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  // Closing a TUN's only file descriptor removes the interface (and its addresses and routes).
  links_.clear();
  if (netns_created_) {
    if (auto s = RunCommand({"ip", "netns", "del", netns_}); !s.ok()) first.Update(s.status());
    netns_created_ = false;
  }
  return first;
}

}  // namespace fl::emulation
