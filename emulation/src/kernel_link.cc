#include "fl/emulation/kernel_link.h"

#include <unistd.h>

#include <atomic>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/shaper.h"
#include "fl/sys/process.h"
#include "netns_common.h"

namespace fl::emulation {
namespace {

using fl::sys::RunCommand;

// The /30s of the links come from 10.213.0.0/16.
constexpr int kPoolOctet = 213;

std::atomic<int> g_next_index{0};

}  // namespace

std::string KernelLinkNetnsName(int pid, int index) { return netns::NetnsName(netns::kKernelNaming, pid, index); }

std::string KernelLinkInterfaceName(int pid, int index, char side) {
  return netns::InterfaceName(netns::kKernelNaming, pid, index, side);
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
    netns::FileLock lock;
    if (auto s = RunCommand({"ip", "netns", "add", netns_}); !s.ok()) return s.status();
    netns_created_ = true;
    if (auto s = RunCommand({"ip", "link", "add", host_if_, "type", "veth", "peer", "name", ns_if_, "netns", netns_});
        !s.ok()) {
      return s.status();
    }
    veth_created_ = true;
    auto subnet = netns::AllocateSubnet(kPoolOctet);
    if (!subnet.ok()) return subnet.status();
    host_ip_ = subnet->host_ip;
    ns_ip_ = subnet->peer_ip;
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
  return netns::WrapCommand(netns_, argv);
}

absl::Status KernelLink::RunInNamespace(const std::function<void()>& fn) const {
  return netns::RunInNamespace(netns_, fn);
}

absl::StatusOr<int> CleanupStaleKernelLinks() {
  // Both backends' leftovers: the kernel backend's namespaces and veth pairs, the packet backend's namespaces
  // (its TUN devices go with their namespace or with the file descriptor of the process that died).
  int removed = 0;
  for (const netns::Naming* naming : {&netns::kKernelNaming, &netns::kPacketNaming}) {
    auto n = netns::CleanupStale(*naming);
    if (!n.ok()) return n.status();
    removed += *n;
  }
  return removed;
}

}  // namespace fl::emulation
