// fl-experiment replay's comparison: the original experiment and its replay side by side.
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"
#include "fl/experiment/runner.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::experiment {
namespace {

using instrumentation::sqlite::Database;

struct RoundOutcome {
  std::optional<double> accuracy;  // the task's metric: accuracy, MAE or perplexity
  std::optional<double> loss;
  double duration_ms = 0;
};

// The rounds column of the experiment's task's metric (schema v6 records the task; older databases and
// classification: accuracy), and its short name for the table's header.
struct Metric {
  std::string column = "eval_accuracy";
  std::string label = "acc";
};

absl::StatusOr<Metric> MetricOf(Database& db, const std::string& id) {
  absl::StatusOr<instrumentation::sqlite::Statement> st = db.Prepare("SELECT task FROM experiments WHERE id = ?1");
  // A database from before tasks has no such column: a classification experiment.
  if (!st.ok()) return Metric{};
  st->BindText(1, id);
  absl::StatusOr<bool> row = st->Step("read the experiment's task");
  if (!row.ok()) return row.status();
  const std::string task = *row ? st->ColumnText(0) : "";
  if (task == "regression") return Metric{"eval_mae", "mae"};
  if (task == "next-token") return Metric{"eval_perplexity", "ppl"};
  return Metric{};
}

absl::StatusOr<std::map<int64_t, RoundOutcome>> Rounds(Database& db, const std::string& id, const Metric& metric) {
  absl::StatusOr<instrumentation::sqlite::Statement> st =
      db.Prepare(fl::StrCat("SELECT round, ", metric.column,
                            ", eval_loss, duration_ms FROM rounds WHERE experiment_id = ?1 AND status = "
                            "'committed' ORDER BY round"));
  if (!st.ok()) return st.status();
  st->BindText(1, id);
  std::map<int64_t, RoundOutcome> out;
  for (;;) {
    absl::StatusOr<bool> row = st->Step("read rounds");
    if (!row.ok()) return row.status();
    if (!*row) break;
    out[st->ColumnInt64(0)] = {st->ColumnOptionalDouble(1), st->ColumnOptionalDouble(2), st->ColumnDouble(3)};
  }
  return out;
}

absl::StatusOr<std::vector<double>> Column(Database& db, const std::string& id, const std::string& column) {
  absl::StatusOr<instrumentation::sqlite::Statement> st =
      db.Prepare(fl::StrCat("SELECT ", column, " FROM client_rounds WHERE experiment_id = ?1 AND outcome = 'ok' AND ",
                            column, " IS NOT NULL"));
  if (!st.ok()) return st.status();
  st->BindText(1, id);
  std::vector<double> v;
  for (;;) {
    absl::StatusOr<bool> row = st->Step("read client_rounds");
    if (!row.ok()) return row.status();
    if (!*row) break;
    v.push_back(st->ColumnDouble(0));
  }
  return v;
}

std::string Opt(const std::optional<double>& v, const char* fmt) {
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
  if (absl::Status s = instrumentation::CheckRecordsFile(db_path); !s.ok()) return s;  // not a FIFO or a device
  absl::StatusOr<Database> db = Database::Open(db_path, SQLITE_OPEN_READONLY);
  if (!db.ok()) return db.status();
  (void)db->Exec("PRAGMA busy_timeout = 5000");
  absl::StatusOr<Metric> metric = MetricOf(*db, original);
  if (!metric.ok()) return metric.status();
  absl::StatusOr<std::map<int64_t, RoundOutcome>> a = Rounds(*db, original, *metric);
  if (!a.ok()) return a.status();
  absl::StatusOr<std::map<int64_t, RoundOutcome>> b = Rounds(*db, replay, *metric);
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
  for (const char* col : {"downlink_ms", "train_ms", "uplink_ms"}) {
    absl::StatusOr<std::vector<double>> x = Column(*db, original, col);
    if (!x.ok()) return x.status();
    absl::StatusOr<std::vector<double>> y = Column(*db, replay, col);
    if (!y.ok()) return y.status();
    line(fl::StrCat("client ", col), *x, *y);
  }
  return out;
}

}  // namespace fl::experiment
