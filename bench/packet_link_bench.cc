// The packet scheduler's cost (emulation/, docs/testbed.md "The scheduler"): 1500-byte packets through
// PacketLink::Offer + Deliver on a virtual clock, at a fixed rate and through a Mahimahi trace, against a memcpy
// of the same bytes measured in the same run.
//
// Each iteration offers a batch of kBatch packets, one every serialisation time (the link is kept busy but its
// queue never overflows), and delivers what left; the packet's bytes are copied into the vector Offer takes, as
// the TUN event loop does with what it read. Bytes are counted per packet offered (1500 each), so the ratio
// column reads "how fast compared with copying the packets once"; the items/s column is packets per second on
// one core.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fl/emulation/link_profile.h"
#include "fl/emulation/packet_link.h"
#include "ratio_reporter.h"

namespace {

constexpr int64_t kPacketBytes = 1500;
constexpr int64_t kBatch = 1024;

void Count(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0) * kPacketBytes);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<uint8_t> in(kPacketBytes, 0x45);
  std::vector<uint8_t> out(static_cast<size_t>(kPacketBytes * state.range(0)), 1);
  for (auto _ : state) {
    for (int64_t i = 0; i < state.range(0); ++i) std::memcpy(out.data() + i * kPacketBytes, in.data(), in.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  Count(state);
}

// Offers packets every `spacing_ns` of virtual time and delivers at each offer's time.
void Run(benchmark::State& state, const fl::emulation::LinkDirection& direction, int64_t spacing_ns) {
  auto link = fl::emulation::PacketLink::Create(direction, /*seed=*/1, /*start_ns=*/0);
  if (!link.ok()) std::abort();
  const std::vector<uint8_t> packet(kPacketBytes, 0x45);
  std::vector<fl::emulation::Packet> out;
  out.reserve(static_cast<size_t>(state.range(0)) * 2);
  int64_t now = 0;
  uint64_t delivered = 0;
  for (auto _ : state) {
    for (int64_t i = 0; i < state.range(0); ++i) {
      now += spacing_ns;
      link->Offer(now, packet);
      link->Deliver(now, &out);
    }
    delivered += out.size();
    out.clear();
  }
  if (link->stats().dropped_queue != 0 || delivered == 0) std::abort();  // the bench measures the path, not drops
  Count(state);
}

void BM_FixedRate(benchmark::State& state) {
  fl::emulation::LinkDirection d;
  d.rate_bps = 1e9;  // 12 us per 1500-byte packet
  d.delay_ms = 10;
  d.jitter_ms = 2;
  d.loss = 0.001;
  Run(state, d, 12'000);
}

void BM_Trace(benchmark::State& state) {
  // 12 opportunities every ms for a 100 ms period: 144 Mbit/s.
  fl::emulation::LinkDirection d;
  d.has_trace = true;
  d.trace.period_ms = 100;
  for (uint64_t ms = 1; ms <= 100; ++ms) {
    for (int k = 0; k < 12; ++k) d.trace.opportunities_ms.push_back(ms);
  }
  d.delay_ms = 10;
  d.jitter_ms = 2;
  d.burst_loss = {.p_good_to_bad = 0.001, .p_bad_to_good = 0.3, .loss_good = 0, .loss_bad = 0.5};
  Run(state, d, 1'000'000 / 12);
}

BENCHMARK(BM_Memcpy)->Arg(kBatch)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FixedRate)->Arg(kBatch)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Trace)->Arg(kBatch)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) { return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy"); }
