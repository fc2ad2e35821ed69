#include "fl/core/tensor_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "fl/core/str_cat.h"
#include "absl/strings/str_join.h"

namespace fl::core {
namespace {

// FNV-1a over an explicit little-endian serialisation: the fingerprint must not depend on the host's
// endianness, struct padding or standard library, because client and server may differ in all three.
class Fnv1a64 {
 public:
  void Byte(uint8_t b) {
    hash_ ^= b;
    hash_ *= 0x100000001b3ULL;
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) Byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Str(std::string_view s) {
    U64(s.size());
    for (char c : s) Byte(static_cast<uint8_t>(c));
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt64: return "int64";
    case DType::kInt32: return "int32";
    case DType::kUInt8: return "uint8";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt64,
                  DType::kInt32, DType::kUInt8}) {
    if (DTypeName(d) == name) return d;
  }
  return absl::InvalidArgumentError(fl::StrCat(
      "unknown dtype '", name, "'; expected one of float32, float16, bfloat16, float64, int64, int32, uint8"));
}

uint64_t TensorSpec::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string TensorSpec::ShapeString() const { return fl::StrCat("[", absl::StrJoin(shape, ", "), "]"); }

absl::StatusOr<ModelSpec> ModelSpec::Create(std::vector<TensorSpec> tensors) {
  ModelSpec spec;
  std::unordered_set<std::string> names;
  Fnv1a64 hash;
  hash.U64(tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorSpec& t = tensors[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(
          fl::StrCat("tensor #", i, " has an empty name; every tensor needs a unique name"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          fl::StrCat("tensor name '", t.name, "' appears twice; tensor names must be unique"));
    }
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(fl::StrCat("tensor '", t.name, "' has shape ", t.ShapeString(),
                                                       " with a negative dimension"));
      }
    }
    t.offset = offset;
    offset += t.num_elements();
    hash.Str(t.name);
    hash.Byte(static_cast<uint8_t>(t.dtype));
    hash.U64(t.shape.size());
    for (int64_t d : t.shape) hash.U64(static_cast<uint64_t>(d));
  }
  spec.tensors_ = std::move(tensors);
  spec.num_elements_ = offset;
  spec.fingerprint_ = hash.value();
  return spec;
}

std::string FingerprintToHex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fingerprint));
  return buf;
}

std::string ModelSpec::FingerprintHex() const { return FingerprintToHex(fingerprint_); }

const TensorSpec* ModelSpec::Find(std::string_view name) const {
  for (const TensorSpec& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t ModelSpec::TensorIndexOfElement(uint64_t element) const {
  // Offsets are sorted: binary search for the last tensor starting at or before `element`, skipping
  // zero-sized tensors, which share their offset with the next one.
  auto it = std::upper_bound(tensors_.begin(), tensors_.end(), element,
                             [](uint64_t e, const TensorSpec& t) { return e < t.offset; });
  size_t idx = static_cast<size_t>(it - tensors_.begin()) - 1;
  while (idx > 0 && tensors_[idx].num_elements() == 0) --idx;
  return idx;
}

absl::Status CheckMatchesSpec(const ModelSpec& expected, uint64_t fingerprint, uint64_t num_elements,
                              std::string_view what) {
  if (fingerprint != expected.fingerprint()) {
    return absl::FailedPreconditionError(fl::StrCat(
        what, " has model fingerprint ", FingerprintToHex(fingerprint), " but the model here has ",
        expected.FingerprintHex(), " (", expected.num_tensors(), " tensors, ", expected.num_elements(),
        " parameters); the sender is running a different model architecture: restart it with the same model"));
  }
  if (num_elements != expected.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat(what, " carries ", num_elements, " parameters but the model has ",
                                                   expected.num_elements(), "; the payload is truncated or padded"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(std::span<const float> values, std::string_view what, const ModelSpec* spec) {
  // Branch-free scan first: the common case (all finite) must stay at memory speed.
  bool all_finite = true;
  for (float v : values) all_finite &= std::isfinite(v);
  if (all_finite) return absl::OkStatus();
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    std::string where = fl::StrCat("element ", i);
    if (spec != nullptr && i < spec->num_elements()) {
      const TensorSpec& t = spec->tensors()[spec->TensorIndexOfElement(i)];
      where = fl::StrCat("tensor '", t.name, "' element ", i - t.offset);
    }
    return absl::InvalidArgumentError(fl::StrCat(what, " contains ", values[i], " at ", where,
                                                   "; non-finite values are never aggregated: check the "
                                                   "client's learning rate and data"));
  }
  return absl::OkStatus();
}

}  // namespace fl::core
