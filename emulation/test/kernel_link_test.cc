// The kernel backend: real namespaces, veth pairs and qdiscs. Needs root (skipped, saying so, otherwise).
#include "fl/emulation/kernel_link.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/clock.h"
#include "fl/sys/process.h"

namespace fl::emulation {
namespace {

using fl::sys::RunCommand;
using ::testing::HasSubstr;
using ::testing::Not;

#define REQUIRE_ROOT()                                                                             \
  do {                                                                                             \
    if (geteuid() != 0) {                                                                          \
      GTEST_SKIP() << "the kernel backend needs root (network namespaces, veth, tc); this run is " \
                      "not root";                                                                  \
    }                                                                                              \
  } while (0)

std::string Sh(const std::vector<std::string>& argv) {
  auto out = RunCommand(argv);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : std::string();
}

bool LinkExists(const std::string& name) { return RunCommand({"ip", "link", "show", name}).ok(); }

// An echo server on 127.0.0.1 (host namespace) for one connection at a time.
class EchoServer {
 public:
  EchoServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 8);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[65536];
        for (;;) {
          const ssize_t r = read(c, buf, sizeof(buf));
          if (r <= 0) break;
          if (write(c, buf, static_cast<size_t>(r)) != r) break;
        }
        close(c);
      }
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

// From the calling thread's namespace: connect, send `message`, read the echo; returns the round trip in ms
// (negative on failure).
double EchoRoundTrip(const std::string& host_port, const std::string& message, std::string* echoed) {
  auto addr = ResolveAddress(host_port);
  if (!addr.ok()) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr->storage), addr->length) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int64_t t0 = NowNs();
  if (write(fd, message.data(), message.size()) != static_cast<ssize_t>(message.size())) {
    close(fd);
    return -1;
  }
  echoed->assign(message.size(), '\0');
  size_t got = 0;
  while (got < message.size()) {
    const ssize_t r = read(fd, echoed->data() + got, message.size() - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  const double ms = static_cast<double>(NowNs() - t0) / 1e6;
  close(fd);
  return got == message.size() ? ms : -1;
}

LinkProfile TestProfile() {
  LinkProfile p;
  p.name = "kernel-test";
  p.uplink.rate_bps = 20e6;
  p.uplink.delay_ms = 4;
  p.downlink.rate_bps = 40e6;
  p.downlink.delay_ms = 6;
  return p;
}

TEST(KernelLinkTest, DetectsNetemTheWayTheKernelConfigSays) {
  REQUIRE_ROOT();
  auto netem = DetectNetem();
  ASSERT_TRUE(netem.ok()) << netem.status();
  // Where the kernel publishes its configuration, it must agree with the probe.
  auto config = RunCommand({"sh", "-c", "zcat /proc/config.gz 2>/dev/null | grep -E '^CONFIG_NET_SCH_NETEM=(y|m)'"});
  if (RunCommand({"test", "-r", "/proc/config.gz"}).ok()) {
    // Built as a module but not loadable counts as absent to the probe; a built-in one must be found.
    if (config.ok() && config->find("=y") != std::string::npos) {
      EXPECT_TRUE(netem->available) << netem->detail;
    }
    if (!config.ok()) {
      EXPECT_FALSE(netem->available) << netem->detail;
    }
  }
  EXPECT_FALSE(netem->detail.empty());
}

TEST(KernelLinkTest, CreatesNamespaceVethAndQdiscsAndRemovesThemAll) {
  REQUIRE_ROOT();
  EchoServer server;
  std::string netns, host_if, ns_if;
  {
    KernelLinkOptions o;
    o.profile = TestProfile();
    o.target_addr = server.address();
    auto link = KernelLink::Create(o);
    ASSERT_TRUE(link.ok()) << link.status();
    netns = (*link)->netns();
    host_if = (*link)->host_interface();
    ns_if = (*link)->netns_interface();
    EXPECT_THAT(Sh({"ip", "netns", "list"}), HasSubstr(netns));
    EXPECT_TRUE(LinkExists(host_if));
    EXPECT_THAT(Sh({"ip", "-n", netns, "link", "show", ns_if}), HasSubstr(ns_if));
    // Each direction has its own rate on its own egress.
    const std::string host_class = Sh({"tc", "class", "show", "dev", host_if});
    const std::string ns_class = Sh({"tc", "-n", netns, "class", "show", "dev", ns_if});
    EXPECT_THAT(host_class, HasSubstr("htb"));
    EXPECT_THAT(host_class, HasSubstr("rate 40Mbit"));
    EXPECT_THAT(ns_class, HasSubstr("rate 20Mbit"));
    if ((*link)->netem_used()) {
      EXPECT_THAT(Sh({"tc", "qdisc", "show", "dev", host_if}), HasSubstr("netem"));
    }

    // A client inside the namespace reaches the server through the link, and pays the delays.
    std::string echoed;
    double rtt = -1;
    const std::string target = (*link)->client_target();
    EXPECT_THAT(target, HasSubstr((*link)->host_ip()));
    ASSERT_TRUE((*link)->RunInNamespace([&] { rtt = EchoRoundTrip(target, "hello through the link", &echoed); }).ok());
    EXPECT_EQ(echoed, "hello through the link");
    EXPECT_GE(rtt, 10.0);  // 4 ms up + 6 ms down
    EXPECT_EQ((*link)->relay_stats().uplink_bytes, 22u);
    // The namespace really is separate: the host's loopback server is not reachable there directly.
    double direct = 0;
    ASSERT_TRUE((*link)->RunInNamespace([&] { direct = EchoRoundTrip(server.address(), "x", &echoed); }).ok());
    EXPECT_LT(direct, 0);
    // WrapCommand runs a command inside: the namespace sees its own interface.
    auto inside = RunCommand((*link)->WrapCommand({"ip", "-o", "addr", "show", "dev", ns_if}));
    ASSERT_TRUE(inside.ok()) << inside.status();
    EXPECT_THAT(*inside, HasSubstr((*link)->netns_ip()));
  }
  EXPECT_THAT(Sh({"ip", "netns", "list"}), Not(HasSubstr(netns)));
  EXPECT_FALSE(LinkExists(host_if));
}

TEST(KernelLinkTest, FailedSetupLeavesNothingBehind) {
  REQUIRE_ROOT();
  KernelLinkOptions o;
  o.profile = TestProfile();
  o.target_addr = "not an address";  // the relay step, after namespace, veth and qdiscs, fails
  auto link = KernelLink::Create(o);
  ASSERT_FALSE(link.ok());
  EXPECT_THAT(std::string(link.status().message()), HasSubstr("not an address"));
  // Nothing named after this process is left (other test processes may be making their own meanwhile).
  std::string ns_prefix = KernelLinkNetnsName(getpid(), 0);
  ns_prefix.resize(ns_prefix.size() - 1);  // "fle_<pid>_"
  std::string if_prefix = KernelLinkInterfaceName(getpid(), 0, 'h');
  if_prefix.resize(if_prefix.size() - 2);  // "fle<pid>_"
  EXPECT_THAT(Sh({"ip", "netns", "list"}), Not(HasSubstr(ns_prefix)));
  EXPECT_THAT(Sh({"ip", "-o", "link", "show"}), Not(HasSubstr(if_prefix)));
}

TEST(KernelLinkTest, TwoLinksAtOnceGetDistinctNamesAndSubnets) {
  REQUIRE_ROOT();
  EchoServer server;
  KernelLinkOptions o;
  o.profile = TestProfile();
  o.target_addr = server.address();
  auto a = KernelLink::Create(o);
  auto b = KernelLink::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->netns(), (*b)->netns());
  EXPECT_NE((*a)->host_ip(), (*b)->host_ip());
  std::string echoed;
  double rtt = -1;
  ASSERT_TRUE((*b)->RunInNamespace([&] { rtt = EchoRoundTrip((*b)->client_target(), "b", &echoed); }).ok());
  EXPECT_EQ(echoed, "b");
}

TEST(KernelLinkTest, StaleCleanupRemovesWhatDeadProcessesLeftAndKeepsLiveOnes) {
  REQUIRE_ROOT();
  // A process that has exited: its pid names the stale objects.
  fl::sys::SpawnOptions true_once;
  true_once.argv = {"/bin/true"};
  absl::StatusOr<fl::sys::Child> exited = fl::sys::Child::Spawn(true_once);
  ASSERT_TRUE(exited.ok()) << exited.status();
  (void)exited->Wait();
  const pid_t child = exited->pid();
  const std::string stale_ns = KernelLinkNetnsName(child, 0);
  const std::string stale_if = KernelLinkInterfaceName(child, 0, 'h');
  const std::string stale_peer = KernelLinkInterfaceName(child, 0, 'n');
  Sh({"ip", "netns", "add", stale_ns});
  Sh({"ip", "link", "add", stale_if, "type", "veth", "peer", "name", stale_peer, "netns", stale_ns});
  // A live one (ours, with an index no link of this process uses).
  const std::string live_ns = KernelLinkNetnsName(getpid(), 0xfff0);
  Sh({"ip", "netns", "add", live_ns});

  auto removed = CleanupStaleKernelLinks();
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_GE(*removed, 2);
  const std::string namespaces = Sh({"ip", "netns", "list"});
  EXPECT_THAT(namespaces, Not(HasSubstr(stale_ns)));
  EXPECT_FALSE(LinkExists(stale_if));
  EXPECT_THAT(namespaces, HasSubstr(live_ns));
  Sh({"ip", "netns", "del", live_ns});
}

}  // namespace
}  // namespace fl::emulation
