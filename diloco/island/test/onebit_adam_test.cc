// 1-bit Adam's arithmetic (onebit_adam.h) with the real ring between islands run as threads in this process:
// its loss against exact data-parallel Adam on a small seeded problem, bit-identical state across islands,
// the state image a joining island loads, and every bad option.
#include "fl/diloco/island/onebit_adam.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <optional>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_allreduce.h"
#include "fl/testing/subprocess.h"

namespace fl::diloco {
namespace {

std::string Msg(const absl::Status& s) { return std::string(fl::ToStd(s.message())); }

// A small seeded problem: softmax regression, 16 features -> 8 classes (136 parameters), labels from a fixed
// random teacher; each island draws its own batches (different seeds: its own data stream, as islands do).
class Problem {
 public:
  static constexpr size_t kIn = 16, kOut = 8, kParams = kIn * kOut + kOut;
  Problem() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    teacher_.resize(kParams);
    for (float& t : teacher_) t = normal(rng);
    eval_ = Sample(rng, 512);
  }
  struct Batch {
    std::vector<float> x;
    std::vector<int> y;
  };
  Batch Sample(std::mt19937& rng, size_t n) const {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Batch b;
    b.x.resize(n * kIn);
    for (float& v : b.x) v = normal(rng);
    for (size_t i = 0; i < n; ++i) b.y.push_back(ArgMax(Logits(teacher_, &b.x[i * kIn])));
    return b;
  }
  // Mean cross-entropy over the batch; gradient into `grad` when given.
  double Loss(const std::vector<float>& w, const Batch& b, std::vector<float>* grad) const {
    const size_t n = b.y.size();
    if (grad != nullptr) grad->assign(kParams, 0.0f);
    double loss = 0;
    for (size_t i = 0; i < n; ++i) {
      const float* x = &b.x[i * kIn];
      std::vector<float> z = Logits(w, x);
      const float mx = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (float& v : z) sum += std::exp(v - mx);
      loss += -(z[b.y[i]] - mx - std::log(sum));
      if (grad == nullptr) continue;
      for (size_t k = 0; k < kOut; ++k) {
        const float p = static_cast<float>(std::exp(z[k] - mx) / sum) - (static_cast<int>(k) == b.y[i] ? 1.0f : 0.0f);
        for (size_t j = 0; j < kIn; ++j) (*grad)[k * kIn + j] += p * x[j] / static_cast<float>(n);
        (*grad)[kIn * kOut + k] += p / static_cast<float>(n);
      }
    }
    return loss / static_cast<double>(n);
  }
  double EvalLoss(const std::vector<float>& w) const { return Loss(w, eval_, nullptr); }

 private:
  static std::vector<float> Logits(const std::vector<float>& w, const float* x) {
    std::vector<float> z(kOut);
    for (size_t k = 0; k < kOut; ++k) {
      float s = w[kIn * kOut + k];
      for (size_t j = 0; j < kIn; ++j) s += w[k * kIn + j] * x[j];
      z[k] = s;
    }
    return z;
  }
  static int ArgMax(const std::vector<float>& z) {
    return static_cast<int>(std::max_element(z.begin(), z.end()) - z.begin());
  }
  std::vector<float> teacher_;
  Batch eval_;
};

struct Island {
  std::unique_ptr<RingAllReduce> ring;
  std::optional<OneBitAdam> adam;
  std::vector<float> w;
  std::mt19937 rng;
};

struct RunResult {
  double eval_loss = 0;
  std::vector<uint64_t> hashes;  // per island at the end
  std::vector<std::vector<uint8_t>> images;
};

std::vector<RingMember> Members(size_t m) {
  std::set<int> ports;
  while (ports.size() < m) ports.insert(fl::testing::FreeLoopbackPort());
  std::vector<RingMember> members;
  for (int port : ports)
    members.push_back({fl::StrCat("island-", members.size()), fl::StrCat("tcp://127.0.0.1:", port)});
  return members;
}

// M islands (threads), each step: own batch gradient, the ring (fp32 gradients in warm-up, sign1 momentum
// after, as fl-island's onebit-adam mode), the optimizer step. Returns island 0's eval loss and every hash.
RunResult Train(const Problem& problem, size_t m, const OneBitAdamOptions& options, double lr,
                bool error_feedback = true) {
  const std::vector<RingMember> members = Members(m);
  std::vector<Island> islands(m);
  for (size_t i = 0; i < m; ++i) {
    RingOptions ro;
    ro.members = members;
    ro.self = i;
    ro.codec = "fp32";
    ro.error_feedback = error_feedback;
    ro.timeout = absl::Seconds(60);
    auto ring = RingAllReduce::Create(ro);
    EXPECT_TRUE(ring.ok()) << ring.status();
    if (!ring.ok()) return {};
    islands[i].ring = std::move(*ring);
    auto adam = OneBitAdam::Create(Problem::kParams, options);
    EXPECT_TRUE(adam.ok()) << adam.status();
    if (!adam.ok()) return {};
    islands[i].adam.emplace(std::move(*adam));
    islands[i].w.assign(Problem::kParams, 0.0f);
    islands[i].rng.seed(static_cast<uint32_t>(1000 + i));
  }
  RunResult result;
  for (uint64_t t = 1; t <= options.total_steps; ++t) {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < m; ++i) {
      threads.emplace_back([&, i] {
        Island& is = islands[i];
        std::vector<float> grad;
        problem.Loss(is.w, problem.Sample(is.rng, 16), &grad);
        const bool compressed = is.adam->NextStepCompressed();
        std::vector<float> send(grad.size());
        if (compressed) {
          ASSERT_TRUE(is.adam->LocalMomentum(grad, send).ok());
          if (t == options.warmup_steps + 1) {
            ASSERT_TRUE(is.ring->SetCodec(options.CompressedCodec()).ok());
          }
        } else {
          send = grad;
        }
        std::vector<float> mean(send.size());
        ASSERT_TRUE(
            is.ring->AllReduce(t, compressed ? 1 : 0, std::span<const float>(send), mean, ReduceOp::kMean, nullptr)
                .ok());
        const double warm = std::min(1.0, static_cast<double>(t) / 10.0);
        ASSERT_TRUE(
            (compressed ? is.adam->CompressedStep(mean, lr * warm, is.w) : is.adam->AdamStep(mean, lr * warm, is.w))
                .ok());
      });
    }
    for (auto& th : threads) th.join();
  }
  result.eval_loss = problem.EvalLoss(islands[0].w);
  for (Island& is : islands) {
    result.hashes.push_back(is.adam->Hash(is.w));
    result.images.push_back(is.adam->Serialize(is.w));
  }
  return result;
}

OneBitAdamOptions Options(uint64_t warmup, uint64_t total) {
  OneBitAdamOptions o;
  o.warmup_steps = warmup;
  o.total_steps = total;
  o.chunk = 32;
  o.weight_decay = 0.0;
  return o;
}

// The paper's claim is Adam's convergence at 1-bit volume after a warm-up. Here: 3 islands, 300 steps, W = 60
// (20%: the paper warms up for 15-25% of training), lr 0.05, chunks of 32. Margin: 1-bit Adam's eval loss at
// most 15% above exact data-parallel Adam's. Why 15%: the run is seeded, so the numbers are fixed; measured
// (2026-11-28) exact 0.2134, 1-bit 0.2331 (+9.2%), the same without error feedback 0.3355 (+57%). Sign
// compression adds noise of the order of the momentum itself each step, which error feedback cancels only over
// steps, so a 300-step run keeps part of a gap the paper sees close over long runs (across W in {30..150} and
// lr in {0.01, 0.02, 0.05} the gap was 4-34%, shrinking with W and lr). 15% sits between what the algorithm
// does and what it does broken: without error feedback it must land well outside (asserted: > 30% above).
TEST(OneBitAdamTest, LossWithinFifteenPercentOfExactDataParallelAdamAfterWarmUp) {
  const Problem problem;
  const double initial = problem.EvalLoss(std::vector<float>(Problem::kParams, 0.0f));
  RunResult exact = Train(problem, 3, Options(300, 300), 0.05);
  RunResult onebit = Train(problem, 3, Options(60, 300), 0.05);
  RunResult no_feedback = Train(problem, 3, Options(60, 300), 0.05, /*error_feedback=*/false);
  ASSERT_EQ(exact.hashes.size(), 3u);
  ASSERT_EQ(onebit.hashes.size(), 3u);
  std::cout << "initial " << initial << " exact Adam " << exact.eval_loss << " 1-bit Adam " << onebit.eval_loss
            << " without error feedback " << no_feedback.eval_loss << "\n";
  EXPECT_LT(exact.eval_loss, 0.2 * initial);  // the problem is learned at all
  EXPECT_LE(onebit.eval_loss, 1.15 * exact.eval_loss);
  EXPECT_GT(no_feedback.eval_loss, 1.30 * exact.eval_loss);
  // Bytes are not compared here: at 136 parameters the ring's 64-byte headers outweigh the payloads (the
  // islands' runs in docs/diloco.md measure them on the char LM).
}

TEST(OneBitAdamTest, EveryIslandEndsWithTheSameStateAndAJoinerLoadsIt) {
  const Problem problem;
  RunResult r = Train(problem, 3, Options(20, 60), 0.02);
  ASSERT_EQ(r.hashes.size(), 3u);
  EXPECT_EQ(r.hashes[0], r.hashes[1]);
  EXPECT_EQ(r.hashes[0], r.hashes[2]);
  // A joining island: fresh state, the image of a peer -> the same hash, and the next step agrees too.
  auto joiner = OneBitAdam::Create(Problem::kParams, Options(20, 60));
  ASSERT_TRUE(joiner.ok());
  std::vector<float> w(Problem::kParams, 0.0f);
  ASSERT_TRUE(joiner->Restore(r.images[1], w).ok());
  EXPECT_EQ(joiner->Hash(w), r.hashes[0]);
  EXPECT_EQ(joiner->step(), 60u);
  auto peer = OneBitAdam::Create(Problem::kParams, Options(20, 60));
  ASSERT_TRUE(peer.ok());
  std::vector<float> wp(Problem::kParams, 0.0f);
  ASSERT_TRUE(peer->Restore(r.images[0], wp).ok());
  std::vector<float> mean(Problem::kParams, 0.25f);
  ASSERT_TRUE(joiner->CompressedStep(mean, 0.01, w).ok());
  ASSERT_TRUE(peer->CompressedStep(mean, 0.01, wp).ok());
  EXPECT_EQ(joiner->Hash(w), peer->Hash(wp));
}

TEST(OneBitAdamTest, TheVarianceIsFrozenAfterTheWarmUp) {
  auto adam = OneBitAdam::Create(4, Options(2, 10));
  ASSERT_TRUE(adam.ok());
  std::vector<float> w(4, 1.0f), g = {1, -2, 3, -4};
  ASSERT_TRUE(adam->AdamStep(g, 0.1, w).ok());
  ASSERT_TRUE(adam->AdamStep(g, 0.1, w).ok());
  const std::vector<float> v(adam->variance().begin(), adam->variance().end());
  EXPECT_FLOAT_EQ(v[1], 0.05f * 4 * 0.95f + 0.05f * 4);  // (1-b2) g^2 twice
  EXPECT_EQ(adam->AdamStep(g, 0.1, w).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> local(4);
  ASSERT_TRUE(adam->LocalMomentum(g, local).ok());
  EXPECT_FLOAT_EQ(local[0], 0.9f * adam->momentum()[0] + 0.1f * 1.0f);
  ASSERT_TRUE(adam->CompressedStep(std::vector<float>{5, 5, 5, 5}, 0.1, w).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(adam->variance().data()), 16),
            std::string(reinterpret_cast<const char*>(v.data()), 16));
  EXPECT_EQ(adam->momentum()[2], 5.0f);
  EXPECT_EQ(adam->step(), 3u);
}

TEST(OneBitAdamTest, BadInputsAreRefusedNamingTheValueAndWhatToDo) {
  OneBitAdamOptions o = Options(500, 400);
  absl::Status s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(s).find("warm-up of 500 steps is longer than the run (400 steps)"), std::string::npos) << s;
  o = Options(100, 400);
  o.chunk = 12;
  s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(s).find("chunk of 12 values cannot be carried by the sign1 codec"), std::string::npos) << s;
  EXPECT_NE(Msg(s).find("multiple of 8"), std::string::npos) << s;
  o.chunk = 0;
  EXPECT_FALSE(o.Validate().ok());
  o.chunk = (1u << 20) + 8;
  EXPECT_FALSE(o.Validate().ok());
  o = Options(100, 400);
  o.inner_optimizer = "sgd";
  s = o.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(s).find("inner optimizer adamw, not 'sgd'"), std::string::npos) << s;
  EXPECT_TRUE(OneBitAdam::Create(4, o).status().code() == absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Options(400, 400).Validate().ok());  // W = T: plain data-parallel Adam

  auto adam = OneBitAdam::Create(4, Options(1, 10));
  ASSERT_TRUE(adam.ok());
  std::vector<float> w(4, 0.0f);
  s = adam->AdamStep(std::vector<float>{1, NAN, 0, 0}, 0.1, w);
  EXPECT_NE(Msg(s).find("at index 1"), std::string::npos) << s;
  EXPECT_EQ(adam->step(), 0u);
  EXPECT_FALSE(adam->AdamStep(std::vector<float>(3), 0.1, w).ok());
  // An image of other options or a corrupt one changes nothing.
  auto other = OneBitAdam::Create(4, Options(2, 10));
  ASSERT_TRUE(other.ok());
  std::vector<uint8_t> image = other->Serialize(w);
  w[0] = 3.0f;
  EXPECT_EQ(adam->Restore(image, w).code(), absl::StatusCode::kFailedPrecondition);
  image = adam->Serialize(w);
  image[40] ^= 1;
  EXPECT_EQ(adam->Restore(image, w).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(w[0], 3.0f);
}

}  // namespace
}  // namespace fl::diloco
