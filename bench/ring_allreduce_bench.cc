// Ring all-reduce goodput over loopback, against the bandwidth-optimal bound measured in the same run.
//
// Reference: BM_RawTcp sends the 100 MB fragment (25M fp32 values) once over a plain loopback TCP
// connection (one sender thread, one receiver thread, blocking send/recv of 4 MiB at a time): raw_bw.
// A ring all-reduce of M members must move at least 2(M-1)/M of the fragment out of every member, so its
// bandwidth-optimal time is 2(M-1)/M x size / raw_bw. Every BM_Ring counts exactly 2(M-1)/M x the fp32
// fragment size per iteration, so the ratio column of the table ("x BM_RawTcp") IS the fraction of that
// bound reached: 1.0 = as fast as raw TCP could move the bytes; target >= 0.7 for fp32.
// For int8/int4 the same column reads "relative to the fp32 bound" (> 1 means the smaller payload wins
// back more than encoding costs); the counter wire_bound_x compares with the bound for the bytes that
// codec actually puts on the wire (bytes_sent / raw_bw / time).
//
// BM_Ring/<codec> uses the out-of-place call AllReduce(id, key, in, out, ...) with `out` a buffer kept across
// exchanges (what a caller that double-buffers does: no final copy); BM_Ring/fp32_inplace uses the in-place
// AllReduce(values), which builds the result in scratch memory and copies it over `values` on success.
//
// All M members run in this process, one thread each, over 127.0.0.1 (each with its own ZeroMQ context
// and I/O thread): on a machine with fewer cores than 2M threads the members compete for CPU, which a real
// deployment (one member per host) does not. Iteration time = the slowest member (wall time of the
// exchange).
//
// BM_Ring/<codec>_curve: the same exchange with CurveZMQ on every connection (RingOptions::curve, what the islands
// run unless --insecure): the counter curve_x is its time over the plaintext BM_Ring/<codec> of the same M
// measured just before in the same run (> 1: what encryption and authentication cost).
//
// The process calls fl::diloco::TuneAllocatorForLargeMessages() first, as fl-island should; pass
// --default_malloc to measure with glibc's defaults.
// Run: ring_allreduce_bench --benchmark_repetitions=3 (see docs/diloco-ring.md for the figures).
#include <arpa/inet.h>
#include <time.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include <array>
#include <atomic>
#include <chrono>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_allreduce.h"
#include "ratio_reporter.h"

namespace {

constexpr int64_t kFragmentBytes = 100'000'000;  // 25M fp32 values
constexpr size_t kTcpChunk = size_t{4} << 20;

// Raw TCP bandwidth measured by BM_RawTcp in this run (bytes/s), for the wire_bound_x counters.
std::atomic<double> g_raw_tcp_rate{0.0};

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::abort();
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Uniform values in [-1e-3, 1e-3) (a cheap generator: 25M values per member are made per benchmark).
std::vector<float> RandomValues(size_t n, uint32_t seed) {
  uint64_t state = 0x9e3779b97f4a7c15ULL * (seed + 1);
  std::vector<float> v(n);
  for (float& x : v) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = (static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 2e-3f;
  }
  return v;
}

// CPU seconds used by the whole process (every thread, user + system), to see what an exchange costs in
// CPU beside its wall time: on a machine with fewer cores than threads the wall time hides that.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// A connected loopback TCP pair: {sending end, receiving end}.
std::pair<int, int> LoopbackPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::abort();
  }
  const int sender = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();
  const int receiver = accept(listener, nullptr, nullptr);
  if (receiver < 0) std::abort();
  close(listener);
  const int one = 1;
  setsockopt(sender, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return {sender, receiver};
}

void SendAll(int fd, const uint8_t* data, size_t bytes) {
  for (size_t sent = 0; sent < bytes;) {
    const ssize_t w = send(fd, data + sent, std::min(kTcpChunk, bytes - sent), 0);
    if (w <= 0) std::abort();
    sent += static_cast<size_t>(w);
  }
}

void RecvAll(int fd, uint8_t* data, size_t bytes) {
  for (size_t got = 0; got < bytes;) {
    const ssize_t r = recv(fd, data + got, std::min(kTcpChunk, bytes - got), 0);
    if (r <= 0) std::abort();
    got += static_cast<size_t>(r);
  }
}

// One sender, one receiver, one loopback TCP connection: the bytes a ring member would send, sent raw.
void BM_RawTcp(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const auto [sender, receiver] = LoopbackPair();
  std::vector<uint8_t> out(bytes, 1), in(bytes, 0);  // touched: page faults are not measured
  double total_s = 0, cpu_s = 0;
  for (auto _ : state) {
    const double cpu0 = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::thread reader([&, fd = receiver] { RecvAll(fd, in.data(), bytes); });
    SendAll(sender, out.data(), bytes);
    reader.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    total_s += seconds;
    cpu_s += ProcessCpuSeconds() - cpu0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["cpu_s"] = cpu_s / static_cast<double>(state.iterations());
  if (total_s > 0) g_raw_tcp_rate = static_cast<double>(state.iterations()) * static_cast<double>(bytes) / total_s;
  close(sender);
  close(receiver);
}

// The transport-only ring on this machine: M members over raw loopback TCP, all at once, each sending
// 2(M-1)/M of the fragment to its successor while receiving as much from its predecessor (2M threads). No
// codec, no reduction: what the ring's traffic costs here when every member shares this machine's cores.
void BM_RawTcpRing(benchmark::State& state) {
  const auto m = static_cast<size_t>(state.range(0));
  const auto bytes = static_cast<size_t>(2.0 * static_cast<double>(m - 1) / static_cast<double>(m) *
                                         static_cast<double>(state.range(1)));
  std::vector<std::pair<int, int>> links;  // link i: member i -> member i+1
  for (size_t i = 0; i < m; ++i) links.push_back(LoopbackPair());
  std::vector<std::vector<uint8_t>> out(m, std::vector<uint8_t>(bytes, 1)), in(m, std::vector<uint8_t>(bytes, 0));
  double cpu_s = 0;
  for (auto _ : state) {
    const double cpu0 = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] { SendAll(links[i].first, out[i].data(), bytes); });
      threads.emplace_back([&, i] { RecvAll(links[i].second, in[i].data(), bytes); });
    }
    for (auto& t : threads) t.join();
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    cpu_s += ProcessCpuSeconds() - cpu0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  state.counters["cpu_s"] = cpu_s / static_cast<double>(state.iterations());
  for (auto& [a, b] : links) {
    close(a);
    close(b);
  }
}

// M members reduce a fragment of range(1) bytes of fp32 values (mean), codec `codec`. By default with the
// out-of-place call (the result goes into a separate buffer of the caller, no final copy); `in_place` uses
// AllReduce(values), which builds the result in scratch memory and copies it over `values` at the end.
// Seconds per exchange of the plaintext BM_Ring/<codec> (one connection, out of place) by "<codec>/<M>", for the
// CURVE variants' curve_x.
fl::Mutex g_plain_mu;
std::map<std::string, double> g_plain_seconds ABSL_GUARDED_BY(g_plain_mu);

void BM_Ring(benchmark::State& state, const std::string& codec, int connections, bool in_place, bool curve = false) {
  const auto m = static_cast<size_t>(state.range(0));
  const auto n = static_cast<size_t>(state.range(1)) / sizeof(float);
  std::vector<fl::diloco::RingMember> members;
  for (size_t i = 0; i < m; ++i) {
    members.push_back({fl::StrCat("m", i), fl::StrCat("tcp://127.0.0.1:", FreeLoopbackPort())});
  }
  std::vector<std::string> public_keys, secret_keys;
  for (size_t i = 0; curve && i < m; ++i) {
    std::array<char, 41> pub{}, sec{};
    if (zmq_curve_keypair(pub.data(), sec.data()) != 0) {
      state.SkipWithError("zmq_curve_keypair failed: this libzmq lacks CURVE");
      return;
    }
    public_keys.emplace_back(pub.data(), 40);
    secret_keys.emplace_back(sec.data(), 40);
  }
  std::vector<std::unique_ptr<fl::diloco::RingAllReduce>> rings;
  for (size_t i = 0; i < m; ++i) {
    fl::diloco::RingOptions o;
    o.members = members;
    o.self = i;
    o.codec = codec;
    o.connections_per_peer = connections;
    o.timeout = absl::Seconds(120);
    if (curve) o.curve = fl::diloco::RingCurve{secret_keys[i], public_keys};
    // FL_RING_SUB_CHUNK_VALUES: values per message (pipelining granularity), to compare against the default.
    if (const char* sub = std::getenv("FL_RING_SUB_CHUNK_VALUES"); sub != nullptr) {
      o.sub_chunk_values = static_cast<size_t>(std::strtoull(sub, nullptr, 10));
    }
    auto ring = fl::diloco::RingAllReduce::Create(o);
    if (!ring.ok()) {
      state.SkipWithError(std::string(fl::ToStd(ring.status().message())).c_str());
      return;
    }
    rings.push_back(std::move(*ring));
  }
  std::vector<std::vector<float>> values, results(m, std::vector<float>(n, 0.0f));  // touched: no page faults
  for (size_t i = 0; i < m; ++i) values.push_back(RandomValues(n, static_cast<uint32_t>(i + 1)));
  const auto exchange_on = [&](size_t i, uint64_t id, fl::diloco::ExchangeStats* st) {
    return in_place ? rings[i]->AllReduce(id, 0, values[i], fl::diloco::ReduceOp::kMean, st)
                    : rings[i]->AllReduce(id, 0, std::span<const float>(values[i]), results[i],
                                          fl::diloco::ReduceOp::kMean, st);
  };
  std::vector<fl::diloco::ExchangeStats> stats(m);
  std::vector<absl::Status> status(m);
  uint64_t exchange = 0;
  // One untimed exchange first: a ring is built once and reused for every outer step, so the steady state
  // (scratch vectors, pooled send buffers and connections already there) is what counts.
  {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] { status[i] = exchange_on(i, 1, nullptr); });
    }
    for (auto& t : threads) t.join();
    exchange = 1;
    for (size_t i = 0; i < m; ++i) {
      if (!status[i].ok()) {
        state.SkipWithError(std::string(fl::ToStd(status[i].message())).c_str());
        return;
      }
    }
  }
  double wire_bytes = 0, encode_s = 0, decode_s = 0, total_s = 0, cpu_s = 0;
  for (auto _ : state) {
    ++exchange;
    const double cpu0 = ProcessCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] { status[i] = exchange_on(i, exchange, &stats[i]); });
    }
    for (auto& t : threads) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(seconds);
    cpu_s += ProcessCpuSeconds() - cpu0;
    for (size_t i = 0; i < m; ++i) {
      if (!status[i].ok()) {
        state.SkipWithError(std::string(fl::ToStd(status[i].message())).c_str());
        return;
      }
    }
    total_s += seconds;
    wire_bytes += static_cast<double>(stats[0].bytes_sent);
    encode_s += stats[0].encode_seconds;
    decode_s += stats[0].decode_seconds;
  }
  const double share = 2.0 * static_cast<double>(m - 1) / static_cast<double>(m);
  state.SetBytesProcessed(
      static_cast<int64_t>(static_cast<double>(state.iterations()) * share * static_cast<double>(n * sizeof(float))));
  const auto iters = static_cast<double>(state.iterations());
  state.counters["wire_MB"] = wire_bytes / iters / 1e6;
  state.counters["encode_s"] = encode_s / iters;
  state.counters["decode_s"] = decode_s / iters;
  state.counters["cpu_s"] = cpu_s / iters;
  if (const double raw = g_raw_tcp_rate.load(); raw > 0) {
    state.counters["wire_bound_x"] = (wire_bytes / raw) / total_s;
  }
  const std::string key = fl::StrCat(codec, "/", m);
  fl::MutexLock lock(g_plain_mu);
  if (!curve && connections == 1 && !in_place) g_plain_seconds[key] = total_s / iters;
  if (curve && g_plain_seconds.count(key) != 0) state.counters["curve_x"] = (total_s / iters) / g_plain_seconds[key];
}

}  // namespace

int main(int argc, char** argv) {
  // --default_malloc: leave glibc's allocator as it is (see TuneAllocatorForLargeMessages) to measure its cost.
  bool tune_malloc = true;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--default_malloc") {
      tune_malloc = false;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  }
  if (tune_malloc && !fl::diloco::TuneAllocatorForLargeMessages()) std::fprintf(stderr, "mallopt failed\n");
  std::printf("allocator: %s\n", tune_malloc ? "tuned (TuneAllocatorForLargeMessages)" : "glibc defaults");
  // Registered in this order so that BM_RawTcp runs first and its rate is known to the ring benchmarks.
  benchmark::RegisterBenchmark("BM_RawTcp", BM_RawTcp)
      ->Arg(kFragmentBytes)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(5);
  benchmark::RegisterBenchmark("BM_RawTcpRing", BM_RawTcpRing)
      ->Args({2, kFragmentBytes})
      ->Args({4, kFragmentBytes})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(3);
  struct Variant {
    std::string codec;
    int connections;
    bool in_place;
    bool curve = false;
  };
  // Each _curve variant after its plaintext one: curve_x needs the plaintext time of the same run.
  for (const Variant& v : std::vector<Variant>{{"fp32", 1, false},
                                               {"fp32", 1, false, true},
                                               {"fp32", 1, true},
                                               {"fp32", 2, false},
                                               {"int8", 1, false},
                                               {"int8", 1, false, true},
                                               {"int4", 1, false}}) {
    const std::string name =
        fl::StrCat("BM_Ring/", v.codec, v.connections == 1 ? "" : fl::StrCat("_x", v.connections, "conn"),
                   v.in_place ? "_inplace" : "", v.curve ? "_curve" : "");
    benchmark::RegisterBenchmark(name.c_str(),
                                 [v](benchmark::State& s) { BM_Ring(s, v.codec, v.connections, v.in_place, v.curve); })
        ->Args({2, kFragmentBytes})
        ->Args({4, kFragmentBytes})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_RawTcp");
}
