// Resolving a pickled tensor reference against its storage record (torchscript_internal.h).
#include <array>

#include "absl/strings/str_join.h"
#include "fl/core/str_cat.h"
#include "torchscript_internal.h"

namespace fl::formats::torchscript {
namespace {

constexpr std::array<StorageType, 17> kStorageTypes = {{
    {"torch.FloatStorage", 4, core::DType::kFloat32, true},
    {"torch.HalfStorage", 2, core::DType::kFloat16, true},
    {"torch.BFloat16Storage", 2, core::DType::kBFloat16, true},
    {"torch.DoubleStorage", 8, core::DType::kFloat64, true},
    {"torch.LongStorage", 8, core::DType::kInt64, false},
    {"torch.IntStorage", 4, core::DType::kInt32, false},
    {"torch.ByteStorage", 1, core::DType::kUInt8, false},
    // Types LibTorch writes that fl does not carry: checked for bounds all the same.
    {"torch.ShortStorage", 2, std::nullopt, false},
    {"torch.CharStorage", 1, std::nullopt, false},
    {"torch.BoolStorage", 1, std::nullopt, false},
    {"torch.ComplexHalfStorage", 4, std::nullopt, true},
    {"torch.ComplexFloatStorage", 8, std::nullopt, true},
    {"torch.ComplexDoubleStorage", 16, std::nullopt, true},
    {"torch.QInt8Storage", 1, std::nullopt, false},
    {"torch.QUInt8Storage", 1, std::nullopt, false},
    {"torch.QInt32Storage", 4, std::nullopt, false},
    {"torch.QUInt4x2Storage", 1, std::nullopt, false},
}};

}  // namespace

std::optional<StorageType> StorageTypeOf(std::string_view global) {
  for (const StorageType& type : kStorageTypes) {
    if (type.global == global) return type;
  }
  return std::nullopt;
}

std::string_view CalleeOf(const PickleDocument& doc, PickleRef ref) {
  if (ref >= doc.size() || doc.at(ref).kind != PickleKind::kCall) return {};
  std::span<const PickleRef> items = doc.items(ref);
  if (items.empty() || doc.at(items[0]).kind != PickleKind::kGlobal) return {};
  return doc.text(items[0]);
}

absl::StatusOr<TensorRef> ResolveTensor(const std::string& path, const PickleDocument& doc, PickleRef call,
                                        const ZipArchive& zip, const std::string& storage_dir,
                                        const std::string& label) {
  auto error = [&](std::string_view message) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": ", label, " ", message));
  };
  const std::span<const PickleRef> call_items = doc.items(call);
  if (call_items.size() != 2 || doc.at(call_items[1]).kind != PickleKind::kTuple) {
    return error(fl::StrCat("is a ", doc.Describe(call), ", not a tensor"));
  }
  const std::span<const PickleRef> args = doc.items(call_items[1]);
  if (args.size() < 4 || doc.at(args[0]).kind != PickleKind::kPersistent) {
    return error(fl::StrCat("has unexpected tensor arguments (", doc.Describe(call_items[1]), ")"));
  }
  // The persistent id: ('storage', torch.<T>Storage, key, location, number of elements).
  const PickleRef pid_ref = doc.items(args[0])[0];
  const std::span<const PickleRef> pid = doc.items(pid_ref);
  if (doc.at(pid_ref).kind != PickleKind::kTuple || pid.size() != 5 || doc.text(pid[0]) != "storage" ||
      doc.at(pid[1]).kind != PickleKind::kGlobal || doc.at(pid[2]).kind != PickleKind::kString ||
      doc.at(pid[4]).kind != PickleKind::kInt) {
    return error(fl::StrCat("has an unexpected storage reference (", doc.Describe(pid_ref), ")"));
  }
  TensorRef ref;
  const std::string_view global = doc.text(pid[1]);
  const std::optional<StorageType> type = StorageTypeOf(global);
  if (!type.has_value()) {
    return error(fl::StrCat("is stored as ", global, ", not a storage type LibTorch writes (corrupt file)"));
  }
  ref.type = *type;
  const int64_t numel = doc.at(pid[4]).integer;
  if (numel < 0) return error(fl::StrCat("declares a storage of ", numel, " elements (corrupt file)"));
  ref.storage_numel = static_cast<uint64_t>(numel);
  ref.storage_key = fl::StrCat(storage_dir, doc.text(pid[2]));

  auto int_at = [&](PickleRef item, std::string_view what) -> absl::StatusOr<int64_t> {
    if (doc.at(item).kind != PickleKind::kInt) {
      return error(fl::StrCat("has a ", what, " that is a ", doc.Describe(item), ", not an int"));
    }
    if (doc.at(item).integer < 0) {
      return error(fl::StrCat("has a negative ", what, " (", doc.at(item).integer,
                              "); LibTorch writes none (export a .contiguous() copy)"));
    }
    return doc.at(item).integer;
  };
  auto tuple_at = [&](PickleRef item, std::string_view what, std::vector<int64_t>* out) -> absl::Status {
    if (doc.at(item).kind != PickleKind::kTuple) {
      return error(fl::StrCat("has a ", what, " that is a ", doc.Describe(item), ", not a tuple"));
    }
    const std::span<const PickleRef> values = doc.items(item);
    if (values.size() > kMaxDims) {
      return error(fl::StrCat("has ", values.size(), " dimensions (at most ", kMaxDims, ")"));
    }
    for (PickleRef value : values) {
      absl::StatusOr<int64_t> v = int_at(value, what);
      if (!v.ok()) return v.status();
      out->push_back(*v);
    }
    return absl::OkStatus();
  };
  absl::StatusOr<int64_t> offset = int_at(args[1], "storage offset");
  if (!offset.ok()) return offset.status();
  ref.offset = static_cast<uint64_t>(*offset);
  if (absl::Status s = tuple_at(args[2], "size", &ref.shape); !s.ok()) return s;
  if (absl::Status s = tuple_at(args[3], "stride", &ref.stride); !s.ok()) return s;
  if (ref.shape.size() != ref.stride.size()) {
    return error(fl::StrCat("has ", ref.shape.size(), " sizes but ", ref.stride.size(), " strides"));
  }
  // Elements, and the highest storage element touched, with overflow checks (a storage offset of 2^62 + 2^28,
  // a shape of (2^20, 2^20)): nothing below trusts a product it has not checked.
  const std::string shape_text = fl::StrCat("(", absl::StrJoin(ref.shape, ", "), ")");
  uint64_t elements = 1;
  uint64_t last = ref.offset;
  bool overflow = false;
  for (size_t d = 0; d < ref.shape.size(); ++d) {
    const uint64_t size = static_cast<uint64_t>(ref.shape[d]);
    overflow |= __builtin_mul_overflow(elements, size, &elements);
    if (size > 0) {
      uint64_t reach = 0;
      overflow |= __builtin_mul_overflow(size - 1, static_cast<uint64_t>(ref.stride[d]), &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
  }
  uint64_t storage_bytes = 0;
  if (overflow || elements > core::kMaxSpecElements || last == UINT64_MAX) {
    return error(fl::StrCat("has shape ", shape_text, ", stride (", absl::StrJoin(ref.stride, ", "), ") and offset ",
                            ref.offset, ", which overflow 64 bits (corrupt or hostile file)"));
  }
  if (__builtin_mul_overflow(ref.storage_numel, ref.type.element_size, &storage_bytes)) {
    return error(fl::StrCat("declares a storage of ", ref.storage_numel, " elements, which overflows 64 bits"));
  }
  ref.elements = elements;
  ref.extent = elements == 0 ? 0 : last + 1;
  const ZipEntry* storage = zip.Find(ref.storage_key);
  if (storage == nullptr) {
    return error(
        fl::StrCat("cannot be read: its storage ", ref.storage_key, " is missing from the archive (corrupt file)"));
  }
  // LibTorch makes a storage of the declared count over the record's bytes: a record shorter than that count
  // would be read past its end.
  if (storage->uncompressed_size < storage_bytes) {
    return error(fl::StrCat("declares a storage of ", ref.storage_numel, " ", global, " elements (", storage_bytes,
                            " bytes) but ", ref.storage_key, " holds ", storage->uncompressed_size,
                            " bytes (corrupt or truncated file)"));
  }
  if (ref.extent > ref.storage_numel) {
    return error(fl::StrCat("(shape ", shape_text, ", stride (", absl::StrJoin(ref.stride, ", "), "), offset ",
                            ref.offset, ") reaches element ", ref.extent - 1, " of its storage ", ref.storage_key,
                            ", which holds ", ref.storage_numel, " (corrupt or truncated file)"));
  }
  return ref;
}

absl::Status StorageCatalog::Add(const std::string& path, const TensorRef& ref, const std::string& label) {
  auto [it, inserted] = seen_.emplace(ref.storage_key, Seen{ref.type.global, ref.storage_numel});
  if (inserted || (it->second.global == ref.type.global && it->second.numel == ref.storage_numel)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(fl::StrCat(path, ": ", label, " refers to ", ref.storage_key, " as ",
                                               ref.storage_numel, " ", ref.type.global, " elements, another tensor as ",
                                               it->second.numel, " ", it->second.global, " (corrupt or hostile file)"));
}

PickleLimits ArchivePickleLimits() {
  PickleLimits limits;
  limits.max_memory_bytes = size_t{512} << 20;
  limits.memory_per_byte = 24;
  return limits;
}

}  // namespace fl::formats::torchscript
