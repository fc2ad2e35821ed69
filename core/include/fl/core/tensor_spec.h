// Tensor specs and model specs: what a flat parameter buffer means.
//
// The server is model-agnostic: it sees a model as one contiguous fp32 buffer plus a ModelSpec that says
// which slice is which tensor. The spec's fingerprint travels with every update so that an update for a
// differently shaped model is caught before any of its values are used.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::core {

// The tensor's dtype in the model that owns it. Flat buffers always hold fp32 values; the dtype tells a
// trainer how to copy values back (e.g. BatchNorm's int64 `num_batches_tracked`).
enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
  kFloat64 = 3,
  kInt64 = 4,
  kInt32 = 5,
  kUInt8 = 6,
};

std::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(std::string_view name);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
  // Position of the tensor's first element in the flat buffer, in elements (not bytes).
  uint64_t offset = 0;

  uint64_t num_elements() const;
  std::string ShapeString() const;  // "[64, 1, 3, 3]"
};

// The most elements a spec may hold, per tensor and in total: far beyond any model (2^56 fp32 values are
// 256 PiB), and small enough that byte sizes (8 bytes per value at most) never overflow 64 bits.
inline constexpr int kMaxSpecElementsLog2 = 56;
inline constexpr uint64_t kMaxSpecElements = uint64_t{1} << kMaxSpecElementsLog2;

class ModelSpec {
 public:
  // Builds a spec from tensors in order; offsets are (re)assigned contiguously. Rejects empty or duplicate
  // names, negative dimensions and element counts above kMaxSpecElements (checked multiplication: a shape
  // such as [2^62, 4] is refused, never wrapped around) with an error naming the tensor.
  static absl::StatusOr<ModelSpec> Create(std::vector<TensorSpec> tensors);

  ModelSpec() = default;

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  size_t num_tensors() const { return tensors_.size(); }
  uint64_t num_elements() const { return num_elements_; }
  // Stable 64-bit hash over names, dtypes, shapes and order: equal on every platform and build for the
  // same model, different when any tensor is renamed, reshaped, retyped or reordered.
  uint64_t fingerprint() const { return fingerprint_; }
  std::string FingerprintHex() const;

  // nullptr when no tensor has that name.
  const TensorSpec* Find(std::string_view name) const;
  // Index of the tensor that holds flat element `element`; requires element < num_elements().
  size_t TensorIndexOfElement(uint64_t element) const;

 private:
  std::vector<TensorSpec> tensors_;
  uint64_t num_elements_ = 0;
  uint64_t fingerprint_ = 0;
};

std::string FingerprintToHex(uint64_t fingerprint);

// Checks that an incoming buffer (an update, a checkpoint) matches `expected`. `what` names the source
// in the error ("update from client 7"), which says both fingerprints and sizes and what to do.
absl::Status CheckMatchesSpec(const ModelSpec& expected, uint64_t fingerprint, uint64_t num_elements,
                              std::string_view what);

// Returns InvalidArgument naming the first NaN/Inf element (and its tensor when `spec` is given).
absl::Status CheckFinite(std::span<const float> values, std::string_view what, const ModelSpec* spec = nullptr);

// Why two specs differ, for a person: "" when they hold the same tensors (names, shapes, dtypes) in the same
// order, else the first difference by tensor position (counting from 0), e.g.
//   tensor #2 'conv2.weight' has shape [64, 32, 3, 3] in the client's model but [32, 16, 3, 3] in the
//   experiment's (first of 5 differences)
// or a tensor only one of them has ("tensor #4 'fc.bias' [10] float32 is in the experiment's model but not in
// the client's"), a dtype, or the same tensors in another order. Differences are counted once per tensor name
// (missing, extra, shape and/or dtype), plus one when the tensors both have are in another order.
// `expected_name` / `actual_name` name the two models in the text ("the experiment's", "the client's model").
std::string DescribeSpecDifference(const ModelSpec& expected, const ModelSpec& actual,
                                   std::string_view expected_name = "the expected model",
                                   std::string_view actual_name = "this model");

// int64, int32, uint8: values that count or index (BatchNorm's num_batches_tracked), not weights.
bool IsIntegerDType(DType dtype);

// Integer tensors are client-local state (every client keeps its own counter), never averaged as floats: the
// server saves their values before it rewrites the global model and restores them afterwards. Save returns
// the values of the integer-dtype tensors of `values` in spec order (a handful of scalars for a real model,
// not a model-sized copy); Restore writes such a list back. Both fail when a size does not fit `spec`.
absl::StatusOr<std::vector<float>> SaveIntegerTensors(const ModelSpec& spec, std::span<const float> values);
absl::Status RestoreIntegerTensors(const ModelSpec& spec, std::span<const float> saved, std::span<float> values);

}  // namespace fl::core
