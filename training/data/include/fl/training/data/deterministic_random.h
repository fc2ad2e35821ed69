// Random sampling that gives bit-identical results on every platform and standard library.
//
// The standard's engines (std::mt19937_64) are fully specified, but its distributions
// (std::uniform_int_distribution, std::gamma_distribution, ...) are not: libstdc++, libc++ and MSVC give
// different values for the same engine state. Partitions of a dataset across clients are part of an
// experiment's record and must replay exactly, so every sampler the partitioners use lives here, built from
// the raw 64-bit engine outputs and IEEE-754 +, -, *, / and sqrt only (all correctly rounded). Log and Exp
// are our own polynomial implementations for the same reason: libm's may differ in the last bit between
// platforms or CPU feature sets. This library is compiled with -ffp-contract=off so that no fused
// multiply-add changes the rounding on one target but not another.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace fl::training::data {

using Engine = std::mt19937_64;

// An engine for (seed, stream): different streams of one seed are independent. The engine is seeded with
// SplitMix64(seed + stream * golden ratio), so nearby seeds also give unrelated streams.
Engine MakeEngine(uint64_t seed, uint64_t stream);

uint64_t SplitMix64(uint64_t x);

// Uniform in [0, 1) with 53 random bits.
double UniformDouble(Engine& engine);
// Uniform in the open interval (0, 1): never 0, never 1 (safe for Log).
double UniformOpenDouble(Engine& engine);
// Uniform integer in [0, n), unbiased (rejection), n >= 1.
uint64_t UniformIndex(Engine& engine, uint64_t n);
// Fisher-Yates shuffle (Durstenfeld's version, from the back).
void Shuffle(Engine& engine, std::span<uint32_t> values);
// Standard normal (Marsaglia's polar method).
double StandardNormal(Engine& engine);
// log of a Gamma(shape, 1) draw, shape > 0 (Marsaglia & Tsang 2000; for shape < 1, the boost
// Gamma(a) = Gamma(a + 1) * U^(1/a), kept in log space so that tiny shapes do not underflow to 0).
double LogGamma(Engine& engine, double shape);
// A Gamma(shape, 1) draw (may underflow to 0 for very small shapes: prefer LogGamma).
double SampleGamma(Engine& engine, double shape);

// Natural log and exp from +, -, *, / only (relative error ~1e-16), identical on every IEEE-754 platform.
double Log(double x);  // x > 0 (returns -inf for 0, NaN for negative)
double Exp(double x);

}  // namespace fl::training::data
