// CheckTorchScriptFile: the whole-archive check fl-client runs before LibTorch loads a user's model
// (torchscript_archive.h). ReadTorchScriptModel checks what fl reads (parameters and buffers); this adds what
// LibTorch reads besides: every entry's CRC, every tensor of data.pkl and constants.pkl, the other pickles, and
// the source files its parser compiles, each under the limits of torchscript_internal.h.
#include <algorithm>
#include <span>
#include <string>

#include "fl/core/str_cat.h"
#include "fl/formats/pickle.h"
#include "fl/formats/torchscript_archive.h"
#include "fl/formats/zip_archive.h"
#include "torchscript_internal.h"

namespace fl::formats {
namespace {

using torchscript::kMaxCodeBlankRun;
using torchscript::kMaxCodeIndent;
using torchscript::kMaxCodeLines;
using torchscript::kMaxCodeNesting;

// As in the reader: an entry inflates to at most this many times the file's size (LibTorch stores entries
// uncompressed; a deflate bomb reaches 1000x).
constexpr uint64_t kMaxInflation = 16;

// One pass over a TorchScript source file, a chunk at a time: lines, runs of blank lines, bracket nesting and
// indentation, outside string literals and comments (so that a ')' in a string does not count).
class CodeScanner {
 public:
  // An error message, or "" while within the limits.
  std::string Feed(std::span<const uint8_t> chunk) {
    for (uint8_t c : chunk) {
      if (c == '\n') {
        ++lines_;
        blank_run_ = content_ ? 0 : blank_run_ + 1;
        content_ = false;
        at_line_start_ = true;
        indent_ = 0;
        comment_ = false;
        quote_ = 0;  // generated code has no multi-line strings; an unterminated one ends with its line
        if (lines_ > kMaxCodeLines) return fl::StrCat("has more than ", kMaxCodeLines, " lines");
        if (blank_run_ > kMaxCodeBlankRun) {
          return fl::StrCat("has more than ", kMaxCodeBlankRun, " blank lines in a row (at line ", lines_, ")");
        }
        continue;
      }
      if (at_line_start_) {
        if (c == ' ' || c == '\t' || c == '\r') {
          if (++indent_ > kMaxCodeIndent) {
            return fl::StrCat("indents line ", lines_ + 1, " by more than ", kMaxCodeIndent, " columns");
          }
          continue;
        }
        at_line_start_ = false;
      }
      if (c != ' ' && c != '\t' && c != '\r') content_ = true;
      if (comment_) continue;
      if (quote_ != 0) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == quote_) {
          quote_ = 0;
        }
        continue;
      }
      switch (c) {
        case '#': comment_ = true; break;
        case '\'':
        case '"': quote_ = c; break;
        case '(':
        case '[':
        case '{':
          if (++depth_ > kMaxCodeNesting) {
            return fl::StrCat("nests brackets more than ", kMaxCodeNesting, " deep (at line ", lines_ + 1, ")");
          }
          break;
        case ')':
        case ']':
        case '}':
          if (depth_ > 0) --depth_;
          break;
        default: break;
      }
    }
    return "";
  }

 private:
  uint64_t lines_ = 0;
  uint64_t blank_run_ = 0;
  uint64_t indent_ = 0;
  uint64_t depth_ = 0;
  bool content_ = false;
  bool at_line_start_ = true;
  bool comment_ = false;
  bool escaped_ = false;
  uint8_t quote_ = 0;
};

class Checker {
 public:
  explicit Checker(std::string path) : path_(std::move(path)) {}

  absl::Status Run() {
    absl::StatusOr<ZipArchive> zip = ZipArchive::Open(path_, "TorchScript model", torchscript::kMaxModelFileBytes);
    if (!zip.ok()) {
      // The reader says the same with its hints (a torch.save() file, a bare pickle, how to export).
      absl::Status read = ReadTorchScriptModel(path_).status();
      return read.ok() ? zip.status() : read;
    }
    zip_ = &*zip;
    if (zip_->entries().empty() || zip_->entries().front().name.find('/') == std::string::npos) {
      absl::Status read = ReadTorchScriptModel(path_).status();
      return read.ok() ? Error("is not a TorchScript archive") : read;
    }
    const std::string& first = zip_->entries().front().name;
    prefix_ = first.substr(0, first.find('/') + 1);

    // Every entry whole: its declared size against the file, its size and CRC-32 (LibTorch reads them all).
    // Each entry, and all of them together, inflate to at most kMaxInflation times the file (plus 1 MiB for
    // all): many small bombs would otherwise cost gigabytes of inflation one at a time.
    const uint64_t max_entry = kMaxInflation * zip_->file_size() + 4096;
    const uint64_t max_total = kMaxInflation * zip_->file_size() + (uint64_t{1} << 20);
    uint64_t total = 0;
    for (const ZipEntry& entry : zip_->entries()) {
      total += entry.uncompressed_size;
      if (entry.uncompressed_size > max_entry || total > max_total) {
        return Error(fl::StrCat("entry '", entry.name, "' inflates to ", entry.uncompressed_size, " bytes",
                                entry.uncompressed_size > max_entry ? "" : " and the entries up to it to more",
                                ", more than ", kMaxInflation,
                                " times the file's size (a deflate bomb?); LibTorch stores entries uncompressed"));
      }
    }
    for (const ZipEntry& entry : zip_->entries()) {
      if (absl::Status s = zip_->VerifyCrc(entry); !s.ok()) return s;
    }
    // The sources LibTorch's parser compiles.
    uint64_t code_bytes = 0;
    for (const ZipEntry& entry : zip_->entries()) {
      if (!entry.name.starts_with(prefix_ + "code/") || !entry.name.ends_with(".py")) continue;
      code_bytes += entry.uncompressed_size;
      if (entry.uncompressed_size > torchscript::kMaxCodeFileBytes || code_bytes > torchscript::kMaxCodeBytes) {
        return Error(fl::StrCat("code file '", entry.name, "' is ", entry.uncompressed_size, " bytes; the limits are ",
                                torchscript::kMaxCodeFileBytes, " bytes a file and ", torchscript::kMaxCodeBytes,
                                " for all (docs/input-limits.md)"));
      }
      CodeScanner scanner;
      std::string problem;
      absl::Status s = zip_->ForEachChunk(entry, [&](uint64_t, std::span<const uint8_t> chunk) {
        problem = scanner.Feed(chunk);
        return problem.empty() ? absl::OkStatus() : absl::CancelledError();
      });
      if (!problem.empty()) {
        return Error(fl::StrCat("code file '", entry.name, "' ", problem,
                                "; LibTorch's parser would overflow its stack on such a file: this is not "
                                "code torch.jit.save writes (docs/input-limits.md)"));
      }
      if (!s.ok()) return s;
    }
    // What fl reads: parameters and buffers, their values finite.
    if (absl::Status s = ReadTorchScriptModel(path_).status(); !s.ok()) return s;
    // Every tensor LibTorch rebuilds, and the other pickles it reads.
    for (const ZipEntry& entry : zip_->entries()) {
      const bool data = entry.name == prefix_ + "data.pkl";
      const bool constants = entry.name == prefix_ + "constants.pkl";
      if (!data && !constants && !entry.name.ends_with(".debug_pkl")) continue;
      const std::string dir = constants ? "constants/" : "data/";
      if (absl::Status s = CheckPickle(entry, data || constants, prefix_ + dir); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(fl::StrCat(path_, ": ", message));
  }

  absl::Status CheckPickle(const ZipEntry& entry, bool has_tensors, const std::string& storage_dir) {
    const uint64_t limit =
        entry.name == prefix_ + "data.pkl" ? torchscript::kMaxPickleBytes : torchscript::kMaxSidePickleBytes;
    absl::StatusOr<std::string> bytes = zip_->ReadAll(entry, limit, "the pickle");
    if (!bytes.ok()) return bytes.status();
    const std::string what = fl::StrCat(path_, ": ", entry.name);
    absl::StatusOr<PickleDocument> doc =
        ParsePickle(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()), what,
                    torchscript::ArchivePickleLimits());
    if (!doc.ok()) return doc.status();
    if (!has_tensors) return absl::OkStatus();
    // A flat scan of the arena: every tensor reference, wherever it hangs (attributes that are neither
    // parameters nor buffers, lists of tensors, constants), without recursion.
    torchscript::StorageCatalog catalog;
    for (PickleRef ref = 0; ref < doc->size(); ++ref) {
      if (torchscript::CalleeOf(*doc, ref) != "torch._utils._rebuild_tensor_v2") continue;
      const std::string label = fl::StrCat("a tensor of ", entry.name, " (pickle value ", ref, ")");
      absl::StatusOr<torchscript::TensorRef> tensor =
          torchscript::ResolveTensor(path_, *doc, ref, *zip_, storage_dir, label);
      if (!tensor.ok()) return tensor.status();
      if (absl::Status s = catalog.Add(path_, *tensor, label); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::string path_;
  const ZipArchive* zip_ = nullptr;
  std::string prefix_;
};

}  // namespace

absl::Status CheckTorchScriptFile(const std::string& path) { return Checker(path).Run(); }

}  // namespace fl::formats
