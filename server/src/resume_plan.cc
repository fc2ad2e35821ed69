#include "fl/server/resume_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <vector>

#include <spdlog/spdlog.h>

#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/server/checkpoint.h"

namespace fl::server {
namespace {

// Rounds of the checkpoint files in `dir` (names CheckpointPath writes), newest first.
absl::StatusOr<std::vector<uint64_t>> CheckpointRounds(const std::string& dir) {
  std::vector<uint64_t> rounds;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned long long round = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "round-%6llu.%4s", &round, tail) == 2 && std::string(tail) == "ckpt" &&
        name == std::filesystem::path(CheckpointPath("", round)).filename().string()) {
      rounds.push_back(round);
    }
  }
  if (ec) return absl::NotFoundError(fl::StrCat("cannot read --checkpoint-dir ", dir, ": ", ec.message()));
  std::sort(rounds.rbegin(), rounds.rend());
  return rounds;
}

// The experiment of the newest checkpoint that loads: a newer file that does not (a round that crashed while
// its checkpoint was written, a damaged disk) must not hide the experiment the older ones belong to.
absl::StatusOr<std::string> ExperimentOfNewestIntactCheckpoint(const std::string& dir) {
  auto rounds = CheckpointRounds(dir);
  if (!rounds.ok()) return rounds.status();
  if (rounds->empty()) {
    return absl::NotFoundError(fl::StrCat("--resume: no checkpoint in ", dir, "; run without --resume to start anew"));
  }
  std::string errors;
  for (uint64_t round : *rounds) {
    auto ckpt = LoadCheckpoint(CheckpointPath(dir, round));
    if (ckpt.ok()) return ckpt->experiment_id;
    spdlog::warn("--resume: skipping checkpoint of round {}: {}", round, ckpt.status().message());
    errors += fl::StrCat("\n  ", fl::ToStd(ckpt.status().message()));
  }
  return absl::DataLossError(fl::StrCat("--resume: no checkpoint in ", dir, " can be loaded:", errors,
                                        "\nrestore one from a copy, or run without --resume to start anew"));
}

// Rounds of the intact checkpoints of `experiment_id` older than `round`, oldest first.
std::vector<uint64_t> IntactOlderCheckpoints(const std::string& dir, const std::string& experiment_id, uint64_t round) {
  std::vector<uint64_t> intact;
  auto rounds = CheckpointRounds(dir);
  if (!rounds.ok()) return intact;
  for (uint64_t r : *rounds) {
    if (r >= round) continue;
    auto ckpt = LoadCheckpoint(CheckpointPath(dir, r));
    if (ckpt.ok() && ckpt->experiment_id == experiment_id && ckpt->round == r) intact.push_back(r);
  }
  std::sort(intact.begin(), intact.end());
  return intact;
}

std::string JoinRounds(const std::vector<uint64_t>& rounds) {
  std::string out;
  for (uint64_t r : rounds) out += fl::StrCat(out.empty() ? "" : ", ", r);
  return out;
}

}  // namespace

absl::StatusOr<RoundEngine::StartPoint> PlanResume(EngineConfig* config, const std::string& db_path,
                                                   std::optional<uint64_t> from_round) {
  RoundEngine::StartPoint start;
  start.resume = true;
  const std::string& dir = config->checkpoint_dir;
  if (dir.empty()) return absl::InvalidArgumentError("--resume needs --checkpoint-dir");
  if (db_path.empty()) return absl::InvalidArgumentError("--resume needs --db (the records say which round committed)");
  if (config->experiment_id.empty()) {
    auto id = ExperimentOfNewestIntactCheckpoint(dir);
    if (!id.ok()) return id.status();
    config->experiment_id = *id;
  }
  const std::string& experiment = config->experiment_id;
  auto reader = instrumentation::RecordReader::Open(db_path);
  if (!reader.ok()) return reader.status();
  if (auto exp = (*reader)->GetExperiment(experiment); !exp.ok()) {
    return absl::NotFoundError(fl::StrCat("--resume: experiment '", experiment, "' is not in ", db_path, ": ",
                                          fl::ToStd(exp.status().message())));
  }
  auto rounds = (*reader)->ListRounds(experiment);
  if (!rounds.ok()) return rounds.status();
  std::map<uint64_t, const instrumentation::RoundRecord*> committed;
  for (const auto& r : *rounds) {
    if (r.status == instrumentation::RoundStatus::kCommitted) committed[static_cast<uint64_t>(r.round)] = &r;
  }
  const uint64_t last = committed.empty() ? 0 : committed.rbegin()->first;
  const uint64_t round = from_round.value_or(last);
  if (round > last) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--resume-from-round ", round, ": the records of experiment '", experiment, "' hold rounds up to ", last,
        " as committed; a checkpoint of a round whose records were never stored cannot be resumed (run --resume "
        "without --resume-from-round to continue after round ",
        last, ")"));
  }
  if (round > 0 && !committed.contains(round)) {
    return absl::InvalidArgumentError(fl::StrCat("--resume-from-round ", round, ": round ", round,
                                                 " is not committed in the records of experiment '", experiment, "'"));
  }

  const std::string path = CheckpointPath(dir, round);
  auto ckpt = LoadCheckpoint(path);
  if (ckpt.ok() && (ckpt->experiment_id != experiment || ckpt->round != round)) {
    ckpt = absl::FailedPreconditionError(fl::StrCat("checkpoint ", path, " holds round ", ckpt->round,
                                                    " of experiment '", ckpt->experiment_id, "', not round ", round,
                                                    " of '", experiment, "'"));
  }
  if (ckpt.ok() && round > 0 && committed[round]->model_version.has_value() &&
      static_cast<uint64_t>(*committed[round]->model_version) != ckpt->model_version) {
    ckpt = absl::FailedPreconditionError(fl::StrCat(
        "checkpoint ", path, " holds model version ", ckpt->model_version, " but the records committed round ", round,
        " with model version ", *committed[round]->model_version, ": it is not the model that round committed"));
  }
  if (!ckpt.ok()) {
    const std::string what = from_round.has_value()
                                 ? fl::StrCat("--resume-from-round ", round, ": its checkpoint cannot be used: ")
                                 : fl::StrCat("--resume: the records say round ", round,
                                              " is the last committed one but its checkpoint "
                                              "cannot be used: ");
    const std::vector<uint64_t> older = IntactOlderCheckpoints(dir, experiment, round);
    const std::string hint = older.empty()
                                 ? fl::StrCat(". No older intact checkpoint of this experiment is in ", dir,
                                              ": restore the file from a copy, or run without --resume to start anew")
                                 : fl::StrCat(". Intact older checkpoints in ", dir, ": round(s) ", JoinRounds(older),
                                              ". Run with --resume --resume-from-round ", older.back(),
                                              " to re-run rounds ", older.back() + 1, "-", last,
                                              " from it (their committed records stay, marked aborted), "
                                              "or restore the file from a copy");
    return absl::Status(ckpt.status().code(), fl::StrCat(what, fl::ToStd(ckpt.status().message()), hint));
  }

  // Attempt numbers continue after every recorded attempt, so that no re-run reuses a (round, attempt).
  for (const auto& r : *rounds) {
    if (static_cast<uint64_t>(r.round) <= round) continue;
    uint32_t& first = start.first_attempts[static_cast<uint64_t>(r.round)];
    first = std::max<uint32_t>(first, static_cast<uint32_t>(r.attempt) + 1);
  }
  if (auto next = start.first_attempts.find(round + 1); next != start.first_attempts.end()) {
    start.first_attempt = next->second;
  }
  if (round < last && config->dp_on()) {
    // Their models were released to clients (and their ε spent) before the restart; the older checkpoint's ledger
    // does not hold them, so re-running them would report less ε than the run has spent.
    return absl::FailedPreconditionError(fl::StrCat(
        "--resume-from-round ", round, " with --dp-noise-multiplier: rounds ", round + 1, "-", last,
        " were committed and their models released, so the privacy they spent cannot be taken back by re-running "
        "them from round ",
        round, "'s ledger; run --resume without --resume-from-round, or start a new experiment"));
  }
  if (round < last) {
    start.supersede_later_rounds = true;
    start.supersede_reason = fl::StrCat("superseded: fl-server --resume-from-round ", round,
                                        " re-ran the rounds after ", round, " from that round's checkpoint");
    spdlog::warn("--resume-from-round {}: rounds {}-{} are re-run; their committed records are kept as aborted", round,
                 round + 1, last);
  }

  if (round > 0) {
    const instrumentation::RoundRecord& row = *committed[round];
    start.committed_attempt = static_cast<uint32_t>(row.attempt);
    // An evaluation that was due after this round but left nothing in the records was cut short (fl-server
    // died during it): redo it. Evaluation rows and figures are stored as one unit, so "nothing" is exact.
    const bool due = config->evaluate_every > 0 && config->fraction_evaluate > 0 &&
                     (round % config->evaluate_every == 0 || round == config->num_rounds);
    if (due && !row.eval_num_examples.has_value()) {
      auto evaluations = (*reader)->ListEvaluations(experiment, static_cast<int64_t>(round));
      if (!evaluations.ok()) return evaluations.status();
      start.redo_evaluation = std::none_of(evaluations->begin(), evaluations->end(),
                                           [&](const auto& e) { return e.attempt == row.attempt; });
    }
  }
  start.checkpoint = *std::move(ckpt);
  return start;
}

}  // namespace fl::server
