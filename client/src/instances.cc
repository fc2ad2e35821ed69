#include "fl/client/instances.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <limits>
#include <exception>
#include <fstream>
#include <sstream>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::client {
namespace {

std::string Mb(uint64_t bytes) {
  std::ostringstream os;
  os.precision(bytes >= (uint64_t{10} << 20) ? 0 : 2);
  os << std::fixed << static_cast<double>(bytes) / (1 << 20) << " MB";
  return os.str();
}

// A cgroup v2 file holding one number, or "max"; 0 when absent or "max".
uint64_t ReadCgroupNumber(const char* path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return 0;
  try {
    return std::stoull(word);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

void TrainGate::Acquire() {
  fl::MutexLock lock(mu_);
  cv_.Wait(mu_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_ < limit_; });
  ++held_;
  peak_ = std::max(peak_, held_);
}

void TrainGate::Release() {
  {
    fl::MutexLock lock(mu_);
    --held_;
  }
  cv_.NotifyOne();
}

uint32_t TrainGate::peak() const {
  fl::MutexLock lock(mu_);
  return peak_;
}

namespace {
// Holds the gate for a scope.
class GateHold {
 public:
  explicit GateHold(TrainGate* gate) : gate_(gate) {
    if (gate_ != nullptr) gate_->Acquire();
  }
  ~GateHold() {
    if (gate_ != nullptr) gate_->Release();
  }
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;

 private:
  TrainGate* gate_;
};

absl::Status Thrown(const std::string& instance, const char* what, const char* call) {
  return absl::InternalError(fl::StrCat("instance ", instance, ": ", call, " threw: ", what));
}
}  // namespace

absl::Status GatedTrainer::GetParameters(std::span<float> out) {
  try {
    return inner_->GetParameters(out);
  } catch (const std::exception& e) {
    return Thrown(instance_, e.what(), "GetParameters");
  }
}

absl::StatusOr<training::TrainResult> GatedTrainer::Train(std::span<const float> global,
                                                          const training::TrainOptions& options) {
  GateHold hold(gate_);
  try {
    return inner_->Train(global, options);
  } catch (const std::exception& e) {
    return Thrown(instance_, e.what(), "training");
  }
}

absl::StatusOr<training::EvalResult> GatedTrainer::Evaluate(std::span<const float> global) {
  GateHold hold(gate_);
  try {
    return inner_->Evaluate(global);
  } catch (const std::exception& e) {
    return Thrown(instance_, e.what(), "evaluation");
  }
}

std::vector<std::string> InstanceNames(const std::string& base, uint32_t count, uint32_t offset) {
  std::vector<std::string> names;
  names.reserve(count);
  for (uint32_t i = 0; i < count; ++i) names.push_back(fl::StrCat(base, "-", offset + i));
  return names;
}

uint32_t SecAggDroppingInstances(double fraction, uint32_t count) {
  if (!(fraction > 0)) return 0;
  // Less a hair: 0.3 x 50 is 15.000000000000002 in doubles, and 15 instances are meant, not 16.
  const double n = std::ceil(std::min(fraction, 1.0) * count - 1e-9);
  return static_cast<uint32_t>(std::clamp<double>(n, 0, count));
}

absl::StatusOr<std::vector<std::string>> InstanceServers(const std::string& flag, uint32_t count) {
  std::vector<std::string> parts;
  std::stringstream in(flag);
  for (std::string part; std::getline(in, part, ',');) {
    if (part.empty()) {
      return absl::InvalidArgumentError(fl::StrCat("--server=", flag, ": an empty address in the list"));
    }
    parts.push_back(part);
  }
  if (parts.size() == 1) return std::vector<std::string>(count, parts[0]);
  if (parts.size() != count) {
    return absl::InvalidArgumentError(fl::StrCat("--server=", flag, ": ", parts.size(), " addresses for --instances=",
                                                 count, "; give one address for all instances or one per instance"));
  }
  return parts;
}

uint64_t SessionBytesPerInstance(uint64_t num_parameters, uint32_t max_chunk_bytes) {
  const uint64_t model = num_parameters * sizeof(float);
  // Global model encoded + decoded, update, error-feedback residual: four model-sized buffers at most; two
  // chunks in flight; about 256 KB of gRPC channel state and touched thread stacks (three threads).
  return 4 * model + 2 * uint64_t{max_chunk_bytes} + (uint64_t{256} << 10);
}

uint64_t AvailableMemoryBytes() {
  uint64_t available = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kb = 0;
    std::string unit;
    meminfo >> kb >> unit;
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
  }
  const uint64_t max = ReadCgroupNumber("/sys/fs/cgroup/memory.max");
  if (max > 0) {
    const uint64_t current = ReadCgroupNumber("/sys/fs/cgroup/memory.current");
    const uint64_t left = max > current ? max - current : 0;
    available = available == 0 ? left : std::min(available, left);
  }
  return available;
}

uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

std::string MemoryEstimate::Describe() const {
  if (!model.empty()) {
    return fl::StrCat("--model ", model, ": estimated ", Mb(total_bytes), " (", how,
                      "); available to this process: ", Mb(limit_bytes), " (", limit_source, ")");
  }
  return fl::StrCat(count, " instances x ", Mb(per_instance_bytes), " (", how, ") = ", Mb(total_bytes),
                    "; available to this process: ", Mb(limit_bytes));
}

uint64_t ActivationBytesPerExample(std::string_view model_name) {
  if (model_name.starts_with("synthetic")) return 0;
  if (model_name == "cnn-fmnist") return uint64_t{200} << 10;
  if (model_name == "squeezenet1_1-fmnist") return uint64_t{950} << 10;
  return uint64_t{400} << 10;
}

MemoryEstimate EstimateOneClient(const OneClientMemory& in, uint64_t limit_bytes) {
  constexpr uint64_t kTrainBatch = 32;  // fl-server's default --batch-size
  const uint64_t per_example = ActivationBytesPerExample(in.model_name);
  const uint64_t training_state = per_example == 0 ? 0 : 3 * in.parameters * sizeof(float);
  const uint64_t eval_batch = per_example * in.eval_batch_size;
  const uint64_t train_batch = 2 * per_example * kTrainBatch;
  const uint64_t activations = std::max(eval_batch, train_batch);
  const uint64_t session = SessionBytesPerInstance(in.parameters, in.max_chunk_bytes);
  MemoryEstimate e;
  e.count = 1;
  e.model = in.model;
  e.per_instance_bytes = in.resident_bytes + kRunningBytes + training_state + activations + session;
  e.total_bytes = e.per_instance_bytes;
  e.limit_bytes = limit_bytes;
  e.how =
      fl::StrCat("resident with the model and its data loaded ", Mb(in.resident_bytes), ", running ", Mb(kRunningBytes),
                 ", training state ", Mb(training_state), ", ", eval_batch >= train_batch ? "evaluation" : "training",
                 " batch (", eval_batch >= train_batch ? uint64_t{in.eval_batch_size} : kTrainBatch, " examples) ",
                 Mb(activations), ", session buffers ", Mb(session));
  return e;
}

absl::Status CheckFits(const MemoryEstimate& e) {
  if (e.fits()) return absl::OkStatus();
  if (!e.model.empty()) {
    return absl::ResourceExhaustedError(fl::StrCat(
        "--model ", e.model, " does not fit this machine's memory: estimated ", Mb(e.total_bytes), " (", e.how,
        "), limit ", Mb(e.limit_bytes), " (", e.limit_source,
        "). Use a smaller model, a smaller --eval-batch-size, a smaller shard (--data-fraction, or more clients: "
        "--num-clients), or a board with more memory; --no-memory-check starts anyway"));
  }
  const uint64_t most = e.per_instance_bytes == 0 ? 0 : e.limit_bytes / e.per_instance_bytes;
  return absl::ResourceExhaustedError(
      fl::StrCat("--instances=", e.count, " does not fit this machine's memory: estimated ", Mb(e.total_bytes), " (",
                 e.Describe(), "), limit ", Mb(e.limit_bytes), " (", e.limit_source, "); at most ", most,
                 " instances fit: run fewer per process, a smaller --data-fraction, or spread them over machines"));
}

absl::StatusOr<AvailabilityTrace> ParseAvailabilityTrace(std::istream& in, const std::string& path) {
  AvailabilityTrace trace;
  trace.path = path;
  std::map<std::string, std::vector<std::pair<OnlineWindow, int>>> lines;  // name -> (window, line number)
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream fields(line);
    std::string name, from_text, until_text, extra;
    if (!(fields >> name)) continue;  // blank or comment
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(
          fl::StrCat(path, ":", number, ": ", what,
                     "; a line is `<client name> <from_s> <until_s>` (seconds since the clients started, until_s "
                     "may be inf), docs/testbed.md \"Availability\""));
    };
    if (!(fields >> from_text >> until_text)) return bad(fl::StrCat("client ", name, ": expected two times"));
    if (fields >> extra) return bad(fl::StrCat("unexpected '", extra, "' after the two times"));
    auto number_of = [](const std::string& text, double* out) {
      if (text == "inf") {
        *out = std::numeric_limits<double>::infinity();
        return true;
      }
      char* end = nullptr;
      *out = std::strtod(text.c_str(), &end);
      return !text.empty() && end != nullptr && *end == '\0' && std::isfinite(*out);
    };
    OnlineWindow w;
    if (!number_of(from_text, &w.start_s) || std::isinf(w.start_s)) {
      return bad(fl::StrCat("from_s '", from_text, "' is not a finite number"));
    }
    if (!number_of(until_text, &w.end_s)) return bad(fl::StrCat("until_s '", until_text, "' is not a number or inf"));
    if (w.start_s < 0) return bad(fl::StrCat("from_s ", from_text, " is negative"));
    if (!(w.start_s < w.end_s)) {
      return bad(fl::StrCat("the window ", from_text, "..", until_text, " is empty: from_s must be below until_s"));
    }
    lines[name].emplace_back(w, number);
  }
  for (auto& [name, windows] : lines) {
    std::sort(windows.begin(), windows.end(),
              [](const auto& x, const auto& y) { return x.first.start_s < y.first.start_s; });
    for (size_t i = 1; i < windows.size(); ++i) {
      if (windows[i].first.start_s < windows[i - 1].first.end_s) {
        return absl::InvalidArgumentError(fl::StrCat(path, ":", windows[i].second, ": client ", name,
                                                     ": this window overlaps the one on line ", windows[i - 1].second,
                                                     "; merge them or make them disjoint"));
      }
    }
    std::vector<OnlineWindow>& out = trace.windows[name];
    for (const auto& [w, line] : windows) out.push_back(w);
  }
  return trace;
}

absl::StatusOr<Availability> ParseAvailability(const std::string& spec) {
  if (spec.starts_with("trace:")) {
    const std::string path = spec.substr(6);
    // A regular file within kMaxAvailabilityTraceBytes, checked before a byte is read: a FIFO would block the
    // start forever, /dev/zero would never end.
    absl::StatusOr<std::string> text = fl::sys::ReadUserFile(
        path, "availability trace", kMaxAvailabilityTraceBytes,
        "a trace has one line `<client name> <from_s> <until_s>` per online window (docs/testbed.md "
        "\"Availability\"); split a larger one over several processes' --instances");
    if (!text.ok()) {
      return absl::Status(text.status().code(), fl::StrCat("--availability=", spec, ": ", text.status().message()));
    }
    std::istringstream in(*std::move(text));
    absl::StatusOr<AvailabilityTrace> trace = ParseAvailabilityTrace(in, path);
    if (!trace.ok()) return trace.status();
    Availability a;
    a.trace = std::make_shared<const AvailabilityTrace>(*std::move(trace));
    return a;
  }
  const std::string prefix = "diurnal:";
  if (!spec.starts_with(prefix)) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--availability=", spec, ": expected diurnal:period_s=<s>,online=<fraction>[,seed=<n>] or trace:<file>"));
  }
  Availability a;
  bool period = false, online = false;
  std::stringstream in(spec.substr(prefix.size()));
  for (std::string part; std::getline(in, part, ',');) {
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq), value = eq == std::string::npos ? "" : part.substr(eq + 1);
    char* end = nullptr;
    if (key == "seed") {
      a.seed = std::strtoull(value.c_str(), &end, 10);
    } else if (key == "period_s" || key == "online") {
      const double v = std::strtod(value.c_str(), &end);
      (key == "period_s" ? a.period_s : a.online_fraction) = v;
      (key == "period_s" ? period : online) = true;
    } else {
      return absl::InvalidArgumentError(
          fl::StrCat("--availability=", spec, ": unknown '", key, "'; allowed: period_s, online, seed"));
    }
    if (value.empty() || end == nullptr || *end != '\0') {
      return absl::InvalidArgumentError(fl::StrCat("--availability=", spec, ": '", part, "' is not a number"));
    }
  }
  if (!period || !(a.period_s > 0)) {
    return absl::InvalidArgumentError(fl::StrCat("--availability=", spec, ": period_s must be given and > 0"));
  }
  if (!online || !(a.online_fraction > 0 && a.online_fraction <= 1)) {
    return absl::InvalidArgumentError(fl::StrCat("--availability=", spec, ": online must be given, in (0, 1]"));
  }
  return a;
}

OnlineWindow NextOnlineWindow(const Availability& a, uint32_t client_index, double t_s, std::string_view client_name) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (a.trace != nullptr) {
    auto it = a.trace->windows.find(client_name);
    if (it == a.trace->windows.end()) return {0, kInf};  // not in the trace: always online
    for (const OnlineWindow& w : it->second) {
      if (t_s < w.end_s) return w;
    }
    return {kInf, kInf};  // its last window is over
  }
  if (a.always()) return {0, kInf};
  // splitmix64 of (seed, shard): a phase that depends on nothing else.
  uint64_t z = a.seed * 0x9E3779B97F4A7C15ull + client_index + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const double phase = static_cast<double>(z >> 11) / static_cast<double>(uint64_t{1} << 53) * a.period_s;
  const double online = a.online_fraction * a.period_s;
  // Windows start at phase + k * period, always computed so (the same k gives the same bits: a window's end
  // fed back in finds the next window, not the same one).
  auto window = [&](double k) { return OnlineWindow{phase + k * a.period_s, phase + k * a.period_s + online}; };
  const double k = std::floor((t_s - phase) / a.period_s);
  const OnlineWindow w = window(k);
  return t_s < w.end_s ? w : window(k + 1);
}

}  // namespace fl::client
