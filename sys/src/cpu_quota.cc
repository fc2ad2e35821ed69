#include "fl/sys/cpu_quota.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "fl/core/str_cat.h"

namespace fl::sys {
namespace {

constexpr std::string_view kParent = "fl-testbed";

// Abseil here has its own string_view; these keep the parsing on std::string_view.
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find(sep, begin);
    if (end == std::string_view::npos) end = text.size();
    if (end > begin) parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(fl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// cgroup files take one write per value; the kernel's answer (EINVAL, EPERM, ESRCH) comes back from write().
absl::Status WriteFile(const std::string& path, std::string_view value) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::PermissionDeniedError(fl::StrCat("cannot open ", path, " for writing: ", std::strerror(errno),
                                                  " (run as root or delegate the cgroup)"));
  }
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    return absl::InvalidArgumentError(fl::StrCat("writing '", value, "' to ", path, " failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path, bool exist_ok) {
  if (::mkdir(path.c_str(), 0755) == 0 || (exist_ok && errno == EEXIST)) return absl::OkStatus();
  return absl::PermissionDeniedError(fl::StrCat("cannot create the cgroup ", path, ": ", std::strerror(errno),
                                                " (run as root, or under a cgroup delegated to this user)"));
}

bool HasWord(std::string_view list, std::string_view word, char sep) {
  for (std::string_view part : Split(list, sep)) {
    if (part == word) return true;
  }
  return false;
}

std::vector<pid_t> Pids(const std::string& procs_file) {
  std::vector<pid_t> pids;
  auto text = ReadFile(procs_file);
  if (!text.ok()) return pids;
  for (std::string_view line : Split(*text, '\n')) {
    int pid = 0;
    if (ParseNumber(line, &pid)) pids.push_back(pid);
  }
  return pids;
}

}  // namespace

absl::StatusOr<CpuController> FindCpuController(std::string_view mounts_file) {
  const std::string mounts_path(mounts_file);
  auto mounts = ReadFile(mounts_path);
  if (!mounts.ok()) return mounts.status();
  std::optional<CpuController> v1;
  std::string v2_without_cpu;  // a v2 mount found, with what it offers, to name it in the error
  for (std::string_view line : Split(*mounts, '\n')) {
    std::vector<std::string_view> fields = Split(line, ' ');
    if (fields.size() < 4) continue;
    const std::string dir(fields[1]);
    if (fields[2] == "cgroup2") {
      auto controllers = ReadFile(dir + "/cgroup.controllers");
      std::string list = controllers.ok() ? *controllers : "";
      while (!list.empty() && list.back() == '\n') list.pop_back();
      if (HasWord(list, "cpu", ' ')) return CpuController{CgroupVersion::kV2, dir};
      if (v2_without_cpu.empty()) v2_without_cpu = fl::StrCat(dir, " (cgroup.controllers: '", list, "')");
    } else if (fields[2] == "cgroup" && HasWord(fields[3], "cpu", ',') && !v1.has_value()) {
      v1 = CpuController{CgroupVersion::kV1, dir};
    }
  }
  // A hybrid host (v1 controllers plus an empty v2 tree, as here) has cpu on v1 only.
  if (v1.has_value()) return *v1;
  if (!v2_without_cpu.empty()) {
    return absl::FailedPreconditionError(fl::StrCat("cgroup v2 is mounted at ", v2_without_cpu,
                                                    " but its cpu controller is not available there and no cgroup v1 "
                                                    "cpu hierarchy is mounted (",
                                                    mounts_path,
                                                    "); enable it (echo +cpu > <root>/cgroup.subtree_control of the "
                                                    "parent) or boot with the cpu controller on v2"));
  }
  return absl::FailedPreconditionError(
      fl::StrCat("no cgroup cpu controller is mounted (", mounts_path,
                 " has neither a cgroup2 mount nor a cgroup v1 mount with the cpu option); mount one, e.g. "
                 "`mount -t cgroup -o cpu cgroup /sys/fs/cgroup/cpu` (v1) or `mount -t cgroup2 none /sys/fs/cgroup`"));
}

absl::StatusOr<CpuController> CpuQuotaSupport() {
  auto controller = FindCpuController();
  if (!controller.ok()) return controller.status();
  if (::access(controller->root.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(
        fl::StrCat("the cgroup ", controller->version == CgroupVersion::kV1 ? "v1" : "v2", " cpu hierarchy at ",
                   controller->root, " is not writable by uid ", ::getuid(), " (", std::strerror(errno),
                   "); run as root or delegate a cgroup to this user"));
  }
  return controller;
}

absl::Status ValidateCores(double cores) {
  const unsigned machine = std::max(1u, std::thread::hardware_concurrency());
  if (!std::isfinite(cores) || cores < 0.01 || cores > static_cast<double>(machine)) {
    return absl::InvalidArgumentError(fl::StrCat("CPU quota of ", cores,
                                                 " cores is out of range: give a number from "
                                                 "0.01 (1 ms per 100 ms period) to this machine's ",
                                                 machine, " cores"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuQuota>> CpuQuota::Create(std::string_view name, double cores) {
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                             "0123456789-_.") != std::string_view::npos ||
      name[0] == '.') {
    return absl::InvalidArgumentError(fl::StrCat("CPU quota name '", name,
                                                 "' is not allowed: use 1 to 64 letters, "
                                                 "digits, '-', '_' or '.' (not starting with '.')"));
  }
  if (absl::Status valid = ValidateCores(cores); !valid.ok()) return valid;
  auto controller = CpuQuotaSupport();
  if (!controller.ok()) return controller.status();

  const std::string parent = fl::StrCat(controller->root, "/", kParent);
  static std::atomic<uint64_t> counter{0};
  const std::string path = fl::StrCat(parent, "/", name, "-", ::getpid(), "-", counter.fetch_add(1));
  // Another process's last CpuQuota removes the shared parent when it empties; if that happens between our
  // mkdirs, make the parent again.
  for (int attempt = 0;; ++attempt) {
    if (absl::Status made = MakeDir(parent, /*exist_ok=*/true); !made.ok()) return made;
    absl::Status s = absl::OkStatus();
    if (controller->version == CgroupVersion::kV2) {
      // v2 gives a child the cpu controller only when every ancestor enables it for its children.
      s = WriteFile(controller->root + "/cgroup.subtree_control", "+cpu");
      if (s.ok()) s = WriteFile(parent + "/cgroup.subtree_control", "+cpu");
    }
    if (s.ok()) s = MakeDir(path, /*exist_ok=*/false);
    if (s.ok()) break;
    if (attempt == 4 || ::access(parent.c_str(), F_OK) == 0) return s;  // not the race: a real error
  }
  // From here on the destructor removes the group whatever fails next.
  std::unique_ptr<CpuQuota> quota(new CpuQuota(*controller, path, cores));

  const int64_t period = PeriodFor(cores).count();
  const int64_t limit = std::max<int64_t>(1000, std::llround(cores * static_cast<double>(period)));
  if (controller->version == CgroupVersion::kV1) {
    if (absl::Status s = WriteFile(path + "/cpu.cfs_period_us", fl::StrCat(period)); !s.ok()) return s;
    if (absl::Status s = WriteFile(path + "/cpu.cfs_quota_us", fl::StrCat(limit)); !s.ok()) return s;
  } else {
    if (absl::Status s = WriteFile(path + "/cpu.max", fl::StrCat(limit, " ", period)); !s.ok()) return s;
  }
  return quota;
}

std::chrono::microseconds CpuQuota::PeriodFor(double cores) {
  if (!(cores > 0)) return kMaxPeriod;
  const double needed_us = 1000.0 / cores;  // the period that makes the quota exactly 1 ms
  const auto period = static_cast<int64_t>(std::ceil(needed_us));
  return std::chrono::microseconds(std::clamp<int64_t>(period, kMinPeriod.count(), kMaxPeriod.count()));
}

CpuQuota::~CpuQuota() {
  // A group with processes cannot be removed: move any left back to the root (v2 forbids processes in the
  // fl-testbed parent, which hands the cpu controller down, so the root is the one place valid on both).
  const std::string root_procs = controller_.root + "/cgroup.procs";
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::vector<pid_t> pids = Pids(path_ + "/cgroup.procs");
    if (pids.empty()) break;
    for (pid_t pid : pids) (void)WriteFile(root_procs, fl::StrCat(pid));
  }
  ::rmdir(path_.c_str());
  // The shared parent goes when the last group does (EBUSY while others remain: fine).
  ::rmdir(fl::StrCat(controller_.root, "/", kParent).c_str());
}

absl::Status CpuQuota::AddProcess(pid_t pid) {
  if (pid <= 0) {
    return absl::InvalidArgumentError(fl::StrCat("cannot add pid ", pid, " to ", path_, ": give a positive pid"));
  }
  absl::Status s = WriteFile(path_ + "/cgroup.procs", fl::StrCat(pid));
  if (!s.ok()) return absl::Status(s.code(), fl::StrCat(s.message(), " (is process ", pid, " alive?)"));
  return s;
}

absl::StatusOr<CpuQuotaStats> CpuQuota::Stats() const {
  auto text = ReadFile(path_ + "/cpu.stat");
  if (!text.ok()) return text.status();
  CpuQuotaStats stats;
  for (std::string_view line : Split(*text, '\n')) {
    const std::vector<std::string_view> kv = Split(line, ' ');
    uint64_t value = 0;
    if (kv.size() != 2 || !ParseNumber(kv[1], &value)) continue;
    if (kv[0] == "nr_periods") stats.periods = value;
    if (kv[0] == "nr_throttled") stats.throttled_periods = value;
    if (kv[0] == "throttled_time") stats.throttled_time = std::chrono::microseconds(value / 1000);  // v1: ns
    if (kv[0] == "throttled_usec") stats.throttled_time = std::chrono::microseconds(value);         // v2
    if (kv[0] == "usage_usec") stats.usage = std::chrono::microseconds(value);                      // v2 only
  }
  return stats;
}

}  // namespace fl::sys
