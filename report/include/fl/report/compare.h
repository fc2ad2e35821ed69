// fl-report --compare DB [DB...]: several experiments side by side (docs/report.md "Comparing experiments",
// docs/stragglers.md): test accuracy against wall time on one plot, and a table of time to a target accuracy
// and bytes moved.
//
// Definitions (the same for synchronous rounds and buffered aggregation steps, schema v9 experiments.aggregation;
// a database from before v9 reads as synchronous):
//   wall time        seconds since the experiment's first dispatch (the earliest round or step start, or
//                    client dispatch, recorded)
//   accuracy point   each committed round/step with an evaluated test accuracy (rounds.eval_accuracy), placed at
//                    the time that round/step committed (its ended_unix_ms): the model existed from then on; the
//                    evaluation's own time is measurement, not training
//   time to target   the wall time of the first accuracy point >= the target; "not reached" when none is
//   bytes moved      sum of every client row's uplink_bytes + downlink_bytes, whatever its outcome (a cancelled,
//                    late or rejected update moved its bytes too)
//   rounds / steps   committed `rounds` rows (aggregation steps in buffered mode)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fl/report/experiment_data.h"
#include "fl/report/tables.h"

namespace fl::report {

inline constexpr double kDefaultTargetAccuracy = 0.85;

struct ComparedExperiment {
  std::string label;  // the experiment's name (with its database's file name when two names are the same)
  std::string id;
  std::string db_path;
  std::string aggregation;                          // synchronous or buffered
  std::vector<std::pair<double, double>> accuracy;  // (seconds since first dispatch, test accuracy), by time
  std::optional<double> final_accuracy;
  std::optional<double> time_to_target_s;
  int64_t uplink_bytes = 0;
  int64_t downlink_bytes = 0;
  int64_t committed = 0;         // committed rounds (or aggregation steps)
  std::optional<double> wall_s;  // first dispatch -> last commit
};

// The experiment's first dispatch (unix ms): the earliest start of any round or step, or dispatch of any client
// round, recorded; +infinity when none. Wall time is measured from it here and in the learning curve (plots.h).
double FirstDispatchUnixMs(const ExperimentData& data);

// One experiment's figures for the comparison (label = its name).
ComparedExperiment Summarize(const ExperimentData& data, double target_accuracy);

// Labels made unique: a name shared by several experiments gets " (FILE)" from its database's file name, and
// " #N" if that is still not enough.
void DisambiguateLabels(std::vector<ComparedExperiment>& experiments);

// The comparison table (name "compare"): experiment, aggregation, final_accuracy, time_to_target_s (text
// "not reached" when not), bytes_moved, uplink_bytes, downlink_bytes, rounds_or_steps, wall_s.
Table CompareTable(const std::vector<ComparedExperiment>& experiments, double target_accuracy);

// A GitHub-flavoured Markdown table of `table` (the cells as FormatCell shows them).
std::string RenderMarkdown(const Table& table);

// Accuracy against wall time, one line per experiment, the target as a dashed line, a legend of labels.
std::string CompareSvg(const std::vector<ComparedExperiment>& experiments, double target_accuracy);

// {"target_accuracy": T, "experiments": [{column: value, ..., "accuracy": [[s, acc], ...]}, ...]}.
std::string CompareJson(const std::vector<ComparedExperiment>& experiments, double target_accuracy);

// A self-contained HTML page: the plot and the table, with the definitions above.
std::string CompareHtml(const std::vector<ComparedExperiment>& experiments, double target_accuracy);

}  // namespace fl::report
