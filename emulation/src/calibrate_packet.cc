// The packet backend's calibration (fl-experiment calibrate --backend packet): capacity and RTT on a lossless
// copy of the profile, UDP loss over N datagrams against the link's own counters, Reno against Mathis.
#include "calibrate_measure.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include <spdlog/spdlog.h>

#include "fl/core/clock.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/packet_network.h"

namespace fl::emulation {
namespace {

// The loss check's datagrams: a sequence number and nothing else (36-byte IP packets, so that a slow link still
// carries 100,000 of them in well under a minute).
constexpr uint64_t kLossMagic = 0x666c2d6c6f737321ull;  // "fl-loss!"
struct LossDatagram {
  uint64_t magic;
  uint64_t seq;
};
constexpr double kLossDatagramIpBytes = 20 + 8 + sizeof(LossDatagram);

absl::StatusOr<int> UdpSocket(uint32_t bind_addr) {
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(StrCat("udp socket: ", std::strerror(errno)));
  int buf = 8 << 20;  // the receiver must never be the one dropping
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof(buf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(bind_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(StrCat("udp bind: ", std::strerror(err)));
  }
  return fd;
}

int LocalPort(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

// Sends `n` datagrams to `to` at `pps`, paced in 1 ms batches.
void SendPaced(int fd, const sockaddr_in& to, int64_t n, double pps) {
  const int64_t t0 = NowNs();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t due = t0 + static_cast<int64_t>(static_cast<double>(i) / pps * 1e9);
    const int64_t now = NowNs();
    if (due > now + 1'000'000) std::this_thread::sleep_for(std::chrono::nanoseconds(due - now));
    const LossDatagram d{kLossMagic, static_cast<uint64_t>(i)};
    while (sendto(fd, &d, sizeof(d), 0, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) < 0 &&
           (errno == ENOBUFS || errno == EAGAIN || errno == EINTR)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // the TUN's queue is full: wait, never skip
    }
  }
}

// Counts distinct sequence numbers < n until `quiet_ms` pass without one after `until_ns`; `from` gets the first
// sender's address.
uint64_t CountReceived(int fd, int64_t n, int64_t until_ns, int quiet_ms, sockaddr_in* from = nullptr) {
  std::vector<bool> seen(static_cast<size_t>(n), false);
  uint64_t received = 0;
  int64_t last = NowNs();
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, 20);
    const int64_t now = NowNs();
    if (r <= 0) {
      if (now > until_ns && now - last > int64_t{quiet_ms} * 1'000'000) break;
      continue;
    }
    LossDatagram d{};
    sockaddr_in src{};
    socklen_t len = sizeof(src);
    const ssize_t got = recvfrom(fd, &d, sizeof(d), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&src), &len);
    if (got != static_cast<ssize_t>(sizeof(d)) || d.magic != kLossMagic) continue;
    last = now;
    if (from != nullptr && from->sin_port == 0) *from = src;
    if (d.seq < static_cast<uint64_t>(n) && !seen[d.seq]) {
      seen[d.seq] = true;
      ++received;
    }
  }
  return received;
}

double LossPacePps(const LinkDirection& d) {
  // 40% of the nominal rate in these datagrams (a trace's dips below that fill the queue, whose drops are
  // counted apart), at most 20,000 a second (the sender's and receiver's syscalls, not the link, would limit).
  const double rate = d.NominalRateBps();
  const double pps = rate > 0 ? 0.4 * rate / (kLossDatagramIpBytes * 8) : 20'000;
  return std::clamp(pps, 200.0, 20'000.0);
}

// The loss check through a running packet namespace (link 0).
absl::Status MeasureLoss(PacketNamespace& ns, const LinkProfile& profile, int64_t n, CalibrationResult* result) {
  auto host = UdpSocket(INADDR_ANY);
  if (!host.ok()) return host.status();
  const int host_fd = *host;
  const int port = LocalPort(host_fd);
  sockaddr_in host_addr{};
  host_addr.sin_family = AF_INET;
  host_addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ns.host_ip(0).c_str(), &host_addr.sin_addr);
  const double delay_s =
      (profile.uplink.delay_ms + profile.uplink.jitter_ms + profile.downlink.delay_ms + profile.downlink.jitter_ms) /
      1e3;
  absl::Status status = absl::OkStatus();
  // Uplink: the namespace sends, the host counts.
  {
    LossMeasurement& m = result->loss_up;
    m.configured = profile.uplink.loss + (1 - profile.uplink.loss) * profile.uplink.burst_loss.StationaryLoss();
    m.pace_pps = LossPacePps(profile.uplink);
    m.sent = static_cast<uint64_t>(n);
    const PacketLinkStats before = ns.stats(0, true);
    const int64_t until = NowNs() + static_cast<int64_t>((static_cast<double>(n) / m.pace_pps + delay_s + 2) * 1e9);
    std::thread counter([&] { m.received = CountReceived(host_fd, n, until, 1500); });
    absl::Status sent = ns.RunInNamespace([&] {
      auto fd = UdpSocket(INADDR_ANY);
      if (!fd.ok()) {
        status = fd.status();
        return;
      }
      SendPaced(*fd, host_addr, n, m.pace_pps);
      close(*fd);
    });
    counter.join();
    if (!sent.ok()) status = sent;
    const PacketLinkStats after = ns.stats(0, true);
    m.queue_drops = after.dropped_queue - before.dropped_queue;
    m.link_lost = after.lost - before.lost;
  }
  // Downlink: the namespace asks (again until answered: the request can be lost too), the host sends.
  if (status.ok()) {
    LossMeasurement& m = result->loss_down;
    m.configured = profile.downlink.loss + (1 - profile.downlink.loss) * profile.downlink.burst_loss.StationaryLoss();
    m.pace_pps = LossPacePps(profile.downlink);
    m.sent = static_cast<uint64_t>(n);
    const PacketLinkStats before = ns.stats(0, false);
    std::atomic<bool> answered{false};
    std::thread sender([&] {
      // Waits for the request, then sends the datagrams to whoever asked.
      for (int tries = 0; tries < 300 && !answered.load(); ++tries) {
        pollfd p{host_fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        char req[16];
        sockaddr_in src{};
        socklen_t len = sizeof(src);
        if (recvfrom(host_fd, req, sizeof(req), 0, reinterpret_cast<sockaddr*>(&src), &len) == 1 && req[0] == 'D') {
          answered = true;
          SendPaced(host_fd, src, n, m.pace_pps);
        }
      }
    });
    absl::Status counted = ns.RunInNamespace([&] {
      auto fd = UdpSocket(INADDR_ANY);
      if (!fd.ok()) {
        status = fd.status();
        return;
      }
      std::thread asker([&] {
        for (int i = 0; i < 100 && !answered.load(); ++i) {
          const char req = 'D';
          sendto(*fd, &req, 1, 0, reinterpret_cast<const sockaddr*>(&host_addr), sizeof(host_addr));
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
      });
      const int64_t until = NowNs() + static_cast<int64_t>((static_cast<double>(n) / m.pace_pps + delay_s + 3) * 1e9);
      m.received = CountReceived(*fd, n, until, 1500);
      asker.join();
      close(*fd);
    });
    answered = true;
    sender.join();
    if (!counted.ok()) status = counted;
    const PacketLinkStats after = ns.stats(0, false);
    m.queue_drops = after.dropped_queue - before.dropped_queue;
    m.link_lost = after.lost - before.lost;
  }
  close(host_fd);
  return status;
}

}  // namespace

// A packet namespace with the profile's link, started.
absl::StatusOr<std::unique_ptr<PacketNamespace>> StartPacketLink(const LinkProfile& profile, uint64_t seed,
                                                                 const std::string& congestion) {
  auto ns = PacketNamespace::Create({.label = "calibrate", .tcp_congestion = congestion, .seed = seed});
  if (!ns.ok()) return ns.status();
  if (auto link = (*ns)->AddLink(profile); !link.ok()) return link.status();
  if (auto s = (*ns)->Start(); !s.ok()) return s;
  return ns;
}

absl::Status CalibratePacket(const LinkProfile& profile, const CalibrationOptions& options, int port,
                             CalibrationResult* result) {
  {
    // Capacity and delay on the profile without its loss: TCP's reaction to loss is the third check's subject,
    // and would otherwise be charged to the link's capacity (at 150 Mbit/s and 24 ms, 0.1% loss alone holds a
    // Reno flow to 19 Mbit/s).
    LinkProfile lossless = profile;
    for (LinkDirection* d : {&lossless.uplink, &lossless.downlink}) {
      d->loss = 0;
      d->burst_loss = BurstLoss{};
    }
    auto ns = StartPacketLink(lossless, options.seed, "");
    if (!ns.ok()) return ns.status();
    const std::string target = StrCat((*ns)->host_ip(0), ":", port);
    absl::Status measured = absl::OkStatus();
    if (auto s = (*ns)->RunInNamespace([&] { measured = MeasureRtt(target, options, result); }); !s.ok()) return s;
    if (!measured.ok()) return measured;
    // Each bulk transfer between two snapshots of its direction's counters: on a trace, the opportunities the
    // link offered meanwhile (each carries up to 1,500 bytes; an unused one is counted when the next packet
    // arrives, and the transfer's last ACK or FIN follows its data) are the capacity it had to match.
    for (const bool up : {true, false}) {
      DirectionMeasurement* d = up ? &result->uplink : &result->downlink;
      const PacketLinkStats before = (*ns)->stats(0, up);
      const int64_t t0 = NowNs();
      if (auto s = (*ns)->RunInNamespace([&] {
            measured = up ? MeasureUplink(target, profile.uplink.NominalRateBps(), options.bulk_seconds, d)
                          : MeasureDownlink(target, profile.downlink.NominalRateBps(), options.bulk_seconds, d);
          });
          !s.ok()) {
        return s;
      }
      if (!measured.ok()) return measured;
      const PacketLinkStats after = (*ns)->stats(0, up);
      const double elapsed_s = static_cast<double>(NowNs() - t0) / 1e9;
      if ((up ? profile.uplink : profile.downlink).has_trace && elapsed_s > 0) {
        const uint64_t opportunities =
            (after.delivered - before.delivered) + (after.opportunities_unused - before.opportunities_unused);
        d->window_capacity_bps = static_cast<double>(opportunities) * 1500 * 8 / elapsed_s;
      }
      if (auto s = Goodput(d); !s.ok()) return s;
    }
    if (auto s = (*ns)->Destroy(); !s.ok()) return s;
  }
  if (options.loss_packets > 0) {
    auto ns = StartPacketLink(profile, options.seed, "");
    if (!ns.ok()) return ns.status();
    if (auto s = MeasureLoss(**ns, profile, options.loss_packets, result); !s.ok()) return s;
    result->has_loss = true;
    if (auto s = (*ns)->Destroy(); !s.ok()) return s;
  }
  if (options.mathis_loss <= 0) return absl::OkStatus();
  // TCP under random loss: Reno (the model's), the profile's delays and uplink rate, only random loss.
  LinkProfile lossy = profile;
  lossy.uplink.loss = options.mathis_loss;
  lossy.uplink.burst_loss = BurstLoss{};
  lossy.downlink.loss = 0;
  lossy.downlink.burst_loss = BurstLoss{};
  auto ns = StartPacketLink(lossy, options.seed + 1, "reno");
  if (!ns.ok()) return ns.status();
  const std::string target = StrCat((*ns)->host_ip(0), ":", port);
  MathisMeasurement& m = result->mathis;
  m.loss = options.mathis_loss;
  m.link_bps = profile.uplink.NominalRateBps();
  m.congestion_control = "reno";
  absl::Status measured = absl::OkStatus();
  CalibrationResult rtt;
  DirectionMeasurement up;
  if (auto s = (*ns)->RunInNamespace([&] {
        CalibrationOptions o = options;
        o.pings = std::min(options.pings, 50);
        measured = MeasureRtt(target, o, &rtt);
        if (measured.ok()) measured = MeasureUplink(target, m.link_bps, options.mathis_seconds, &up, &m.retransmits);
        if (measured.ok()) measured = Goodput(&up);
      });
      !s.ok()) {
    return s;
  }
  if (!measured.ok()) return measured;
  m.rtt_ms = rtt.rtt_median_ms;
  m.measured_bps = up.measured_bps;
  m.bound_bps = kMssBytes * 8.0 / (m.rtt_ms / 1e3) * std::sqrt(1.5) / std::sqrt(m.loss);
  result->has_mathis = true;
  return (*ns)->Destroy();
}

}  // namespace fl::emulation
