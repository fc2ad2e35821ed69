// Codec throughput against memcpy of the same fp32 buffer, at 1M and 25M values.
//
// Every benchmark counts n * 4 bytes per iteration (the fp32 size of the tensor, whatever the direction), so
// the ratio column reads "how fast compared with just copying the fp32 tensor". 1M values (4 MB) stays in
// the last-level cache of most servers; 25M (100 MB, a ResNet-scale model) goes to DRAM.
// Target: int8, int4 and fp4 Encode and Decode at >= 0.5x memcpy on one core.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fl/core/codec.h"
#include "ratio_reporter.h"

namespace {

constexpr int64_t kSizes[] = {1 << 20, 25'000'000};

// Gaussian values, like a pseudo-gradient; built once per size and shared by every benchmark.
const std::vector<float>& Input(size_t n) {
  static std::vector<std::unique_ptr<std::vector<float>>> cache;
  for (const auto& v : cache) {
    if (v->size() == n) return *v;
  }
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  auto v = std::make_unique<std::vector<float>>(n);
  for (float& x : *v) x = dist(rng);
  cache.push_back(std::move(v));
  return *cache.back();
}

std::unique_ptr<fl::core::Codec> Make(const std::string& spec) {
  auto codec = fl::core::MakeCodec(spec);
  if (!codec.ok()) std::abort();
  return std::move(*codec);
}

void BM_Memcpy(benchmark::State& state) {
  fl::bench::MemcpyReference(state, Input(static_cast<size_t>(state.range(0))));
}

void BM_Encode(benchmark::State& state, const std::string& spec) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto codec = Make(spec);
  const std::vector<float>& in = Input(n);
  std::vector<uint8_t> payload(codec->EncodedSize(n), 1);
  for (auto _ : state) {
    if (!codec->Encode(in, &payload).ok()) state.SkipWithError("encode failed");
    benchmark::DoNotOptimize(payload.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
  state.counters["payload_MB"] = static_cast<double>(payload.size()) / 1e6;
}

void BM_Decode(benchmark::State& state, const std::string& spec, bool accumulate) {
  const size_t n = static_cast<size_t>(state.range(0));
  const auto codec = Make(spec);
  std::vector<uint8_t> payload;
  if (!codec->Encode(Input(n), &payload).ok()) std::abort();
  std::vector<float> out(n, 0.0f);
  for (auto _ : state) {
    const absl::Status s = accumulate ? codec->DecodeAccumulate(payload, 0.25f, out) : codec->Decode(payload, out);
    if (!s.ok()) state.SkipWithError("decode failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}

void RegisterAll() {
  auto sizes = [](benchmark::internal::Benchmark* b) {
    for (int64_t n : kSizes) b->Arg(n);
    // Wall time, not CPU time: on a shared VM, time the core spends waiting on memory or stolen by the
    // hypervisor is part of what a caller waits for.
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  sizes(benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy));
  for (const char* spec : {"fp32", "fp16", "bf16", "int8", "int4", "fp4", "sign1"}) {
    const std::string s = spec;
    sizes(benchmark::RegisterBenchmark(("BM_Encode/" + s).c_str(), BM_Encode, s));
    sizes(benchmark::RegisterBenchmark(("BM_Decode/" + s).c_str(), BM_Decode, s, false));
    sizes(benchmark::RegisterBenchmark(("BM_DecodeAccumulate/" + s).c_str(), BM_Decode, s, true));
  }
}

}  // namespace

int main(int argc, char** argv) {
  RegisterAll();
  return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy");
}
