// Fashion-MNIST (Xiao, Rasul & Vollgraf 2017): 60,000 training and 10,000 test grey-scale 28x28 images of
// 10 clothing classes, read from the four IDX files of the Debian package `dataset-fashion-mnist`
// (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`,
// `t10k-labels-idx1-ubyte.gz`; uncompressed copies without `.gz` are accepted too).
//
// The result is plain arrays: uint8 pixels and uint8 labels. The trainer turns them into tensors (and
// normalises with kFashionMnistMean / kFashionMnistStd); nothing here depends on LibTorch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::training::data {

inline constexpr std::string_view kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr uint32_t kFashionMnistClasses = 10;
inline constexpr uint32_t kFashionMnistRows = 28;
inline constexpr uint32_t kFashionMnistCols = 28;
// Per-pixel statistics of the training set, pixels scaled to [0, 1] (mean pixel ~72.94 of 255).
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;
inline constexpr std::array<std::string_view, kFashionMnistClasses> kFashionMnistClassNames = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

enum class Split : uint8_t { kTrain = 0, kTest = 1 };

std::string_view SplitName(Split split);                  // "train", "test"
absl::StatusOr<Split> ParseSplit(std::string_view name);  // "train" | "test"

// An image classification dataset held in memory.
struct Dataset {
  std::string name;  // e.g. "fashion-mnist/train"
  uint32_t num_examples = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  uint32_t num_classes = 0;
  std::vector<uint8_t> pixels;  // num_examples x rows x cols, contiguous, example-major then row-major
  std::vector<uint8_t> labels;  // num_examples values in [0, num_classes)

  size_t image_size() const { return static_cast<size_t>(rows) * cols; }
  std::span<const uint8_t> image(size_t i) const {
    return std::span<const uint8_t>(pixels).subspan(i * image_size(), image_size());
  }
};

// Loads one split from `dir`. A missing file is NotFound and says how to install the dataset; a corrupt
// one is InvalidArgument naming the file and the problem; image and label counts must agree.
absl::StatusOr<Dataset> LoadFashionMnist(std::string_view dir, Split split);
inline absl::StatusOr<Dataset> LoadFashionMnist(Split split) {
  return LoadFashionMnist(kDefaultFashionMnistDir, split);
}

// One client's part of a split without holding the whole split (a small board's start-up peak was the 47 MB
// training images read before the shard was cut), in two calls:
//  1. LoadFashionMnistLabels: every label of the split (60 KB for train), what a partitioner needs to pick
//     the client's rows. It also checks that the split's images file is there, so that a missing file is
//     reported before any work, as LoadFashionMnist reports it.
//  2. LoadFashionMnistRows: only the examples `rows` of the split, in that order: example i of the result is
//     row rows[i] of the split (its image and its label); num_examples = rows.size(), the name, image size and
//     classes are LoadFashionMnist's. The images file is read through and checked as LoadFashionMnist checks
//     it, but only the kept images are stored. Errors are LoadFashionMnist's, and InvalidArgument for a row
//     outside the split (naming the row and the split's size).
// LoadFashionMnistRows(dir, split, rows) holds the same bytes as cutting `rows` out of LoadFashionMnist(dir,
// split). Several clients in one process should load the split once and share it (fl-client --instances).
absl::StatusOr<std::vector<uint8_t>> LoadFashionMnistLabels(std::string_view dir, Split split);
absl::StatusOr<Dataset> LoadFashionMnistRows(std::string_view dir, Split split, std::span<const uint32_t> rows);

}  // namespace fl::training::data
