// The plain-text corpus of LoadClientData: byte-level next-token windows of a text file or a directory of them,
// read through fl::sys::OpenUserFile within a stated limit (text_corpus.h).
#include "text_corpus.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/training/data/partition.h"
#include "fl/sys/user_file.h"

namespace fl::training::data::internal {

absl::StatusOr<std::string> ReadTextCorpus(const std::string& path, bool is_directory) {
  std::vector<std::string> files;
  if (is_directory) {
    std::error_code ec;
    for (const auto& item : std::filesystem::directory_iterator(path, ec)) {
      const std::string name = item.path().filename().string();
      if (name.find('.') == std::string::npos && item.is_regular_file(ec)) files.push_back(item.path().string());
    }
    if (ec) return absl::PermissionDeniedError(fl::StrCat("cannot list ", path, ": ", ec.message()));
    std::sort(files.begin(), files.end());  // byte order of names: the same on every machine
    if (files.empty()) {
      return absl::InvalidArgumentError(
          fl::StrCat(path,
                     " has no text files (regular files without a '.' in their name; fortune's .dat and .u8 are "
                     "skipped); give a text file or a directory of them (e.g. /usr/share/games/fortunes from the "
                     "fortunes-min package)"));
    }
  } else {
    files.push_back(path);
  }
  const std::string hint = fl::StrCat(
      "a text corpus is read whole by every client, at most ", kMaxTextCorpusBytes,
      " bytes in all; for a larger one save token windows in an .npz (np.savez(path, x_train=..., y_train=..., "
      "x_test=..., y_test=...), read by rows)");
  std::string text;
  for (size_t i = 0; i < files.size(); ++i) {
    // Each file within what is left of the corpus's limit (the "\n" joining it to the previous one included).
    const uint64_t separator = i > 0 ? 1 : 0;
    const uint64_t left = kMaxTextCorpusBytes - std::min<uint64_t>(kMaxTextCorpusBytes, text.size() + separator);
    absl::StatusOr<std::string> content = fl::sys::ReadUserFile(files[i], "text file", left, hint);
    if (!content.ok()) return content.status();
    if (i > 0) text += '\n';
    text += *content;
  }
  return text;
}

namespace {

uint64_t NumWindows(uint64_t bytes, uint32_t seq_len) { return bytes > seq_len ? (bytes - 1) / seq_len : 0; }

Examples TextExamples(std::string_view text, const std::vector<uint32_t>& windows, uint32_t seq_len,
                      std::string source) {
  Examples e;
  e.source = std::move(source);
  e.n = windows.size();
  e.rows = windows;
  e.x_shape = {seq_len};
  e.y_shape = {seq_len};
  e.x_type = ElementType::kInt64;
  e.y_type = ElementType::kInt64;
  std::vector<int64_t> x(windows.size() * seq_len), y(windows.size() * seq_len);
  for (size_t i = 0; i < windows.size(); ++i) {
    const size_t start = static_cast<size_t>(windows[i]) * seq_len;
    for (uint32_t t = 0; t < seq_len; ++t) {
      x[i * seq_len + t] = static_cast<uint8_t>(text[start + t]);
      y[i * seq_len + t] = static_cast<uint8_t>(text[start + t + 1]);
    }
  }
  for (auto [bytes, values] : {std::pair{&e.x, &x}, std::pair{&e.y, &y}}) {
    bytes->resize(values->size() * sizeof(int64_t));
    std::memcpy(bytes->data(), values->data(), bytes->size());
  }
  return e;
}

}  // namespace

absl::StatusOr<ClientData> LoadTextCorpus(const DataOptions& o, bool is_directory) {
  auto spec = PartitionSpec::Parse(o.partition);
  if (!spec.ok()) return spec.status();
  if (spec->kind != PartitionKind::kIid) {
    return absl::InvalidArgumentError(fl::StrCat(
        "partition ", spec->ToString(), " is not available for a plain text corpus (", o.path,
        "): it has no labels and no client ids; use iid (or an .npz of token sequences with a client_id array)"));
  }
  if (o.seq_len == 0) return absl::InvalidArgumentError("seq_len must be at least 1");
  auto text = ReadTextCorpus(o.path, is_directory);
  if (!text.ok()) return text.status();
  const uint64_t test_bytes = text->size() * kTextTestPercent / 100;
  const std::string_view train_text = std::string_view(*text).substr(0, text->size() - test_bytes);
  const std::string_view test_text = std::string_view(*text).substr(text->size() - test_bytes);
  const uint64_t train_windows = NumWindows(train_text.size(), o.seq_len);
  const uint64_t test_windows = NumWindows(test_text.size(), o.seq_len);
  if (train_windows < o.num_clients || test_windows < o.num_clients) {
    return absl::InvalidArgumentError(
        fl::StrCat("text ", o.path, " (", text->size(), " bytes) is too short for seq_len ", o.seq_len, " and ",
                   o.num_clients, " clients: its first ", 100 - kTextTestPercent, "% gives ", train_windows,
                   " training windows of ", o.seq_len + 1, " bytes and its last ", kTextTestPercent, "% ", test_windows,
                   " test windows, and each client needs at least one of each: use a longer text, a smaller seq_len or "
                   "fewer clients"));
  }
  auto train_rows = PartitionIidFor(o.client_index, train_windows, o.num_clients, o.partition_seed);
  if (!train_rows.ok()) return train_rows.status();
  if (o.data_fraction < 1) {
    const size_t keep =
        std::max<size_t>(1, static_cast<size_t>(std::ceil(o.data_fraction * static_cast<double>(train_rows->size()))));
    train_rows->resize(std::min(keep, train_rows->size()));
  }
  auto test_rows = PartitionIidFor(o.client_index, test_windows, o.num_clients, o.partition_seed);
  if (!test_rows.ok()) return test_rows.status();

  ClientData data;
  data.train = TextExamples(train_text, *train_rows, o.seq_len, fl::StrCat(o.path, ":train text"));
  data.test = TextExamples(test_text, *test_rows, o.seq_len, fl::StrCat(o.path, ":test text"));
  // Token ids are bytes: the largest over the whole text, so every client agrees.
  for (auto [split_text, range, array] : {std::tuple{train_text, &data.train_labels, "train text"},
                                          std::tuple{test_text, &data.test_labels, "test text"}}) {
    LabelRange r;
    r.file = o.path;
    r.array = array;
    r.index = 0;
    for (size_t i = 0; i < split_text.size(); ++i) {
      const int64_t byte = static_cast<uint8_t>(split_text[i]);
      if (byte > r.max) {
        r.max = byte;
        r.element = static_cast<int64_t>(i);  // byte offset in the split's text
      }
    }
    *range = r;
  }
  data.description = fl::StrCat(o.path, ": next-token over bytes (vocabulary ", kTextVocabulary, "), ", text->size(),
                                " bytes, windows of ", o.seq_len, "+1; client ", o.client_index, " of ", o.num_clients,
                                " (partition iid, seed ", o.partition_seed, "): ", data.train.n, " of ", train_windows,
                                " train windows, ", data.test.n, " of ", test_windows, " test");
  return data;
}

}  // namespace fl::training::data::internal
