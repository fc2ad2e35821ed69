#include "fl/server/client_input.h"

#include <algorithm>
#include <cmath>

#include "fl/core/clock_sync.h"
#include "fl/core/str_cat.h"

namespace fl::server {
namespace {

using Problem = std::optional<InputProblem>;

Problem TooLong(std::string_view field, std::string_view value, size_t limit) {
  if (value.size() <= limit) return std::nullopt;
  return InputProblem{std::string(field), fl::StrCat(field, " is ", value.size(), " bytes long; the limit is ", limit,
                                                     " bytes (it starts '", LogSafe(value, 40), "')")};
}

// Each check in turn; the first problem wins.
template <typename... Checks>
Problem First(Checks... checks) {
  Problem found;
  ((found.has_value() ? void() : void(found = checks())), ...);
  return found;
}

// A finite figure beyond InputLimits::kMaxReportedValue (NaN and Inf pass: the callers name them as not finite).
Problem OutOfRange(const std::string& field, double value) {
  if (!std::isfinite(value) || std::fabs(value) <= InputLimits::kMaxReportedValue) return std::nullopt;
  return InputProblem{
      field, fl::StrCat(field, " is ", value, "; a reported figure is at most ", InputLimits::kMaxReportedValue,
                        " in magnitude (the largest fp32 value: clients compute their figures in "
                        "fp32, and the server's weighted sums of them must stay finite)")};
}

Problem CheckMetrics(const google::protobuf::Map<std::string, double>& metrics, std::string_view field) {
  if (metrics.size() > InputLimits::kMaxMetrics) {
    return InputProblem{std::string(field), fl::StrCat(field, " holds ", metrics.size(), " entries; the limit is ",
                                                       InputLimits::kMaxMetrics)};
  }
  for (const auto& [name, value] : metrics) {
    if (Problem p = TooLong(fl::StrCat(field, " key"), name, InputLimits::kShortText)) return p;
    if (!std::isfinite(value)) {
      return InputProblem{fl::StrCat(field, "[", LogSafe(name, 64), "]"),
                          fl::StrCat(field, "[\"", LogSafe(name, 64), "\"] is ", value, "; metrics must be finite")};
    }
  }
  return std::nullopt;
}

// Every metric within InputLimits::kMaxReportedValue; after the checks of the metrics the server knows by name,
// whose own messages say more (num_steps of 1e300 is not a whole number of steps in range).
Problem CheckMetricMagnitudes(const google::protobuf::Map<std::string, double>& metrics, std::string_view field) {
  for (const auto& [name, value] : metrics) {
    if (Problem p = OutOfRange(fl::StrCat(field, "[\"", LogSafe(name, 64), "\"]"), value)) {
      p->field = fl::StrCat(field, "[", LogSafe(name, 64), "]");
      return p;
    }
  }
  return std::nullopt;
}

Problem CheckTimings(const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings, std::string_view field,
                     int64_t max_phase_ns, uint64_t max_bytes) {
  if (static_cast<size_t>(timings.size()) > InputLimits::kMaxTimings) {
    return InputProblem{std::string(field), fl::StrCat(field, " holds ", timings.size(), " entries; the limit is ",
                                                       InputLimits::kMaxTimings)};
  }
  // Durations are summed per phase when recorded: the sum must respect the bound too.
  int64_t total[8] = {};
  for (const fl::v1::PhaseTiming& t : timings) {
    if (Problem p = CheckPhaseTiming(t, field, max_phase_ns, max_bytes)) return p;
    int64_t& sum = total[static_cast<int>(t.phase())];
    sum += t.duration_ns();  // each <= max_phase_ns < 2^62 and at most 16 of them: no overflow
    if (sum > max_phase_ns) {
      return InputProblem{
          std::string(field),
          fl::StrCat(field, ": the ", fl::v1::Phase_Name(t.phase()), " durations add up to ", sum,
                     " ns, more than the ", max_phase_ns, " ns since the server dispatched the task (with slack)")};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<InputProblem> CheckJoinRequestSizes(const fl::v1::JoinRequest& r) {
  using L = InputLimits;
  const fl::v1::DeviceInfo& d = r.device();
  Problem p = First([&] { return TooLong("device.device_class", d.device_class(), L::kShortText); },
                    [&] { return TooLong("device.arch", d.arch(), L::kShortText); },
                    [&] { return TooLong("device.os", d.os(), L::kLongText); },
                    [&] { return TooLong("device.hostname", d.hostname(), L::kLongText); },
                    [&] { return TooLong("device.profile", d.profile(), L::kLongText); },
                    [&] { return TooLong("device.accelerator.name", d.accelerator().name(), L::kLongText); },
                    [&] { return TooLong("link.interface", r.link().interface(), L::kShortText); },
                    [&] { return TooLong("link.profile", r.link().profile(), L::kLongText); },
                    [&] { return TooLong("link.description", r.link().description(), L::kLongText); },
                    [&] { return TooLong("software_version", r.software_version(), L::kLongText); },
                    [&] { return TooLong("task", r.task(), L::kShortText); },
                    [&] { return TooLong("model_spec.name", r.model_spec().name(), L::kLongText); });
  if (p.has_value()) return p;
  // device_class is a Prometheus label value and a group-by key: printable ASCII only (a byte that is not
  // UTF-8 would make every scrape of /metrics fail).
  for (char c : d.device_class()) {
    if (c < 0x20 || c > 0x7e) {
      return InputProblem{"device.device_class", fl::StrCat("device.device_class '", LogSafe(d.device_class(), 64),
                                                            "' holds a byte that is not printable ASCII")};
    }
  }
  // Counts that go into the records' INTEGER columns (CHECK >= 0): a uint64 above INT64_MAX would be stored
  // negative and lose the client's row.
  if (d.memory_bytes() > L::kMaxMemoryBytes) {
    return InputProblem{"device.memory_bytes", fl::StrCat("device.memory_bytes is ", d.memory_bytes(),
                                                          "; the limit is ", L::kMaxMemoryBytes, " (1 PiB)")};
  }
  if (d.cpu_cores() > L::kMaxCpuCores) {
    return InputProblem{"device.cpu_cores",
                        fl::StrCat("device.cpu_cores is ", d.cpu_cores(), "; the limit is ", L::kMaxCpuCores)};
  }
  if (static_cast<size_t>(r.labels_size()) > L::kMaxLabels) {
    return InputProblem{"labels",
                        fl::StrCat("labels holds ", r.labels_size(), " entries; the limit is ", L::kMaxLabels)};
  }
  for (const auto& [key, value] : r.labels()) {
    if (Problem q = TooLong("labels key", key, L::kShortText)) return q;
    if (Problem q = TooLong(fl::StrCat("labels[\"", LogSafe(key, 64), "\"]"), value, L::kLongText)) return q;
  }
  const auto& tensors = r.model_spec().tensors();
  if (static_cast<size_t>(tensors.size()) > L::kMaxTensors) {
    return InputProblem{"model_spec.tensors",
                        fl::StrCat("model_spec holds ", tensors.size(), " tensors; the limit is ", L::kMaxTensors)};
  }
  for (int i = 0; i < tensors.size(); ++i) {
    const fl::v1::TensorSpec& t = tensors[i];
    if (Problem q = TooLong(fl::StrCat("model_spec.tensors[", i, "].name"), t.name(), L::kMaxTensorName)) return q;
    if (static_cast<size_t>(t.shape_size()) > L::kMaxTensorRank) {
      return InputProblem{fl::StrCat("model_spec.tensors[", i, "].shape"),
                          fl::StrCat("tensor '", LogSafe(t.name(), 64), "' has ", t.shape_size(),
                                     " dimensions; the limit is ", L::kMaxTensorRank)};
    }
  }
  return std::nullopt;
}

std::optional<InputProblem> CheckPhaseTiming(const fl::v1::PhaseTiming& t, std::string_view field, int64_t max_phase_ns,
                                             uint64_t max_bytes) {
  const std::string where = fl::StrCat(field, " (", fl::v1::Phase_Name(t.phase()), ")");
  if (t.phase() <= fl::v1::PHASE_UNSPECIFIED || t.phase() > fl::v1::PHASE_IDLE) {
    return InputProblem{std::string(field), fl::StrCat(field, " names phase ", static_cast<int>(t.phase()),
                                                       ", which is not a known fl.v1.Phase")};
  }
  if (t.duration_ns() < 0 || t.duration_ns() > max_phase_ns) {
    return InputProblem{where, fl::StrCat(where, " lasted ", t.duration_ns(), " ns; it must be in [0, ", max_phase_ns,
                                          "] ns, the time since the server dispatched the task (with slack)")};
  }
  if (t.start_client_ns() < -core::kMaxClockNs || t.start_client_ns() > core::kMaxClockNs) {
    return InputProblem{where, fl::StrCat(where, " starts at ", t.start_client_ns(),
                                          " ns of the client's clock; no monotonic clock reads that (limit +-",
                                          core::kMaxClockNs, " ns)")};
  }
  if (t.bytes() > max_bytes) {
    return InputProblem{
        where, fl::StrCat(where, " moved ", t.bytes(), " bytes; at most ", max_bytes, " are possible for this model")};
  }
  return std::nullopt;
}

std::optional<InputProblem> CheckUpdateReport(const fl::v1::UpdateHeader& h, const UpdateBounds& b) {
  if (Problem p = TooLong("task_id", h.task_id(), InputLimits::kLongText)) return p;
  if (Problem p = TooLong("codec", h.codec(), InputLimits::kShortText)) return p;
  if (h.num_examples() == 0 || h.num_examples() > b.max_examples) {
    return InputProblem{"num_examples",
                        fl::StrCat("update claims ", h.num_examples(), " training examples; it must be in [1, ",
                                   b.max_examples, "] (", b.examples_basis, ")")};
  }
  if (Problem p = CheckMetrics(h.metrics(), "metrics")) return p;
  if (auto it = h.metrics().find("train_loss"); it != h.metrics().end() && it->second < 0) {
    return InputProblem{"metrics[train_loss]",
                        fl::StrCat("metrics[\"train_loss\"] is ", it->second, "; a loss is a finite value >= 0")};
  }
  if (auto it = h.metrics().find("train_accuracy"); it != h.metrics().end() && (it->second < 0 || it->second > 1)) {
    return InputProblem{"metrics[train_accuracy]",
                        fl::StrCat("metrics[\"train_accuracy\"] is ", it->second, "; an accuracy is in [0, 1]")};
  }
  if (auto it = h.metrics().find("num_steps"); it != h.metrics().end()) {
    const double steps = it->second;
    if (steps < 0 || steps != std::floor(steps) || steps > static_cast<double>(b.max_steps)) {
      return InputProblem{"metrics[num_steps]", fl::StrCat("metrics[\"num_steps\"] is ", steps,
                                                           "; it must be a whole number in [0, ", b.max_steps, "]")};
    }
  }
  if (Problem p = CheckMetricMagnitudes(h.metrics(), "metrics")) return p;
  return CheckTimings(h.timings(), "timings", b.max_phase_ns, b.max_phase_bytes);
}

std::optional<InputProblem> CheckEvaluationReport(const fl::v1::EvaluationResult& r, uint64_t max_examples,
                                                  int64_t max_phase_ns) {
  if (r.num_examples() > max_examples) {
    return InputProblem{"num_examples", fl::StrCat("the result claims ", r.num_examples(), " examples; at most ",
                                                   max_examples, " are possible")};
  }
  if (Problem p = OutOfRange("loss", r.loss())) return p;
  if (Problem p = OutOfRange("accuracy", r.accuracy())) return p;
  if (Problem p = CheckMetrics(r.metrics(), "metrics")) return p;
  if (Problem p = CheckMetricMagnitudes(r.metrics(), "metrics")) return p;
  // An evaluation moves no bytes but the model download: bytes are bounded by the caller's phase bound
  // only through the downlink, which is not in an evaluation's header; any count is cut at 2^62.
  return CheckTimings(r.timings(), "timings", max_phase_ns, uint64_t{1} << 62);
}

std::string LogSafe(std::string_view text, size_t max_bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  const size_t n = std::min(text.size(), max_bytes);
  out.reserve(n + 16);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > max_bytes) out += fl::StrCat("...(", text.size(), " bytes)");
  return out;
}

}  // namespace fl::server
