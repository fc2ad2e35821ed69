// CPU quota for whole processes through the kernel's CPU controller (cgroup `cpu`): a device profile slows
// everything a client process does (training and the transfer's CPU work alike), not only the training loop.
// cgroup v1 (cpu.cfs_quota_us / cpu.cfs_period_us) or v2 (cpu.max), whichever this machine has: detected from
// the mounts, never assumed. Issue 30, item 3: this is the mechanism; fl-experiment does not use it yet.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::sys {

enum class CgroupVersion { kV1, kV2 };

// Where the cpu controller lives on this machine.
struct CpuController {
  CgroupVersion version = CgroupVersion::kV1;
  std::string root;  // the hierarchy's root directory, e.g. /sys/fs/cgroup/cpu (v1) or /sys/fs/cgroup (v2)
};

// Finds the cpu controller from a mounts table (/proc/self/mounts format): a cgroup2 mount whose
// cgroup.controllers lists `cpu`, else a v1 `cgroup` mount with the `cpu` option. The error says what is
// missing (no controller mounted, v2 without cpu) and what to do. Does not check permissions.
absl::StatusOr<CpuController> FindCpuController(std::string_view mounts_file = "/proc/self/mounts");

// FindCpuController() plus whether we may create groups there (the root writable: root, or a delegated tree).
// OK means CpuQuota::Create can work; the error names the path and what is missing.
absl::StatusOr<CpuController> CpuQuotaSupport();

// Checks a quota in cores (0.25 = a quarter of one core): finite, at least 0.01 (the kernel's 1 ms minimum per
// 100 ms period) and at most the machine's cores. The error names the value and what is allowed.
absl::Status ValidateCores(double cores);

struct CpuQuotaStats {
  uint64_t periods = 0;            // enforcement periods that had runnable work
  uint64_t throttled_periods = 0;  // of those, the periods in which the group hit its quota
  std::chrono::microseconds throttled_time{0};
  // CPU time used by the group: v2's cpu.stat has it; v1's cpu controller does not (it is cpuacct's, a
  // separate hierarchy here), so it is absent on v1.
  std::optional<std::chrono::microseconds> usage;
};

// One cgroup with a CPU quota, <root>/fl-testbed/<name>-<pid>-<n> (unique per process and call). The
// destructor moves any processes still in it back to the hierarchy's root and removes it.
class CpuQuota {
 public:
  // The enforcement period: the shortest in [10 ms, 100 ms] that still gives the kernel's minimum quota of 1 ms.
  // The kernel lets a group run its whole quota at once and then stops it for the rest of the period, so the
  // period is how long an emulated device can freeze: at 0.25 core, 100 ms periods stall a process for up to
  // 75 ms (a transfer caught there takes 75 ms longer), 10 ms periods for 7.5 ms, closer to a slower CPU that
  // never stops. Shorter periods cost the scheduler a little more bookkeeping.
  static constexpr std::chrono::microseconds kMinPeriod{10'000};
  static constexpr std::chrono::microseconds kMaxPeriod{100'000};
  static std::chrono::microseconds PeriodFor(double cores);

  // `name`: letters, digits, '-', '_', '.' (it becomes a directory name).
  static absl::StatusOr<std::unique_ptr<CpuQuota>> Create(std::string_view name, double cores);
  ~CpuQuota();
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;

  // Moves `pid` (the whole process, all its threads) into the group; its later children start there too.
  absl::Status AddProcess(pid_t pid);
  absl::StatusOr<CpuQuotaStats> Stats() const;

  const std::string& path() const { return path_; }
  double cores() const { return cores_; }
  std::chrono::microseconds period() const { return PeriodFor(cores_); }
  const CpuController& controller() const { return controller_; }

 private:
  CpuQuota(CpuController controller, std::string path, double cores)
      : controller_(std::move(controller)), path_(std::move(path)), cores_(cores) {}

  CpuController controller_;
  std::string path_;
  double cores_;
};

}  // namespace fl::sys
