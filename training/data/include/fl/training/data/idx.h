// IDX files (LeCun's MNIST container format), read directly from `.gz` or from plain uncompressed files.
//
// An IDX file is a 4-byte magic (two zero bytes, a type code — 0x08 for unsigned bytes — and the number of
// dimensions), one big-endian uint32 per dimension, then the values in row-major order. Only unsigned-byte
// files of images (3 dimensions, magic 0x00000803) and labels (1 dimension, magic 0x00000801) are read here.
//
// Everything is validated before it is trusted: a regular file within the limits below, the magic, non-zero
// dimensions, the exact file length (a truncated or oversized file is an error naming the file and both sizes,
// in decompressed bytes for `.gz`), and label range. A file is decompressed when it starts with the gzip magic (1f 8b);
// a file whose name ends in `.gz` must be gzip.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::training::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
inline constexpr size_t kIdxImagesHeaderBytes = 16;      // magic + count + rows + cols
inline constexpr size_t kIdxLabelsHeaderBytes = 8;       // magic + count

// What an IDX file may be: a regular file (not a FIFO or a device: those are refused before a byte is read) of
// at most kMaxIdxFileBytes, holding at most kMaxIdxDataBytes once decompressed (a gzip stream is bounded as it
// inflates; a header that declares more is refused before anything is allocated). 1 GiB: 20 times Fashion-MNIST's
// largest file (47 MB of training images), and above every MNIST-like IDX dataset (EMNIST ByClass's training
// images are 547 MB); a client holds at most that much of a split while reading it.
inline constexpr uint64_t kMaxIdxFileBytes = uint64_t{1} << 30;
inline constexpr uint64_t kMaxIdxDataBytes = uint64_t{1} << 30;

struct IdxImages {
  uint32_t count = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, image-major, row-major within an image
};

// Reads an image file (`.gz` or plain).
absl::StatusOr<IdxImages> LoadIdxImages(std::string_view path);

// Reads a label file (`.gz` or plain); every label must be < num_classes (num_classes in [1, 256]).
absl::StatusOr<std::vector<uint8_t>> LoadIdxLabels(std::string_view path, uint32_t num_classes);

// Some images of an image file: what one client of many keeps of a shared dataset.
struct IdxImageRows {
  uint32_t file_count = 0;  // images in the file
  IdxImages images;         // count = rows.size(): image i is image rows[i] of the file
};

// Reads only the images `rows` of an image file (`.gz` or plain), in the order given (a row may repeat).
// The whole file is still read through and checked as LoadIdxImages checks it (a gzip stream cannot be
// skipped), but only the kept images are stored: the memory is rows.size() images, not the file's. A row
// >= the file's image count is InvalidArgument naming the row and the count, before the images are read.
// Rows in increasing order (a partition's) are stored as read; other orders cost one more copy of the kept
// images at the end.
absl::StatusOr<IdxImageRows> LoadIdxImageRows(std::string_view path, std::span<const uint32_t> rows);

// The same checks on an uncompressed IDX file already in memory; `name` is used in error messages.
// (Handy for fuzzing and for tests.)
absl::StatusOr<IdxImages> ParseIdxImages(std::span<const uint8_t> bytes, std::string_view name);
absl::StatusOr<IdxImageRows> ParseIdxImageRows(std::span<const uint8_t> bytes, std::string_view name,
                                               std::span<const uint32_t> rows);
absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(std::span<const uint8_t> bytes, std::string_view name,
                                                    uint32_t num_classes);

}  // namespace fl::training::data
