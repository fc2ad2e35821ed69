#include "fl/diloco/island/text_corpus.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"
#include "fl/training/data/deterministic_random.h"

namespace fl::diloco {
namespace {

// "_\bx" and "x\bx" (nroff underline / bold) -> "x": the backspace and the byte before it go.
std::string RemoveOverstrikes(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\b') {
      if (!out.empty()) out.pop_back();
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<std::string> SplitEntries(const std::string& text) {
  std::vector<std::string> entries;
  std::string current;
  std::istringstream in(text);
  std::string line;
  auto flush = [&] {
    while (!current.empty() && (current.back() == '\n' || current.back() == ' ')) current.pop_back();
    if (!current.empty()) entries.push_back(current);
    current.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%") {
      flush();
    } else {
      current += line;
      current += '\n';
    }
  }
  flush();
  return entries;
}

}  // namespace

absl::StatusOr<CharCorpus> LoadCharCorpus(std::string_view dir, uint32_t eval_percent) {
  if (eval_percent < 1 || eval_percent > 50) {
    return absl::InvalidArgumentError(fl::StrCat("eval_percent is ", eval_percent, "; use a value in [1, 50]"));
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  for (fs::directory_iterator it(fs::path(dir), ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file() && !it->path().has_extension()) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  std::vector<std::string> entries;
  // The whole corpus is held in memory (as text and as token ids): fortunes-min is a few MB. The limit is
  // fl-client's for a text corpus (training/data/src/text_corpus.cc); a directory past it is not a corpus of
  // fortunes, and a file that grows while it is read cannot take the memory with it.
  constexpr uint64_t kMaxCorpusBytes = uint64_t{256} << 20;
  uint64_t total = 0;
  for (const fs::path& path : files) {
    absl::StatusOr<std::string> text =
        sys::ReadUserFile(path.string(), "fortune file", kMaxCorpusBytes - total,
                          "the corpus of a directory is at most 256 MiB in all; pass a directory of fewer files");
    if (!text.ok()) return text.status();
    total += text->size();
    std::vector<std::string> file_entries = SplitEntries(RemoveOverstrikes(*text));
    entries.insert(entries.end(), file_entries.begin(), file_entries.end());
  }
  if (entries.empty()) {
    return absl::NotFoundError(fl::StrCat("no fortunes found in '", dir,
                                          "': install the Debian package fortunes-min (apt-get install "
                                          "fortunes-min) or pass the directory that holds fortune files"));
  }
  std::array<bool, 256> present{};
  for (const std::string& e : entries) {
    for (unsigned char c : e) present[c] = true;
  }
  present['\n'] = true;
  CharCorpus corpus;
  std::array<uint8_t, 256> id_of{};
  for (int b = 0; b < 256; ++b) {
    if (present[b]) {
      id_of[b] = static_cast<uint8_t>(corpus.vocab.size());
      corpus.vocab.push_back(static_cast<char>(b));
    }
  }
  corpus.num_entries = entries.size();
  for (size_t i = 0; i < entries.size(); ++i) {
    std::vector<uint8_t>& target = (training::data::SplitMix64(i) % 100 < eval_percent) ? corpus.eval : corpus.train;
    if (!target.empty()) {
      target.push_back(id_of['\n']);
      target.push_back(id_of['\n']);
    }
    for (unsigned char c : entries[i]) target.push_back(id_of[c]);
  }
  return corpus;
}

absl::StatusOr<std::span<const uint8_t>> TrainShard(const CharCorpus& corpus, size_t shard, size_t num_shards,
                                                    size_t min_tokens) {
  if (num_shards == 0 || shard >= num_shards) {
    return absl::InvalidArgumentError(fl::StrCat("shard ", shard, " of ", num_shards, ": use 0 <= shard < num_shards"));
  }
  const size_t n = corpus.train.size();
  const size_t begin = n * shard / num_shards;
  const size_t end = n * (shard + 1) / num_shards;
  if (end - begin < min_tokens) {
    return absl::InvalidArgumentError(fl::StrCat("training shard ", shard, " of ", num_shards, " has ", end - begin,
                                                 " tokens, fewer than the ", min_tokens,
                                                 " one sample needs; use fewer shards or a shorter context"));
  }
  return std::span<const uint8_t>(corpus.train).subspan(begin, end - begin);
}

}  // namespace fl::diloco
