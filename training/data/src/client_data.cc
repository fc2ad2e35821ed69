// LoadClientData: one client's shard of a user's data (.npz, Fashion-MNIST IDX folder, text corpus) for a task.
//
// The formats share the shard selection (partitioners, rows read per shard), the label and shape checks and their
// error messages; each format's reader is a few functions here (the text corpus in text_corpus.cc), and the
// byte-level readers they use live in formats/ and idx.cc. Every file is opened as a user's file
// (fl::sys::OpenUserFile): regular files only, each reader within a stated size limit.
#include "fl/training/data/client_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/training/data/fashion_mnist.h"
#include "fl/training/data/partition.h"
#include "fl/formats/npy.h"
#include "fl/sys/user_file.h"
#include "text_corpus.h"

namespace fl::training::data {
namespace {

static_assert(std::endian::native == std::endian::little,
              "arrays are delivered in native byte order, read from little-endian files without conversion");

using formats::DType;
using formats::NpyHeader;
using formats::NpzFile;

constexpr std::string_view kRequiredArrays[] = {"x_train", "y_train", "x_test", "y_test"};

std::string ShapeOf(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += fl::StrCat(i > 0 ? ", " : "", shape[i]);
  return text + "]";
}

// "[3, 17]": the position of flat element `flat` in an example of shape `shape`.
std::string ElementIndex(uint64_t flat, const std::vector<int64_t>& shape) {
  std::vector<uint64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % static_cast<uint64_t>(shape[d]);
    flat /= static_cast<uint64_t>(shape[d]);
  }
  std::string text;
  for (uint64_t i : index) text += fl::StrCat("[", i, "]");
  return text;
}

std::vector<int64_t> PerExampleShape(const NpyHeader& header) {
  return std::vector<int64_t>(header.shape.begin() + 1, header.shape.end());
}

template <typename T>
void AppendValues(std::vector<uint8_t>& bytes, const std::vector<T>& values) {
  const size_t at = bytes.size();
  bytes.resize(at + values.size() * sizeof(T));
  std::memcpy(bytes.data() + at, values.data(), values.size() * sizeof(T));
}

template <typename T>
int64_t LoadAs64(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return static_cast<int64_t>(value);
}

// Integer elements of any dtype as int64 (the dtype was checked to be an integer one).
absl::StatusOr<std::vector<int64_t>> ToInt64(std::span<const uint8_t> bytes, DType dtype, std::string_view where) {
  const size_t size = formats::DTypeSize(dtype);
  int64_t (*load)(const uint8_t*) = nullptr;
  switch (dtype) {
    case DType::kInt8: load = LoadAs64<int8_t>; break;
    case DType::kUInt8: load = LoadAs64<uint8_t>; break;
    case DType::kInt16: load = LoadAs64<int16_t>; break;
    case DType::kUInt16: load = LoadAs64<uint16_t>; break;
    case DType::kInt32: load = LoadAs64<int32_t>; break;
    case DType::kUInt32: load = LoadAs64<uint32_t>; break;
    case DType::kInt64:
    case DType::kUInt64: load = LoadAs64<int64_t>; break;
    default: return absl::InternalError(fl::StrCat(where, ": not an integer dtype"));
  }
  std::vector<int64_t> out(bytes.size() / size);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = load(bytes.data() + i * size);
    // uint64 values above INT64_MAX read as negative: name them as what they were.
    if (dtype == DType::kUInt64 && out[i] < 0) {
      return absl::InvalidArgumentError(
          fl::StrCat(where, ": element ", i, " = ", static_cast<uint64_t>(out[i]), " does not fit int64"));
    }
  }
  return out;
}

// Reads one .npz and cuts this client's shard out of it.
class NpzLoader {
 public:
  NpzLoader(const DataOptions& options, NpzFile npz) : o_(options), npz_(std::move(npz)) {}

  absl::StatusOr<ClientData> Load() {
    for (std::string_view name : kRequiredArrays) {
      if (!npz_.Has(name)) {
        std::string present;
        for (const std::string& array : npz_.ArrayNames()) present += (present.empty() ? "" : ", ") + array;
        return absl::InvalidArgumentError(
            fl::StrCat(path(), " has no array '", name, "' (it has: ", present.empty() ? "no arrays" : present,
                       "); a dataset needs x_train, y_train, x_test and y_test (and optionally client_id): "
                       "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"));
      }
    }
    auto x_train = Header("x_train");
    if (!x_train.ok()) return x_train.status();
    auto y_train = Header("y_train");
    if (!y_train.ok()) return y_train.status();
    auto x_test = Header("x_test");
    if (!x_test.ok()) return x_test.status();
    auto y_test = Header("y_test");
    if (!y_test.ok()) return y_test.status();
    for (auto [x, y, x_name, y_name] :
         {std::tuple{&*x_train, &*y_train, "x_train", "y_train"}, std::tuple{&*x_test, &*y_test, "x_test", "y_test"}}) {
      if (auto status = CheckPair(*x, *y, x_name, y_name); !status.ok()) return status;
    }
    if (PerExampleShape(*x_train) != PerExampleShape(*x_test)) {
      return absl::InvalidArgumentError(
          fl::StrCat(path(), ": x_train's examples are ", ShapeOf(PerExampleShape(*x_train)), " but x_test's are ",
                     ShapeOf(PerExampleShape(*x_test)), "; train and test examples must have the same shape"));
    }
    if (PerExampleShape(*y_train) != PerExampleShape(*y_test)) {
      return absl::InvalidArgumentError(
          fl::StrCat(path(), ": y_train's examples are ", ShapeOf(PerExampleShape(*y_train)), " but y_test's are ",
                     ShapeOf(PerExampleShape(*y_test)), "; train and test targets must have the same shape"));
    }

    auto spec = PartitionSpec::Parse(o_.partition);
    if (!spec.ok()) return spec.status();
    if (o_.task != Task::kClassification && spec->kind != PartitionKind::kIid &&
        spec->kind != PartitionKind::kNatural) {
      return absl::InvalidArgumentError(fl::StrCat("partition ", spec->ToString(), " splits by class label, and ",
                                                   TaskName(o_.task), " data (", path(),
                                                   ") have none: use iid, or natural with a client_id array"));
    }

    // Whole arrays: the labels (classification) and the client ids, which the partitioners need.
    ClientData data;
    std::vector<int64_t> train_labels, test_labels;
    if (o_.task == Task::kClassification) {
      auto labels = ReadLabels("y_train", *y_train, data.train_labels);
      if (!labels.ok()) return labels.status();
      train_labels = std::move(*labels);
      labels = ReadLabels("y_test", *y_test, data.test_labels);
      if (!labels.ok()) return labels.status();
      test_labels = std::move(*labels);
    }
    std::vector<int64_t> client_ids;
    if (npz_.Has("client_id")) {
      auto ids = ReadClientIds(x_train->rows());
      if (!ids.ok()) return ids.status();
      client_ids = std::move(*ids);
    }

    // This client's rows.
    absl::StatusOr<std::vector<uint32_t>> train_rows;
    if (spec->kind == PartitionKind::kNatural) {
      if (!npz_.Has("client_id")) {
        return absl::InvalidArgumentError(
            fl::StrCat("partition natural: ", path(),
                       " has no client_id array; add one integer per training example "
                       "(np.savez(..., client_id=ids) with len(ids) == len(x_train)), or use iid"));
      }
      train_rows = PartitionNaturalFor(o_.client_index, client_ids, o_.num_clients);
    } else if (o_.task == Task::kClassification) {
      train_rows = PartitionFor(o_.client_index, *spec, std::span<const int64_t>(train_labels), o_.num_clients,
                                o_.partition_seed);
    } else {
      train_rows = PartitionIidFor(o_.client_index, x_train->rows(), o_.num_clients, o_.partition_seed);
    }
    if (!train_rows.ok()) {
      return absl::Status(train_rows.status().code(),
                          fl::StrCat(path(), ": ", fl::ToStd(train_rows.status().message())));
    }
    KeepFraction(*train_rows, o_.data_fraction);
    auto test_rows = PartitionIidFor(o_.client_index, x_test->rows(), o_.num_clients, o_.partition_seed);
    if (!test_rows.ok()) {
      return absl::Status(test_rows.status().code(),
                          fl::StrCat(path(), ": test split: ", fl::ToStd(test_rows.status().message())));
    }

    auto train = ReadExamples("x_train", *x_train, "y_train", *y_train, *train_rows, train_labels);
    if (!train.ok()) return train.status();
    data.train = std::move(*train);
    auto test = ReadExamples("x_test", *x_test, "y_test", *y_test, *test_rows, test_labels);
    if (!test.ok()) return test.status();
    data.test = std::move(*test);
    if (o_.task == Task::kNextToken) {
      data.train_labels = TokenRange(data.train, "train");
      data.test_labels = TokenRange(data.test, "test");
    }
    data.description =
        fl::StrCat(path(), ": ", TaskName(o_.task), ", x ", formats::DTypeName(x_train->dtype), " ",
                   ShapeOf(data.train.x_shape), " per example, y ", formats::DTypeName(y_train->dtype), " ",
                   ShapeOf(data.train.y_shape), "; client ", o_.client_index, " of ", o_.num_clients, " (partition ",
                   spec->ToString(), ", seed ", o_.partition_seed, "): ", data.train.n, " of ", x_train->rows(),
                   " train examples, ", data.test.n, " of ", x_test->rows(), " test");
    return data;
  }

 private:
  const std::string& path() const { return npz_.path(); }
  std::string Where(std::string_view array) const { return fl::StrCat(path(), ":", array); }

  absl::StatusOr<NpyHeader> Header(std::string_view name) {
    auto header = npz_.Header(name);
    if (!header.ok()) return header.status();
    if (header->shape.empty()) {
      return absl::InvalidArgumentError(fl::StrCat(Where(name), " is a scalar; it must hold one row per example"));
    }
    if (header->rows() == 0 || header->row_elements() == 0) {
      return absl::InvalidArgumentError(fl::StrCat(Where(name), " is empty (shape ", header->ShapeString(),
                                                   "); a dataset needs at least one training and one test example"));
    }
    if (header->rows() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(
          fl::StrCat(Where(name), ": ", header->rows(), " examples do not fit 32-bit indices"));
    }
    return header;
  }

  // dtype and shape rules of one (x, y) pair for the task, and the lengths.
  absl::Status CheckPair(const NpyHeader& x, const NpyHeader& y, std::string_view x_name, std::string_view y_name) {
    const std::string task(TaskName(o_.task));
    if (o_.task == Task::kNextToken) {
      if (!formats::IsInteger(x.dtype)) {
        return absl::InvalidArgumentError(fl::StrCat(Where(x_name), " has dtype ", formats::DTypeName(x.dtype),
                                                     "; next-token inputs are integer token ids: save ", x_name,
                                                     ".astype(np.int64)"));
      }
      if (x.shape.size() != 2) {
        return absl::InvalidArgumentError(fl::StrCat(Where(x_name), " has shape ", x.ShapeString(),
                                                     "; next-token inputs are sequences of shape (N, T)"));
      }
    } else if (x.dtype != DType::kFloat32 && x.dtype != DType::kUInt8) {
      return absl::InvalidArgumentError(fl::StrCat(Where(x_name), " has dtype ", formats::DTypeName(x.dtype), "; ",
                                                   task, " features must be float32 or uint8: save ", x_name,
                                                   ".astype(np.float32)"));
    }
    switch (o_.task) {
      case Task::kClassification:
        if (!formats::IsInteger(y.dtype)) {
          return absl::InvalidArgumentError(fl::StrCat(Where(y_name), " has dtype ", formats::DTypeName(y.dtype),
                                                       "; classification labels are integer class indices "
                                                       "(int64, int32 or uint8): save ",
                                                       y_name, ".astype(np.int64)"));
        }
        if (y.shape.size() != 1) {
          return absl::InvalidArgumentError(fl::StrCat(Where(y_name), " has shape ", y.ShapeString(),
                                                       "; classification labels are one integer per example, shape "
                                                       "(N,): save ",
                                                       y_name, ".reshape(-1) (or argmax of one-hot labels)"));
        }
        break;
      case Task::kRegression:
        if (y.dtype != DType::kFloat32) {
          return absl::InvalidArgumentError(fl::StrCat(Where(y_name), " has dtype ", formats::DTypeName(y.dtype),
                                                       "; regression targets are float32: save ", y_name,
                                                       ".astype(np.float32)"));
        }
        break;
      case Task::kNextToken:
        if (!formats::IsInteger(y.dtype)) {
          return absl::InvalidArgumentError(fl::StrCat(Where(y_name), " has dtype ", formats::DTypeName(y.dtype),
                                                       "; next-token targets are integer token ids: save ", y_name,
                                                       ".astype(np.int64)"));
        }
        if (y.shape != x.shape) {
          return absl::InvalidArgumentError(fl::StrCat(Where(y_name), " has shape ", y.ShapeString(), " but ", x_name,
                                                       " has ", x.ShapeString(),
                                                       "; next-token targets are the inputs shifted by one token, "
                                                       "of the same shape"));
        }
        break;
    }
    if (x.rows() != y.rows()) {
      return absl::InvalidArgumentError(fl::StrCat(path(), ": ", x_name, " has ", x.rows(), " examples but ", y_name,
                                                   " has ", y.rows(), "; their first dimensions must agree"));
    }
    return absl::OkStatus();
  }

  // A whole label array as int64, every label >= 0; the largest is noted in `range`.
  absl::StatusOr<std::vector<int64_t>> ReadLabels(std::string_view name, const NpyHeader& header,
                                                  std::optional<LabelRange>& range) {
    auto bytes = npz_.ReadAll(name);
    if (!bytes.ok()) return bytes.status();
    auto labels = ToInt64(*bytes, header.dtype, Where(name));
    if (!labels.ok()) return labels.status();
    LabelRange r;
    r.file = path();
    r.array = std::string(name);
    for (size_t i = 0; i < labels->size(); ++i) {
      const int64_t label = (*labels)[i];
      if (label < 0) {
        return absl::InvalidArgumentError(
            fl::StrCat(Where(name), "[", i, "] = ", label, " is negative; labels are class indices 0, 1, ..., C-1"));
      }
      if (label > r.max) {
        r.max = label;
        r.index = i;
      }
    }
    range = r;
    return labels;
  }

  absl::StatusOr<std::vector<int64_t>> ReadClientIds(uint64_t train_rows) {
    auto header = npz_.Header("client_id");
    if (!header.ok()) return header.status();
    if (!formats::IsInteger(header->dtype) || header->shape.size() != 1) {
      return absl::InvalidArgumentError(fl::StrCat(Where("client_id"), " is ", formats::DTypeName(header->dtype), " ",
                                                   header->ShapeString(),
                                                   "; it must hold one integer per training example: save "
                                                   "np.asarray(client_id, dtype=np.int64).reshape(-1)"));
    }
    if (header->rows() != train_rows) {
      return absl::InvalidArgumentError(fl::StrCat(path(), ": client_id has ", header->rows(),
                                                   " entries but x_train has ", train_rows,
                                                   " examples; client_id gives each training example's client"));
    }
    auto bytes = npz_.ReadAll("client_id");
    if (!bytes.ok()) return bytes.status();
    return ToInt64(*bytes, header->dtype, Where("client_id"));
  }

  static void KeepFraction(std::vector<uint32_t>& rows, double fraction) {
    if (fraction >= 1) return;
    const size_t keep =
        std::max<size_t>(1, static_cast<size_t>(std::ceil(fraction * static_cast<double>(rows.size()))));
    rows.resize(std::min(keep, rows.size()));
  }

  // The x and y of `rows`. `labels`: the whole label array (classification), else y is read by rows.
  absl::StatusOr<Examples> ReadExamples(std::string_view x_name, const NpyHeader& x, std::string_view y_name,
                                        const NpyHeader& y, const std::vector<uint32_t>& rows,
                                        const std::vector<int64_t>& labels) {
    Examples e;
    e.source = Where(x_name);
    e.n = rows.size();
    e.rows = rows;
    e.x_shape = PerExampleShape(x);
    e.y_shape = PerExampleShape(y);
    auto x_bytes = npz_.ReadRows(x_name, rows);
    if (!x_bytes.ok()) return x_bytes.status();
    if (o_.task == Task::kNextToken) {
      e.x_type = ElementType::kInt64;
      auto tokens = ToInt64(*x_bytes, x.dtype, Where(x_name));
      if (!tokens.ok()) return tokens.status();
      x_bytes->clear();
      x_bytes->shrink_to_fit();
      AppendValues(e.x, *tokens);
    } else {
      e.x_type = x.dtype == DType::kUInt8 ? ElementType::kUInt8 : ElementType::kFloat32;
      e.x = std::move(*x_bytes);
      if (e.x_type == ElementType::kFloat32) {
        if (auto status = CheckFinite(e.x, rows, e.x_elements(), e.x_shape, x_name); !status.ok()) return status;
      }
    }
    if (o_.task == Task::kClassification) {
      e.y_type = ElementType::kInt64;
      std::vector<int64_t> selected(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) selected[i] = labels[rows[i]];
      AppendValues(e.y, selected);
    } else {
      auto y_bytes = npz_.ReadRows(y_name, rows);
      if (!y_bytes.ok()) return y_bytes.status();
      if (o_.task == Task::kRegression) {
        e.y_type = ElementType::kFloat32;
        e.y = std::move(*y_bytes);
        if (auto status = CheckFinite(e.y, rows, e.y_elements(), e.y_shape, y_name); !status.ok()) return status;
      } else {
        e.y_type = ElementType::kInt64;
        auto tokens = ToInt64(*y_bytes, y.dtype, Where(y_name));
        if (!tokens.ok()) return tokens.status();
        AppendValues(e.y, *tokens);
      }
      for (size_t i = 0; i < e.n && o_.task == Task::kNextToken; ++i) {
        if (auto status = CheckTokensNonNegative(e, i, x_name, y_name); !status.ok()) return status;
      }
    }
    return e;
  }

  absl::Status CheckTokensNonNegative(const Examples& e, size_t i, std::string_view x_name, std::string_view y_name) {
    const uint64_t t = e.x_elements();
    for (auto [bytes, name] : {std::pair{&e.x, x_name}, std::pair{&e.y, y_name}}) {
      const int64_t* tokens = reinterpret_cast<const int64_t*>(bytes->data()) + i * t;
      for (uint64_t j = 0; j < t; ++j) {
        if (tokens[j] < 0) {
          return absl::InvalidArgumentError(fl::StrCat(Where(name), "[", e.rows[i], "][", j, "] = ", tokens[j],
                                                       " is negative; token ids are 0, 1, ..., vocabulary-1"));
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckFinite(const std::vector<uint8_t>& bytes, const std::vector<uint32_t>& rows, uint64_t per_row,
                           const std::vector<int64_t>& shape, std::string_view name) {
    const size_t n = bytes.size() / sizeof(float);
    for (size_t k = 0; k < n; ++k) {
      float v;
      std::memcpy(&v, bytes.data() + k * sizeof(float), sizeof(float));
      if (std::isfinite(v)) continue;
      const uint64_t row = rows[k / per_row];
      return absl::InvalidArgumentError(fl::StrCat(
          Where(name), "[", row, "]", ElementIndex(k % per_row, shape), " is ", std::isnan(v) ? "NaN" : "infinite",
          "; every value must be finite: fix or drop those examples, e.g. keep = np.isfinite(", name, ").reshape(len(",
          name, "), -1).all(axis=1)"));
    }
    return absl::OkStatus();
  }

  // The largest token id among a split's inputs and targets.
  LabelRange TokenRange(const Examples& e, std::string_view split) const {
    LabelRange r;
    r.file = path();
    const uint64_t t = e.x_elements();
    for (auto [bytes, name] : {std::pair{&e.x, fl::StrCat("x_", split)}, std::pair{&e.y, fl::StrCat("y_", split)}}) {
      const int64_t* tokens = reinterpret_cast<const int64_t*>(bytes->data());
      for (uint64_t k = 0; k < e.n * t; ++k) {
        if (tokens[k] > r.max) {
          r.max = tokens[k];
          r.array = name;
          r.index = e.rows[k / t];
          r.element = static_cast<int64_t>(k % t);
        }
      }
    }
    return r;
  }

  const DataOptions& o_;
  NpzFile npz_;
};

// ------------------------------------------------------------------------------------------------------------
// Fashion-MNIST from its IDX directory, delivered like an .npz: x uint8 [1, 28, 28], y int64. As for an .npz,
// only this client's images are held: the labels are read whole (the partitioner needs them), then only the
// shard's rows of the images (LoadFashionMnistRows).

absl::StatusOr<ClientData> LoadFashionMnistDir(const DataOptions& o) {
  if (o.task != Task::kClassification) {
    return absl::InvalidArgumentError(
        fl::StrCat(o.path, " is a Fashion-MNIST directory: its task is classification, not ", TaskName(o.task)));
  }
  auto spec = PartitionSpec::Parse(o.partition);
  if (!spec.ok()) return spec.status();
  auto train_labels = LoadFashionMnistLabels(o.path, Split::kTrain);
  if (!train_labels.ok()) return train_labels.status();
  auto test_labels = LoadFashionMnistLabels(o.path, Split::kTest);
  if (!test_labels.ok()) return test_labels.status();
  auto train_rows = PartitionFor(o.client_index, *spec, *train_labels, o.num_clients, o.partition_seed);
  if (!train_rows.ok()) return train_rows.status();
  if (o.data_fraction < 1) {
    const size_t keep =
        std::max<size_t>(1, static_cast<size_t>(std::ceil(o.data_fraction * static_cast<double>(train_rows->size()))));
    train_rows->resize(std::min(keep, train_rows->size()));
  }
  // As TorchTrainer: the test split is this client's IID part of the test labels.
  auto test_rows = PartitionFor(o.client_index, PartitionSpec::Iid(), *test_labels, o.num_clients, o.partition_seed);
  if (!test_rows.ok()) return test_rows.status();
  auto train = LoadFashionMnistRows(o.path, Split::kTrain, *train_rows);
  if (!train.ok()) return train.status();
  auto test = LoadFashionMnistRows(o.path, Split::kTest, *test_rows);
  if (!test.ok()) return test.status();

  ClientData data;
  // `shard` holds the examples `rows` of the split in that order; `all_labels` are the whole split's.
  auto fill = [&](Dataset& shard, const std::vector<uint8_t>& all_labels, const std::vector<uint32_t>& rows,
                  std::string_view split, Examples& e, std::optional<LabelRange>& range) {
    e.source = fl::StrCat(o.path, ":", shard.name);
    e.n = rows.size();
    e.rows = rows;
    e.x_shape = {1, shard.rows, shard.cols};
    e.x_type = ElementType::kUInt8;
    e.y_type = ElementType::kInt64;
    e.x = std::move(shard.pixels);
    AppendValues(e.y, std::vector<int64_t>(shard.labels.begin(), shard.labels.end()));
    LabelRange r;
    r.file = o.path;
    r.array = fl::StrCat("y_", split);
    for (size_t i = 0; i < all_labels.size(); ++i) {
      if (all_labels[i] > r.max) {
        r.max = all_labels[i];
        r.index = i;
      }
    }
    range = r;
  };
  fill(*train, *train_labels, *train_rows, "train", data.train, data.train_labels);
  fill(*test, *test_labels, *test_rows, "test", data.test, data.test_labels);
  data.description =
      fl::StrCat(o.path, ": Fashion-MNIST, classification, x uint8 [1, 28, 28]; client ", o.client_index, " of ",
                 o.num_clients, " (partition ", spec->ToString(), ", seed ", o.partition_seed, "): ", data.train.n,
                 " of ", train_labels->size(), " train examples, ", data.test.n, " of ", test_labels->size(), " test");
  return data;
}

bool IsFashionMnistDir(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-images-idx3-ubyte"}) {
    if (std::filesystem::exists(std::filesystem::path(dir) / name, ec)) return true;
  }
  return false;
}

}  // namespace

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kUInt8: return "uint8";
    case ElementType::kFloat32: return "float32";
    case ElementType::kInt64: return "int64";
  }
  return "unknown";
}

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kUInt8: return 1;
    case ElementType::kFloat32: return 4;
    case ElementType::kInt64: return 8;
  }
  return 0;
}

uint64_t Examples::x_elements() const {
  uint64_t elements = 1;
  for (int64_t d : x_shape) elements *= static_cast<uint64_t>(d);
  return elements;
}

uint64_t Examples::y_elements() const {
  uint64_t elements = 1;
  for (int64_t d : y_shape) elements *= static_cast<uint64_t>(d);
  return elements;
}

absl::StatusOr<ClientData> LoadClientData(const DataOptions& options) {
  if (options.num_clients == 0) return absl::InvalidArgumentError("the number of clients must be at least 1");
  if (options.client_index >= options.num_clients) {
    return absl::InvalidArgumentError(fl::StrCat("client index ", options.client_index, " is out of range for ",
                                                 options.num_clients, " clients (expected 0..", options.num_clients - 1,
                                                 ")"));
  }
  if (!(options.data_fraction > 0 && options.data_fraction <= 1)) {
    return absl::InvalidArgumentError(
        fl::StrCat("data fraction ", options.data_fraction, " is outside (0, 1]; give the share of the shard to use"));
  }
  std::error_code ec;
  const auto status = std::filesystem::status(options.path, ec);
  if (options.path.empty() || !std::filesystem::exists(status)) {
    return absl::NotFoundError(fl::StrCat("data path '", options.path,
                                          "' does not exist; give an .npz file, a Fashion-MNIST directory or "
                                          "(next-token) a text file or directory"));
  }
  if (std::filesystem::is_directory(status)) {
    if (options.task == Task::kNextToken && !IsFashionMnistDir(options.path))
      return internal::LoadTextCorpus(options, true);
    if (IsFashionMnistDir(options.path)) return LoadFashionMnistDir(options);
    return absl::InvalidArgumentError(fl::StrCat(
        options.path, " is a directory without Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...); for ",
        TaskName(options.task), " give an .npz with x_train, y_train, x_test and y_test"));
  }
  // An .npz by name or by content (a ZIP's first bytes); anything else is text for next-token. Opened as a user's
  // file: a FIFO or a device (/dev/zero) is refused here, before a byte is read; each format's reader then
  // applies its own size limit.
  absl::StatusOr<fl::sys::UserFile> file =
      fl::sys::OpenUserFile(options.path, "data file", std::numeric_limits<uint64_t>::max(),
                            "give an .npz file, a Fashion-MNIST directory or (next-token) a text file or directory");
  if (!file.ok()) return file.status();
  char magic[4] = {};
  if (file->size() >= sizeof(magic)) {
    if (absl::Status s = file->ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(magic), sizeof(magic)));
        !s.ok()) {
      return s;
    }
  }
  const bool zip = std::memcmp(magic, "PK\x03\x04", 4) == 0 || std::memcmp(magic, "PK\x05\x06", 4) == 0;
  if (options.path.ends_with(".npy")) {
    return absl::InvalidArgumentError(fl::StrCat(options.path,
                                                 " is a single array; a dataset is an .npz of four: "
                                                 "np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...)"));
  }
  if (zip || options.path.ends_with(".npz")) {
    auto npz = NpzFile::Open(options.path);
    if (!npz.ok()) return npz.status();
    return NpzLoader(options, std::move(*npz)).Load();
  }
  if (options.task == Task::kNextToken) return internal::LoadTextCorpus(options, false);
  return absl::InvalidArgumentError(fl::StrCat(options.path,
                                               " is not an .npz (a ZIP of .npy arrays written by "
                                               "np.savez); plain text is read for the next-token task only"));
}

absl::Status CheckLabelRange(const ClientData& data, int64_t classes) {
  if (classes <= 0) return absl::InvalidArgumentError(fl::StrCat("the model has ", classes, " outputs"));
  for (const std::optional<LabelRange>& range : {data.train_labels, data.test_labels}) {
    if (!range.has_value() || range->max < classes) continue;
    const bool tokens = range->element >= 0;
    const std::string where =
        range->array.ends_with(" text")
            ? fl::StrCat(range->array, " byte ", range->element)
            : fl::StrCat(range->array, "[", range->index, "]", tokens ? fl::StrCat("[", range->element, "]") : "");
    const std::string what = tokens ? "token ids" : "classes";
    return absl::InvalidArgumentError(
        fl::StrCat(range->file, ": ", where, " = ", range->max, " is outside [0, ", classes, ") (the model outputs ",
                   classes, " ", what, "); ",
                   tokens ? fl::StrCat("give a model whose vocabulary has at least ", range->max + 1, " tokens")
                          : fl::StrCat("give a model with at least ", range->max + 1,
                                       " outputs, or relabel the data to 0..", classes - 1)));
  }
  return absl::OkStatus();
}

}  // namespace fl::training::data
