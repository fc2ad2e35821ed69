// The userspace relay with real sockets on loopback. Timing assertions are lower bounds that follow from
// the configured link (a transfer cannot beat the rate, a round trip cannot beat the delay), never
// wall-clock ceilings.
#include "fl/emulation/shaping_relay.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/checksum.h"
#include "fl/core/clock.h"
#include "fl/emulation/shaper.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::emulation {
namespace {

bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadExact(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

std::vector<char> ReadToEof(int fd) {
  std::vector<char> out;
  char buf[65536];
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    out.insert(out.end(), buf, buf + r);
  }
  return out;
}

int Connect(int port) {
  const int fd = fl::testing::ConnectLoopback(port);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

uint64_t Sum(const std::vector<char>& v) {
  return fl::core::Checksum64(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
}

std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

// A loopback server running `serve(fd)` on a thread per connection.
class TestServer {
 public:
  explicit TestServer(std::function<void(int)> serve, int port = 0) : serve_(std::move(serve)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(fd_, 64), 0);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        int one = 1;
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::lock_guard<std::mutex> lock(mu_);
        workers_.emplace_back([this, c] {
          serve_(c);
          close(c);
        });
      }
    });
  }
  ~TestServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) w.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::function<void(int)> serve_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::thread> workers_;
};

// Echo: returns every byte it reads, closes its write side on EOF.
void Echo(int fd) {
  char buf[65536];
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r <= 0) break;
    if (!WriteAll(fd, buf, static_cast<size_t>(r))) break;
  }
  shutdown(fd, SHUT_WR);
}

std::unique_ptr<ShapingRelay> StartRelay(const std::string& target, const LinkDirection& up, const LinkDirection& down,
                                         uint64_t seed = 1, int64_t connect_retry_ms = 0) {
  RelayOptions o;
  o.target_addr = target;
  o.uplink = up;
  o.downlink = down;
  o.seed = seed;
  o.connect_retry_ms = connect_retry_ms;
  auto r = ShapingRelay::Start(o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// Sends `data` and returns what comes back (through the echo server: up and down the relay).
std::vector<char> EchoThrough(int port, const std::vector<char>& data) {
  const int fd = Connect(port);
  EXPECT_GE(fd, 0);
  std::vector<char> back;
  std::thread reader([&] { back = ReadToEof(fd); });
  WriteAll(fd, data.data(), data.size());
  shutdown(fd, SHUT_WR);
  reader.join();
  close(fd);
  return back;
}

TEST(ShapingRelayTest, ForwardsBytesUnchangedBothWaysOnConcurrentConnections) {
  TestServer server(Echo);
  LinkDirection up, down;  // unshaped
  auto relay = StartRelay(server.address(), up, down);
  ASSERT_NE(relay, nullptr);
  constexpr int kConnections = 6;
  constexpr size_t kBytes = 4 << 20;
  std::vector<std::thread> clients;
  std::vector<bool> same(kConnections, false);
  for (int i = 0; i < kConnections; ++i) {
    clients.emplace_back([&, i] {
      const auto data = RandomBytes(kBytes + static_cast<size_t>(i) * 1234, static_cast<uint64_t>(i));
      const auto back = EchoThrough(relay->port(), data);
      same[static_cast<size_t>(i)] = back.size() == data.size() && Sum(back) == Sum(data);
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kConnections; ++i) EXPECT_TRUE(same[static_cast<size_t>(i)]) << "connection " << i;
  // Connections are closed on both sides once both directions ended; wait for the relay to notice.
  for (int i = 0; i < 200 && relay->stats().connections_active > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const RelayStats s = relay->stats();
  uint64_t expected = 0;
  for (int i = 0; i < kConnections; ++i) expected += kBytes + static_cast<uint64_t>(i) * 1234;
  EXPECT_EQ(s.uplink_bytes, expected);
  EXPECT_EQ(s.downlink_bytes, expected);
  EXPECT_EQ(s.connections_accepted, static_cast<uint64_t>(kConnections));
  EXPECT_EQ(s.connections_active, 0u);
}

TEST(ShapingRelayTest, ShapedAndDelayedLinkStillDeliversEveryByteInOrder) {
  TestServer server(Echo);
  LinkDirection up, down;
  up.rate_bps = 200e6;
  up.delay_ms = 1;
  up.jitter_ms = 1;
  down.rate_bps = 300e6;
  down.delay_ms = 2;
  down.jitter_ms = 2;
  down.queue_limit_bytes = 20000;
  auto relay = StartRelay(server.address(), up, down, 9);
  ASSERT_NE(relay, nullptr);
  std::vector<std::thread> clients;
  std::vector<bool> same(3, false);
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      const auto data = RandomBytes(3 << 20, 100 + static_cast<uint64_t>(i));
      const auto back = EchoThrough(relay->port(), data);
      same[static_cast<size_t>(i)] = back == data;
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same[static_cast<size_t>(i)]) << "connection " << i;
}

// The kernel backend's relay only delays and holds little: when its buffer fills while the source is
// still readable, it must resume reading once it has written (the source sends no new edge then).
TEST(ShapingRelayTest, SmallBufferWithDelayNeverStallsABulkTransfer) {
  constexpr size_t kBytes = 16 << 20;
  TestServer server([](int fd) {
    const auto data = RandomBytes(kBytes, 11);
    WriteAll(fd, data.data(), data.size());
  });
  RelayOptions o;
  o.target_addr = server.address();
  o.downlink.delay_ms = 2;
  o.downlink_buffer_bytes = 64 << 10;
  auto relay = ShapingRelay::Start(o);
  ASSERT_TRUE(relay.ok()) << relay.status();
  const int fd = Connect((*relay)->port());
  ASSERT_GE(fd, 0);
  const auto got = ReadToEof(fd);
  close(fd);
  EXPECT_EQ(got.size(), kBytes);
  EXPECT_TRUE(Sum(got) == Sum(RandomBytes(kBytes, 11)));
}

TEST(ShapingRelayTest, RateIsEnforcedInEachDirection) {
  constexpr size_t kBytes = 1'000'000;
  // The sink reads kBytes then acks; the source sends kBytes on request.
  TestServer server([](int fd) {
    char mode = 0;
    if (!ReadExact(fd, &mode, 1)) return;
    if (mode == 'U') {
      std::vector<char> buf(kBytes);
      if (ReadExact(fd, buf.data(), buf.size())) WriteAll(fd, "k", 1);
    } else {
      const auto data = RandomBytes(kBytes, 6);
      WriteAll(fd, data.data(), data.size());
    }
  });
  LinkDirection up, down;
  up.rate_bps = 8e6;     // 1 MB takes about 1 s
  down.rate_bps = 16e6;  // about 0.5 s
  auto relay = StartRelay(server.address(), up, down);
  ASSERT_NE(relay, nullptr);

  // The fastest the link allows: all bytes as link bytes at the rate, less the initial bucket.
  auto min_seconds = [](double rate_bps, size_t bytes) {
    const double wire = static_cast<double>(bytes) * kMtuBytes / kMssBytes;
    return (wire - DirectionShaper::BurstBytes(rate_bps)) * 8 / rate_bps;
  };
  {
    const int fd = Connect(relay->port());
    const auto data = RandomBytes(kBytes, 7);
    const int64_t t0 = NowNs();
    ASSERT_TRUE(WriteAll(fd, "U", 1));
    ASSERT_TRUE(WriteAll(fd, data.data(), data.size()));
    char ack = 0;
    ASSERT_TRUE(ReadExact(fd, &ack, 1));
    const double seconds = static_cast<double>(NowNs() - t0) / 1e9;
    close(fd);
    EXPECT_GE(seconds, min_seconds(up.rate_bps, kBytes + 1)) << "uplink beat its 8 Mbit/s rate";
  }
  {
    const int fd = Connect(relay->port());
    const int64_t t0 = NowNs();
    ASSERT_TRUE(WriteAll(fd, "D", 1));
    std::vector<char> buf(kBytes);
    ASSERT_TRUE(ReadExact(fd, buf.data(), buf.size()));
    const double seconds = static_cast<double>(NowNs() - t0) / 1e9;
    close(fd);
    EXPECT_GE(seconds, min_seconds(down.rate_bps, kBytes)) << "downlink beat its 16 Mbit/s rate";
  }
}

TEST(ShapingRelayTest, DelayAddsAtLeastTheOneWayDelaysToARoundTrip) {
  TestServer server(Echo);
  LinkDirection up, down;
  up.delay_ms = 15;
  down.delay_ms = 25;
  auto relay = StartRelay(server.address(), up, down);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  char buf[64] = {1};
  for (int i = 0; i < 5; ++i) {
    const int64_t t0 = NowNs();
    ASSERT_TRUE(WriteAll(fd, buf, sizeof(buf)));
    ASSERT_TRUE(ReadExact(fd, buf, sizeof(buf)));
    const double rtt_ms = static_cast<double>(NowNs() - t0) / 1e6;
    EXPECT_GE(rtt_ms, 40.0) << "ping " << i;
  }
  close(fd);
}

TEST(ShapingRelayTest, JitterDoesNotReorderMessages) {
  // The server returns each 8-byte sequence number it receives; jitter on both directions must not
  // change their order.
  TestServer server(Echo);
  LinkDirection up, down;
  up.delay_ms = 3;
  up.jitter_ms = 3;
  down.delay_ms = 3;
  down.jitter_ms = 3;
  auto relay = StartRelay(server.address(), up, down, 77);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  constexpr uint64_t kMessages = 2000;
  std::thread writer([&] {
    for (uint64_t i = 0; i < kMessages; ++i) {
      WriteAll(fd, &i, sizeof(i));
      if (i % 50 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
    shutdown(fd, SHUT_WR);
  });
  const auto back = ReadToEof(fd);
  writer.join();
  close(fd);
  ASSERT_EQ(back.size(), kMessages * sizeof(uint64_t));
  for (uint64_t i = 0; i < kMessages; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, back.data() + i * sizeof(uint64_t), sizeof(v));
    ASSERT_EQ(v, i) << "message " << i << " out of order";
  }
}

TEST(ShapingRelayTest, TraceReplayDeliversTheTracesBytesAtItsPace) {
  fl::testing::ScratchDir dir("trace");
  // 2 opportunities every 10 ms: 2 * 1448 payload bytes per 10 ms.
  {
    std::ofstream f(dir.File("t.trace"));
    f << "5\n5\n10\n10\n";  // 4 per 10 ms
  }
  auto trace = LoadMahimahiTrace(dir.File("t.trace"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  TestServer server([](int fd) {
    const auto got = ReadToEof(fd);
    const uint64_t n = got.size();
    const uint64_t sum = Sum(got);
    WriteAll(fd, &n, sizeof(n));
    WriteAll(fd, &sum, sizeof(sum));
  });
  LinkDirection up, down;
  up.has_trace = true;
  up.trace = *trace;
  auto relay = StartRelay(server.address(), up, down);
  ASSERT_NE(relay, nullptr);
  const size_t kBytes = 200'000;  // 139 opportunities = 35 trace periods
  const auto data = RandomBytes(kBytes, 3);
  const int fd = Connect(relay->port());
  const int64_t t0 = NowNs();
  ASSERT_TRUE(WriteAll(fd, data.data(), data.size()));
  shutdown(fd, SHUT_WR);
  uint64_t reply[2] = {0, 0};
  ASSERT_TRUE(ReadExact(fd, reply, sizeof(reply)));
  const double seconds = static_cast<double>(NowNs() - t0) / 1e9;
  close(fd);
  EXPECT_EQ(reply[0], kBytes);
  EXPECT_EQ(reply[1], Sum(data));
  const double opportunities = std::ceil(static_cast<double>(kBytes) / kMssBytes);
  // The first cycle's opportunities come at 5 and 10 ms; the last one needed is in cycle
  // ceil(opportunities / 4) - 1, at its 5 or 10 ms mark.
  const double min_seconds = (std::ceil(opportunities / 4) - 1) * 0.010 + 0.005;
  EXPECT_GE(seconds, min_seconds);
}

TEST(ShapingRelayTest, UnreachableTargetClosesTheClientAndCountsAFailure) {
  // A port that was free a moment ago: nothing listens there.
  int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
  close(probe);
  auto relay = StartRelay("127.0.0.1:" + std::to_string(ntohs(a.sin_port)), LinkDirection{}, LinkDirection{});
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ReadToEof(fd).empty());
  close(fd);
  EXPECT_EQ(relay->stats().connect_failures, 1u);
}

// With a retry budget, a target that starts listening only after the client connected is reached: the
// client's connection stays open and what it sent meanwhile arrives (islands bind their ring endpoint
// lazily, and ZeroMQ would take a dropped connection for a vanished peer).
TEST(ShapingRelayTest, TargetThatStartsLateIsRetriedWhileTheClientWaits) {
  const int port = fl::testing::FreeLoopbackPort();
  auto relay = StartRelay("127.0.0.1:" + std::to_string(port), LinkDirection{}, LinkDirection{}, 1,
                          /*connect_retry_ms=*/10000);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  const auto data = RandomBytes(100000, 7);
  ASSERT_TRUE(WriteAll(fd, data.data(), data.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(350));  // a few refused attempts
  TestServer late(Echo, port);
  shutdown(fd, SHUT_WR);
  const auto back = ReadToEof(fd);
  close(fd);
  EXPECT_EQ(back.size(), data.size());
  EXPECT_EQ(Sum(back), Sum(data));
  EXPECT_EQ(relay->stats().connect_failures, 0u);
}

// Past the budget the client's connection is closed and the failure counted.
TEST(ShapingRelayTest, RetryBudgetEndsWithTheClientClosed) {
  const int port = fl::testing::FreeLoopbackPort();
  auto relay = StartRelay("127.0.0.1:" + std::to_string(port), LinkDirection{}, LinkDirection{}, 1,
                          /*connect_retry_ms=*/300);
  ASSERT_NE(relay, nullptr);
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(ReadToEof(fd).empty());
  close(fd);
  EXPECT_EQ(relay->stats().connect_failures, 1u);
}

TEST(ShapingRelayTest, BadAddressesAreRejectedAndStopIsIdempotent) {
  RelayOptions o;
  o.target_addr = "127.0.0.1";  // no port
  auto r = ShapingRelay::Start(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("has no port"), std::string::npos);

  TestServer server(Echo);
  auto relay = StartRelay(server.address(), LinkDirection{}, LinkDirection{});
  ASSERT_NE(relay, nullptr);
  // A second relay cannot listen on the first one's port.
  o.target_addr = server.address();
  o.listen_addr = relay->address();
  auto clash = ShapingRelay::Start(o);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(std::string(clash.status().message()).find("cannot listen on"), std::string::npos);
  // Stop with a connection open, twice.
  const int fd = Connect(relay->port());
  ASSERT_GE(fd, 0);
  relay->Stop();
  relay->Stop();
  EXPECT_TRUE(ReadToEof(fd).empty());
  close(fd);
}

}  // namespace
}  // namespace fl::emulation
