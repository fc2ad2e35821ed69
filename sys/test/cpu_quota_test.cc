// The CPU quota through the real kernel: a busy child under 0.2 core is throttled and gets no more CPU than
// the quota allows (a ceiling only: the machine is shared, so nothing asserts how fast it runs), the group is
// gone afterwards, bad values are refused. On a machine without the controller or permissions the refusal
// itself is what is checked.
#include "fl/sys/cpu_quota.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fl::sys {
namespace {

using ::testing::HasSubstr;

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Kills and reaps a forked child if the test ends early (a failed ASSERT), so no spinning child is left.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// A directory of this run's own (a fixed name would meet files an earlier run, maybe another user, left).
const std::string& OwnTempDir() {
  static const std::string dir = [] {
    std::string templ = ::testing::TempDir() + "/cpu_quota_test.XXXXXX";
    return std::string(::mkdtemp(templ.data()) != nullptr ? templ.c_str() : ::testing::TempDir().c_str());
  }();
  return dir;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = OwnTempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(CpuQuotaTest, BadValuesAreRefusedNamingTheValue) {
  for (double bad :
       {0.0, -1.0, 0.001, 1e9, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    absl::StatusOr<std::unique_ptr<CpuQuota>> quota = CpuQuota::Create("bad", bad);
    ASSERT_FALSE(quota.ok()) << bad;
    EXPECT_EQ(quota.status().code(), absl::StatusCode::kInvalidArgument) << quota.status();
    EXPECT_THAT(quota.status().message(), HasSubstr("cores is out of range")) << quota.status();
  }
  EXPECT_THAT(ValidateCores(-1).message(), HasSubstr("-1 cores"));
  EXPECT_THAT(ValidateCores(1e9).message(), HasSubstr("1e+09 cores"));
  for (const char* bad : {"", "a/b", "..", ".hidden", "sp ace"}) {
    absl::StatusOr<std::unique_ptr<CpuQuota>> quota = CpuQuota::Create(bad, 0.5);
    ASSERT_FALSE(quota.ok()) << bad;
    EXPECT_THAT(quota.status().message(), HasSubstr(std::string("'") + bad + "'"));
  }
}

// The period is the shortest in [10, 100] ms whose quota is at least the kernel's 1 ms: short, so that an emulated
// device is slowed evenly rather than frozen for most of a long period.
TEST(CpuQuotaTest, PeriodIsTheShortestThatGivesTheKernelsMillisecond) {
  using std::chrono::microseconds;
  EXPECT_EQ(CpuQuota::PeriodFor(0.25), microseconds(10'000));  // 2.5 ms of every 10 ms
  EXPECT_EQ(CpuQuota::PeriodFor(2.0), microseconds(10'000));
  EXPECT_EQ(CpuQuota::PeriodFor(0.05), microseconds(20'000));  // 1 ms of every 20 ms
  EXPECT_EQ(CpuQuota::PeriodFor(0.02), microseconds(50'000));
  EXPECT_EQ(CpuQuota::PeriodFor(0.01), microseconds(100'000));
}

TEST(CpuQuotaTest, FindsV1AndV2AndNamesWhatIsMissing) {
  // v1: a cgroup mount with the cpu option (possibly co-mounted with cpuacct).
  auto v1 = FindCpuController(WriteTemp("mounts_v1",
                                        "tmpfs /sys/fs/cgroup tmpfs rw 0 0\n"
                                        "cgroup /x/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0\n"));
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(v1->version, CgroupVersion::kV1);
  EXPECT_EQ(v1->root, "/x/cpu,cpuacct");

  // v2 whose cgroup.controllers lists cpu.
  const std::string v2_root = OwnTempDir() + "/v2root";
  ::mkdir(v2_root.c_str(), 0755);
  std::ofstream(v2_root + "/cgroup.controllers") << "cpuset cpu io memory pids\n";
  auto v2 = FindCpuController(WriteTemp("mounts_v2", "cgroup2 " + v2_root + " cgroup2 rw 0 0\n"));
  ASSERT_TRUE(v2.ok()) << v2.status();
  EXPECT_EQ(v2->version, CgroupVersion::kV2);
  EXPECT_EQ(v2->root, v2_root);

  // v2 without cpu, and nothing at all: the refusal says which.
  std::ofstream(v2_root + "/cgroup.controllers") << "memory pids\n";
  auto no_cpu = FindCpuController(WriteTemp("mounts_v2", "cgroup2 " + v2_root +
                                                             " cgroup2 rw 0 0\n"
                                                             "cgroup /x/cpuacct cgroup rw,cpuacct 0 0\n"));
  ASSERT_FALSE(no_cpu.ok());
  EXPECT_THAT(no_cpu.status().message(), HasSubstr("cpu controller is not available"));
  EXPECT_THAT(no_cpu.status().message(), HasSubstr("'memory pids'"));
  auto none = FindCpuController(WriteTemp("mounts_none", "proc /proc proc rw 0 0\n"));
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("no cgroup cpu controller is mounted"));
  EXPECT_THAT(none.status().message(), HasSubstr("mounts_none"));
}

// A child that waits on a pipe, then spins: it is put in the group before it uses any CPU, so all its CPU time
// was under the quota.
TEST(CpuQuotaTest, BusyChildIsHeldToTheQuota) {
  absl::StatusOr<CpuController> support = CpuQuotaSupport();
  if (!support.ok()) {
    // Unsupported here: the refusal must name what is missing, and Create must refuse the same way.
    EXPECT_THAT(support.status().message(), ::testing::AnyOf(HasSubstr("no cgroup cpu controller"),
                                                             HasSubstr("not available"), HasSubstr("not writable")));
    absl::StatusOr<std::unique_ptr<CpuQuota>> quota = CpuQuota::Create("busy", 0.2);
    ASSERT_FALSE(quota.ok());
    EXPECT_EQ(quota.status().message(), support.status().message());
    return;
  }
  constexpr double kCores = 0.2;
  absl::StatusOr<std::unique_ptr<CpuQuota>> quota = CpuQuota::Create("busy", kCores);
  ASSERT_TRUE(quota.ok()) << quota.status();
  const std::string path = (*quota)->path();
  ASSERT_TRUE(Exists(path)) << path;

  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(go[1]);
    char c;
    if (::read(go[0], &c, 1) != 1) ::_exit(1);
    volatile uint64_t spin = 0;
    for (;;) spin = spin + 1;
  }
  ChildGuard guard{pid};
  ::close(go[0]);
  absl::Status added = (*quota)->AddProcess(pid);
  ASSERT_TRUE(added.ok()) << added;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  ::close(go[1]);

  // At least 1 s; longer (bounded) only if the shared machine gave the child too little CPU to reach the quota.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  absl::StatusOr<CpuQuotaStats> stats = (*quota)->Stats();
  // A throttle in progress is counted at its start and timed at its end: wait for a finished one.
  for (int i = 0; i < 190 && stats.ok() && (stats->throttled_periods == 0 || stats->throttled_time.count() == 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stats = (*quota)->Stats();
  }
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->throttled_periods, 0u);
  EXPECT_GT(stats->throttled_time.count(), 0);

  // Removing the group while the child still runs moves it back out first.
  quota->reset();
  EXPECT_FALSE(Exists(path)) << path;

  ::kill(pid, SIGKILL);
  int status = 0;
  struct rusage usage {};
  ASSERT_EQ(::wait4(pid, &status, 0, &usage), pid);
  guard.pid = -1;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  RecordProperty("cpu_s", std::to_string(cpu));
  RecordProperty("wall_s", std::to_string(wall));
  RecordProperty("throttled_periods", std::to_string(stats->throttled_periods));
  // A ceiling: quota x wall, 20% for the period boundaries, 0.15 s slack for the time after the group went.
  EXPECT_LE(cpu, kCores * wall * 1.2 + 0.15) << "cpu " << cpu << " s over wall " << wall << " s";
}

TEST(CpuQuotaTest, AddingAProcessThatDoesNotExistNamesThePid) {
  absl::StatusOr<CpuController> support = CpuQuotaSupport();
  absl::StatusOr<std::unique_ptr<CpuQuota>> quota = CpuQuota::Create("gone", 0.5);
  if (!support.ok()) {  // unsupported: the refusal is what there is to check
    ASSERT_FALSE(quota.ok());
    EXPECT_EQ(quota.status().message(), support.status().message());
    return;
  }
  ASSERT_TRUE(quota.ok()) << quota.status();
  // pid_max itself is never a pid (pids are below it), so no process can have it, unlike a reaped child's pid.
  std::ifstream pid_max_file("/proc/sys/kernel/pid_max");
  pid_t pid_max = 0;
  ASSERT_TRUE(pid_max_file >> pid_max);
  absl::Status added = (*quota)->AddProcess(pid_max);
  ASSERT_FALSE(added.ok());
  EXPECT_THAT(added.message(), HasSubstr(std::to_string(pid_max)));
  EXPECT_THAT(added.message(), HasSubstr("alive?"));
  EXPECT_THAT((*quota)->AddProcess(0).message(), HasSubstr("pid 0"));
}

}  // namespace
}  // namespace fl::sys
