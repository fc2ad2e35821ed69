// Whole-process device emulation (issue 30 item 3): the rule that turns a device profile into a cpu quota, the
// choice between the quota and the duty cycle (emulation.devices), a busy process slowed by the profile's factor
// under that quota (the real kernel), and fl-experiment putting a process-per-client client in its quota with
// fl-client --slowdown 1 (the real fl-server and fl-client). Where this machine cannot give cpu quotas (not root,
// no cpu controller), the tests check the refusal instead.
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <atomic>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/experiment/manifest.h"
#include "fl/experiment/runner.h"
#include "fl/sys/cpu_quota.h"
#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

// One client on a Pi 4 (relative_speed 1) on a host 4 times as fast: slowdown 4; one training thread.
constexpr char kManifest[] = R"(name: device-quota-test
seed: 5
server:
  rounds: 3
  round_deadline_s: 60
  selection: {min_fit_clients: 1, min_available_clients: 1}
  evaluation: {every: 0}
training: {model: "synthetic:20000:300", threads: 1}
security: {mode: insecure}
emulation: {backend: none, host_relative_speed: 4, devices: cpu-quota, virtual_clients: false}
clients:
  - name: devquota
    device: rpi4
)";

std::string Edit(std::string text, std::string_view from, std::string_view to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

absl::StatusOr<Manifest> Parse(const std::string& text) {
  const fs::path dir = FL_EXPERIMENTS_DIR;
  return ParseManifest(text, "device.yaml", dir, ManifestOptions{dir / "profiles"});
}

void ParseOk(const std::string& text, Manifest* m) {
  absl::StatusOr<Manifest> parsed = Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  *m = *std::move(parsed);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

double Cores() { return std::max(1u, std::thread::hardware_concurrency()); }

TEST(DeviceQuotaTest, TheRuleIsTheTrainingThreadsOverTheSlowdown) {
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(ParseOk(kManifest, &m));
  EXPECT_DOUBLE_EQ(DeviceQuotaCores(m, m.clients[0]), 1.0 / 4);
  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "threads: 1", "threads: 2"), &m));
  EXPECT_DOUBLE_EQ(DeviceQuotaCores(m, m.clients[0]), std::min(2.0, Cores()) / 4);
  // threads 0: LibTorch's default, every core of this machine.
  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "threads: 1", "threads: 0"), &m));
  EXPECT_DOUBLE_EQ(DeviceQuotaCores(m, m.clients[0]), Cores() / 4);
  // More threads than cores keep only the cores busy.
  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "threads: 1", "threads: 1024"), &m));
  EXPECT_DOUBLE_EQ(DeviceQuotaCores(m, m.clients[0]), Cores() / 4);
  // A Pi 5 (relative_speed 2.5) on the same host: slowdown 1.6.
  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "device: rpi4", "device: rpi5"), &m));
  EXPECT_DOUBLE_EQ(DeviceQuotaCores(m, m.clients[0]), 1 / 1.6);
}

TEST(DeviceQuotaTest, DevicesSettingResolvesPerGroup) {
  const absl::Status support = fl::sys::CpuQuotaSupport().status();
  // A host-speed group needs nothing; virtual clients keep the duty cycle and say why; duty-cycle is as asked.
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(ParseOk(
      Edit(Edit(kManifest, "devices: cpu-quota, virtual_clients: false", "devices: auto"),
           "  - name: devquota\n    device: rpi4\n", "  - name: fast\n  - name: pis\n    count: 3\n    device: rpi4\n"),
      &m));
  absl::StatusOr<std::vector<DeviceEmulation>> d = ResolveDevices(m, "none");
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->size(), 2u);
  EXPECT_EQ((*d)[0].mode, "host");
  EXPECT_EQ((*d)[1].mode, "duty-cycle");
  EXPECT_DOUBLE_EQ((*d)[1].slowdown, 4);
  EXPECT_NE((*d)[1].why.find("virtual clients"), std::string::npos) << (*d)[1].why;
  // The kernel backend runs a process per client: those get the quota (where this machine has it).
  d = ResolveDevices(m, "kernel");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)[1].mode, support.ok() ? "cpu-quota" : "duty-cycle");
  if (!support.ok()) {
    EXPECT_EQ((*d)[1].why, support.message());
  }

  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "devices: cpu-quota", "devices: duty-cycle"), &m));
  d = ResolveDevices(m, "none");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)[0].mode, "duty-cycle");
  EXPECT_EQ((*d)[0].why, "");

  // Asked for explicitly: a quota, or a refusal naming what this machine lacks.
  ASSERT_NO_FATAL_FAILURE(ParseOk(kManifest, &m));
  d = ResolveDevices(m, "none");
  if (support.ok()) {
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)[0].mode, "cpu-quota");
    EXPECT_DOUBLE_EQ((*d)[0].cores, 0.25);
  } else {
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find(support.message()), std::string::npos) << d.status();
    EXPECT_NE(d.status().message().find("emulation.devices"), std::string::npos) << d.status();
  }
  // A quota under the kernel's 1 ms per 100 ms cannot be enforced: refused when asked for, naming the value;
  // auto falls back to the duty cycle.
  if (support.ok()) {
    ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(kManifest, "host_relative_speed: 4", "host_relative_speed: 400"), &m));
    d = ResolveDevices(m, "none");
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("0.0025"), std::string::npos) << d.status();
    ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(Edit(kManifest, "host_relative_speed: 4", "host_relative_speed: 400"),
                                         "devices: cpu-quota", "devices: auto"),
                                    &m));
    d = ResolveDevices(m, "none");
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)[0].mode, "duty-cycle");
    EXPECT_NE((*d)[0].why.find("0.0025"), std::string::npos) << (*d)[0].why;
  }
}

double Seconds(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// The profile's factor through the kernel: a child does a fixed 0.6 s of CPU work inside the quota the rule gives
// a Pi 4 on a 4x host (0.25 core). Physics, not a timing threshold: in `wall` seconds the group can have used at
// most cores x (wall + one period) of CPU, so the work takes at least about 4x its CPU time however loaded the
// machine is; and the kernel says it throttled the group.
TEST(DeviceQuotaTest, TheQuotaSlowsABusyProcessByTheProfilesFactor) {
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(ParseOk(kManifest, &m));
  absl::StatusOr<std::vector<DeviceEmulation>> d = ResolveDevices(m, "none");
  if (!fl::sys::CpuQuotaSupport().ok()) {
    EXPECT_FALSE(d.ok()) << "cpu-quota asked for on a machine without it must be refused";
    GTEST_SKIP() << "no cpu quotas here (the refusal is checked): " << fl::sys::CpuQuotaSupport().status();
  }
  ASSERT_TRUE(d.ok()) << d.status();
  const double cores = (*d)[0].cores;
  ASSERT_DOUBLE_EQ(cores, 0.25);
  absl::StatusOr<std::unique_ptr<fl::sys::CpuQuota>> q = fl::sys::CpuQuota::Create("device-quota-test", cores);
  ASSERT_TRUE(q.ok()) << q.status();

  int go[2], done[2];
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(done), 0);
  constexpr double kWorkCpuS = 0.6;
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    if (read(go[0], &c, 1) != 1) _exit(2);  // inside the group from here on
    const double cpu0 = Seconds(CLOCK_PROCESS_CPUTIME_ID), wall0 = Seconds(CLOCK_MONOTONIC);
    volatile uint64_t x = 0;
    while (Seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0 < kWorkCpuS) {
      for (int i = 0; i < 10000; ++i) x = x + i;
    }
    const double out[2] = {Seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0, Seconds(CLOCK_MONOTONIC) - wall0};
    _exit(write(done[1], out, sizeof(out)) == sizeof(out) ? 0 : 3);
  }
  close(go[0]);
  close(done[1]);
  const absl::Status added = (*q)->AddProcess(child);
  EXPECT_TRUE(added.ok()) << added;
  ASSERT_EQ(write(go[1], "g", 1), 1);
  double out[2] = {0, 0};
  const ssize_t got = read(done[0], out, sizeof(out));
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  close(go[1]);
  close(done[0]);
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(out)));
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  const double cpu = out[0], wall = out[1];
  const double period_s = std::chrono::duration<double>((*q)->period()).count();
  EXPECT_GE(cpu, kWorkCpuS);
  EXPECT_LE(cpu, cores * (wall + period_s))
      << "cpu " << cpu << " s in " << wall << " s of wall under " << cores << " core";
  absl::StatusOr<fl::sys::CpuQuotaStats> stats = (*q)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->throttled_periods, 0u);
  std::cout << "0.6 s of CPU work under " << cores << " core: " << wall << " s of wall (" << wall / cpu
            << "x), throttled in " << stats->throttled_periods << " of " << stats->periods << " periods\n";
}

// The cgroup (relative to the cpu controller's root) that /proc/<pid>/cgroup gives for the cpu controller.
std::string CpuCgroupOf(pid_t pid, const fl::sys::CpuController& c) {
  std::istringstream lines(ReadText(fl::StrCat("/proc/", pid, "/cgroup")));
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    if (c.version == fl::sys::CgroupVersion::kV2 ? line.substr(0, a) == "0" && controllers.empty()
                                                 : ("," + controllers + ",").find(",cpu,") != std::string::npos) {
      return line.substr(b + 1);
    }
  }
  return "";
}

// The group's quota in cores: v1 cpu.cfs_quota_us / cpu.cfs_period_us, v2 cpu.max "<quota> <period>".
double QuotaCoresOf(const fs::path& group, const fl::sys::CpuController& c) {
  double quota = 0, period = 0;
  if (c.version == fl::sys::CgroupVersion::kV2) {
    std::istringstream(ReadText((group / "cpu.max").string())) >> quota >> period;
  } else {
    std::istringstream(ReadText((group / "cpu.cfs_quota_us").string())) >> quota;
    std::istringstream(ReadText((group / "cpu.cfs_period_us").string())) >> period;
  }
  return period > 0 ? quota / period : -1;
}

// `flag` and `value` as two arguments of a /proc/<pid>/cmdline (NUL-separated).
std::string ArgPair(std::string_view flag, std::string_view value) {
  const std::string nul(1, '\0');
  return nul + std::string(flag) + nul + std::string(value) + nul;
}

// The child of ours running FL_CLIENT_BIN as `name`, or -1.
pid_t ClientPid(const std::string& name) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = ReadText(fl::StrCat("/proc/", pid, "/cmdline"));
    if (cmd.rfind(FL_CLIENT_BIN, 0) != 0 || cmd.find(ArgPair("--name", name)) == std::string::npos) {
      continue;
    }
    std::istringstream stat(ReadText(fl::StrCat("/proc/", pid, "/stat")));
    std::string field;
    for (int i = 0; i < 4 && stat >> field;) ++i;  // pid (comm) state ppid; comm has no spaces here
    if (std::stoi(field) == getpid()) return std::stoi(pid);
  }
  return -1;
}

// What the wait loop saw of the client devquota-0: its cpu cgroup, that group's quota, its --slowdown.
struct Seen {
  std::string cgroup;  // relative to the controller's root; "" = not seen yet
  double quota_cores = -1;
  bool slowdown_1 = false;
};

// RunOptions::on_tick filling `seen` the first time the client runs. The wait loop runs right after each client
// starts, in the same thread, and about every 100 ms while the client lives (seconds), so it cannot be missed.
// With the kernel backend the first look may find `ip netns exec` not yet exec'd into fl-client: a later one sees
// it.
std::function<void(const std::string&)> Observe(Seen* seen, const fl::sys::CpuController& c) {
  return [seen, &c](const std::string&) {
    if (!seen->cgroup.empty()) return;
    const pid_t pid = ClientPid("devquota-0");
    if (pid < 0) return;
    seen->slowdown_1 =
        ReadText(fl::StrCat("/proc/", pid, "/cmdline")).find(ArgPair("--slowdown", "1")) != std::string::npos;
    seen->cgroup = CpuCgroupOf(pid, c);
    seen->quota_cores = QuotaCoresOf(fs::path(c.root + seen->cgroup), c);
  };
}

// The finished run `r` of kManifest (or a variant): its client ran in a group of the rule's quota with
// --slowdown 1, the result says so, and the group is gone.
void ExpectRanInItsQuota(const Manifest& m, const RunResult& r, const Seen& seen, const fl::sys::CpuController& c) {
  EXPECT_EQ(r.status, "finished") << r.reason;
  ASSERT_FALSE(seen.cgroup.empty()) << "the client was never seen running";
  EXPECT_NE(seen.cgroup.find("/fl-testbed/devquota-0-"), std::string::npos) << seen.cgroup;
  EXPECT_DOUBLE_EQ(seen.quota_cores, DeviceQuotaCores(m, m.clients[0]));
  EXPECT_DOUBLE_EQ(seen.quota_cores, 0.25);
  EXPECT_TRUE(seen.slowdown_1) << "the client was not started with --slowdown 1";
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].process, "devquota-0");
  EXPECT_EQ(r.devices[0].mode, "cpu-quota");
  EXPECT_DOUBLE_EQ(r.devices[0].slowdown, 4);
  EXPECT_EQ(r.devices[0].cgroup, c.root + seen.cgroup);
  EXPECT_FALSE(fs::exists(r.devices[0].cgroup)) << "the quota outlived the run";
}

// A quiet run into `dir` with the real binaries.
RunOptions Options(const fl::testing::ScratchDir& dir) {
  RunOptions o;
  o.db_path = dir.File("records.db");
  o.out_dir = dir.File("run");
  o.server_bin = FL_SERVER_BIN;
  o.client_bin = FL_CLIENT_BIN;
  o.software_version = "test";
  o.quiet = true;
  return o;
}

// fl-experiment end to end: the Pi 4 client, its own process, runs in a cgroup whose quota is the rule's 0.25 core
// and was started with --slowdown 1 (the kernel slows it; no duty cycle on top); the group is gone afterwards.
TEST(DeviceQuotaRunTest, AProcessPerClientClientRunsInItsQuotaWithSlowdown1) {
  fl::testing::ScratchDir dir("device_quota");
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(ParseOk(kManifest, &m));
  RunOptions o = Options(dir);
  absl::StatusOr<fl::sys::CpuController> controller = fl::sys::CpuQuotaSupport();
  if (!controller.ok()) {
    absl::StatusOr<RunResult> r = RunExperiment(m, o);
    ASSERT_FALSE(r.ok()) << "cpu-quota asked for on a machine without it must be refused before anything starts";
    EXPECT_NE(r.status().message().find(controller.status().message()), std::string::npos) << r.status();
    EXPECT_FALSE(fs::exists(o.out_dir)) << "refused, yet the run's folder was made";
    GTEST_SKIP() << "no cpu quotas here (the refusal is checked): " << controller.status();
  }
  // A group left behind by an fl-experiment that was killed: its creator (a pid above pid_max, so none) is gone.
  std::istringstream pid_max_text(ReadText("/proc/sys/kernel/pid_max"));
  long pid_max = 0;
  pid_max_text >> pid_max;
  ASSERT_GT(pid_max, 0);
  const fs::path stale = fs::path(controller->root) / "fl-testbed" / fl::StrCat("devquota-stale-", pid_max + 1, "-0");
  std::error_code ec;
  fs::create_directories(stale, ec);
  ASSERT_FALSE(ec) << stale << ": " << ec.message();
  struct RemoveAtEnd {  // whatever happens below (the next run that uses quotas would remove it too)
    fs::path path;
    ~RemoveAtEnd() {
      std::error_code e;
      fs::remove(path, e);
    }
  } remove_stale{stale};
  Seen seen;
  o.on_tick = Observe(&seen, *controller);
  absl::StatusOr<RunResult> r = RunExperiment(m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(fs::exists(stale)) << "the stale group of a killed run was not removed";
  ASSERT_NO_FATAL_FAILURE(ExpectRanInItsQuota(m, *r, seen, *controller));
}

// The kernel backend: the client runs through `ip netns exec` (which execs it: the pid fl-experiment put in the
// group is fl-client's) behind an emulated Ethernet link, in its quota all the same.
TEST(DeviceQuotaRunTest, AKernelBackendClientRunsInItsQuota) {
  absl::StatusOr<fl::sys::CpuController> controller = fl::sys::CpuQuotaSupport();
  if (!controller.ok()) GTEST_SKIP() << "no cpu quotas here (the refusal is checked above): " << controller.status();
  if (geteuid() != 0) GTEST_SKIP() << "the kernel link backend needs root (network namespaces, tc)";
  fl::testing::ScratchDir dir("device_quota");
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(ParseOk(Edit(Edit(kManifest, "backend: none", "backend: kernel"), "    device: rpi4\n",
                                       "    device: rpi4\n    link: ethernet\n"),
                                  &m));
  RunOptions o = Options(dir);
  Seen seen;
  o.on_tick = Observe(&seen, *controller);
  absl::StatusOr<RunResult> r = RunExperiment(m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, "kernel");
  ASSERT_NO_FATAL_FAILURE(ExpectRanInItsQuota(m, *r, seen, *controller));
}

// Interrupted (Ctrl-C) as soon as the client is in its quota: the run stops and the group is gone all the same.
TEST(DeviceQuotaRunTest, AnInterruptedRunRemovesItsQuotas) {
  absl::StatusOr<fl::sys::CpuController> controller = fl::sys::CpuQuotaSupport();
  if (!controller.ok()) GTEST_SKIP() << "no cpu quotas here (the refusal is checked above): " << controller.status();
  fl::testing::ScratchDir dir("device_quota");
  Manifest m;
  ASSERT_NO_FATAL_FAILURE(
      ParseOk(Edit(Edit(kManifest, "rounds: 3", "rounds: 50"), "synthetic:20000:300", "synthetic:20000:2000"), &m));
  std::atomic<bool> interrupted{false};
  RunOptions o = Options(dir);
  o.interrupted = &interrupted;
  std::string cgroup;
  o.on_tick = [&](const std::string&) {
    const pid_t pid = ClientPid("devquota-0");
    if (pid < 0 || !cgroup.empty()) return;
    cgroup = CpuCgroupOf(pid, *controller);
    interrupted = true;
  };
  absl::StatusOr<RunResult> r = RunExperiment(m, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, "aborted") << r->reason;
  EXPECT_NE(cgroup.find("/fl-testbed/devquota-0-"), std::string::npos) << cgroup;
  ASSERT_EQ(r->devices.size(), 1u);
  EXPECT_EQ(r->devices[0].cgroup, controller->root + cgroup);
  EXPECT_FALSE(fs::exists(r->devices[0].cgroup)) << "the quota outlived the interrupted run";
}

}  // namespace
}  // namespace fl::experiment
