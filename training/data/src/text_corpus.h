// Private to training/data: the plain-text corpus reader of LoadClientData (next-token over bytes).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fl/training/data/client_data.h"

namespace fl::training::data::internal {

// The most text a client reads. Every client reads the whole corpus (so that all cut the same windows) and
// holds its shard's windows as int64 inputs and targets, 16 bytes for each byte it trains on: 256 MiB of text
// is 4 GiB of windows for a single client. A larger corpus belongs in an .npz of token windows, which is read
// by rows (docs/models-and-data.md).
inline constexpr uint64_t kMaxTextCorpusBytes = uint64_t{256} << 20;

// The text of `path` (a file, or the regular files without a '.' of a directory, in byte order of their names,
// joined with "\n"): regular files only (a FIFO, a device such as /dev/zero, are refused before a byte is read),
// at most kMaxTextCorpusBytes in all. Errors name the file.
absl::StatusOr<std::string> ReadTextCorpus(const std::string& path, bool is_directory);

// One client's shard of a text corpus (DataOptions::path) for the next-token task.
absl::StatusOr<ClientData> LoadTextCorpus(const DataOptions& options, bool is_directory);

}  // namespace fl::training::data::internal
