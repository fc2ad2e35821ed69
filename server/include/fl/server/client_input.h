// Bounds on what clients send, checked before anything they send is kept, recorded, aggregated or logged.
//
// fl-server keeps a client's Join request for the client's lifetime, writes its strings into the records and
// puts its numbers into a round's figures and the Prometheus metrics. A hostile or broken client must not be
// able to grow the server's memory or the records without bound, nor put absurd figures into a committed
// round: every string and map it sends is bounded (InputLimits), every number it reports is checked against
// its meaning and against what the server measured itself (CheckUpdateReport, CheckEvaluationReport,
// CheckPhaseTiming), and whatever of it goes to a log line is made safe first (LogSafe). docs/round-engine.md,
// "Limits on what clients send", lists the limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fl/v1/federation.pb.h"

namespace fl::server {

struct InputLimits {
  // Names and labels used as group-by keys or metric labels: device_class, arch, link.interface, task,
  // codec, metric names, label keys.
  static constexpr size_t kShortText = 64;
  // Free text shown to people: os, hostname, profiles, accelerator name, link description,
  // software_version, model name, label values, task ids.
  static constexpr size_t kLongText = 256;
  // A client's error message or leave reason (kept in logs only).
  static constexpr size_t kMessageText = 1024;
  static constexpr size_t kMaxLabels = 16;
  // Device figures recorded in the clients table.
  static constexpr uint64_t kMaxMemoryBytes = uint64_t{1} << 50;
  static constexpr uint32_t kMaxCpuCores = 1u << 16;
  static constexpr size_t kMaxMetrics = 32;
  static constexpr size_t kMaxTimings = 16;
  // Model specs: far beyond real models (a LLaMA-70B state_dict has ~800 tensors of rank <= 2, names < 100
  // bytes), small enough that a spec kept per client stays a few MB at most.
  static constexpr size_t kMaxTensors = 1 << 16;
  static constexpr size_t kMaxTensorName = 512;
  static constexpr size_t kMaxTensorRank = 16;
  // Slack on durations compared with the server's own clock: the client's monotonic clock and the
  // network add up to a round trip of uncertainty.
  static constexpr int64_t kTimingSlackNs = 2'000'000'000;
  // The largest magnitude of a reported figure (a metric, an evaluation's loss): the largest finite fp32 value.
  // Clients compute their losses and metrics in fp32 (LibTorch), so a finite double beyond it is not a real
  // figure; and it keeps every weighted sum of figures finite (issue 27: a train_loss of 1.7e308 times its
  // example count overflowed to inf in the round's record): a figure times a weight (at most
  // --max-client-examples <= 1e12, core::kMaxUpdateWeight) is below 3.5e50, and a sum of even 2^64 of those
  // below 7e69, far from the double's 1.8e308.
  static constexpr double kMaxReportedValue = 3.4028234663852886e38;  // FLT_MAX
};

// What is wrong with a client's message: the field (as in the .proto, dotted) and a sentence naming the
// value and the bound.
struct InputProblem {
  std::string field;
  std::string message;
};

// The sizes of every string, map and the spec of a JoinRequest, and the device's counts (memory, cores) that
// the records store (not the request's meaning: the round engine checks the name's characters, the task, the
// model and the example counts).
std::optional<InputProblem> CheckJoinRequestSizes(const fl::v1::JoinRequest& request);

// What the server knows when a train update's header arrives, to bound what the client reports.
struct UpdateBounds {
  uint64_t max_examples = 0;     // the update's weight: see RoundEngine (declared at Join, task config)
  std::string examples_basis;    // why that bound, for the message ("the 600 train examples it declared at Join")
  uint64_t max_steps = 0;        // metrics["num_steps"]
  int64_t max_phase_ns = 0;      // time since the task was dispatched, plus slack
  uint64_t max_phase_bytes = 0;  // bytes a phase can have moved (the model download, with headroom)
};

// The client-reported numbers of a train update's header: num_examples in (0, max_examples]; metrics at
// most kMaxMetrics with short names, every value finite and at most kMaxReportedValue in magnitude, train_loss >= 0,
// train_accuracy in [0, 1], num_steps a whole number in [0, max_steps]; timings at most kMaxTimings, known phases,
// durations in [0, max_phase_ns], bytes <= max_phase_bytes, start timestamps within +-core::kMaxClockNs; task id and
// codec bounded.
std::optional<InputProblem> CheckUpdateReport(const fl::v1::UpdateHeader& header, const UpdateBounds& bounds);

// The numbers of an evaluation result that do not depend on the task (the round engine checks loss,
// accuracy and MAE per task): num_examples in (0, max_examples]; loss and accuracy at most kMaxReportedValue in
// magnitude (NaN and Inf are the engine's to name); metrics and timings bounded as above; durations in
// [0, max_phase_ns].
std::optional<InputProblem> CheckEvaluationReport(const fl::v1::EvaluationResult& result, uint64_t max_examples,
                                                  int64_t max_phase_ns);

// One phase timing reported after the fact (ClientStatus: the uplink): duration in [0, max_phase_ns],
// start within +-core::kMaxClockNs, bytes <= max_bytes.
std::optional<InputProblem> CheckPhaseTiming(const fl::v1::PhaseTiming& timing, std::string_view field,
                                             int64_t max_phase_ns, uint64_t max_bytes);

// `text` made safe for one log line: newlines, tabs and backslashes escaped (\n, \t, \\), every other
// control or non-ASCII byte as \xNN (no terminal escape sequence or forged log line gets through), and cut
// after `max_bytes` with "...(N bytes)" so that a megabyte of garbage cannot flood the log.
std::string LogSafe(std::string_view text, size_t max_bytes = 200);

}  // namespace fl::server
