// The report's tables as plain data (named columns with units, typed cells), and their text, CSV and JSON
// renderings. One place builds the tables; every output format (text, CSV, JSON, HTML) renders the same ones,
// so the figures cannot differ between formats.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"

namespace fl::report {

// One table cell. Empty = not measured / does not apply: "-" in text and HTML, empty in CSV, null in JSON.
// (A plain struct rather than std::variant: GCC 12 reports false maybe-uninitialized warnings for
// initializer lists of variants.)
struct Cell {
  enum class Kind { kEmpty, kInt, kReal, kText };
  Cell() = default;
  Cell(int64_t v) : kind(Kind::kInt), int_value(v) {}             // NOLINT: implicit on purpose
  Cell(double v) : kind(Kind::kReal), real_value(v) {}            // NOLINT
  Cell(std::string v) : kind(Kind::kText), text(std::move(v)) {}  // NOLINT
  Cell(const char* v) : kind(Kind::kText), text(v) {}             // NOLINT

  bool empty() const { return kind == Kind::kEmpty; }
  bool numeric() const { return kind == Kind::kInt || kind == Kind::kReal; }
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(int_value) : real_value; }

  Kind kind = Kind::kEmpty;
  int64_t int_value = 0;
  double real_value = 0;
  std::string text;
};

struct Column {
  Column(std::string column_name, int digits = 1, std::string unit_suffix = "", double multiplier = 1)
      : name(std::move(column_name)), decimals(digits), suffix(std::move(unit_suffix)), scale(multiplier) {}

  std::string name;    // snake_case with the unit suffix, as in CSV/JSON: "uplink_mean_ms"
  int decimals = 1;    // digits after the point in text and HTML (CSV/JSON carry full precision)
  std::string suffix;  // appended in text/HTML: "x" for ratios, "%" for shares shown as percent
  double scale = 1;    // multiplied in text/HTML only: 100 for shares shown as percent
};

struct Table {
  std::string name;   // rounds, links, groups, stragglers, client_events, security_events, secagg
  std::string title;  // a heading for people
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;

  // The index of a column; -1 if there is none by that name.
  int ColumnIndex(std::string_view column) const;
};

inline constexpr std::string_view kTableNames[] = {"rounds",        "links",           "groups", "stragglers",
                                                   "client_events", "security_events", "secagg"};

// Rows of the stragglers table by default (fl-report --top): the clients most often the straggler. A fleet's
// thousand clients are summarized by the groups table; 0 lists every client.
inline constexpr size_t kDefaultTopStragglers = 20;

// The evaluation columns of the rounds table for an experiment's task (experiments.task): the task's metric
// first, then the loss. classification: eval_accuracy, eval_loss; regression: eval_mae, eval_loss;
// next-token: eval_perplexity, eval_token_accuracy, eval_loss. An unknown task is shown as classification.
struct EvalColumn {
  std::string name;
  std::optional<double> (*value)(const RoundAttempt& round);
};
std::vector<EvalColumn> EvalColumns(std::string_view task);

Table RoundsTable(const ExperimentData& data, const Analysis& analysis);
Table LinksTable(const ExperimentData& data, const Analysis& analysis);
// Link kind x device class: clients, phase means and maxima, how often the group held the round's straggler, its
// dominant phase and the group's most frequent straggler by name (readable at any fleet size).
Table GroupsTable(const ExperimentData& data, const Analysis& analysis);
// The `top` clients most often the straggler (0: every client with an accepted update).
Table StragglersTable(const ExperimentData& data, const Analysis& analysis, size_t top = kDefaultTopStragglers);
// What fl-server refused from or did to each client outside its round rows (client_events, schema v7), by time.
Table ClientEventsTable(const ExperimentData& data);
// What fl-server refused on the secure federation channel (security_events, schema v8), by time.
Table SecurityEventsTable(const ExperimentData& data);
// Secure aggregation (secagg_stages, schema v11): per round attempt and stage, its clients ok, dropped and refused,
// the median and maximum stage time and the bytes down and up.
Table SecAggTable(const ExperimentData& data);
// All of them, in kTableNames order; secagg only for a run with secure-aggregation stages recorded.
std::vector<Table> AllTables(const ExperimentData& data, const Analysis& analysis,
                             size_t top_stragglers = kDefaultTopStragglers);
// One by name; InvalidArgument naming the choices for an unknown one.
absl::StatusOr<Table> TableByName(const ExperimentData& data, const Analysis& analysis, std::string_view name,
                                  size_t top_stragglers = kDefaultTopStragglers);

// A cell as shown to people (the column's decimals, scale and suffix; "-" when empty).
std::string FormatCell(const Column& column, const Cell& cell);

// A one-paragraph header: experiment id, name, status, database, schema version, rounds, clients.
std::string ExperimentHeaderText(const ExperimentData& data, const Analysis& analysis);
// Title, then columns aligned (numbers right, text left); units are in the column names (_ms, _bytes).
std::string RenderText(const Table& table);
// RFC 4180: header row of column names, one line per row, full-precision numbers, empty for NULL.
std::string RenderCsv(const Table& table);
// One JSON document: {"experiment": {...}, "definitions": {...}, "tables": {"rounds": [{col: value}, ...]}}.
std::string RenderJson(const ExperimentData& data, const Analysis& analysis, const std::vector<Table>& tables);

}  // namespace fl::report
