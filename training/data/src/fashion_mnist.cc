#include "fl/training/data/fashion_mnist.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"
#include "fl/training/data/idx.h"

namespace fl::training::data {
namespace {

// The file to read for `base` in `dir`: `base.gz`, else an uncompressed `base`.
absl::StatusOr<std::string> FindFile(std::string_view dir, std::string_view base, std::string_view what) {
  const std::filesystem::path directory{std::string(dir)};
  const std::string gz = (directory / fl::StrCat(base, ".gz")).string();
  const std::string plain = (directory / std::string(base)).string();
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  if (std::filesystem::exists(plain, ec)) return plain;
  return absl::NotFoundError(fl::StrCat("Fashion-MNIST ", what, " not found: neither ", gz, " nor ", plain,
                                        " exists; install the dataset with `apt-get install "
                                        "dataset-fashion-mnist` (or run deploy/install-deps.sh)"));
}

}  // namespace

std::string_view SplitName(Split split) {
  switch (split) {
    case Split::kTrain: return "train";
    case Split::kTest: return "test";
  }
  return "unknown";
}

absl::StatusOr<Split> ParseSplit(std::string_view name) {
  if (name == "train") return Split::kTrain;
  if (name == "test") return Split::kTest;
  return absl::InvalidArgumentError(fl::StrCat("unknown dataset split '", name, "'; expected train or test"));
}

namespace {

struct SplitFiles {
  std::string images, labels;
};

// The split's two files; the images file is looked for first (its absence is the one reported).
absl::StatusOr<SplitFiles> FindSplitFiles(std::string_view dir, Split split) {
  const std::string_view prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string split_name(SplitName(split));
  auto images = FindFile(dir, fl::StrCat(prefix, "-images-idx3-ubyte"), fl::StrCat(split_name, " images"));
  if (!images.ok()) return images.status();
  auto labels = FindFile(dir, fl::StrCat(prefix, "-labels-idx1-ubyte"), fl::StrCat(split_name, " labels"));
  if (!labels.ok()) return labels.status();
  return SplitFiles{std::move(*images), std::move(*labels)};
}

absl::Status CheckImageSize(const std::string& path, const IdxImages& images) {
  if (images.rows != kFashionMnistRows || images.cols != kFashionMnistCols) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": images are ", images.rows, " x ", images.cols,
                                                 ", Fashion-MNIST images are ", kFashionMnistRows, " x ",
                                                 kFashionMnistCols));
  }
  return absl::OkStatus();
}

absl::Status CheckCounts(Split split, const SplitFiles& files, uint64_t images, uint64_t labels) {
  if (labels != images) {
    return absl::InvalidArgumentError(fl::StrCat("Fashion-MNIST ", SplitName(split), ": count mismatch: ", files.images,
                                                 " has ", images, " images but ", files.labels, " has ", labels,
                                                 " labels"));
  }
  return absl::OkStatus();
}

Dataset MakeDataset(Split split, IdxImages images, std::vector<uint8_t> labels) {
  Dataset dataset;
  dataset.name = fl::StrCat("fashion-mnist/", SplitName(split));
  dataset.num_examples = images.count;
  dataset.rows = images.rows;
  dataset.cols = images.cols;
  dataset.num_classes = kFashionMnistClasses;
  dataset.pixels = std::move(images.pixels);
  dataset.labels = std::move(labels);
  return dataset;
}

}  // namespace

absl::StatusOr<Dataset> LoadFashionMnist(std::string_view dir, Split split) {
  auto files = FindSplitFiles(dir, split);
  if (!files.ok()) return files.status();
  auto images = LoadIdxImages(files->images);
  if (!images.ok()) return images.status();
  if (auto status = CheckImageSize(files->images, *images); !status.ok()) return status;
  auto labels = LoadIdxLabels(files->labels, kFashionMnistClasses);
  if (!labels.ok()) return labels.status();
  if (auto status = CheckCounts(split, *files, images->count, labels->size()); !status.ok()) return status;
  return MakeDataset(split, std::move(*images), std::move(*labels));
}

absl::StatusOr<std::vector<uint8_t>> LoadFashionMnistLabels(std::string_view dir, Split split) {
  auto files = FindSplitFiles(dir, split);
  if (!files.ok()) return files.status();
  return LoadIdxLabels(files->labels, kFashionMnistClasses);
}

absl::StatusOr<Dataset> LoadFashionMnistRows(std::string_view dir, Split split, std::span<const uint32_t> rows) {
  auto files = FindSplitFiles(dir, split);
  if (!files.ok()) return files.status();
  // The labels first (small), so that a row outside the split is named before the images are read through.
  auto labels = LoadIdxLabels(files->labels, kFashionMnistClasses);
  if (!labels.ok()) return labels.status();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= labels->size()) {
      return absl::InvalidArgumentError(fl::StrCat(
          "Fashion-MNIST ", SplitName(split), ": row ", rows[i], " (entry ", i, " of the ", rows.size(),
          " rows asked for) is out of range for the split's ", labels->size(), " examples (", files->labels, ")"));
    }
  }
  auto images = LoadIdxImageRows(files->images, rows);
  if (!images.ok()) return images.status();
  if (auto status = CheckImageSize(files->images, images->images); !status.ok()) return status;
  if (auto status = CheckCounts(split, *files, images->file_count, labels->size()); !status.ok()) return status;
  std::vector<uint8_t> kept(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) kept[i] = (*labels)[rows[i]];
  return MakeDataset(split, std::move(images->images), std::move(kept));
}

}  // namespace fl::training::data
