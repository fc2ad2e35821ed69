// Server-side aggregation throughput against memcpy of the same fp32 buffer, at 1M and 25M parameters.
//
// BM_WeightedMeanAdd is what the server does per accepted update when it holds decoded values: validate
// (size, weight, NaN/Inf, range) and accumulate w * x. BM_WeightedMeanAddEncoded is the server's actual path
// for a pseudo-gradient payload: validate and decode the codec payload into the aggregator's own buffer,
// then accumulate. Every benchmark counts n * 4 bytes per update, so the ratio column reads "how fast
// compared with just copying the update". Target: weighted accumulation at >= 0.5x memcpy on one core.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "ratio_reporter.h"

namespace {

constexpr int64_t kSizes[] = {1 << 20, 25'000'000};

std::shared_ptr<const fl::core::ModelSpec> Spec(size_t n) {
  auto spec = fl::core::ModelSpec::Create({{"w", {static_cast<int64_t>(n)}, fl::core::DType::kFloat32, 0}});
  if (!spec.ok()) std::abort();
  return std::make_shared<const fl::core::ModelSpec>(*spec);
}

std::vector<float> Gaussian(size_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  fl::bench::MemcpyReference(state, Gaussian(static_cast<size_t>(state.range(0))));
}

void BM_WeightedMeanAdd(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto spec = Spec(n);
  fl::core::WeightedMeanAggregator agg(spec);
  const std::vector<float> update = Gaussian(n);
  for (auto _ : state) {
    if (!agg.Add(update, 100.0, spec->fingerprint(), "bench").ok()) state.SkipWithError("add failed");
    if (agg.num_updates() + 1 >= fl::core::kMaxUpdatesPerAggregate) agg.Reset();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}

void BM_WeightedMeanAddEncoded(benchmark::State& state, const std::string& codec_name) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto spec = Spec(n);
  fl::core::WeightedMeanAggregator agg(spec);
  auto codec = fl::core::MakeCodec(codec_name);
  if (!codec.ok()) std::abort();
  std::vector<uint8_t> payload;
  if (!(*codec)->Encode(Gaussian(n), &payload).ok()) std::abort();
  for (auto _ : state) {
    if (!agg.AddEncoded(**codec, payload, 100.0, spec->fingerprint(), "bench").ok()) {
      state.SkipWithError("add failed");
    }
    if (agg.num_updates() + 1 >= fl::core::kMaxUpdatesPerAggregate) agg.Reset();
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}

void RegisterAll() {
  auto sizes = [](benchmark::internal::Benchmark* b) {
    for (int64_t n : kSizes) b->Arg(n);
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  };
  sizes(benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy));
  sizes(benchmark::RegisterBenchmark("BM_WeightedMeanAdd", BM_WeightedMeanAdd));
  for (const char* codec : {"fp32", "int8", "fp4"}) {
    sizes(benchmark::RegisterBenchmark((std::string("BM_WeightedMeanAddEncoded/") + codec).c_str(),
                                       BM_WeightedMeanAddEncoded, std::string(codec)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  RegisterAll();
  return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy");
}
