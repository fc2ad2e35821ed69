// One client's data for "bring your own data": its shard of a NumPy .npz, of Fashion-MNIST's IDX files, or
// of a plain text corpus (next-token), as plain arrays the trainer turns into tensors. No LibTorch here.
//
// Sources (DataOptions::path):
//   - an .npz (np.savez / np.savez_compressed) with arrays x_train, y_train, x_test, y_test and optionally
//     client_id (one integer per training example, for the natural partition);
//       classification  x float32 or uint8, shape N x ...;  y integer labels (any integer dtype), shape N
//       regression      x float32 or uint8, shape N x ...;  y float32 targets, shape N or N x ...
//       next-token      x integer token ids, shape N x T;    y integer token ids, shape N x T
//     Integer arrays are delivered as int64, features in their own type.
//   - a Fashion-MNIST IDX directory (fashion_mnist.h): classification, x uint8 [1, 28, 28], y int64.
//   - next-token only: a text file, or a directory whose regular files without a '.' in their name are read
//     in byte order of their names and joined with "\n" (so /usr/share/games/fortunes works). Byte-level
//     tokens (vocabulary 256); the last 10% of the bytes is the test text, the first 90% the training text;
//     examples are non-overlapping windows of seq_len + 1 bytes (stride seq_len): x = window[:-1],
//     y = window[1:], both int64 [seq_len].
//
// What is read: only this client's rows of x (NpzFile::ReadRows: pread for np.savez, one streamed inflate
// for np.savez_compressed). Labels (classification y_train / y_test) and client_id are read whole because
// the partitioners need them; regression targets and next-token y are read by rows like x. So 100 clients
// sharing one large .npz hold about 1/100 of it each. A Fashion-MNIST directory likewise: its labels whole,
// then only this client's rows of its images (LoadFashionMnistRows).
//
// Partition of the training split (DataOptions::partition, PartitionSpec::Parse syntax): iid, dirichlet,
// shards (classification: they need labels) and natural (needs client_id); regression and next-token
// accept iid and natural. The test split is always this client's IID share of the test set (the same seed),
// so the example-weighted mean of all clients' evaluations is the evaluation on the whole test set.
//
// Every error names the file and the array, the offending value, and the numpy call that fixes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/task.h"

namespace fl::training::data {

// The task is core's (its names are on the wire and in the records); re-exported for the data layer.
using Task = core::Task;
using core::ParseTask;  // "classification" | "regression" | "next-token"
using core::TaskName;

enum class ElementType { kUInt8, kFloat32, kInt64 };
std::string_view ElementTypeName(ElementType type);  // "uint8", "float32", "int64"
size_t ElementSize(ElementType type);                // 1, 4, 8

// One split of one client's data, only its own rows.
struct Examples {
  std::string source;  // for messages: "/path/data.npz:x_train"
  uint64_t n = 0;
  std::vector<int64_t> x_shape;                // per example, without N
  ElementType x_type = ElementType::kFloat32;  // uint8 or float32 (features); int64 (tokens, next-token)
  std::vector<uint8_t> x;        // n * prod(x_shape) elements of x_type, C order, native (little-endian) bytes
  std::vector<int64_t> y_shape;  // per example: {} for a scalar label/target
  ElementType y_type = ElementType::kInt64;  // int64 (labels, tokens) or float32 (regression targets)
  std::vector<uint8_t> y;
  std::vector<uint32_t> rows;  // the row of the source array each example came from (for messages)

  uint64_t x_elements() const;  // prod(x_shape)
  uint64_t y_elements() const;  // prod(y_shape)
};

// Where the largest label (classification) or token id (next-token) is, for CheckLabelRange.
// Classification: over the WHOLE file's y_train / y_test, not just this client's shard, so that every
// client agrees. Next-token: over this client's x and y tokens (a token corpus is read by rows only).
struct LabelRange {
  int64_t max = -1;
  std::string file;      // the data file or directory
  std::string array;     // "y_train", "x_test", ...
  uint64_t index = 0;    // the row in that array
  int64_t element = -1;  // next-token: the position within the row; -1 for a scalar label
};

struct ClientData {
  Examples train, test;
  std::string description;                              // one line for logs: source, task, shapes, partition, sizes
  std::optional<LabelRange> train_labels, test_labels;  // classification and next-token
};

struct DataOptions {
  std::string path;  // .npz file; a Fashion-MNIST IDX directory; or (next-token) a text file or a
                     // directory of text files
  Task task = Task::kClassification;
  std::string partition = "iid";  // PartitionSpec::Parse syntax, including "natural"
  uint32_t client_index = 0, num_clients = 1;
  uint64_t partition_seed = 0;
  uint32_t seq_len = 64;       // next-token from plain text: tokens per example
  double data_fraction = 1.0;  // (0,1]: keep the first ceil(f*n) of this client's train shard (as TorchTrainer)
};

inline constexpr uint32_t kTextVocabulary = 256;  // byte-level tokens of a plain text corpus
inline constexpr uint32_t kTextTestPercent = 10;  // the last 10% of a text's bytes is its test text

absl::StatusOr<ClientData> LoadClientData(const DataOptions& options);

// Labels (or token ids) outside [0, classes): InvalidArgument
// "data.npz: y_train[123] = 12 is outside [0, 10) (the model outputs 10 classes); ...".
absl::Status CheckLabelRange(const ClientData& data, int64_t classes);

}  // namespace fl::training::data
