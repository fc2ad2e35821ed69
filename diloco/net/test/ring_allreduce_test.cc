// Ring all-reduce results: real members over loopback ZeroMQ, one thread each, against a naive reference.
#include "fl/diloco/net/ring_allreduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/codec.h"
#include "ring_test_util.h"

namespace fl::diloco {
namespace {

using testing::BitEqual;
using testing::CreateAll;
using testing::RandomValues;
using testing::RingOf;
using testing::RunExchange;

// The documented order: chunk c is the left fold x_c + x_{c+1} + ... + x_{c-1} (mod M) in fp32, then one
// division by float(M) for the mean.
std::vector<float> FoldReference(const std::vector<std::vector<float>>& x, ReduceOp op) {
  const size_t m = x.size();
  const size_t n = x[0].size();
  std::vector<float> out(n);
  for (size_t c = 0; c < m; ++c) {
    const ValueRange r = RingChunk(n, m, c);
    for (size_t i = r.begin; i < r.end; ++i) {
      float acc = x[c][i];
      for (size_t k = 1; k < m; ++k) acc += x[(c + k) % m][i];
      out[i] = op == ReduceOp::kMean ? acc / static_cast<float>(m) : acc;
    }
  }
  return out;
}

// The exact mean/sum in double (no summation-order question at all).
std::vector<double> ExactReference(const std::vector<std::vector<float>>& x, ReduceOp op) {
  std::vector<double> out(x[0].size(), 0.0);
  for (const auto& v : x) {
    for (size_t i = 0; i < v.size(); ++i) out[i] += v[i];
  }
  if (op == ReduceOp::kMean) {
    for (double& v : out) v /= static_cast<double>(x.size());
  }
  return out;
}

std::vector<std::vector<float>> Inputs(size_t m, size_t n, uint32_t seed) {
  std::vector<std::vector<float>> x;
  for (size_t i = 0; i < m; ++i) x.push_back(RandomValues(n, seed + 101 * static_cast<uint32_t>(i)));
  return x;
}

TEST(RingChunkTest, CoversTheVectorWithChunksDifferingByAtMostOne) {
  for (size_t m = 1; m <= 6; ++m) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{5}, size_t{17}, size_t{1000}}) {
      size_t next = 0, smallest = n, largest = 0;
      for (size_t c = 0; c < m; ++c) {
        const ValueRange r = RingChunk(n, m, c);
        EXPECT_EQ(r.begin, next) << "m=" << m << " n=" << n << " chunk " << c;
        next = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(largest - smallest, 1u);
    }
  }
}

// fp32: bit for bit the documented left fold on every member, for M = 1..5 and sizes not divisible by M
// (size < M included, so some chunks are empty), with small sub-chunks so that chunks span several messages.
TEST(RingAllReduceTest, Fp32EqualsTheRingOrderFoldBitForBitOnEveryMember) {
  for (size_t m = 1; m <= 5; ++m) {
    for (size_t n : {size_t{1}, m > 1 ? m - 1 : size_t{2}, size_t{7}, size_t{1001}}) {
      for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum}) {
        SCOPED_TRACE(fl::StrCat("M=", m, " n=", n, op == ReduceOp::kMean ? " mean" : " sum"));
        RingOptions base;
        base.sub_chunk_values = 64;
        auto rings = CreateAll(RingOf(m, base));
        ASSERT_EQ(rings.size(), m);
        const auto x = Inputs(m, n, static_cast<uint32_t>(7 * m + n));
        auto values = x;
        const auto result = RunExchange(rings, 1, values, op);
        const std::vector<float> want = FoldReference(x, op);
        const std::vector<double> exact = ExactReference(x, op);
        for (size_t i = 0; i < m; ++i) {
          ASSERT_TRUE(result.status[i].ok()) << "member " << i << ": " << result.status[i];
          EXPECT_TRUE(BitEqual(values[i], want)) << "member " << i << " differs from the ring-order fold";
          // And the fold is the mean/sum up to fp32 rounding of M-1 additions (a sanity check of the
          // reference itself, loose on purpose: values span six decades).
          for (size_t k = 0; k < n; ++k) {
            double scale = 0;
            for (size_t j = 0; j < m; ++j) scale += std::fabs(x[j][k]);
            EXPECT_NEAR(values[i][k], exact[k], scale * 1e-6 + 1e-30) << "value " << k;
          }
        }
      }
    }
  }
}

// The out-of-place call: the same bits as the in-place one (fp32: the fold; int8: what the in-place call
// gives for the same inputs), `in` untouched, several exchanges on the same rings (scratch and zero-copy
// buffers reused).
TEST(RingAllReduceTest, OutOfPlaceGivesTheInPlaceBitsAndLeavesTheInputAlone) {
  for (const std::string codec : {"fp32", "int8"}) {
    for (size_t m = 1; m <= 4; ++m) {
      SCOPED_TRACE(fl::StrCat(codec, " M=", m));
      RingOptions base;
      base.codec = codec;
      base.sub_chunk_values = 300;
      auto rings = CreateAll(RingOf(m, base));
      ASSERT_EQ(rings.size(), m);
      const auto x = Inputs(m, 5003, static_cast<uint32_t>(m));
      auto in_place = x;
      const auto first = RunExchange(rings, 1, in_place, ReduceOp::kMean);
      for (size_t i = 0; i < m; ++i) ASSERT_TRUE(first.status[i].ok()) << first.status[i];
      if (codec == "fp32") {
        for (size_t i = 0; i < m; ++i) EXPECT_TRUE(BitEqual(in_place[i], FoldReference(x, ReduceOp::kMean)));
      }
      for (uint64_t exchange = 2; exchange <= 3; ++exchange) {
        auto in = x;
        std::vector<std::vector<float>> out(m, std::vector<float>(x[0].size(), -1.0f));
        std::vector<absl::Status> status(m);
        std::vector<std::thread> threads;
        for (size_t i = 0; i < m; ++i) {
          threads.emplace_back([&, i] {
            status[i] =
                rings[i]->AllReduce(exchange, 0, std::span<const float>(in[i]), out[i], ReduceOp::kMean, nullptr);
          });
        }
        for (auto& t : threads) t.join();
        for (size_t i = 0; i < m; ++i) {
          ASSERT_TRUE(status[i].ok()) << status[i];
          EXPECT_TRUE(BitEqual(out[i], in_place[i])) << "member " << i << " exchange " << exchange;
          EXPECT_TRUE(BitEqual(in[i], x[i])) << "member " << i << " changed its input";
        }
      }
    }
  }
}

// fp32 sends straight from the caller's memory: once AllReduce has returned the caller may scribble over
// `in` and `out` at once, and no other member may see it (each member trashes its buffers the moment its
// own call returns, while the others may still be receiving).
TEST(RingAllReduceTest, TheCallersBuffersAreFreeTheMomentAllReduceReturns) {
  const size_t m = 3, n = 1 << 20;
  RingOptions base;
  base.sub_chunk_values = 1 << 14;
  auto rings = CreateAll(RingOf(m, base));
  ASSERT_EQ(rings.size(), m);
  const auto x = Inputs(m, n, 9);
  const auto want = FoldReference(x, ReduceOp::kSum);
  for (uint64_t exchange = 1; exchange <= 3; ++exchange) {
    auto in = x;
    std::vector<std::vector<float>> out(m, std::vector<float>(n)), kept(m);
    std::vector<absl::Status> status(m);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] {
        status[i] = rings[i]->AllReduce(exchange, 0, std::span<const float>(in[i]), out[i], ReduceOp::kSum, nullptr);
        kept[i] = out[i];
        std::fill(out[i].begin(), out[i].end(), std::numeric_limits<float>::quiet_NaN());
        std::fill(in[i].begin(), in[i].end(), 1e30f);
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < m; ++i) {
      ASSERT_TRUE(status[i].ok()) << status[i];
      EXPECT_TRUE(BitEqual(kept[i], want)) << "member " << i << " exchange " << exchange;
    }
  }
}

TEST(RingAllReduceTest, OutOfPlaceRejectsMismatchedOrOverlappingSpans) {
  auto rings = CreateAll(RingOf(1));
  ASSERT_EQ(rings.size(), 1u);
  std::vector<float> a = RandomValues(100, 1), b(99);
  absl::Status s = rings[0]->AllReduce(1, 0, std::span<const float>(a), b, ReduceOp::kMean, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(testing::Msg(s).find("in has 100 values but out has 99"), std::string::npos) << s;
  s = rings[0]->AllReduce(2, 0, std::span<const float>(a.data(), 50), std::span<float>(a.data() + 10, 50),
                          ReduceOp::kMean, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(testing::Msg(s).find("overlap"), std::string::npos) << s;
  // The same span is the in-place call (a ring of one with fp32: the identity).
  const std::vector<float> before = a;
  EXPECT_TRUE(rings[0]->AllReduce(3, 0, std::span<const float>(a), a, ReduceOp::kMean, nullptr).ok());
  EXPECT_TRUE(BitEqual(a, before));
}

// Several connections per peer: sub-chunks arrive out of order over the stripes and still land in place.
TEST(RingAllReduceTest, StripedOverSeveralConnectionsGivesTheSameBits) {
  const size_t m = 3, n = 20011;
  RingOptions base;
  base.connections_per_peer = 3;
  base.sub_chunk_values = 97;
  auto rings = CreateAll(RingOf(m, base));
  ASSERT_EQ(rings.size(), m);
  const auto x = Inputs(m, n, 5);
  for (uint64_t exchange = 1; exchange <= 3; ++exchange) {
    auto values = x;
    const auto result = RunExchange(rings, exchange, values, ReduceOp::kMean);
    const auto want = FoldReference(x, ReduceOp::kMean);
    for (size_t i = 0; i < m; ++i) {
      ASSERT_TRUE(result.status[i].ok()) << result.status[i];
      EXPECT_TRUE(BitEqual(values[i], want)) << "member " << i << " exchange " << exchange;
    }
  }
}

// Per-value error bound of one encoding with each codec, relative to the absmax of the encoded values
// (codec.h): int8 1/254, int4 1/14, fp4 1/6 (half the widest E2M1 gap), bf16 2^-9 (round to nearest, 8
// significand bits).
double CodecRelativeBound(const std::string& spec) {
  if (spec.rfind("int8", 0) == 0) return 1.0 / 254;
  if (spec.rfind("int4", 0) == 0) return 1.0 / 14;
  if (spec.rfind("fp4", 0) == 0) return 1.0 / 6;
  if (spec == "bf16") return 1.0 / 256;
  return 0;
}

// Lossy codecs: bit-identical on every member (the owner decodes the bytes it sends), and within the
// sum of the per-hop bounds of the exact mean/sum. Chunk c is encoded M-1 times in the reduce-scatter
// (partial sums, |partial| <= G = sum_k max|x_k|, plus the errors so far) and once in the all-gather (the
// mean, <= G/M): |error of the sum| <= (M-1) G e (1 + M e) + G e, i.e. M G e (1 + M e); a mean divides it by
// M. A 1% margin covers the codecs' own fp slack (a few ulp of x/scale).
TEST(RingAllReduceTest, LossyCodecsAreBitIdenticalEverywhereAndWithinTheirBound) {
  for (const std::string codec : {"bf16", "int8", "int8:64", "int4", "fp4"}) {
    for (size_t m = 1; m <= 5; ++m) {
      for (size_t n : {m > 1 ? m - 1 : size_t{1}, size_t{3001}}) {
        for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum}) {
          SCOPED_TRACE(fl::StrCat(codec, " M=", m, " n=", n, op == ReduceOp::kMean ? " mean" : " sum"));
          RingOptions base;
          base.codec = codec;
          base.sub_chunk_values = 500;
          auto rings = CreateAll(RingOf(m, base));
          ASSERT_EQ(rings.size(), m);
          const auto x = Inputs(m, n, static_cast<uint32_t>(m * 13 + n));
          auto values = x;
          const auto result = RunExchange(rings, 42, values, op);
          const std::vector<double> exact = ExactReference(x, op);
          double g = 0;
          for (const auto& v : x)
            g += std::fabs(
                *std::max_element(v.begin(), v.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
          const double e = CodecRelativeBound(codec);
          double bound = static_cast<double>(m) * g * e * (1 + static_cast<double>(m) * e) * 1.01;
          if (op == ReduceOp::kMean) bound /= static_cast<double>(m);
          for (size_t i = 0; i < m; ++i) {
            ASSERT_TRUE(result.status[i].ok()) << "member " << i << ": " << result.status[i];
            EXPECT_TRUE(BitEqual(values[i], values[0])) << "member " << i << " differs from member 0";
          }
          double worst = 0;
          for (size_t k = 0; k < n; ++k) worst = std::max(worst, std::fabs(values[0][k] - exact[k]));
          EXPECT_LE(worst, bound);
        }
      }
    }
  }
}

// Each member sends exactly its M-1 reduce-scatter and M-1 all-gather messages, which is 2(M-1)/M of the
// encoded vector plus headers; and receives exactly what its predecessor sent.
TEST(RingAllReduceTest, BytesSentAreTheBandwidthOptimalShare) {
  const size_t n = 1000003;
  for (const std::string codec : {"fp32", "int8", "int4"}) {
    for (size_t m = 2; m <= 5; ++m) {
      SCOPED_TRACE(fl::StrCat(codec, " M=", m));
      RingOptions base;
      base.codec = codec;
      base.sub_chunk_values = 65536;
      auto rings = CreateAll(RingOf(m, base));
      ASSERT_EQ(rings.size(), m);
      auto values = Inputs(m, n, 3);
      const auto result = RunExchange(rings, 1, values, ReduceOp::kMean);
      auto encoder = fl::core::MakeCodec(codec);
      ASSERT_TRUE(encoder.ok());
      const double optimal =
          2.0 * static_cast<double>(m - 1) / static_cast<double>(m) * static_cast<double>((*encoder)->EncodedSize(n));
      for (size_t i = 0; i < m; ++i) {
        ASSERT_TRUE(result.status[i].ok()) << result.status[i];
        auto want = RingBytesSentPerMember(n, m, i, codec, base.sub_chunk_values);
        ASSERT_TRUE(want.ok()) << want.status();
        EXPECT_EQ(result.stats[i].bytes_sent, *want) << "member " << i;
        EXPECT_EQ(result.stats[i].bytes_received, result.stats[(i + m - 1) % m].bytes_sent) << "member " << i;
        // Within 1% of 2(M-1)/M x encoded size: the rest is 64 + 32 header bytes per message and the scales
        // of blocks cut by chunk/sub-chunk boundaries (~0.2% here, with 256 KiB of fp32 per message).
        EXPECT_NEAR(static_cast<double>(result.stats[i].bytes_sent), optimal, optimal * 0.01) << "member " << i;
        EXPECT_GT(result.stats[i].seconds, 0.0);
        EXPECT_GT(result.stats[i].encode_seconds, 0.0);
        EXPECT_GT(result.stats[i].decode_seconds, 0.0);
      }
    }
  }
}

// Error feedback with int4: the same vectors exchanged T times; the running mean of the results converges to
// the true mean (the residual re-injects what the codec lost), whereas without feedback the same bias
// repeats every time. |avg_T - mean| <= (largest residual)/(M T), and a residual is at most one exchange's
// error in sum units, so the bound is 2 x (one exchange's bound) / T with margin.
TEST(RingAllReduceTest, ErrorFeedbackMakesTheRunningMeanConvergeWithInt4) {
  const size_t m = 3, n = 2000;
  const int rounds = 200;
  const auto x = Inputs(m, n, 11);
  const std::vector<double> exact = ExactReference(x, ReduceOp::kMean);
  double g = 0;
  for (const auto& v : x) {
    double a = 0;
    for (float f : v) a = std::max(a, static_cast<double>(std::fabs(f)));
    g += a;
  }
  const double one_exchange_bound = g / 14 * (1 + 3.0 / 14) * 1.01;  // the mean's bound above

  const auto run = [&](bool feedback) {
    RingOptions base;
    base.codec = "int4";
    base.error_feedback = feedback;
    auto rings = CreateAll(RingOf(m, base));
    std::vector<std::vector<double>> sums(m, std::vector<double>(n, 0.0));
    std::vector<std::thread> threads;
    std::vector<absl::Status> status(m);
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] {
        for (int t = 0; t < rounds && status[i].ok(); ++t) {
          std::vector<float> v = x[i];
          status[i] = rings[i]->AllReduce(100 + t, /*residual_key=*/7, v, ReduceOp::kMean, nullptr);
          for (size_t k = 0; k < n; ++k) sums[i][k] += v[k];
        }
      });
    }
    for (auto& th : threads) th.join();
    for (size_t i = 0; i < m; ++i) EXPECT_TRUE(status[i].ok()) << status[i];
    for (size_t i = 1; i < m; ++i) EXPECT_EQ(sums[i], sums[0]) << "member " << i;
    double worst = 0;
    for (size_t k = 0; k < n; ++k) worst = std::max(worst, std::fabs(sums[0][k] / rounds - exact[k]));
    return worst;
  };
  const double with_feedback = run(true);
  const double without = run(false);
  EXPECT_LE(with_feedback, 2 * one_exchange_bound * m / rounds)
      << "without feedback: " << without << ", one exchange's bound: " << one_exchange_bound;
  EXPECT_LT(with_feedback * 10, without);
}

// A residual key keeps its size; ResetResidual frees it for another.
TEST(RingAllReduceTest, ResidualKeyWithAnotherSizeIsRejectedUntilReset) {
  RingOptions base;
  base.codec = "int8";
  base.error_feedback = true;
  auto rings = CreateAll(RingOf(1, base));
  ASSERT_EQ(rings.size(), 1u);
  std::vector<float> a = RandomValues(100, 1), b = RandomValues(50, 2);
  ASSERT_TRUE(rings[0]->AllReduce(1, 3, a, ReduceOp::kMean, nullptr).ok());
  const std::vector<float> before = b;
  const absl::Status s = rings[0]->AllReduce(2, 3, b, ReduceOp::kMean, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(testing::Msg(s).find("ResetResidual(3)"), std::string::npos) << s;
  EXPECT_TRUE(BitEqual(b, before));
  rings[0]->ResetResidual(3);
  EXPECT_TRUE(rings[0]->AllReduce(3, 3, b, ReduceOp::kMean, nullptr).ok());
}

}  // namespace
}  // namespace fl::diloco
