#include "fl/client/device_info.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace fl::client {
namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string OsPrettyName() {
  std::ifstream in("/etc/os-release");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("PRETTY_NAME=")) {
      std::string v = line.substr(12);
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
      return v;
    }
  }
  return "unknown";
}

}  // namespace

fl::v1::DeviceInfo DetectDevice(const std::string& device_class) {
  fl::v1::DeviceInfo info;
  cpu_set_t set;
  CPU_ZERO(&set);
  // The affinity mask, not the machine's core count: a client pinned to 1 core of 4 may use 1.
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0
                        ? CPU_COUNT(&set)
                        : static_cast<int>(std::thread::hardware_concurrency());
  info.set_cpu_cores(static_cast<uint32_t>(cores));
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_size > 0)
    info.set_memory_bytes(static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size));
  utsname u{};
  if (uname(&u) == 0) {
    info.set_arch(u.machine);
    info.set_hostname(u.nodename);
  }
  info.set_os(OsPrettyName());
  std::string cls = device_class;
  if (cls.empty()) {
    // /proc/device-tree/model reads e.g. "Raspberry Pi 4 Model B Rev 1.4" on a Pi (NUL-terminated).
    const std::string model = ReadFirstLine("/proc/device-tree/model");
    if (model.find("Raspberry Pi 5") != std::string::npos) {
      cls = "rpi5";
    } else if (model.find("Raspberry Pi 4") != std::string::npos) {
      cls = "rpi4";
    } else {
      cls = info.arch().empty() ? "unknown" : info.arch();
    }
  }
  info.set_device_class(cls);
  return info;
}

}  // namespace fl::client
