#include "fl/data/fashion_mnist.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"
#include "fl/data/idx.h"

namespace fl::data {
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

absl::StatusOr<Dataset> LoadFashionMnist(std::string_view dir, Split split) {
  const std::string_view prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string split_name(SplitName(split));
  auto images_path = FindFile(dir, fl::StrCat(prefix, "-images-idx3-ubyte"), fl::StrCat(split_name, " images"));
  if (!images_path.ok()) return images_path.status();
  auto labels_path = FindFile(dir, fl::StrCat(prefix, "-labels-idx1-ubyte"), fl::StrCat(split_name, " labels"));
  if (!labels_path.ok()) return labels_path.status();

  auto images = LoadIdxImages(*images_path);
  if (!images.ok()) return images.status();
  if (images->rows != kFashionMnistRows || images->cols != kFashionMnistCols) {
    return absl::InvalidArgumentError(fl::StrCat(*images_path, ": images are ", images->rows, " x ", images->cols,
                                                 ", Fashion-MNIST images are ", kFashionMnistRows, " x ",
                                                 kFashionMnistCols));
  }
  auto labels = LoadIdxLabels(*labels_path, kFashionMnistClasses);
  if (!labels.ok()) return labels.status();
  if (labels->size() != images->count) {
    return absl::InvalidArgumentError(fl::StrCat("Fashion-MNIST ", split_name, ": count mismatch: ", *images_path,
                                                 " has ", images->count, " images but ", *labels_path, " has ",
                                                 labels->size(), " labels"));
  }

  Dataset dataset;
  dataset.name = fl::StrCat("fashion-mnist/", split_name);
  dataset.num_examples = images->count;
  dataset.rows = images->rows;
  dataset.cols = images->cols;
  dataset.num_classes = kFashionMnistClasses;
  dataset.pixels = std::move(images->pixels);
  dataset.labels = std::move(*labels);
  return dataset;
}

}  // namespace fl::data
