// The parts of fl-client --instances that need no server: the training gate's bound, a trainer's exception kept
// inside its instance, the per-instance server list, the memory check's refusal.
#include "fl/client/instances.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
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
class ThrowingTrainer : public training::Trainer {
 public:
  const core::ModelSpec& spec() const override { return inner_.spec(); }
  std::string model_name() const override { return "throwing"; }
  uint64_t num_train_examples() const override { return 100; }
  uint64_t num_test_examples() const override { return 100; }
  absl::Status GetParameters(std::span<float> out) override { return inner_.GetParameters(out); }
  absl::StatusOr<training::TrainResult> Train(std::span<const float>, const training::TrainOptions&) override {
    throw std::runtime_error("out of memory in conv1");
  }
  absl::StatusOr<training::EvalResult> Evaluate(std::span<const float> global) override {
    return inner_.Evaluate(global);
  }

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
  // A group split over processes (fl-client --instance-offset): the second process of two-instance ones.
  EXPECT_EQ(InstanceNames("wifi", 2, 2), (std::vector<std::string>{"wifi-2", "wifi-3"}));
}

// --secagg-drop-after-shares: 10% and 30% of 50 are 5 and 15 instances (not 16: 0.3 x 50 exceeds 15 in doubles).
TEST(InstancesTest, TheDroppingInstancesAreTheCeilingOfTheFraction) {
  EXPECT_EQ(SecAggDroppingInstances(0.1, 50), 5u);
  EXPECT_EQ(SecAggDroppingInstances(0.3, 50), 15u);
  EXPECT_EQ(SecAggDroppingInstances(0.3, 10), 3u);
  EXPECT_EQ(SecAggDroppingInstances(0.25, 10), 3u);  // 2.5 -> 3
  EXPECT_EQ(SecAggDroppingInstances(0.01, 50), 1u);
  EXPECT_EQ(SecAggDroppingInstances(0, 50), 0u);
  EXPECT_EQ(SecAggDroppingInstances(1, 50), 50u);
  EXPECT_EQ(SecAggDroppingInstances(0.5, 1), 1u);
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

TEST(InstancesTest, OneClientIsEstimatedFromItsResidentSetItsModelAndItsEvaluationBatch) {
  OneClientMemory m;
  m.model = "cnn";
  m.model_name = "cnn-fmnist";
  m.resident_bytes = uint64_t{200} << 20;
  m.parameters = 1'000'000;
  m.eval_batch_size = 100;
  m.max_chunk_bytes = 1 << 20;
  const uint64_t session = SessionBytesPerInstance(m.parameters, m.max_chunk_bytes);
  const MemoryEstimate e = EstimateOneClient(m, uint64_t{1} << 30);
  // 200 MB resident, the running margin, 12 MB of gradients and optimizer moments, 100 x 200 KiB of evaluation
  // activations (above a training batch's 2 x 32 x 200 KiB), the session's buffers.
  EXPECT_EQ(e.total_bytes, (uint64_t{200} << 20) + kRunningBytes + 12'000'000 + 100 * (uint64_t{200} << 10) + session);
  EXPECT_EQ(e.count, 1u);
  EXPECT_TRUE(e.fits());
  EXPECT_TRUE(CheckFits(e).ok());
  // A smaller evaluation batch costs less, down to the training batch's activations.
  m.eval_batch_size = 10;
  EXPECT_EQ(EstimateOneClient(m, 0).total_bytes,
            (uint64_t{200} << 20) + kRunningBytes + 12'000'000 + 2 * 32 * (uint64_t{200} << 10) + session);
  // The synthetic model trains nothing: its resident set and the session only.
  m.model_name = "synthetic-1000000";
  EXPECT_EQ(EstimateOneClient(m, 0).total_bytes, (uint64_t{200} << 20) + kRunningBytes + session);
  EXPECT_GT(ActivationBytesPerExample("squeezenet1_1-fmnist"), ActivationBytesPerExample("cnn-fmnist"));
  EXPECT_GT(ActivationBytesPerExample("my_torchscript_model"), 0u);
}

TEST(InstancesTest, OneClientAboveTheLimitIsRefusedNamingTheModelTheEstimateTheLimitAndWhatToDo) {
  OneClientMemory m;
  m.model = "squeezenet";
  m.model_name = "squeezenet1_1-fmnist";
  m.resident_bytes = uint64_t{300} << 20;
  m.parameters = 700'000;
  m.eval_batch_size = 100;
  m.max_chunk_bytes = 1 << 20;
  MemoryEstimate e = EstimateOneClient(m, uint64_t{256} << 20);
  e.limit_source = "--memory-limit";
  const absl::Status s = CheckFits(e);
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  const std::string message(s.message());
  EXPECT_NE(message.find("--model squeezenet does not fit this machine's memory: estimated "), std::string::npos) << s;
  EXPECT_NE(message.find("evaluation batch (100 examples)"), std::string::npos) << s;
  EXPECT_NE(message.find("limit 256 MB (--memory-limit)"), std::string::npos) << s;
  for (const char* advice : {"smaller model", "--eval-batch-size", "--data-fraction", "--num-clients",
                             "board with more memory", "--no-memory-check"}) {
    EXPECT_NE(message.find(advice), std::string::npos) << advice << " in " << s;
  }
  EXPECT_EQ(message.find("instances"), std::string::npos) << "one client is not told about --instances: " << s;
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
  EXPECT_FALSE(ParseAvailability("trace:/nonexistent/trace.txt").ok());
  EXPECT_FALSE(ParseAvailability("weekly:x").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60").ok());            // online missing
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=0,online=0.5").ok());  // no period
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60,online=1.5").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=60,online=0.5,phase=3").ok());
  EXPECT_FALSE(ParseAvailability("diurnal:period_s=abc,online=0.5").ok());
}

// Issue 27: the trace is a user's file: a regular file within kMaxAvailabilityTraceBytes, checked before a byte is
// read (before the fix a FIFO blocked fl-client's start forever and /dev/zero grew it without bound).
TEST(AvailabilityTest, TracesThatAreDevicesOrTooLargeAreRefusedBeforeReading) {
  const std::string big = ::testing::TempDir() + "/instances_test_big_trace.txt";
  { std::ofstream create(big); }
  std::filesystem::resize_file(big, kMaxAvailabilityTraceBytes + 1);  // sparse: nothing is written
  auto over = ParseAvailability("trace:" + big);
  std::filesystem::remove(big);
  ASSERT_FALSE(over.ok());
  const std::string message(over.status().message());
  EXPECT_NE(message.find("availability trace " + big + ": 67108865 bytes, over the limit of 67108864"),
            std::string::npos)
      << message;
  auto zero = ParseAvailability("trace:/dev/zero");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(std::string(zero.status().message()).find("/dev/zero: is a character device, not a regular file"),
            std::string::npos)
      << zero.status();
}

// The schedule is a function of (seed, shard, time) alone: two runs with one seed agree window for window, another
// seed moves the phases, and every client is online its fraction of each period.
TEST(AvailabilityTest, WindowsAreDeterministicUnderASeedAndCoverTheOnlineFraction) {
  const Availability a{.period_s = 10, .online_fraction = 0.3, .seed = 42, .trace = nullptr};
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

absl::StatusOr<AvailabilityTrace> Trace(const std::string& text) {
  std::istringstream in(text);
  return ParseAvailabilityTrace(in, "t.trace");
}

// A trace gives each named client its windows, in time order whatever the file's order; a client it does not name
// is always online; after its last window a client is never online again (start infinity).
TEST(AvailabilityTraceTest, WindowsComeFromTheTraceByClientName) {
  char path_buf[] = "/tmp/availability_trace_XXXXXX";
  const int fd = mkstemp(path_buf);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = path_buf;
  std::ofstream(path) << "# fleet availability\n"
                         "cell-0   100  200   # second window first\n"
                         "cell-0     0   50\n"
                         "\n"
                         "wifi-3    30  inf\n";
  absl::StatusOr<Availability> a = ParseAvailability("trace:" + path);
  std::remove(path.c_str());  // read at parse time: the file is no longer needed
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NE(a->trace, nullptr);
  EXPECT_FALSE(a->always());
  auto at = [&](std::string_view name, double t) { return NextOnlineWindow(*a, 0, t, name); };
  EXPECT_EQ(at("cell-0", 0).start_s, 0);
  EXPECT_EQ(at("cell-0", 0).end_s, 50);
  EXPECT_EQ(at("cell-0", 50).start_s, 100);  // the window's end finds the next window
  EXPECT_EQ(at("cell-0", 120).end_s, 200);
  EXPECT_TRUE(std::isinf(at("cell-0", 200).start_s));  // no window left
  EXPECT_EQ(at("wifi-3", 5).start_s, 30);
  EXPECT_TRUE(std::isinf(at("wifi-3", 5).end_s));
  EXPECT_EQ(at("eth-9", 1e6).start_s, 0);  // not in the trace: always online
  EXPECT_TRUE(std::isinf(at("eth-9", 1e6).end_s));
}

TEST(AvailabilityTraceTest, BadLinesAreRefusedNamingFileLineAndWhat) {
  auto error = [](const std::string& text) {
    absl::StatusOr<AvailabilityTrace> t = Trace(text);
    EXPECT_FALSE(t.ok()) << text;
    return t.ok() ? std::string() : std::string(t.status().message());
  };
  EXPECT_NE(error("a 0 10\nb 5\n").find("t.trace:2: client b: expected two times"), std::string::npos);
  EXPECT_NE(error("a zero 10\n").find("t.trace:1: from_s 'zero' is not a finite number"), std::string::npos);
  EXPECT_NE(error("a 0 soon\n").find("until_s 'soon' is not a number or inf"), std::string::npos);
  EXPECT_NE(error("a 10 10\n").find("is empty: from_s must be below until_s"), std::string::npos);
  EXPECT_NE(error("a -5 10\n").find("from_s -5 is negative"), std::string::npos);
  EXPECT_NE(error("a 0 10 20\n").find("unexpected '20'"), std::string::npos);
  EXPECT_NE(error("a 0 10\nb 0 5\na 5 20\n").find("t.trace:3: client a: this window overlaps the one on line 1"),
            std::string::npos);
  // Touching windows do not overlap.
  EXPECT_TRUE(Trace("a 0 10\na 10 20\n").ok());
}

}  // namespace
}  // namespace fl::client
