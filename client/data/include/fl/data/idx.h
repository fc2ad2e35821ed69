// IDX files (LeCun's MNIST container format), read directly from `.gz` or from plain uncompressed files.
//
// An IDX file is a 4-byte magic (two zero bytes, a type code — 0x08 for unsigned bytes — and the number of
// dimensions), one big-endian uint32 per dimension, then the values in row-major order. Only unsigned-byte
// files of images (3 dimensions, magic 0x00000803) and labels (1 dimension, magic 0x00000801) are read here.
//
// Everything is validated before it is trusted: the magic, non-zero dimensions, the exact file length (a
// truncated or oversized file is an error naming the file and both sizes, in decompressed bytes for `.gz`),
// and label range. A file is decompressed when it starts with the gzip magic (1f 8b); a file whose name ends
// in `.gz` must be gzip.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
inline constexpr size_t kIdxImagesHeaderBytes = 16;      // magic + count + rows + cols
inline constexpr size_t kIdxLabelsHeaderBytes = 8;       // magic + count

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

// The same checks on an uncompressed IDX file already in memory; `name` is used in error messages.
// (Handy for fuzzing and for tests.)
absl::StatusOr<IdxImages> ParseIdxImages(std::span<const uint8_t> bytes, std::string_view name);
absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(std::span<const uint8_t> bytes, std::string_view name,
                                                    uint32_t num_classes);

}  // namespace fl::data
