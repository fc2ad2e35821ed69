#include "fl/training/data/deterministic_random.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace fl::training::data {
namespace {

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^20 (fdlibm's constants).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;
constexpr double kSqrtHalf = 0.70710678118654752440;

// 1/n! for n = 0..kExpTerms, evaluated by the compiler (so identical everywhere).
constexpr int kExpTerms = 15;
constexpr std::array<double, kExpTerms + 1> InverseFactorials() {
  std::array<double, kExpTerms + 1> inv{};
  double factorial = 1.0;
  for (int n = 0; n <= kExpTerms; ++n) {
    if (n > 0) factorial *= n;  // exact: 15! < 2^53
    inv[n] = 1.0 / factorial;
  }
  return inv;
}
constexpr auto kInvFactorial = InverseFactorials();

double LogGammaShapeAtLeastOne(Engine& engine, double shape) {
  // Marsaglia & Tsang, "A simple method for generating gamma variables" (2000).
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0;
    double v = 0.0;
    do {
      x = StandardNormal(engine);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = UniformOpenDouble(engine);
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * (x2 * x2)) return Log(d) + Log(v);
    const double log_v = Log(v);
    if (Log(u) < 0.5 * x2 + d * (1.0 - v + log_v)) return Log(d) + log_v;
  }
}

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Engine MakeEngine(uint64_t seed, uint64_t stream) { return Engine(SplitMix64(seed + stream * 0x9e3779b97f4a7c15ULL)); }

double UniformDouble(Engine& engine) { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }

double UniformOpenDouble(Engine& engine) { return (static_cast<double>(engine() >> 11) + 0.5) * 0x1.0p-53; }

uint64_t UniformIndex(Engine& engine, uint64_t n) {
  // Accept x only in the top (2^64 - 2^64 mod n) values, a whole number of copies of [0, n).
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = engine();
    if (x >= threshold) return x % n;
  }
}

void Shuffle(Engine& engine, std::span<uint32_t> values) {
  for (size_t i = values.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(UniformIndex(engine, i));
    std::swap(values[i - 1], values[j]);
  }
}

double StandardNormal(Engine& engine) {
  for (;;) {
    const double u = 2.0 * UniformDouble(engine) - 1.0;
    const double v = 2.0 * UniformDouble(engine) - 1.0;
    const double s = u * u + v * v;
    if (s >= 1.0 || s == 0.0) continue;
    return u * std::sqrt(-2.0 * Log(s) / s);
  }
}

double LogGamma(Engine& engine, double shape) {
  if (!(shape > 0.0)) return std::numeric_limits<double>::quiet_NaN();
  if (shape >= 1.0) return LogGammaShapeAtLeastOne(engine, shape);
  const double log_boosted = LogGammaShapeAtLeastOne(engine, shape + 1.0);
  return log_boosted + Log(UniformOpenDouble(engine)) / shape;
}

double SampleGamma(Engine& engine, double shape) { return Exp(LogGamma(engine, shape)); }

double Log(double x) {
  if (std::isnan(x) || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  int exponent = 0;
  double m = std::frexp(x, &exponent);  // exact: x = m * 2^exponent, m in [0.5, 1)
  if (m < kSqrtHalf) {
    m *= 2.0;
    --exponent;
  }
  // m in [sqrt(1/2), sqrt(2)): log m = 2 atanh(f), f = (m - 1) / (m + 1), |f| < 0.172.
  const double f = (m - 1.0) / (m + 1.0);
  const double s = f * f;
  double p = 2.0 / 27.0;
  for (int k = 25; k >= 3; k -= 2) p = p * s + 2.0 / k;
  p = p * s + 2.0;
  const double log_m = f * p;
  const double e = static_cast<double>(exponent);
  return e * kLn2Hi + (e * kLn2Lo + log_m);
}

double Exp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.782712893383973096) return std::numeric_limits<double>::infinity();
  if (x < -745.133219101941108420) return 0.0;
  const double k = std::floor(x * kInvLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;  // |r| <= ~0.347
  double p = kInvFactorial[kExpTerms];
  for (int n = kExpTerms - 1; n >= 0; --n) p = p * r + kInvFactorial[n];
  return std::ldexp(p, static_cast<int>(k));
}

}  // namespace fl::training::data
