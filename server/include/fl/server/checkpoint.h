// Checkpoints of the global model and the server optimizer's state, one file per committed round.
//
// Format: see proto/fl/v1/checkpoint.proto. Files are written to "<name>.tmp", fsynced, renamed over
// the final name and the directory fsynced, so a crash at any instant leaves a complete old or new file.
// Loading verifies magic, header, sizes and the trailing checksum before returning anything.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/server_optimizer.h"
#include "fl/core/tensor_spec.h"
#include "fl/v1/checkpoint.pb.h"

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
  // Differential privacy's ledger (the accountant's RDP, adaptive clipping's C; server/src/engine_privacy.h):
  // nullopt when the run is not private.
  std::optional<fl::v1::PrivacyLedger> privacy;
};

// The largest checkpoint file LoadCheckpoint reads: the largest model fl-server accepts (--max-model-values
// default 2^29 values, 2 GiB of fp32) with two optimizer buffers of the same size (FedAdam/FedYogi's moments)
// is 6 GiB; 8 GiB leaves room for a header and a raised --max-model-values.
inline constexpr uint64_t kMaxCheckpointBytes = uint64_t{8} << 30;
// The largest header (the model's tensor specs, names and the optimizer's buffer names): 64 MiB holds a model
// of a million tensors with long names; a header is read into memory before the file's size is checked by it.
inline constexpr uint64_t kMaxCheckpointHeaderBytes = uint64_t{64} << 20;

// "<dir>/round-000042.ckpt"
std::string CheckpointPath(std::string_view dir, uint64_t round);

absl::Status SaveCheckpoint(const Checkpoint& checkpoint, const std::string& path);
// Opens a regular file only (fl::sys::OpenUserFile: a FIFO, a device or a link to one is refused before it is
// read) of at most kMaxCheckpointBytes; the header must declare exactly the file's size; the checksum must
// match; the model and optimizer state must be finite (InvalidArgument naming the tensor and element). Every
// error names the path.
absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path);

// The first NaN/Inf in `values`: "tensor 'fc.weight' element 3 is nan" (with `spec`, a model's values) or
// "element 3 is inf"; nullopt when every value is finite.
std::optional<std::string> FindNonFinite(std::span<const float> values, const core::ModelSpec* spec);

// Deletes checkpoints of rounds older than `keep_from_round` in `dir` (only files this module named).
absl::Status PruneCheckpoints(std::string_view dir, uint64_t keep_from_round);

}  // namespace fl::server
