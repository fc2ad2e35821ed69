// Human text for the islands' character-level language model: the fortune cookies of the Debian package
// `fortunes-min` (/usr/share/games/fortunes), about 100 kB of English.
//
// Everything here is deterministic and platform-independent, so every island builds the same vocabulary
// and the same split without talking to the others:
//   - files: every regular file of the directory whose name has no extension (the strfile indices `.dat`
//     and the UTF-8 copies `.u8` are skipped), in byte order of their names;
//   - entries: a file's text cut at lines holding only "%", each entry trimmed of trailing newlines,
//     empty ones dropped; the corpus is the entries joined by "\n\n" (backspace overstrikes removed:
//     "_\bx" -> "x");
//   - vocabulary: the distinct bytes of the whole corpus in ascending order, id = rank;
//   - split: entry i goes to evaluation when SplitMix64(i) mod 100 < eval_percent, else to training;
//   - shards: the training text cut into num_shards contiguous pieces of equal length (so islands see
//     different files: a mild, realistic non-IID split).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::diloco {

inline constexpr std::string_view kDefaultFortunesDir = "/usr/share/games/fortunes";

struct CharCorpus {
  std::string vocab;           // id -> byte
  std::vector<uint8_t> train;  // token ids
  std::vector<uint8_t> eval;   // token ids
  size_t num_entries = 0;
  size_t vocab_size() const { return vocab.size(); }
};

// NotFound (naming the directory and the package to install) when there is no usable text;
// InvalidArgument when eval_percent is outside [1, 50].
absl::StatusOr<CharCorpus> LoadCharCorpus(std::string_view dir, uint32_t eval_percent = 10);

// Training shard `shard` of `num_shards` (contiguous, equal length up to one token). InvalidArgument when
// shard >= num_shards or the shard would be shorter than `min_tokens`.
absl::StatusOr<std::span<const uint8_t>> TrainShard(const CharCorpus& corpus, size_t shard, size_t num_shards,
                                                    size_t min_tokens);

}  // namespace fl::diloco
