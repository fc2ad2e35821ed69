// The packet backend's data plane (docs/testbed.md, "What the data plane costs"): sustained packets per second
// per core of the event loop moving UDP datagrams through a real namespace link (TUN read, PacketLink, TUN
// write), against a raw loopback UDP blast of the same datagrams measured in the same run.
//
// Not a Google Benchmark loop: it needs root (a namespace and TUN devices) and measures threads' CPU time, so it
// is a plain program (its own main; not run in CI). For each datagram size:
//   - reference: a thread blasts datagrams at a receiver on 127.0.0.1 for `seconds`; packets received per CPU
//     second of the sending thread (its sendto carries each datagram through the loopback stack into the
//     receiver's socket);
//   - packet link: the same blast from a thread in the namespace to the host end of an unlimited link (no delay,
//     no loss; the scheduler still queues and times every packet); packets received per CPU second of the event
//     loop's thread (/proc/self/task/<tid>/stat: user + system time, so the TUN syscalls count too). The loop's
//     thread is the one Start() adds to this process.
// The ratio is the link's packets per core against the loopback's; a packet through the link costs two extra
// trips across the user/kernel boundary (read from one TUN, write to the other) on top of the same stack.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fl/emulation/link_profile.h"
#include "fl/emulation/packet_network.h"
#include "fl/emulation/tun_device.h"

namespace {

using fl::emulation::LinkProfile;
using fl::emulation::PacketNamespace;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::set<int> Tasks() {
  std::set<int> tids;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    tids.insert(std::atoi(e.path().filename().c_str()));
  }
  return tids;
}

// A thread's user + system CPU seconds (fields 14 and 15 of its stat, in clock ticks).
double TaskCpuSeconds(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream fields(line.substr(paren + 2));
  std::string f;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stoull(f);
    if (i == 15) stime = std::stoull(f);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

int UdpSocket() {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int buf = 8 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &buf, sizeof(buf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  return fd;
}

int Port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Receives until `stop`, then until 200 ms pass without a datagram; returns the count.
uint64_t Receive(int fd, const std::atomic<bool>& stop) {
  std::vector<char> buf(65536);
  uint64_t n = 0;
  int64_t last = NowNs();
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) > 0) {
      while (recv(fd, buf.data(), buf.size(), MSG_DONTWAIT) > 0) ++n;
      last = NowNs();
    } else if (stop.load() && NowNs() - last > 200'000'000) {
      return n;
    }
  }
}

// Sends `payload`-byte datagrams to `to` for `seconds` (waiting briefly where the socket's buffer is full);
// returns the sending thread's CPU seconds.
double Blast(const sockaddr_in& to, size_t payload, double seconds, uint64_t* sent) {
  const int fd = UdpSocket();
  std::vector<char> buf(payload, 'x');
  const double cpu0 = ThreadCpuSeconds();
  const int64_t until = NowNs() + static_cast<int64_t>(seconds * 1e9);
  uint64_t n = 0;
  while (NowNs() < until) {
    for (int i = 0; i < 64; ++i) {
      if (sendto(fd, buf.data(), buf.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) >= 0) {
        ++n;
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  const double cpu = ThreadCpuSeconds() - cpu0;
  close(fd);
  *sent = n;
  return cpu;
}

struct Row {
  size_t ip_bytes = 0;
  uint64_t sent = 0, received = 0;
  double cpu = 0, wall = 0;
  double PerCore() const { return cpu > 0 ? static_cast<double>(received) / cpu : 0; }
};

// A receiver on this host's `ip`, the blast `send` makes to it (in whatever thread or namespace), and the
// received count once the blast is over and the link drained; `cpu` (called then) is the row's CPU seconds.
Row Through(size_t payload, const char* ip, const std::function<void(const sockaddr_in&, Row*)>& send,
            const std::function<double()>& cpu) {
  Row r;
  r.ip_bytes = payload + 28;
  const int rx = UdpSocket();
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(Port(rx)));
  inet_pton(AF_INET, ip, &to.sin_addr);
  std::atomic<bool> stop{false};
  std::thread receiver([&] { r.received = Receive(rx, stop); });
  const int64_t t0 = NowNs();
  send(to, &r);
  stop = true;
  receiver.join();
  r.wall = static_cast<double>(NowNs() - t0) / 1e9;
  if (cpu) r.cpu = cpu();
  close(rx);
  return r;
}

int Run(double seconds) {
  if (const absl::Status s = fl::emulation::PacketBackendSupport(); !s.ok()) {
    std::fprintf(stderr, "packet_backend_bench: %s\n(run it as root: sudo %s)\n", std::string(s.message()).c_str(),
                 "build/bench/packet_backend_bench");
    return 2;
  }
  std::printf(
      "| datagram (IP bytes) | loopback: received, sender CPU s | loopback packets/s per core | "
      "packet link: received (sent), loop CPU s | packet link packets/s per core | link / loopback |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const size_t payload : {size_t{36}, size_t{1472}}) {
    const Row ref = Through(
        payload, "127.0.0.1", [&](const sockaddr_in& to, Row* r) { r->cpu = Blast(to, payload, seconds, &r->sent); },
        nullptr);

    LinkProfile profile;  // unlimited both ways, no delay, no loss: the data plane's own cost
    profile.name = "unlimited";
    fl::emulation::PacketNamespaceOptions options;
    options.label = "bench";
    auto ns = PacketNamespace::Create(options);
    if (!ns.ok()) {
      std::fprintf(stderr, "packet_backend_bench: %s\n", std::string(ns.status().message()).c_str());
      return 1;
    }
    if (auto link = (*ns)->AddLink(profile); !link.ok()) {
      std::fprintf(stderr, "packet_backend_bench: %s\n", std::string(link.status().message()).c_str());
      return 1;
    }
    const std::set<int> before = Tasks();
    if (auto s = (*ns)->Start(); !s.ok()) {
      std::fprintf(stderr, "packet_backend_bench: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::vector<int> loop_tids;
    for (int tid : Tasks()) {
      if (!before.contains(tid)) loop_tids.push_back(tid);
    }
    auto loop_cpu = [&] {
      double c = 0;
      for (int tid : loop_tids) c += TaskCpuSeconds(tid);
      return c;
    };
    absl::Status ran = absl::OkStatus();
    const double cpu0 = loop_cpu();
    const Row link = Through(
        payload, (*ns)->host_ip(0).c_str(),
        [&](const sockaddr_in& to, Row* r) {
          ran = (*ns)->RunInNamespace([&] { Blast(to, payload, seconds, &r->sent); });
        },
        [&] { return loop_cpu() - cpu0; });
    if (!ran.ok()) {
      std::fprintf(stderr, "packet_backend_bench: %s\n", std::string(ran.message()).c_str());
      return 1;
    }
    (void)(*ns)->Destroy();
    std::printf("| %zu | %llu, %.2f | %.0f | %llu (%llu), %.2f | %.0f | %.2fx |\n", ref.ip_bytes,
                static_cast<unsigned long long>(ref.received), ref.cpu, ref.PerCore(),
                static_cast<unsigned long long>(link.received), static_cast<unsigned long long>(link.sent), link.cpu,
                link.PerCore(), ref.PerCore() > 0 ? link.PerCore() / ref.PerCore() : 0.0);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  if (argc > 1) {
    char* end = nullptr;
    seconds = std::strtod(argv[1], &end);
    if (end == argv[1] || *end != '\0' || !(seconds >= 0.5 && seconds <= 60)) {
      std::fprintf(stderr, "packet_backend_bench: seconds per blast '%s' is not a number in [0.5, 60]\n", argv[1]);
      return 2;
    }
  }
  return Run(seconds);
}
