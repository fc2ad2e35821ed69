// fl-experiment's progress lines out of the records database (progress.h).
#include "fl/report/progress.h"

#include <cstdio>
#include <filesystem>

#include "fl/core/str_cat.h"

namespace fl::report {
namespace {

std::string Fixed(double v, int decimals) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

bool Buffered(const ExperimentData& data) { return data.experiment.aggregation == "buffered"; }

std::string Name(const ExperimentData& data, const RoundAttempt& r, std::optional<int64_t> total) {
  if (Buffered(data)) return fl::StrCat("step ", r.round);
  return total.has_value() ? fl::StrCat("round ", r.round, "/", *total) : fl::StrCat("round ", r.round);
}

// The round's test metric as the task names it; "" when not evaluated (yet).
std::string Metric(const RoundAttempt& r) {
  if (r.eval_perplexity.has_value()) return fl::StrCat("test perplexity ", Fixed(*r.eval_perplexity, 3));
  if (r.eval_accuracy.has_value()) return fl::StrCat("test accuracy ", Fixed(*r.eval_accuracy, 4));
  if (r.eval_mae.has_value()) return fl::StrCat("test MAE ", Fixed(*r.eval_mae, 4));
  return "";
}

}  // namespace

std::string ProgressLine(const ExperimentData& data, const RoundSummary& summary, std::optional<int64_t> total_rounds) {
  const RoundAttempt& r = *summary.attempt;
  const std::string seconds = fl::StrCat(Fixed(r.duration_ms / 1000.0, 1), " s");
  if (!r.committed()) {
    return fl::StrCat(Name(data, r, total_rounds), " attempt ", r.attempt, " ", r.status, " after ", seconds,
                      r.failure_reason.empty() ? "" : ": ", r.failure_reason);
  }
  std::string line =
      Buffered(data) ? fl::StrCat(Name(data, r, total_rounds), ": ", r.num_accepted, " updates applied in ", seconds)
                     : fl::StrCat(Name(data, r, total_rounds), ": ", r.num_accepted, "/", r.num_selected, " accepted");
  std::string others;
  auto add = [&](int64_t n, std::string_view what) {
    if (n > 0) others += fl::StrCat(others.empty() ? "" : ", ", n, " ", what);
  };
  add(r.num_late, "late");
  add(r.num_rejected, "rejected");
  add(r.num_dropped, "dropped");
  int64_t cancelled = 0, folded = 0;
  for (const ClientRoundRow& c : r.clients) {
    cancelled += c.outcome == "cancelled";
    folded += c.outcome == "folded";
  }
  add(cancelled, "cancelled");
  add(folded, "folded");
  if (!others.empty()) line += fl::StrCat(" (", others, ")");
  if (!Buffered(data)) line += fl::StrCat(" in ", seconds);
  if (summary.straggler.has_value()) {
    const Straggler& s = *summary.straggler;
    const ClientInfo* client = data.FindClient(s.client_id);
    const std::string name = client != nullptr ? client->label : s.client_id;
    std::optional<double> ms;
    for (const ClientRoundRow& c : r.clients) {
      if (c.client_id == s.client_id && c.accepted()) ms = PhaseMs(c, s.dominant_phase);
    }
    line += fl::StrCat("; slowest ", name, ": ", PhaseName(s.dominant_phase),
                       ms.has_value() ? fl::StrCat(" ", Fixed(*ms / 1000.0, 2), " s") : std::string());
  }
  if (const std::string metric = Metric(r); !metric.empty()) line += fl::StrCat("; ", metric);
  return line;
}

std::string EvaluationLine(const ExperimentData& data, const RoundAttempt& round, std::optional<int64_t> total_rounds) {
  const std::string metric = Metric(round);
  if (metric.empty()) return "";
  return fl::StrCat(Name(data, round, total_rounds), " evaluated: ", metric);
}

ProgressFollower::ProgressFollower(std::string db_path, std::string experiment_id, std::optional<int64_t> total_rounds)
    : db_path_(std::move(db_path)), experiment_id_(std::move(experiment_id)), total_rounds_(total_rounds) {}

std::vector<std::string> ProgressFollower::Poll() {
  std::vector<std::string> lines;
  std::error_code ec;
  if (!std::filesystem::exists(db_path_, ec)) return lines;
  // The whole experiment is read each time (one read-only snapshot): simple, and cheap at the sizes a run on
  // one machine reaches; fl-experiment polls about once a second.
  absl::StatusOr<ExperimentData> data = LoadExperiment(db_path_, experiment_id_);
  if (!data.ok()) return lines;  // not there yet (no experiment row, no round)
  const Analysis analysis = Analyze(*data);
  for (const RoundSummary& s : analysis.rounds) {
    const std::pair<int64_t, int64_t> key{s.attempt->round, s.attempt->attempt};
    if (printed_.insert(key).second) {
      lines.push_back(ProgressLine(*data, s, total_rounds_));
      if (s.attempt->committed() && Metric(*s.attempt).empty()) awaiting_eval_.insert(key);
    } else if (awaiting_eval_.count(key) > 0) {
      if (std::string line = EvaluationLine(*data, *s.attempt, total_rounds_); !line.empty()) {
        lines.push_back(std::move(line));
        awaiting_eval_.erase(key);
      }
    }
  }
  return lines;
}

}  // namespace fl::report
