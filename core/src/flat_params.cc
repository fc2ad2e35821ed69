#include "fl/core/flat_params.h"

#include "fl/core/str_cat.h"

namespace fl::core {

FlatParams::FlatParams(std::shared_ptr<const ModelSpec> spec)
    : spec_(std::move(spec)), values_(spec_->num_elements(), 0.0f) {}

absl::StatusOr<FlatParams> FlatParams::FromValues(std::shared_ptr<const ModelSpec> spec, std::vector<float> values) {
  if (values.size() != spec->num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("got ", values.size(), " values for a model of ", spec->num_elements(),
                                                 " parameters (fingerprint ", spec->FingerprintHex(), ")"));
  }
  return FlatParams(std::move(spec), std::move(values));
}

std::span<float> FlatParams::tensor(size_t index) {
  const TensorSpec& t = spec_->tensors().at(index);
  return std::span<float>(values_).subspan(t.offset, t.num_elements());
}

std::span<const float> FlatParams::tensor(size_t index) const {
  const TensorSpec& t = spec_->tensors().at(index);
  return std::span<const float>(values_).subspan(t.offset, t.num_elements());
}

absl::StatusOr<std::span<float>> FlatParams::tensor(std::string_view name) {
  const TensorSpec* t = spec_->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(
        fl::StrCat("model (fingerprint ", spec_->FingerprintHex(), ") has no tensor named '", name, "'"));
  }
  return std::span<float>(values_).subspan(t->offset, t->num_elements());
}

}  // namespace fl::core
