// fl-experiment's progress lines: a line per committed (or failed) round or aggregation step while an experiment
// runs, read from the records database as fl-server writes it (docs/manifests.md "Progress").
//
// Why the database and not fl-server's stdout table: the records are the experiment's own structured account
// (schema-versioned, read through instrumentation's RecordReader on a read-only WAL snapshot that never blocks the
// writer), they carry everything a line needs (accepted/selected, each client's phases, the evaluation), they read
// the same for synchronous rounds and buffered aggregation steps, and a round is in them exactly when it is
// committed. The console table is a human format whose columns change with the task and the options, and
// fl-experiment runs fl-server with its output in a log file.
//
//   round 3/20: 8/10 accepted (1 late, 1 dropped) in 12.3 s; slowest c-5g-2: uplink 4.21 s; test accuracy 0.8123
//   round 4/20 attempt 1 failed after 60.0 s: 1 update(s) accepted by the deadline; the round needs 2 (...)
//   step 17: 4 updates applied in 3.1 s; slowest c-5g-0: uplink 2.40 s
//   round 3/20 evaluated: test accuracy 0.8123            (when the evaluation arrives after the commit's line)
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fl/report/analysis.h"
#include "fl/report/experiment_data.h"

namespace fl::report {

// The line of one round attempt (or aggregation step); `total_rounds` (the planned number, when known) is shown
// as "3/20". The test metric is included when the round's evaluation is already recorded.
std::string ProgressLine(const ExperimentData& data, const RoundSummary& summary, std::optional<int64_t> total_rounds);
// The line of an evaluation recorded after its round's line was printed; "" when the round has none.
std::string EvaluationLine(const ExperimentData& data, const RoundAttempt& round, std::optional<int64_t> total_rounds);

// Follows one experiment in a records database: each Poll returns the lines of what was recorded since the last.
class ProgressFollower {
 public:
  ProgressFollower(std::string db_path, std::string experiment_id, std::optional<int64_t> total_rounds);
  // Nothing (no error) while the database or the experiment's first round does not exist yet.
  std::vector<std::string> Poll();

 private:
  std::string db_path_;
  std::string experiment_id_;
  std::optional<int64_t> total_rounds_;
  std::set<std::pair<int64_t, int64_t>> printed_;        // (round, attempt)
  std::set<std::pair<int64_t, int64_t>> awaiting_eval_;  // committed, printed without a test metric
};

}  // namespace fl::report
