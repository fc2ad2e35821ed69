// The report's plots, drawn with SvgWriter (each returns a complete <svg> document):
//   timeline      Gantt-style: one row per client (plus the server's row), each phase a coloured bar placed on
//                 the server's timeline; x = seconds since the first dispatch shown; round starts marked. Above
//                 kTimelineMaxClientRows clients in the window, one row per link kind / device class instead, its
//                 clients' bars translucent on top of each other.
//   phase_shares  per link kind, one 100% bar: mean downlink, train, eval, idle, uplink as shares of the mean
//                 round time of the rounds those clients were in, and the rest ("waiting": the client was done
//                 and the round was not) in grey.
//   round_time    round time (ms) over committed rounds; each point coloured by its straggler's dominant phase.
//   metric        the learning curve: the task's metric (EvalColumns' first: eval_accuracy, eval_mae or
//                 eval_perplexity) of the global model after each committed round that was evaluated, against the
//                 round (top panel) and against wall time, seconds since the first dispatch at the round's commit
//                 (bottom panel, as fl-report --compare places it); rounds without an evaluation are no points,
//                 and a run with none says so instead of drawing empty axes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"

namespace fl::report {

inline constexpr size_t kTimelineMaxClientRows = 48;

inline constexpr std::string_view kPlotNames[] = {"timeline", "phase_shares", "round_time", "metric"};

// The fill colour of a phase (colour-blind-safe Tableau 10 hues), used by every plot and the HTML legend.
std::string_view PhaseColor(Phase phase);

struct TimelineOptions {
  std::optional<int64_t> first_round;  // inclusive; nullopt = from the first
  std::optional<int64_t> last_round;   // inclusive; nullopt = to the last
};

std::string TimelineSvg(const ExperimentData& data, const Analysis& analysis, const TimelineOptions& options = {});
std::string PhaseSharesSvg(const ExperimentData& data, const Analysis& analysis);
std::string RoundTimeSvg(const ExperimentData& data, const Analysis& analysis);

// The learning curve's points: each committed round (step) with a value of the task's metric, by round.
struct MetricPoint {
  int64_t round = 0;
  double seconds = 0;  // since the experiment's first dispatch, at the round's commit
  double value = 0;
};
struct MetricCurve {
  std::string metric;             // the rounds table's column: eval_accuracy, eval_mae or eval_perplexity
  bool higher_is_better = false;  // accuracy: true; MAE, perplexity: false
  std::vector<MetricPoint> points;
};
MetricCurve LearningCurve(const ExperimentData& data);
std::string MetricSvg(const ExperimentData& data);

// By name (kPlotNames); empty for an unknown name.
std::string PlotByName(std::string_view name, const ExperimentData& data, const Analysis& analysis,
                       const TimelineOptions& options = {});

}  // namespace fl::report
