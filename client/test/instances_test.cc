// The parts of fl-client --instances that need no server: the training gate's bound, a trainer's exception kept
// inside its instance, the per-instance server list, the memory check's refusal.
#include "fl/client/instances.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

#include "fl/client/synthetic_trainer.h"

namespace fl::client {
namespace {

TEST(TrainGateTest, NeverAdmitsMoreThanItsLimit) {
  TrainGate gate(3);
  std::atomic<int> inside{0}, most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        gate.Acquire();
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        --inside;
        gate.Release();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_LE(gate.peak(), 3u);
  EXPECT_GE(gate.peak(), 1u);
}

// A trainer whose training throws, as LibTorch's do (c10::Error derives from std::exception).
class ThrowingTrainer : public Trainer {
 public:
  const core::ModelSpec& spec() const override { return inner_.spec(); }
  std::string model_name() const override { return "throwing"; }
  uint64_t num_train_examples() const override { return 100; }
  uint64_t num_test_examples() const override { return 100; }
  absl::Status GetParameters(std::span<float> out) override { return inner_.GetParameters(out); }
  absl::StatusOr<TrainResult> Train(std::span<const float>, const TrainOptions&) override {
    throw std::runtime_error("out of memory in conv1");
  }
  absl::StatusOr<EvalResult> Evaluate(std::span<const float> global) override { return inner_.Evaluate(global); }

 private:
  SyntheticTrainer inner_{10, 100, 0, 0};
};

TEST(GatedTrainerTest, AnExceptionBecomesAnErrorNamingTheInstanceAndReleasesTheGate) {
  TrainGate gate(1);
  GatedTrainer trainer("edge-7", std::make_unique<ThrowingTrainer>(), &gate);
  std::vector<float> global(trainer.spec().num_elements());
  auto r = trainer.Train(global, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("edge-7"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("out of memory in conv1"), std::string::npos) << r.status();
  // The gate was released: an evaluation (limit 1) does not wait forever.
  EXPECT_TRUE(trainer.Evaluate(global).ok());
}

TEST(InstancesTest, NamesFollowTheGroupConvention) {
  EXPECT_EQ(InstanceNames("wifi", 3), (std::vector<std::string>{"wifi-0", "wifi-1", "wifi-2"}));
}

TEST(InstancesTest, OneServerForAllOrOnePerInstance) {
  auto one = InstanceServers("127.0.0.1:5", 3);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, (std::vector<std::string>(3, "127.0.0.1:5")));
  auto each = InstanceServers("a:1,b:2,c:3", 3);
  ASSERT_TRUE(each.ok());
  EXPECT_EQ(*each, (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  auto wrong = InstanceServers("a:1,b:2", 3);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("2 addresses for --instances=3"), std::string::npos) << wrong.status();
  EXPECT_FALSE(InstanceServers("a:1,,c:3", 3).ok());
}

TEST(InstancesTest, AnEstimateAboveTheLimitIsRefusedNamingBoth) {
  MemoryEstimate e;
  e.count = 1000;
  e.per_instance_bytes = uint64_t{100} << 20;
  e.total_bytes = e.count * e.per_instance_bytes;
  e.limit_bytes = uint64_t{2} << 30;
  e.how = "derived";
  const absl::Status s = CheckFits(e);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("--instances=1000"), std::string::npos) << s;
  EXPECT_NE(s.message().find("estimated 100000 MB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("limit 2048 MB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at most 20 instances fit"), std::string::npos) << s;
  e.count = 20;
  e.total_bytes = e.count * e.per_instance_bytes;
  EXPECT_TRUE(CheckFits(e).ok());
}

TEST(InstancesTest, SessionBytesGrowWithTheModel) {
  EXPECT_GT(SessionBytesPerInstance(1'000'000, 1 << 20), SessionBytesPerInstance(1000, 1 << 20));
  EXPECT_GE(SessionBytesPerInstance(1'000'000, 1 << 20), uint64_t{4'000'000} * 4);
}

TEST(InstancesTest, ThisMachineReportsItsMemory) {
  EXPECT_GT(AvailableMemoryBytes(), 0u);
  EXPECT_GT(ResidentBytes(), 0u);
}

TEST(AvailabilityTest, ParsesTheDiurnalModelAndRefusesWhatItCannotUse) {
  auto a = ParseAvailability("diurnal:period_s=60,online=0.25,seed=7");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->period_s, 60);
  EXPECT_EQ(a->online_fraction, 0.25);
  EXPECT_EQ(a->seed, 7u);
  EXPECT_FALSE(ParseAvailability("trace:x").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60").ok());           // online missing
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=0,online=0.5").ok());  // no period
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60,online=1.5").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60,online=0.5,phase=3").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=abc,online=0.5").ok());
}

// The schedule is a function of (seed, shard, time) alone: two runs with one seed agree window for window, another
// seed moves the phases, and every client is online its fraction of each period.
TEST(AvailabilityTest, WindowsAreDeterministicUnderASeedAndCoverTheOnlineFraction) {
  const Availability a{.period_s = 10, .online_fraction = 0.3, .seed = 42};
  Availability other = a;
  other.seed = 43;
  int moved = 0;
  for (uint32_t shard = 0; shard < 50; ++shard) {
    const OnlineWindow w = NextOnlineWindow(a, shard, 0);
    const OnlineWindow again = NextOnlineWindow(a, shard, 0);
    EXPECT_EQ(w.start_s, again.start_s);
    EXPECT_EQ(w.end_s, again.end_s);
    EXPECT_NEAR(w.end_s - w.start_s, 3.0, 1e-9);
    EXPECT_LT(w.start_s, 10.0);
    EXPECT_GT(w.end_s, 0.0);
    if (NextOnlineWindow(other, shard, 0).start_s != w.start_s) ++moved;
    // Online time over 100 periods, sampled every 10 ms: 30%.
    int online = 0;
    for (int k = 0; k < 100'000; ++k) {
      const double t = k * 0.01;
      const OnlineWindow now = NextOnlineWindow(a, shard, t);
      online += (now.start_s <= t && t < now.end_s) ? 1 : 0;
    }
    EXPECT_NEAR(online / 100'000.0, 0.3, 0.001) << shard;
    // The next window after this one is one period later.
    EXPECT_NEAR(NextOnlineWindow(a, shard, w.end_s).start_s, w.start_s + 10, 1e-9);
  }
  EXPECT_GT(moved, 45);
  EXPECT_TRUE(std::isinf(NextOnlineWindow(Availability{}, 3, 5).end_s));
}

}  // namespace
}  // namespace fl::client
