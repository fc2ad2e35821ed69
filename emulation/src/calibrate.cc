#include "fl/emulation/calibrate.h"

#include "calibrate_measure.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include "absl/base/thread_annotations.h"
#include "fl/core/clock.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/kernel_link.h"
#include "fl/emulation/shaping_relay.h"

namespace fl::emulation {
namespace {

constexpr size_t kPingBytes = 64;
constexpr size_t kBulkChunk = 256 * 1024;

bool WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadExact(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, data, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    data += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct Received {
  uint64_t bytes_after_first = 0;
  int64_t first_ns = 0;
  int64_t last_ns = 0;
};

// Reads until EOF; the window runs from the first read to the last, so the link's delay is not counted.
Received ReceiveAll(int fd) {
  Received r;
  std::vector<char> buf(kBulkChunk);
  bool first = true;
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    const int64_t now = NowNs();
    if (first) {
      r.first_ns = now;
      first = false;
    } else {
      r.bytes_after_first += static_cast<uint64_t>(n);
    }
    r.last_ns = now;
  }
  return r;
}

void SendFor(int fd, double seconds) {
  std::vector<char> buf(kBulkChunk, 'x');
  const int64_t end = NowNs() + static_cast<int64_t>(seconds * 1e9);
  while (NowNs() < end) {
    if (!WriteAll(fd, buf.data(), buf.size())) break;
  }
  shutdown(fd, SHUT_WR);
}

absl::StatusOr<int> ConnectTo(const std::string& host_port) {
  auto addr = ResolveAddress(host_port);
  if (!addr.ok()) return addr.status();
  const int fd = socket(addr->family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(StrCat("socket: ", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr->storage), addr->length) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(StrCat("cannot connect to ", host_port, ": ", std::strerror(err)));
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

void LimitSendBuffer(int fd, double nominal_bps) {
  // A sender's autotuned buffer can hold seconds of data at a slow link's rate; 100 ms of it is plenty
  // (the relay and the kernel queue add their own) and keeps the transfer's tail short.
  if (nominal_bps <= 0) return;
  int bytes = static_cast<int>(std::clamp(nominal_bps / 8.0 * 0.1, 64.0 * 1024, 4.0 * 1024 * 1024));
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

// Stands where fl-server would: echoes pings ('P'), sinks uploads ('U'), sources downloads ('D').
class MeasurementServer {
 public:
  // Loopback, or every address where clients come through the packet backend's host-side TUN devices.
  absl::Status Start(bool any_address = false) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(any_address ? INADDR_ANY : INADDR_LOOPBACK);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 16) != 0) {
      return absl::InternalError(StrCat("measurement server: ", std::strerror(errno)));
    }
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return absl::OkStatus();
  }
  ~MeasurementServer() {
    stop_ = true;
    if (accept_thread_.joinable()) accept_thread_.join();
    std::vector<std::thread> threads;  // joined outside the lock: each Serve takes it as it ends
    {
      fl::MutexLock lock(mu_);
      for (int fd : open_) shutdown(fd, SHUT_RDWR);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
    if (fd_ >= 0) close(fd_);
  }
  std::string address() const { return StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      int one = 1;
      setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      fl::MutexLock lock(mu_);
      open_.push_back(c);
      threads_.emplace_back([this, c] { Serve(c); });
    }
  }
  void Serve(int fd) {
    char mode = 0;
    if (ReadExact(fd, &mode, 1)) {
      if (mode == 'P') {
        char buf[kPingBytes];
        while (ReadExact(fd, buf, kPingBytes) && WriteAll(fd, buf, kPingBytes)) {
        }
      } else if (mode == 'U') {
        const Received r = ReceiveAll(fd);
        const int64_t reply[3] = {static_cast<int64_t>(r.bytes_after_first), r.first_ns, r.last_ns};
        WriteAll(fd, reinterpret_cast<const char*>(reply), sizeof(reply));
      } else if (mode == 'D') {
        double params[2] = {0, 0};  // seconds, nominal downlink rate
        if (ReadExact(fd, reinterpret_cast<char*>(params), sizeof(params))) {
          LimitSendBuffer(fd, params[1]);
          SendFor(fd, params[0]);
          char sink[256];
          while (read(fd, sink, sizeof(sink)) > 0) {
          }
        }
      }
    }
    fl::MutexLock lock(mu_);
    open_.erase(std::remove(open_.begin(), open_.end(), fd), open_.end());
    close(fd);
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  fl::Mutex mu_;
  std::vector<int> open_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// The idle round trip: 64-byte ping-pongs, `options.pings` of them.
absl::Status MeasureRtt(const std::string& link_addr, const CalibrationOptions& options, CalibrationResult* result) {
  auto fd = ConnectTo(link_addr);
  if (!fd.ok()) return fd.status();
  char buf[kPingBytes] = {'P'};
  bool ok = WriteAll(*fd, buf, 1);
  std::vector<double> rtts;
  for (int i = 0; ok && i < options.pings; ++i) {
    const int64_t t0 = NowNs();
    ok = WriteAll(*fd, buf, kPingBytes) && ReadExact(*fd, buf, kPingBytes);
    if (ok) rtts.push_back(static_cast<double>(NowNs() - t0) / 1e6);
    std::this_thread::sleep_for(std::chrono::milliseconds(options.ping_gap_ms));
  }
  close(*fd);
  if (!ok || rtts.empty()) return absl::UnavailableError(StrCat("ping through ", link_addr, " failed"));
  std::sort(rtts.begin(), rtts.end());
  auto q = [&rtts](double f) {
    return rtts[static_cast<size_t>(std::floor(f * static_cast<double>(rtts.size() - 1)))];
  };
  result->rtt_median_ms =
      rtts.size() % 2 == 1 ? rtts[rtts.size() / 2] : (rtts[rtts.size() / 2 - 1] + rtts[rtts.size() / 2]) / 2;
  result->rtt_p10_ms = q(0.1);
  result->rtt_p90_ms = q(0.9);
  result->pings = static_cast<int>(rtts.size());
  return absl::OkStatus();
}

// We send for `seconds`, the server measures and reports; `retransmits` (optional) gets the sender's TCP
// retransmission count.
absl::Status MeasureUplink(const std::string& link_addr, double nominal_bps, double seconds, DirectionMeasurement* d,
                           uint64_t* retransmits) {
  auto fd = ConnectTo(link_addr);
  if (!fd.ok()) return fd.status();
  LimitSendBuffer(*fd, nominal_bps);
  const char mode = 'U';
  if (!WriteAll(*fd, &mode, 1)) return absl::UnavailableError("uplink transfer: send failed");
  SendFor(*fd, seconds);
  int64_t reply[3] = {0, 0, 0};
  const bool ok = ReadExact(*fd, reinterpret_cast<char*>(reply), sizeof(reply));
  if (retransmits != nullptr) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(*fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0) *retransmits = info.tcpi_total_retrans;
  }
  close(*fd);
  if (!ok) return absl::UnavailableError("uplink transfer: no report from the measurement server");
  d->bytes = static_cast<uint64_t>(reply[0]);
  d->seconds = static_cast<double>(reply[2] - reply[1]) / 1e9;
  return absl::OkStatus();
}

// The server sends for `seconds`, we measure.
absl::Status MeasureDownlink(const std::string& link_addr, double nominal_bps, double seconds,
                             DirectionMeasurement* d) {
  auto fd = ConnectTo(link_addr);
  if (!fd.ok()) return fd.status();
  const double params[2] = {seconds, nominal_bps};
  char header[1 + sizeof(params)] = {'D'};
  std::memcpy(header + 1, params, sizeof(params));
  if (!WriteAll(*fd, header, sizeof(header))) return absl::UnavailableError("downlink transfer: send failed");
  const Received r = ReceiveAll(*fd);
  close(*fd);
  d->bytes = r.bytes_after_first;
  d->seconds = static_cast<double>(r.last_ns - r.first_ns) / 1e9;
  return absl::OkStatus();
}

absl::Status Goodput(DirectionMeasurement* d) {
  if (d->seconds <= 0) return absl::UnavailableError("bulk transfer delivered nothing measurable");
  d->measured_bps = static_cast<double>(d->bytes) * 8.0 / d->seconds;
  return absl::OkStatus();
}

namespace {

// Runs the three measurements against `link_addr` (from wherever the calling thread's namespace is).
absl::Status Measure(const std::string& link_addr, const LinkProfile& profile, const CalibrationOptions& options,
                     CalibrationResult* result) {
  if (auto s = MeasureRtt(link_addr, options, result); !s.ok()) return s;
  spdlog::debug("calibrate {}: {} pings, median {:.2f} ms", profile.name, result->pings, result->rtt_median_ms);
  if (auto s = MeasureUplink(link_addr, profile.uplink.NominalRateBps(), options.bulk_seconds, &result->uplink);
      !s.ok()) {
    return s;
  }
  spdlog::debug("calibrate {}: uplink {} bytes in {:.3f} s", profile.name, result->uplink.bytes,
                result->uplink.seconds);
  if (auto s = MeasureDownlink(link_addr, profile.downlink.NominalRateBps(), options.bulk_seconds, &result->downlink);
      !s.ok()) {
    return s;
  }
  spdlog::debug("calibrate {}: downlink {} bytes in {:.3f} s", profile.name, result->downlink.bytes,
                result->downlink.seconds);
  for (DirectionMeasurement* d : {&result->uplink, &result->downlink}) {
    if (auto s = Goodput(d); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string Mbit(double bps) {
  if (bps <= 0) return "unlimited";
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(bps < 10e6 ? 2 : 1);
  os << bps / 1e6;
  return os.str();
}

std::string Fixed(double v, int digits) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}

}  // namespace

absl::StatusOr<Backend> ParseBackend(std::string_view name) {
  if (name == "userspace") return Backend::kUserspace;
  if (name == "kernel") return Backend::kKernel;
  if (name == "packet") return Backend::kPacket;
  return absl::InvalidArgumentError(StrCat("unknown backend '", name, "'; allowed: userspace, kernel, packet"));
}

absl::StatusOr<std::vector<Backend>> ParseBackends(std::string_view name) {
  if (name == "both") return std::vector<Backend>{Backend::kUserspace, Backend::kKernel};
  if (name == "all") return std::vector<Backend>{Backend::kUserspace, Backend::kKernel, Backend::kPacket};
  auto b = ParseBackend(name);
  if (!b.ok()) {
    return absl::InvalidArgumentError(
        StrCat("unknown backend '", name, "'; allowed: userspace, kernel, packet, both (userspace and kernel), all"));
  }
  return std::vector<Backend>{*b};
}

std::string BackendName(Backend b) {
  switch (b) {
    case Backend::kKernel: return "kernel";
    case Backend::kPacket: return "packet";
    case Backend::kUserspace: break;
  }
  return "userspace";
}

double LossMeasurement::Measured() const {
  if (sent == 0) return 0;
  const uint64_t missing = sent > received ? sent - received : 0;
  const uint64_t by_loss = missing > queue_drops ? missing - queue_drops : 0;
  return static_cast<double>(by_loss) / static_cast<double>(sent - std::min(sent, queue_drops));
}

bool LossMeasurement::WithinTarget() const {
  if (configured <= 0) return Measured() == 0;
  return std::abs(Measured() / configured - 1.0) <= 0.20;
}

bool MathisMeasurement::ModelHolds() const {
  return rtt_ms >= 5 && bound_bps > 0 && (link_bps <= 0 || bound_bps <= 0.5 * link_bps);
}

bool CalibrationResult::RateWithinTarget() const {
  return std::abs(uplink.RateError()) <= 0.10 && std::abs(downlink.RateError()) <= 0.10;
}

bool CalibrationResult::RttWithinTarget() const { return std::abs(rtt_median_ms - nominal_rtt_ms) <= 2.0; }

absl::StatusOr<CalibrationResult> Calibrate(const LinkProfile& profile, const CalibrationOptions& options) {
  CalibrationResult result;
  result.profile = profile.name;
  result.source = profile.source;
  result.backend = options.backend;
  result.uplink.nominal_bps = profile.uplink.NominalRateBps();
  result.downlink.nominal_bps = profile.downlink.NominalRateBps();
  result.nominal_rtt_ms = profile.NominalRttMs();

  MeasurementServer server;
  if (auto s = server.Start(options.backend == Backend::kPacket); !s.ok()) return s;
  if (options.backend == Backend::kPacket) {
    if (auto s = CalibratePacket(profile, options, server.port(), &result); !s.ok()) return s;
    return result;
  }
  if (options.backend == Backend::kUserspace) {
    RelayOptions ro;
    ro.target_addr = server.address();
    ro.uplink = profile.uplink;
    ro.downlink = profile.downlink;
    ro.seed = options.seed;
    ro.name = StrCat("calibrate ", profile.name);
    auto relay = ShapingRelay::Start(ro);
    if (!relay.ok()) return relay.status();
    if (auto s = Measure(StrCat("127.0.0.1:", (*relay)->port()), profile, options, &result); !s.ok()) return s;
    return result;
  }
  KernelLinkOptions ko;
  ko.profile = profile;
  ko.target_addr = server.address();
  ko.seed = options.seed;
  auto link = KernelLink::Create(ko);
  if (!link.ok()) return link.status();
  result.netem = (*link)->netem_used();
  absl::Status measured = absl::OkStatus();
  const std::string target = (*link)->client_target();
  if (auto s = (*link)->RunInNamespace([&] { measured = Measure(target, profile, options, &result); }); !s.ok()) {
    return s;
  }
  if (!measured.ok()) return measured;
  if (auto s = (*link)->Destroy(); !s.ok()) return s;
  return result;
}

std::string CalibrationTable(const std::vector<CalibrationResult>& results) {
  std::ostringstream os;
  os << "| profile | backend | up nominal Mbit/s | up measured | up error | down nominal Mbit/s | down measured | "
        "down error | RTT nominal ms | RTT median ms (p10-p90) | RTT error ms | targets |\n";
  os << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : results) {
    auto err = [](const DirectionMeasurement& d) {
      return d.nominal_bps > 0 ? StrCat(d.RateError() >= 0 ? "+" : "", Fixed(d.RateError() * 100, 1), "%")
                               : std::string("n/a");
    };
    // A trace's rows give its long-run mean and, after it, what it offered during the transfer (the error's
    // reference).
    auto nominal = [](const DirectionMeasurement& d) {
      return d.window_capacity_bps > 0 ? StrCat(Mbit(d.nominal_bps), " (window ", Mbit(d.window_capacity_bps), ")")
                                       : Mbit(d.nominal_bps);
    };
    const double rtt_err = r.rtt_median_ms - r.nominal_rtt_ms;
    std::string targets = StrCat(r.RateWithinTarget() ? "rate ok" : "RATE MISSED", ", ",
                                 r.RttWithinTarget() ? "delay ok" : "DELAY MISSED");
    os << "| " << r.profile << " | " << BackendName(r.backend)
       << (r.backend == Backend::kKernel ? (r.netem ? " (netem)" : " (htb + delay line)") : "") << " | "
       << nominal(r.uplink) << " | " << Mbit(r.uplink.measured_bps) << " | " << err(r.uplink) << " | "
       << nominal(r.downlink) << " | " << Mbit(r.downlink.measured_bps) << " | " << err(r.downlink) << " | "
       << Fixed(r.nominal_rtt_ms, 1) << " | " << Fixed(r.rtt_median_ms, 2) << " (" << Fixed(r.rtt_p10_ms, 2) << "-"
       << Fixed(r.rtt_p90_ms, 2) << ") | " << (rtt_err >= 0 ? "+" : "") << Fixed(rtt_err, 2) << " | " << targets
       << " |\n";
  }
  return os.str();
}

std::string PhysicsTable(const std::vector<CalibrationResult>& results) {
  std::ostringstream os;
  bool any = false;
  for (const auto& r : results) any |= r.has_loss || r.has_mathis;
  if (!any) return "";
  os << "| profile | loss up configured | measured (sent, queue drops) | loss down configured | measured (sent, queue "
        "drops) | loss target | TCP (Reno) at p | RTT ms | Mathis bound Mbit/s | measured Mbit/s | error | "
        "retransmits | Mathis target |\n";
  os << "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto pct = [](double v) { return StrCat(Fixed(v * 100, v < 0.01 ? 3 : 2), "%"); };
  for (const auto& r : results) {
    if (!r.has_loss && !r.has_mathis) continue;
    os << "| " << r.profile << " | ";
    if (r.has_loss) {
      for (const LossMeasurement* m : {&r.loss_up, &r.loss_down}) {
        os << pct(m->configured) << " | " << pct(m->Measured()) << " (" << m->sent << ", " << m->queue_drops << ") | ";
      }
      os << (r.loss_up.WithinTarget() && r.loss_down.WithinTarget() ? "ok" : "MISSED") << " | ";
    } else {
      os << "- | - | - | - | - | ";
    }
    if (r.has_mathis) {
      const MathisMeasurement& m = r.mathis;
      os << pct(m.loss) << " | " << Fixed(m.rtt_ms, 2) << " | " << Mbit(m.bound_bps) << " | " << Mbit(m.measured_bps)
         << " | " << (m.Error() >= 0 ? "+" : "") << Fixed(m.Error() * 100, 1) << "% | " << m.retransmits << " | "
         << (!m.ModelHolds()    ? "n/a (link- or timer-bound)"
             : m.WithinTarget() ? "ok"
                                : "MISSED")
         << " |\n";
    } else {
      os << "- | - | - | - | - | - | - |\n";
    }
  }
  return os.str();
}

absl::StatusOr<std::filesystem::path> WriteCalibrationYaml(const std::filesystem::path& profile_path,
                                                           const std::vector<CalibrationResult>& results) {
  std::filesystem::path out = profile_path.parent_path() / StrCat(profile_path.stem().string(), ".calibration.yaml");
  std::vector<YAML::Node> kept;
  if (std::filesystem::exists(out)) {
    try {
      const YAML::Node old = YAML::LoadFile(out.string());
      if (old["calibrations"] && old["calibrations"].IsSequence()) {
        for (const auto& entry : old["calibrations"]) {
          const std::string backend = entry["backend"] ? entry["backend"].as<std::string>() : "";
          const bool replaced = std::any_of(results.begin(), results.end(), [&](const CalibrationResult& r) {
            return BackendName(r.backend) == backend;
          });
          if (!replaced) kept.push_back(entry);
        }
      }
    } catch (const YAML::Exception& e) {
      spdlog::warn("{}: replacing an unreadable calibration file ({})", out.string(), e.what());
    }
  }
  YAML::Emitter y;
  y.SetDoublePrecision(8);
  y << YAML::Comment(StrCat("Measured by `fl-link calibrate ", profile_path.filename().string(),
                            "`; nominal values are the profile's. Rates in bits/s (TCP goodput), delays in ms."));
  y << YAML::BeginMap << YAML::Key << "profile" << YAML::Value << (results.empty() ? "" : results[0].profile);
  y << YAML::Key << "calibrations" << YAML::Value << YAML::BeginSeq;
  for (const auto& k : kept) y << k;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  for (const auto& r : results) {
    y << YAML::BeginMap;
    y << YAML::Key << "backend" << YAML::Value << BackendName(r.backend);
    if (r.backend == Backend::kKernel) {
      y << YAML::Key << "delay_by" << YAML::Value << (r.netem ? "netem" : "userspace delay line");
    }
    y << YAML::Key << "host" << YAML::Value << host;
    y << YAML::Key << "measured_at_unix_ms" << YAML::Value << UnixMs();
    for (int i = 0; i < 2; ++i) {
      const DirectionMeasurement& d = i == 0 ? r.uplink : r.downlink;
      y << YAML::Key << (i == 0 ? "uplink" : "downlink") << YAML::Value << YAML::BeginMap;
      y << YAML::Key << "nominal_bps" << YAML::Value << d.nominal_bps;
      if (d.window_capacity_bps > 0) {
        y << YAML::Key << "window_capacity_bps" << YAML::Value << std::round(d.window_capacity_bps);
      }
      y << YAML::Key << "measured_bps" << YAML::Value << std::round(d.measured_bps);
      y << YAML::Key << "error" << YAML::Value << std::round(d.RateError() * 10000) / 10000;
      y << YAML::Key << "bytes" << YAML::Value << d.bytes;
      y << YAML::Key << "seconds" << YAML::Value << std::round(d.seconds * 1000) / 1000;
      y << YAML::EndMap;
    }
    y << YAML::Key << "rtt_ms" << YAML::Value << YAML::BeginMap;
    y << YAML::Key << "nominal" << YAML::Value << r.nominal_rtt_ms;
    y << YAML::Key << "median" << YAML::Value << std::round(r.rtt_median_ms * 1000) / 1000;
    y << YAML::Key << "p10" << YAML::Value << std::round(r.rtt_p10_ms * 1000) / 1000;
    y << YAML::Key << "p90" << YAML::Value << std::round(r.rtt_p90_ms * 1000) / 1000;
    y << YAML::Key << "pings" << YAML::Value << r.pings;
    y << YAML::EndMap;
    if (r.has_loss) {
      y << YAML::Key << "loss" << YAML::Value << YAML::BeginMap;
      for (int i = 0; i < 2; ++i) {
        const LossMeasurement& m = i == 0 ? r.loss_up : r.loss_down;
        y << YAML::Key << (i == 0 ? "uplink" : "downlink") << YAML::Value << YAML::BeginMap;
        y << YAML::Key << "configured" << YAML::Value << m.configured;
        y << YAML::Key << "measured" << YAML::Value << m.Measured();
        y << YAML::Key << "sent" << YAML::Value << m.sent;
        y << YAML::Key << "received" << YAML::Value << m.received;
        y << YAML::Key << "queue_drops" << YAML::Value << m.queue_drops;
        y << YAML::Key << "pace_pps" << YAML::Value << std::round(m.pace_pps);
        y << YAML::EndMap;
      }
      y << YAML::EndMap;
    }
    if (r.has_mathis) {
      const MathisMeasurement& m = r.mathis;
      y << YAML::Key << "tcp_under_loss" << YAML::Value << YAML::BeginMap;
      y << YAML::Key << "congestion_control" << YAML::Value << m.congestion_control;
      y << YAML::Key << "loss" << YAML::Value << m.loss;
      y << YAML::Key << "rtt_ms" << YAML::Value << std::round(m.rtt_ms * 1000) / 1000;
      y << YAML::Key << "mathis_bound_bps" << YAML::Value << std::round(m.bound_bps);
      y << YAML::Key << "measured_bps" << YAML::Value << std::round(m.measured_bps);
      y << YAML::Key << "retransmits" << YAML::Value << m.retransmits;
      y << YAML::Key << "model_holds" << YAML::Value << m.ModelHolds();
      y << YAML::EndMap;
    }
    y << YAML::Key << "within_target" << YAML::Value << YAML::BeginMap;
    y << YAML::Key << "rate_10pct" << YAML::Value << r.RateWithinTarget();
    y << YAML::Key << "rtt_2ms" << YAML::Value << r.RttWithinTarget();
    if (r.has_loss) {
      y << YAML::Key << "loss_20pct" << YAML::Value << (r.loss_up.WithinTarget() && r.loss_down.WithinTarget());
    }
    if (r.has_mathis && r.mathis.ModelHolds()) {
      y << YAML::Key << "mathis_30pct" << YAML::Value << r.mathis.WithinTarget();
    }
    y << YAML::EndMap;
    y << YAML::EndMap;
  }
  y << YAML::EndSeq << YAML::EndMap;
  std::ofstream f(out);
  if (!f) return absl::PermissionDeniedError(StrCat("cannot write ", out.string()));
  f << y.c_str() << "\n";
  if (!f) return absl::DataLossError(StrCat("writing ", out.string(), " failed"));
  return out;
}

}  // namespace fl::emulation
