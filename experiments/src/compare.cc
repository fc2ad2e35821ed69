// fl-experiment replay's comparison: the original experiment and its replay side by side.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"
#include "fl/experiment/runner.h"
#include "fl/instrumentation/record_reader.h"

namespace fl::experiment {
namespace {

using instrumentation::RecordReader;

struct RoundOutcome {
  std::optional<double> accuracy;  // the task's metric: accuracy, MAE or perplexity
  std::optional<double> loss;
  double duration_ms = 0;
};

// The task's metric of a round (schema v6 records the task; older databases and classification: accuracy), and
// its short name for the table's header.
struct Metric {
  std::optional<double> instrumentation::RoundRecord::*field = &instrumentation::RoundRecord::eval_accuracy;
  std::string label = "acc";
};

absl::StatusOr<Metric> MetricOf(RecordReader& reader, const std::string& id) {
  absl::StatusOr<instrumentation::ExperimentRecord> experiment = reader.GetExperiment(id);
  if (absl::IsNotFound(experiment.status())) return Metric{};  // never recorded by fl-server: no task
  if (!experiment.ok()) return experiment.status();
  if (experiment->task == "regression") return Metric{&instrumentation::RoundRecord::eval_mae, "mae"};
  if (experiment->task == "next-token") return Metric{&instrumentation::RoundRecord::eval_perplexity, "ppl"};
  return Metric{};
}

absl::StatusOr<std::map<int64_t, RoundOutcome>> Rounds(RecordReader& reader, const std::string& id,
                                                       const Metric& metric) {
  absl::StatusOr<std::vector<instrumentation::RoundRecord>> rounds = reader.ListRounds(id);
  if (!rounds.ok()) return rounds.status();
  std::map<int64_t, RoundOutcome> out;
  for (const instrumentation::RoundRecord& r : *rounds) {
    if (r.status != instrumentation::RoundStatus::kCommitted) continue;
    out[r.round] = {r.*metric.field, r.eval_loss, r.duration_ms};
  }
  return out;
}

// One phase's durations over the experiment's successful client rounds (those that recorded it).
absl::StatusOr<std::vector<double>> Phase(RecordReader& reader, const std::string& id,
                                          std::optional<double> instrumentation::ClientRoundRecord::*phase) {
  absl::StatusOr<std::vector<instrumentation::ClientRoundRecord>> rows = reader.ListClientRounds(id);
  if (!rows.ok()) return rows.status();
  std::vector<double> v;
  for (const instrumentation::ClientRoundRecord& r : *rows) {
    if (r.outcome == instrumentation::ClientOutcome::kOk && (r.*phase).has_value()) v.push_back(*(r.*phase));
  }
  return v;
}

// A FormatSpec, not a const char*: clang checks the format against the argument where Opt is called (with a
// runtime string it refuses StrFormat outright).
std::string Opt(const std::optional<double>& v, const absl::FormatSpec<double>& fmt) {
  return v.has_value() ? absl::StrFormat(fmt, *v) : std::string("-");
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace

absl::StatusOr<std::string> CompareExperiments(const std::string& db_path, const std::string& original,
                                               const std::string& replay) {
  // Checks the file first (not a FIFO or a device); reads a file of any schema version as it is.
  absl::StatusOr<std::unique_ptr<RecordReader>> reader = RecordReader::OpenAnyVersion(db_path);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<Metric> metric = MetricOf(**reader, original);
  if (!metric.ok()) return metric.status();
  absl::StatusOr<std::map<int64_t, RoundOutcome>> a = Rounds(**reader, original, *metric);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::map<int64_t, RoundOutcome>> b = Rounds(**reader, replay, *metric);
  if (!b.ok()) return b.status();
  std::string out = absl::StrFormat("Replay %s of %s\n\n", replay, original);
  out += absl::StrFormat("%6s  %10s %10s %9s  %10s %10s %9s\n", "round", metric->label + "(orig)",
                         metric->label + "(rep)", "diff", "loss(orig)", "loss(rep)", "diff");
  std::map<int64_t, bool> rounds;
  for (const auto& [r, _] : *a) rounds[r] = true;
  for (const auto& [r, _] : *b) rounds[r] = true;
  for (const auto& [r, _] : rounds) {
    const RoundOutcome x = a->count(r) ? a->at(r) : RoundOutcome{};
    const RoundOutcome y = b->count(r) ? b->at(r) : RoundOutcome{};
    std::optional<double> dacc, dloss;
    if (x.accuracy && y.accuracy) dacc = *y.accuracy - *x.accuracy;
    if (x.loss && y.loss) dloss = *y.loss - *x.loss;
    out += absl::StrFormat("%6d  %10s %10s %9s  %10s %10s %9s\n", r, Opt(x.accuracy, "%.4f"), Opt(y.accuracy, "%.4f"),
                           Opt(dacc, "%+.4f"), Opt(x.loss, "%.4f"), Opt(y.loss, "%.4f"), Opt(dloss, "%+.4f"));
  }
  out +=
      absl::StrFormat("\n%-22s  %28s  %28s\n", "timing (ms)", "original: median  p90  max", "replay: median  p90  max");
  auto line = [&](const std::string& label, const std::vector<double>& x, const std::vector<double>& y) {
    out += absl::StrFormat("%-22s  %10.1f %8.1f %8.1f  %10.1f %8.1f %8.1f\n", label, Quantile(x, 0.5), Quantile(x, 0.9),
                           Quantile(x, 1.0), Quantile(y, 0.5), Quantile(y, 0.9), Quantile(y, 1.0));
  };
  std::vector<double> ra, rb;
  for (const auto& [r, o] : *a) ra.push_back(o.duration_ms);
  for (const auto& [r, o] : *b) rb.push_back(o.duration_ms);
  line("round", ra, rb);
  using instrumentation::ClientRoundRecord;
  const std::pair<const char*, std::optional<double> ClientRoundRecord::*> phases[] = {
      {"downlink_ms", &ClientRoundRecord::downlink_ms},
      {"train_ms", &ClientRoundRecord::train_ms},
      {"uplink_ms", &ClientRoundRecord::uplink_ms}};
  for (const auto& [name, phase] : phases) {
    absl::StatusOr<std::vector<double>> x = Phase(**reader, original, phase);
    if (!x.ok()) return x.status();
    absl::StatusOr<std::vector<double>> y = Phase(**reader, replay, phase);
    if (!y.ok()) return y.status();
    line(fl::StrCat("client ", name), *x, *y);
  }
  return out;
}

}  // namespace fl::experiment
