// fl-server --resume: where a resumed experiment starts, decided from the records (which round committed last)
// and the checkpoint files (the model and optimizer state of that round).
//
// The records are the truth: a round is committed when its records are (docs/round-engine.md, "Commit and
// resume"). The plan loads the checkpoint of the last committed round, or of an older round chosen with
// --resume-from-round (the rounds after it are then re-run and their committed attempts recorded as aborted),
// checks that it is intact and that it is the model the records committed (experiment, round, model version),
// and says whether that round's evaluation has to be redone (fl-server died during it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "fl/server/round_engine.h"

namespace fl::server {

// `config`: its checkpoint_dir, num_rounds, evaluate_every and fraction_evaluate are read; its experiment_id,
// when empty, is set to the experiment of the newest intact checkpoint in checkpoint_dir (corrupt files, e.g. a
// checkpoint of a round that never committed, are skipped with a warning). `from_round`: --resume-from-round.
// Errors say what is wrong and what to run instead (which older checkpoints are intact).
absl::StatusOr<RoundEngine::StartPoint> PlanResume(EngineConfig* config, const std::string& db_path,
                                                   std::optional<uint64_t> from_round);

}  // namespace fl::server
