// Checkpoints of the global model and the server optimizer's state, one file per committed round.
//
// Format: see proto/fl/v1/checkpoint.proto. Files are written to "<name>.tmp", fsynced, renamed over
// the final name and the directory fsynced, so a crash at any instant leaves a complete old or new file.
// Loading verifies magic, header, sizes and the trailing checksum before returning anything.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/tensor_spec.h"

namespace fl::server {

struct Checkpoint {
  std::string experiment_id;
  uint64_t round = 0;
  uint64_t model_version = 0;
  core::ModelSpec spec;
  std::string model_name;
  std::vector<float> values;
  // The server optimizer's name, step count and buffers.
  core::ServerOptimizerState optimizer;
  int64_t created_unix_ms = 0;
  // The experiment's learning task (fl::core::TaskName); "" when no client had joined yet (and in checkpoints
  // written before tasks existed, whose experiments were classifiers).
  std::string task;
};

// "<dir>/round-000042.ckpt"
std::string CheckpointPath(std::string_view dir, uint64_t round);

absl::Status SaveCheckpoint(const Checkpoint& checkpoint, const std::string& path);
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);

// Deletes checkpoints of rounds older than `keep_from_round` in `dir` (only files this module named).
absl::Status PruneCheckpoints(std::string_view dir, uint64_t keep_from_round);

}  // namespace fl::server
