// FlatParams: a model's parameters as one contiguous fp32 buffer with the spec that explains it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"

namespace fl::core {

class FlatParams {
 public:
  // Zero-filled buffer for `spec`.
  explicit FlatParams(std::shared_ptr<const ModelSpec> spec);
  // Takes ownership of `values`; fails when their count differs from the spec's element count.
  static absl::StatusOr<FlatParams> FromValues(std::shared_ptr<const ModelSpec> spec, std::vector<float> values);

  const ModelSpec& spec() const { return *spec_; }
  const std::shared_ptr<const ModelSpec>& shared_spec() const { return spec_; }
  uint64_t fingerprint() const { return spec_->fingerprint(); }
  size_t size() const { return values_.size(); }

  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }
  std::vector<float>& mutable_vector() { return values_; }

  // View of tensor `index` (in spec order).
  std::span<float> tensor(size_t index);
  std::span<const float> tensor(size_t index) const;
  // View of the tensor called `name`; NotFound names the tensor when the spec has none.
  absl::StatusOr<std::span<float>> tensor(std::string_view name);

 private:
  FlatParams(std::shared_ptr<const ModelSpec> spec, std::vector<float> values)
      : spec_(std::move(spec)), values_(std::move(values)) {}

  std::shared_ptr<const ModelSpec> spec_;
  std::vector<float> values_;
};

}  // namespace fl::core
