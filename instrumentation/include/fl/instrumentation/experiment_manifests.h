// The manifests fl-experiment ran (`experiment_manifests`, schema v4): written once per run, before fl-server
// starts, and read back by `fl-experiment replay`. Its columns are declared with every other table's
// (record_columns.h: ExperimentManifestsTable), so the statements here are derived from them; no SQL of this table
// is written outside instrumentation/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::instrumentation {

// One row of `experiment_manifests`.
struct ExperimentManifestRecord {
  std::string experiment_id;
  std::string manifest_path;     // as given to fl-experiment
  std::string manifest_yaml;     // the file's text as it was read
  std::string resolved_json;     // every setting after defaults (fl::experiment::ResolvedManifestJson)
  int64_t seed = 0;              // the experiment's seed (as the int64 bit pattern of the manifest's uint64)
  std::string backend;           // the link emulation backend it ran on: none | userspace | kernel
  std::string software_version;  // the fl-experiment that ran it
  std::string replay_of;         // the experiment this one replays; "" (NULL) for an original run
  int64_t created_unix_ms = 0;

  bool operator==(const ExperimentManifestRecord&) const = default;
};

// Creates the records database at `db_path` if need be (brought to this build's schema by RecordStore), then
// inserts `record`. Errors name the file.
absl::Status WriteExperimentManifest(const std::string& db_path, const ExperimentManifestRecord& record);

// The recorded manifest of `experiment_id`, or with "" the newest one. FAILED_PRECONDITION when the file has no
// manifests table (an older build's, or not fl-experiment's); NOT_FOUND naming the experiments it does have.
// The file is checked as a user's file first (CheckRecordsFile: not a FIFO or a device).
absl::StatusOr<ExperimentManifestRecord> ReadExperimentManifest(const std::string& db_path,
                                                                std::string_view experiment_id);

}  // namespace fl::instrumentation
