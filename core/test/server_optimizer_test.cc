#include "fl/core/server_optimizer.h"

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"

namespace fl::core {
namespace {

// Substring check with a readable failure (the suites link gtest only, not gmock).
::testing::AssertionResult HasSubstr(std::string_view haystack, std::string_view needle) {
  if (haystack.find(needle) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << needle << "' not found in: " << haystack;
}

// Expected values below are worked out by hand from the formulas in server_optimizer.h (in exact decimal
// arithmetic); the optimizers compute in fp32, hence the tolerance.
constexpr double kTol = 1e-6;

std::unique_ptr<ServerOptimizer> Make(std::string_view spec, size_t n) {
  auto opt = MakeServerOptimizer(spec, n);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

// Steps a one-parameter optimizer from theta0 through the pseudo-gradients `gs`, returning theta after
// each step.
std::vector<double> Trajectory(ServerOptimizer& opt, float theta0, const std::vector<float>& gs) {
  std::vector<float> theta = {theta0};
  std::vector<double> out;
  for (float g : gs) {
    std::vector<float> grad = {g};
    EXPECT_TRUE(opt.Step(theta, grad).ok());
    out.push_back(theta[0]);
  }
  return out;
}

void ExpectTrajectory(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], kTol) << "after step " << i + 1;
}

TEST(FedAvgTest, StepsByHand) {
  auto opt = Make("fedavg:lr=0.5", 2);
  std::vector<float> theta = {1.0f, -2.0f};
  // theta -= 0.5 g: [1 - 0.2, -2 + 0.5] = [0.8, -1.5]
  ASSERT_TRUE(opt->Step(theta, std::vector<float>{0.4f, -1.0f}).ok());
  EXPECT_NEAR(theta[0], 0.8, kTol);
  EXPECT_NEAR(theta[1], -1.5, kTol);
  // [0.8 - 0.1, -1.5 - 0.1] = [0.7, -1.6]
  ASSERT_TRUE(opt->Step(theta, std::vector<float>{0.2f, 0.2f}).ok());
  EXPECT_NEAR(theta[0], 0.7, kTol);
  EXPECT_NEAR(theta[1], -1.6, kTol);
  EXPECT_EQ(opt->step_count(), 2u);
  EXPECT_TRUE(opt->ExportState().buffers.empty());
}

TEST(FedAvgTest, LearningRateOneGivesTheAggregate) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = 1000;
  std::vector<float> global(n), aggregate(n), close_aggregate(n), g(n);
  for (size_t i = 0; i < n; ++i) {
    global[i] = normal(rng);
    aggregate[i] = normal(rng);
    // Within a factor 2 of global: both subtractions are then exact (Sterbenz), so the result is too.
    close_aggregate[i] = global[i] * (1.0f + 0.5f * std::uniform_real_distribution<float>(-0.9f, 0.9f)(rng));
  }
  auto opt = Make("fedavg", n);

  std::vector<float> theta = global;
  ASSERT_TRUE(PseudoGradient(theta, close_aggregate, g).ok());
  ASSERT_TRUE(opt->Step(theta, g).ok());
  EXPECT_EQ(theta, close_aggregate);

  theta = global;
  ASSERT_TRUE(PseudoGradient(theta, aggregate, g).ok());
  ASSERT_TRUE(opt->Step(theta, g).ok());
  for (size_t i = 0; i < n; ++i) {
    // In general: one rounding of g and one of the step, each at most half an ulp of the larger operand.
    const float scale = std::max(std::fabs(global[i]), std::fabs(aggregate[i]));
    EXPECT_NEAR(theta[i], aggregate[i], 2 * scale * std::numeric_limits<float>::epsilon()) << i;
  }
}

TEST(FedAvgMTest, StepsByHand) {
  auto opt = Make("fedavgm", 1);  // lr 1.0, momentum 0.9
  // v = 0.5, theta = 1 - 0.5 = 0.5
  // v = 0.9*0.5 + 0.5 = 0.95, theta = 0.5 - 0.95 = -0.45
  // v = 0.9*0.95 - 1 = -0.145, theta = -0.45 + 0.145 = -0.305
  ExpectTrajectory(Trajectory(*opt, 1.0f, {0.5f, 0.5f, -1.0f}), {0.5, -0.45, -0.305});
  ServerOptimizerState state = opt->ExportState();
  ASSERT_EQ(state.buffers.size(), 1u);
  EXPECT_EQ(state.buffers[0].name, "momentum");
  EXPECT_NEAR(state.buffers[0].values[0], -0.145, kTol);
  EXPECT_EQ(state.step_count, 3u);
}

TEST(NesterovTest, StepsByHand) {
  auto opt = Make("nesterov", 1);  // lr 0.7, momentum 0.9 (DiLoCo)
  // buf = 0.1;                  theta = 1 - 0.7*(0.1 + 0.9*0.1)    = 1 - 0.133     = 0.867
  // buf = 0.09 + 0.2 = 0.29;    theta = 0.867 - 0.7*(0.2 + 0.261)  = 0.867 - 0.3227 = 0.5443
  // buf = 0.261 - 0.1 = 0.161;  theta = 0.5443 - 0.7*(-0.1 + 0.1449) = 0.5443 - 0.03143 = 0.51287
  ExpectTrajectory(Trajectory(*opt, 1.0f, {0.1f, 0.2f, -0.1f}), {0.867, 0.5443, 0.51287});
}

TEST(NesterovTest, MatchesDiLoCoDefaults) {
  auto opt = Make("diloco", 4);
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->name(), "nesterov");
  EXPECT_EQ(opt->DescribeConfig(), "lr=0.7 momentum=0.9");
}

// The FedOpt trajectories are written with Delta = -g (the paper's sign), i.e. g = -Delta.
TEST(FedAdamTest, StepsByHand) {
  auto opt = Make("fedadam", 1);  // lr 0.1, b1 0.9, b2 0.99, tau 1e-9
  // Delta 0.2:  m = 0.1*0.2 = 0.02;            v = 0.01*0.04 = 0.0004, sqrt 0.02
  //             theta = 0 + 0.1*0.02/(0.02 + 1e-9)                           = 0.099999995
  // Delta 0.1:  m = 0.018 + 0.01 = 0.028;      v = 0.000396 + 0.0001 = 0.000496, sqrt 0.0222711
  //             theta += 0.1*0.028/0.0222711 = 0.1257237                     -> 0.2257237
  // Delta -0.3: m = 0.0252 - 0.03 = -0.0048;   v = 0.00049104 + 0.0009 = 0.00139104, sqrt 0.0372966
  //             theta += 0.1*(-0.0048)/0.0372966 = -0.0128698                -> 0.2128539
  ExpectTrajectory(Trajectory(*opt, 0.0f, {-0.2f, -0.1f, 0.3f}), {0.099999995, 0.2257237, 0.2128539});
  ServerOptimizerState state = opt->ExportState();
  ASSERT_EQ(state.buffers.size(), 2u);
  EXPECT_EQ(state.buffers[0].name, "m");
  EXPECT_EQ(state.buffers[1].name, "v");
  EXPECT_NEAR(state.buffers[0].values[0], -0.0048, kTol);
  EXPECT_NEAR(state.buffers[1].values[0], 0.00139104, kTol);
}

TEST(FedYogiTest, StepsByHand) {
  auto opt = Make("fedyogi", 1);  // lr 0.01, b1 0.9, b2 0.99, tau 1e-3
  // Delta 0.2:  d2 0.04;   v = 0 - 0.01*0.04*sign(0 - 0.04) = 0.0004;  m = 0.02
  //             theta = 0.01*0.02/(0.02 + 0.001)                               = 0.0095238
  // Delta 0.1:  d2 0.01;   v = 0.0004 + 0.01*0.01 = 0.0005 (v < d2);  m = 0.028; sqrt(v) = 0.0223607
  //             theta += 0.01*0.028/0.0233607 = 0.0119859                      -> 0.0215098
  // Delta 0.01: d2 0.0001; v = 0.0005 - 0.01*0.0001 = 0.000499 (v > d2: sign +1); m = 0.0262
  //             theta += 0.01*0.0262/(0.0223383 + 0.001) = 0.0112262           -> 0.0327359
  ExpectTrajectory(Trajectory(*opt, 0.0f, {-0.2f, -0.1f, -0.01f}), {0.0095238, 0.0215098, 0.0327359});
  EXPECT_NEAR(opt->ExportState().buffers[1].values[0], 0.000499, kTol);
}

TEST(FedAdagradTest, StepsByHand) {
  auto opt = Make("fedadagrad", 1);  // lr 0.1, b1 0, tau 1e-9
  // Delta 0.2:   m = 0.2;   v = 0.04;   theta = 0.1*0.2/0.2                  = 0.1 (0.0999999995)
  // Delta -0.1:  m = -0.1;  v = 0.05;   theta += 0.1*(-0.1)/0.2236068 = -0.0447214 -> 0.0552786
  // Delta 0.05:  m = 0.05;  v = 0.0525; theta += 0.1*0.05/0.2291288 = 0.0218218   -> 0.0771004
  ExpectTrajectory(Trajectory(*opt, 0.0f, {-0.2f, 0.1f, -0.05f}), {0.1, 0.0552786, 0.0771004});
}

TEST(FedOptTest, InitialVIsUsed) {
  // v starts at 0.01: Adagrad's first step then has v = 0.01 + 0.04 = 0.05: theta = 0.1*0.2/0.2236068.
  auto opt = Make("fedadagrad:initial_v=0.01", 1);
  ExpectTrajectory(Trajectory(*opt, 0.0f, {-0.2f}), {0.0894427});
  opt->Reset();
  EXPECT_EQ(opt->step_count(), 0u);
  EXPECT_FLOAT_EQ(opt->ExportState().buffers[1].values[0], 0.01f);
}

TEST(ServerOptimizerTest, ElementsAreIndependent) {
  // Two parameters stepped together match each stepped alone.
  for (const char* name : {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "nesterov"}) {
    auto pair = Make(name, 2);
    auto a = Make(name, 1);
    auto b = Make(name, 1);
    std::vector<float> theta = {0.3f, -0.7f}, ta = {0.3f}, tb = {-0.7f};
    for (int step = 0; step < 3; ++step) {
      const float ga = 0.1f * static_cast<float>(step + 1), gb = -0.05f * static_cast<float>(step * step + 1);
      ASSERT_TRUE(pair->Step(theta, std::vector<float>{ga, gb}).ok());
      ASSERT_TRUE(a->Step(ta, std::vector<float>{ga}).ok());
      ASSERT_TRUE(b->Step(tb, std::vector<float>{gb}).ok());
    }
    EXPECT_EQ(theta[0], ta[0]) << name;
    EXPECT_EQ(theta[1], tb[0]) << name;
  }
}

TEST(ServerOptimizerTest, ExportImportRoundTripGivesIdenticalNextSteps) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  const size_t n = 257;
  for (const char* name : {"fedavg", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "nesterov"}) {
    auto a = Make(name, n);
    std::vector<float> theta_a(n), g(n);
    for (float& x : theta_a) x = normal(rng);
    for (int step = 0; step < 2; ++step) {
      for (float& x : g) x = normal(rng);
      ASSERT_TRUE(a->Step(theta_a, g).ok());
    }
    const ServerOptimizerState state = a->ExportState();
    EXPECT_EQ(state.optimizer, name);
    EXPECT_EQ(state.step_count, 2u);

    auto b = Make(name, n);
    ASSERT_TRUE(b->ImportState(state).ok()) << name;
    EXPECT_EQ(b->step_count(), 2u);
    std::vector<float> theta_b = theta_a;
    for (int step = 0; step < 2; ++step) {
      for (float& x : g) x = normal(rng);
      ASSERT_TRUE(a->Step(theta_a, g).ok());
      ASSERT_TRUE(b->Step(theta_b, g).ok());
    }
    EXPECT_EQ(theta_a, theta_b) << name;
    const ServerOptimizerState sa = a->ExportState(), sb = b->ExportState();
    ASSERT_EQ(sa.buffers.size(), sb.buffers.size());
    for (size_t i = 0; i < sa.buffers.size(); ++i) EXPECT_EQ(sa.buffers[i].values, sb.buffers[i].values) << name;
  }
}

TEST(ServerOptimizerTest, ImportAcceptsBuffersInAnyOrder) {
  auto a = Make("fedadam", 3);
  std::vector<float> theta = {1, 2, 3};
  ASSERT_TRUE(a->Step(theta, std::vector<float>{0.1f, 0.2f, 0.3f}).ok());
  ServerOptimizerState state = a->ExportState();
  std::swap(state.buffers[0], state.buffers[1]);
  auto b = Make("fedadam", 3);
  ASSERT_TRUE(b->ImportState(state).ok());
  EXPECT_EQ(b->ExportState().buffers[0].values, a->ExportState().buffers[0].values);
}

TEST(ServerOptimizerTest, BadImportsAreRejectedAndChangeNothing) {
  auto opt = Make("fedyogi", 2);
  std::vector<float> theta = {1, 2};
  ASSERT_TRUE(opt->Step(theta, std::vector<float>{0.1f, 0.2f}).ok());
  const ServerOptimizerState good = opt->ExportState();

  auto expect_rejected = [&](ServerOptimizerState bad, const char* needle) {
    absl::Status s = opt->ImportState(bad);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_TRUE(HasSubstr(std::string(s.message()), needle));
    const ServerOptimizerState now = opt->ExportState();
    EXPECT_EQ(now.step_count, good.step_count);
    for (size_t i = 0; i < now.buffers.size(); ++i) EXPECT_EQ(now.buffers[i].values, good.buffers[i].values);
  };

  ServerOptimizerState s = good;
  s.optimizer = "fedadam";
  expect_rejected(s, "'fedadam' state into a 'fedyogi'");
  s = good;
  s.buffers[1].values.push_back(0.0f);
  expect_rejected(s, "has 3 values");
  s = good;
  s.buffers.pop_back();
  expect_rejected(s, "lacks buffer 'v'");
  s = good;
  s.buffers.push_back(NamedBuffer{"extra", {0, 0}});
  expect_rejected(s, "unknown buffer 'extra'");
  s = good;
  s.buffers.push_back(good.buffers[0]);
  expect_rejected(s, "buffer 'm' twice");
  s = good;
  s.buffers[1].values[1] = -1.0f;
  expect_rejected(s, "never negative");
  s = good;
  s.buffers[0].values[0] = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(s, "nan");
  s = good;
  s.step_count = 99;
  s.buffers[0].values[1] = std::numeric_limits<float>::infinity();
  expect_rejected(s, "inf");
}

TEST(ServerOptimizerTest, BadStepsAreRejectedAndChangeNothing) {
  auto opt = Make("fedavgm", 3);
  std::vector<float> theta = {1, 2, 3};
  ASSERT_TRUE(opt->Step(theta, std::vector<float>{0.1f, 0.1f, 0.1f}).ok());
  const std::vector<float> theta_before = theta;
  const ServerOptimizerState before = opt->ExportState();

  absl::Status s = opt->Step(theta, std::vector<float>{0.1f, 0.1f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(std::string(s.message()), "pseudo-gradient of 2"));
  std::vector<float> short_theta = {1, 2};
  EXPECT_FALSE(opt->Step(short_theta, std::vector<float>{0.1f, 0.1f, 0.1f}).ok());
  s = opt->Step(theta, std::vector<float>{0.1f, std::numeric_limits<float>::infinity(), 0.1f});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(std::string(s.message()), "element 1"));

  EXPECT_EQ(theta, theta_before);
  EXPECT_EQ(opt->step_count(), 1u);
  EXPECT_EQ(opt->ExportState().buffers[0].values, before.buffers[0].values);
}

TEST(ServerOptimizerTest, PseudoGradient) {
  std::vector<float> out(2);
  ASSERT_TRUE(PseudoGradient(std::vector<float>{1, 2}, std::vector<float>{0.5f, 3}, out).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, -1.0f}));
  EXPECT_FALSE(PseudoGradient(std::vector<float>{1, 2}, std::vector<float>{1}, out).ok());
}

TEST(MakeServerOptimizerTest, DefaultsAndOptions) {
  EXPECT_EQ(Make("fedavg", 1)->DescribeConfig(), "lr=1");
  EXPECT_EQ(Make("fedavgm", 1)->DescribeConfig(), "lr=1 momentum=0.9");
  EXPECT_EQ(Make("fedadam", 1)->DescribeConfig(), "lr=0.1 beta1=0.9 beta2=0.99 tau=1e-09 initial_v=0");
  EXPECT_EQ(Make("fedyogi", 1)->DescribeConfig(), "lr=0.01 beta1=0.9 beta2=0.99 tau=0.001 initial_v=0");
  EXPECT_EQ(Make("fedadagrad", 1)->DescribeConfig(), "lr=0.1 beta1=0 tau=1e-09 initial_v=0");
  EXPECT_EQ(Make("fedadam:lr=0.03,tau=1e-3", 1)->DescribeConfig(),
            "lr=0.03 beta1=0.9 beta2=0.99 tau=0.001 initial_v=0");

  auto opt = MakeServerOptimizer("nesterov", ServerOptimizerOptions{{"lr", 0.5}, {"momentum", 0.0}}, 5);
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ((*opt)->DescribeConfig(), "lr=0.5 momentum=0");
  EXPECT_EQ((*opt)->num_params(), 5u);
}

TEST(MakeServerOptimizerTest, ClearErrors) {
  auto expect_error = [](std::string_view spec, const char* needle) {
    auto opt = MakeServerOptimizer(spec, 4);
    ASSERT_FALSE(opt.ok()) << spec;
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_TRUE(HasSubstr(std::string(opt.status().message()), needle)) << spec;
  };
  expect_error("fedsgd", "unknown server optimizer 'fedsgd'");
  expect_error("fedavg:lr=-1", "lr = -1 is out of range");
  expect_error("fedavg:lr=0", "lr = 0 is out of range");
  expect_error("fedavg:lr=nan", "lr = nan");
  expect_error("fedavgm:momentum=1", "momentum = 1 is out of range");
  expect_error("nesterov:momentum=-0.1", "momentum = -0.1");
  expect_error("fedadam:beta1=1", "beta1 = 1");
  expect_error("fedyogi:beta2=1.5", "beta2 = 1.5");
  expect_error("fedadam:tau=0", "tau = 0");
  expect_error("fedadam:initial_v=-1", "initial_v = -1");
  expect_error("fedadagrad:beta2=0.9", "'fedadagrad' has no option 'beta2'; it takes: lr, beta1, tau, initial_v");
  expect_error("fedavg:momentum=0.9", "has no option 'momentum'");
  expect_error("fedadam:lr", "'lr' is not key=number");
  expect_error("fedadam:lr=abc", "'lr=abc' is not key=number");
  expect_error("fedadam:lr=0.1,lr=0.2", "sets 'lr' twice");
}

}  // namespace
}  // namespace fl::core
