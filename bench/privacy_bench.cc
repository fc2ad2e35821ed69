// The DP mechanisms' cost per update (privacy/, docs/privacy.md "What the mechanisms cost"), on the CNN's update
// (225,034 floats, the Fashion-MNIST model of the quickstart) and a 1M-float one (4 MiB), against a memcpy of the
// same bytes measured in the same run.
//
// Every benchmark counts 4 bytes per coordinate, so the ratio column reads "how fast compared with copying the
// update once". ClipToNorm restores the unclipped update outside the timed region (a clipped update would not be
// clipped again). The discrete Gaussian share is timed at a share std of 100 integer units (a secure aggregation
// scale of 2^10 per unit of C, σ = 1, 100 clients: 1024/√100 ≈ 100) and at fl-server's defaults (scale 2^16,
// σ = 1, C = 1, 10 clients: 65536/√10 ≈ 20,724); its cost grows only with log σ.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "fl/privacy/mechanisms.h"
#include "fl/privacy/noise_rng.h"
#include "ratio_reporter.h"

namespace {

constexpr int64_t kSize = 1 << 20;
constexpr int64_t kCnn = 225034;  // fl-client --model cnn's parameters

// The first n values of a fixed 1M-value update.
std::vector<float> Update(int64_t n) {
  static const std::vector<float> update = [] {
    std::mt19937 rng(42);
    std::normal_distribution<float> dist(0.0f, 1e-3f);
    std::vector<float> v(kSize);
    for (float& x : v) x = dist(rng);
    return v;
  }();
  return {update.begin(), update.begin() + n};
}

void SetBytes(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0) * 4);
}

void BM_Memcpy(benchmark::State& state) { fl::bench::MemcpyReference(state, Update(state.range(0))); }

void BM_L2Norm(benchmark::State& state) {
  const std::vector<float> in = Update(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(fl::privacy::L2Norm(in));
  SetBytes(state);
}

void BM_ClipToNorm(benchmark::State& state) {
  const std::vector<float> in = Update(state.range(0));
  std::vector<float> update = in;
  const double c = fl::privacy::L2Norm(in) / 2;  // always clipped
  for (auto _ : state) {
    auto clip = fl::privacy::ClipToNorm(update, c);
    if (!clip.ok() || !clip->clipped) std::abort();
    benchmark::ClobberMemory();
    state.PauseTiming();
    std::memcpy(update.data(), in.data(), in.size() * sizeof(float));
    state.ResumeTiming();
  }
  SetBytes(state);
}

void BM_GaussianNoise(benchmark::State& state) {
  std::vector<float> update = Update(state.range(0));
  fl::privacy::NoiseRng rng = fl::privacy::NoiseRng::FromSeed(1);
  for (auto _ : state) {
    if (!fl::privacy::AddGaussianNoise(update, 1e-3, rng).ok()) std::abort();
    benchmark::ClobberMemory();
  }
  SetBytes(state);
}

// Local DP as a client runs it: clip to C and add its own noise (the clip is a no-op after the first iteration, so
// this is the norm, a comparison and the noise).
void BM_LocalDp(benchmark::State& state) {
  std::vector<float> update = Update(state.range(0));
  fl::privacy::NoiseRng rng = fl::privacy::NoiseRng::FromSeed(2);
  for (auto _ : state) {
    if (!fl::privacy::ApplyLocalDp(update, 1e3, 0.5, 1e-5, rng).ok()) std::abort();
    benchmark::ClobberMemory();
  }
  SetBytes(state);
}

void BM_DiscreteGaussianShare(benchmark::State& state) {
  std::vector<uint32_t> quantised(static_cast<size_t>(state.range(0)), 1u << 31);
  fl::privacy::NoiseRng rng = fl::privacy::NoiseRng::FromSeed(3);
  for (auto _ : state) {
    if (!fl::privacy::AddDiscreteGaussianShare(quantised, static_cast<double>(state.range(1)), 1, rng).ok()) {
      std::abort();
    }
    benchmark::ClobberMemory();
  }
  SetBytes(state);
}

// The generator alone: 8 bytes of ChaCha20 keystream per coordinate (what one Gaussian deviate costs, roughly).
void BM_NoiseRngStream(benchmark::State& state) {
  fl::privacy::NoiseRng rng = fl::privacy::NoiseRng::FromSeed(4);
  for (auto _ : state) {
    uint64_t acc = 0;
    for (int64_t i = 0; i < state.range(0); ++i) acc ^= rng.Next64();
    benchmark::DoNotOptimize(acc);
  }
  SetBytes(state);
}

BENCHMARK(BM_Memcpy)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_L2Norm)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ClipToNorm)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_NoiseRngStream)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GaussianNoise)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LocalDp)->Arg(kCnn)->Arg(kSize)->Unit(benchmark::kMicrosecond);
// (n, share std): the size stays the last number, so that the ratio column finds its memcpy.
BENCHMARK(BM_DiscreteGaussianShare)
    ->ArgNames({"", "std"})
    ->Args({kCnn, 100})
    ->Args({kSize, 100})
    ->Args({kCnn, 20724})
    ->Args({kSize, 20724})
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy"); }
