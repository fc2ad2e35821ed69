#include "fl/core/tensor_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>
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
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt64, DType::kInt32,
                  DType::kUInt8}) {
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
    // Checked arithmetic: shapes come from peers (a Join's spec), and [2^62, 4] must be refused, not wrap
    // around to a small element count that the rest of the program would then trust.
    uint64_t count = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            fl::StrCat("tensor '", t.name, "' has shape ", t.ShapeString(), " with a negative dimension"));
      }
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count) || count > kMaxSpecElements) {
        return absl::InvalidArgumentError(
            fl::StrCat("tensor '", t.name, "' has shape ", t.ShapeString(), ": its element count exceeds 2^",
                       kMaxSpecElementsLog2, " (or overflows 64 bits); no model is that large, the spec is damaged"));
      }
    }
    t.offset = offset;
    offset += count;
    if (offset > kMaxSpecElements) {
      return absl::InvalidArgumentError(fl::StrCat("the model's tensors up to '", t.name, "' (tensor #", i,
                                                   ") hold more than 2^", kMaxSpecElementsLog2,
                                                   " elements; no model is that large, the spec is damaged"));
    }
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

std::string DescribeSpecDifference(const ModelSpec& expected, const ModelSpec& actual, std::string_view expected_name,
                                   std::string_view actual_name) {
  struct Difference {
    size_t position;  // where it is, to report the first one
    std::string text;
  };
  std::vector<Difference> diffs;
  std::unordered_map<std::string_view, size_t> expected_index, actual_index;
  for (size_t i = 0; i < expected.num_tensors(); ++i) expected_index[expected.tensors()[i].name] = i;
  for (size_t j = 0; j < actual.num_tensors(); ++j) actual_index[actual.tensors()[j].name] = j;
  auto layout = [](const TensorSpec& t) { return fl::StrCat(t.ShapeString(), " ", DTypeName(t.dtype)); };

  for (size_t i = 0; i < expected.num_tensors(); ++i) {
    const TensorSpec& e = expected.tensors()[i];
    auto it = actual_index.find(e.name);
    if (it == actual_index.end()) {
      diffs.push_back({i, fl::StrCat("tensor #", i, " '", e.name, "' ", layout(e), " is in ", expected_name,
                                     " but not in ", actual_name)});
      continue;
    }
    const TensorSpec& a = actual.tensors()[it->second];
    const bool shape = a.shape != e.shape;
    const bool dtype = a.dtype != e.dtype;
    if (shape && dtype) {
      diffs.push_back({i, fl::StrCat("tensor #", i, " '", e.name, "' has shape ", a.ShapeString(), " and dtype ",
                                     DTypeName(a.dtype), " in ", actual_name, " but ", e.ShapeString(), " and ",
                                     DTypeName(e.dtype), " in ", expected_name)});
    } else if (shape) {
      diffs.push_back({i, fl::StrCat("tensor #", i, " '", e.name, "' has shape ", a.ShapeString(), " in ", actual_name,
                                     " but ", e.ShapeString(), " in ", expected_name)});
    } else if (dtype) {
      diffs.push_back({i, fl::StrCat("tensor #", i, " '", e.name, "' has dtype ", DTypeName(a.dtype), " in ",
                                     actual_name, " but ", DTypeName(e.dtype), " in ", expected_name)});
    }
  }
  for (size_t j = 0; j < actual.num_tensors(); ++j) {
    const TensorSpec& a = actual.tensors()[j];
    if (expected_index.count(a.name) == 0) {
      diffs.push_back({j, fl::StrCat("tensor #", j, " '", a.name, "' ", layout(a), " is in ", actual_name,
                                     " but not in ", expected_name)});
    }
  }
  // Order: the tensors both models have, each in its model's order; the first slot where they disagree.
  std::vector<std::string_view> common_expected, common_actual;
  for (const TensorSpec& e : expected.tensors()) {
    if (actual_index.count(e.name) > 0) common_expected.push_back(e.name);
  }
  for (const TensorSpec& a : actual.tensors()) {
    if (expected_index.count(a.name) > 0) common_actual.push_back(a.name);
  }
  for (size_t k = 0; k < common_expected.size(); ++k) {
    if (common_expected[k] == common_actual[k]) continue;
    const std::string_view early = common_actual[k];  // comes first in `actual`, later in `expected`
    const std::string_view late = common_expected[k];
    diffs.push_back({expected_index[late], fl::StrCat("tensor #", actual_index[early], " '", early, "' comes before '",
                                                      late, "' in ", actual_name, " but after it in ", expected_name,
                                                      " (the same tensors in another order)")});
    break;
  }
  if (diffs.empty()) return "";
  std::stable_sort(diffs.begin(), diffs.end(),
                   [](const Difference& a, const Difference& b) { return a.position < b.position; });
  std::string out = std::move(diffs.front().text);
  if (diffs.size() > 1) out += fl::StrCat(" (first of ", diffs.size(), " differences)");
  return out;
}

bool IsIntegerDType(DType dtype) { return dtype == DType::kInt64 || dtype == DType::kInt32 || dtype == DType::kUInt8; }

absl::StatusOr<std::vector<float>> SaveIntegerTensors(const ModelSpec& spec, std::span<const float> values) {
  if (values.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("cannot save the integer tensors of ", values.size(),
                                                 " values: the model has ", spec.num_elements()));
  }
  std::vector<float> saved;
  for (const TensorSpec& t : spec.tensors()) {
    if (!IsIntegerDType(t.dtype)) continue;
    const auto range = values.subspan(t.offset, t.num_elements());
    saved.insert(saved.end(), range.begin(), range.end());
  }
  return saved;
}

absl::Status RestoreIntegerTensors(const ModelSpec& spec, std::span<const float> saved, std::span<float> values) {
  if (values.size() != spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("cannot restore the integer tensors of ", values.size(),
                                                 " values: the model has ", spec.num_elements()));
  }
  uint64_t needed = 0;
  for (const TensorSpec& t : spec.tensors()) needed += IsIntegerDType(t.dtype) ? t.num_elements() : 0;
  if (saved.size() != needed) {
    return absl::InvalidArgumentError(fl::StrCat(saved.size(),
                                                 " saved integer values, but the model's integer "
                                                 "tensors hold ",
                                                 needed));
  }
  size_t next = 0;
  for (const TensorSpec& t : spec.tensors()) {
    if (!IsIntegerDType(t.dtype)) continue;
    std::copy_n(saved.begin() + static_cast<std::ptrdiff_t>(next), t.num_elements(),
                values.begin() + static_cast<std::ptrdiff_t>(t.offset));
    next += t.num_elements();
  }
  return absl::OkStatus();
}

}  // namespace fl::core
