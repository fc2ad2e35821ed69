#include "fl/formats/torchscript_archive.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "fl/core/str_cat.h"
#include "fl/formats/pickle.h"
#include "fl/formats/zip_archive.h"

namespace fl::formats {
namespace {

constexpr std::string_view kExportHint =
    "export the model in PyTorch with torch.jit.script(model).save(path) or "
    "torch.jit.trace(model, example_input).save(path)";
// Module trees deeper than this are refused (a pickle can make an object contain itself).
constexpr int kMaxModuleDepth = 256;
// Modules and tensors visited: bounds a hostile pickle whose modules share children exponentially.
constexpr size_t kMaxVisits = size_t{1} << 20;
constexpr size_t kMaxDims = 64;
// data.pkl and class files are read whole; LibTorch's own files are far below these.
constexpr uint64_t kMaxPickleBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxCodeBytes = uint64_t{64} << 20;

struct ClassInfo {
  bool is_module = false;
  std::vector<std::string> parameters;
  std::vector<std::string> buffers;
};

struct StorageType {
  core::DType dtype;
  size_t element_size;
};

// torch.<X>Storage -> our dtype. The names are those LibTorch's pickler writes (toString(ScalarType) +
// "Storage").
std::optional<StorageType> StorageTypeOf(std::string_view global) {
  if (global == "torch.FloatStorage") return StorageType{core::DType::kFloat32, 4};
  if (global == "torch.HalfStorage") return StorageType{core::DType::kFloat16, 2};
  if (global == "torch.BFloat16Storage") return StorageType{core::DType::kBFloat16, 2};
  if (global == "torch.DoubleStorage") return StorageType{core::DType::kFloat64, 8};
  if (global == "torch.LongStorage") return StorageType{core::DType::kInt64, 8};
  if (global == "torch.IntStorage") return StorageType{core::DType::kInt32, 4};
  if (global == "torch.ByteStorage") return StorageType{core::DType::kUInt8, 1};
  return std::nullopt;
}

uint64_t LoadLE(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // Inf / NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {  // subnormal: normalise
    uint32_t e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mantissa & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  return std::bit_cast<float>(bits);
}

float ElementToFloat(const uint8_t* p, core::DType dtype) {
  switch (dtype) {
    case core::DType::kFloat32: return std::bit_cast<float>(static_cast<uint32_t>(LoadLE(p, 4)));
    case core::DType::kFloat16: return HalfToFloat(static_cast<uint16_t>(LoadLE(p, 2)));
    case core::DType::kBFloat16: return std::bit_cast<float>(static_cast<uint32_t>(LoadLE(p, 2)) << 16);
    case core::DType::kFloat64: return static_cast<float>(std::bit_cast<double>(LoadLE(p, 8)));
    case core::DType::kInt64: return static_cast<float>(static_cast<int64_t>(LoadLE(p, 8)));
    case core::DType::kInt32: return static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(LoadLE(p, 4))));
    case core::DType::kUInt8: return static_cast<float>(p[0]);
  }
  return 0.0f;
}

// Parses `  __parameters__ = ["a", "b", ]` (the tail after the '=' sign) into names.
bool ParseNameList(std::string_view text, std::vector<std::string>* names) {
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  skip_spaces();
  if (i >= text.size() || text[i] != '[') return false;
  ++i;
  while (true) {
    skip_spaces();
    if (i >= text.size()) return false;
    if (text[i] == ']') return true;
    if (text[i] != '"') return false;
    const size_t end = text.find('"', i + 1);
    if (end == std::string_view::npos) return false;
    names->emplace_back(text.substr(i + 1, end - i - 1));
    i = end + 1;
    skip_spaces();
    if (i < text.size() && text[i] == ',') ++i;
  }
}

struct PendingTensor {
  size_t index = 0;         // position in the spec
  std::string storage_key;  // "<archive>/data/<key>"
  StorageType type{};
  int64_t storage_offset = 0;
  std::vector<int64_t> stride;
  uint64_t storage_elements = 0;  // highest element index + 1 that the tensor touches
};

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  absl::StatusOr<ScriptModelFile> Read() {
    if (absl::Status s = OpenArchive(); !s.ok()) return s;
    const ZipEntry* pickle_entry = zip_->Find(prefix_ + "data.pkl");
    if (pickle_entry->uncompressed_size > kMaxPickleBytes) {
      return Error(fl::StrCat(prefix_, "data.pkl is ", pickle_entry->uncompressed_size,
                              " bytes, more than this reader accepts (", kMaxPickleBytes, ")"));
    }
    absl::StatusOr<std::string> pickle_bytes = zip_->ReadAll(*pickle_entry);
    if (!pickle_bytes.ok()) return pickle_bytes.status();
    absl::StatusOr<PickleDocument> doc = ParsePickle(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(pickle_bytes->data()), pickle_bytes->size()),
        fl::StrCat(path_, ": ", prefix_, "data.pkl"));
    if (!doc.ok()) return doc.status();
    doc_ = *std::move(doc);

    const PickleNode& root = doc_.at(doc_.root());
    if (root.kind != PickleKind::kObject || doc_.at(root.items[0]).kind != PickleKind::kGlobal) {
      return Error(fl::StrCat("the root of ", prefix_, "data.pkl is a ", doc_.Describe(doc_.root()),
                              ", not a TorchScript module; ", kExportHint));
    }
    result_.root_class = doc_.at(root.items[0]).text;
    absl::StatusOr<const ClassInfo*> root_class = LookupClass(result_.root_class);
    if (!root_class.ok()) return root_class.status();
    if (!(*root_class)->is_module) {
      return Error(fl::StrCat("the root object (", result_.root_class, ") is not a module; ", kExportHint));
    }
    if (absl::Status s = VisitModule(doc_.root(), "", 0); !s.ok()) return s;

    const bool any_parameter = std::any_of(result_.tensors.begin(), result_.tensors.end(),
                                           [](const ScriptTensor& t) { return t.is_parameter; });
    if (!any_parameter) {
      return Error(fl::StrCat("the model (", result_.root_class,
                              ") has no parameters: there is nothing to train; check that the layers are "
                              "registered as submodules (attributes of type nn.Module, nn.ModuleList, ...)"));
    }
    std::vector<core::TensorSpec> specs;
    specs.reserve(result_.tensors.size());
    for (const ScriptTensor& t : result_.tensors) {
      core::TensorSpec spec;
      spec.name = t.name;
      spec.shape = t.shape;
      spec.dtype = t.dtype;
      specs.push_back(std::move(spec));
    }
    absl::StatusOr<core::ModelSpec> spec = core::ModelSpec::Create(std::move(specs));
    if (!spec.ok()) return Error(fl::ToStd(spec.status().message()));
    result_.spec = *std::move(spec);
    if (absl::Status s = ReadValues(); !s.ok()) return s;
    return std::move(result_);
  }

 private:
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(fl::StrCat(path_, ": ", message));
  }

  absl::Status OpenArchive() {
    absl::StatusOr<ZipArchive> zip = ZipArchive::Open(path_);
    if (!zip.ok()) {
      // A legacy (pre-1.6) torch.save file is a bare pickle: protocol 2 starts with 0x80 0x02.
      std::ifstream in(path_, std::ios::binary);
      char head[2] = {0, 0};
      const bool legacy = in.read(head, 2) && static_cast<uint8_t>(head[0]) == 0x80 && head[1] == 0x02;
      // The ZIP reader's message names the file already.
      return absl::InvalidArgumentError(fl::StrCat(
          zip.status().message(),
          legacy ? " (it is a bare pickle, as written by torch.save before PyTorch 1.6: not TorchScript)" : "", "; ",
          kExportHint));
    }
    zip_ = *std::move(zip);
    if (zip_->entries().empty())
      return Error(fl::StrCat("is an empty ZIP archive, not a TorchScript model; ", kExportHint));
    // LibTorch's writer puts every record under one top-level folder (the archive name).
    const std::string& first = zip_->entries().front().name;
    const size_t slash = first.find('/');
    if (slash == std::string::npos) {
      return Error(fl::StrCat("is a ZIP archive but not a TorchScript model (its first entry '", first,
                              "' is not inside an archive folder; a NumPy .npz?); ", kExportHint));
    }
    prefix_ = first.substr(0, slash + 1);
    if (zip_->Find(prefix_ + "data.pkl") == nullptr) {
      return Error(
          fl::StrCat("is a ZIP archive but not a TorchScript model: it has no ", prefix_, "data.pkl; ", kExportHint));
    }
    const bool has_code = std::any_of(zip_->entries().begin(), zip_->entries().end(),
                                      [&](const ZipEntry& e) { return e.name.starts_with(prefix_ + "code/"); });
    if (!has_code) {
      return Error(fl::StrCat("has ", prefix_, "data.pkl but no ", prefix_,
                              "code/: it is a torch.save() file (a state_dict or a pickled nn.Module), "
                              "not TorchScript; ",
                              kExportHint));
    }
    if (const ZipEntry* order = zip_->Find(prefix_ + "byteorder"); order != nullptr) {
      absl::StatusOr<std::string> text = zip_->ReadAll(*order);
      if (!text.ok()) return text.status();
      if (*text != "little") {
        return Error(fl::StrCat("its tensors are stored in '", *text,
                                "' byte order; only little-endian files "
                                "are supported (save the model on a little-endian machine)"));
      }
    }
    return absl::OkStatus();
  }

  // Class headers: "__torch__.a.b.C" is `class C` in <archive>/code/__torch__/a/b.py.
  absl::StatusOr<const ClassInfo*> LookupClass(const std::string& qualified) {
    if (auto it = classes_.find(qualified); it != classes_.end()) return &it->second;
    ClassInfo info;
    const size_t dot = qualified.rfind('.');
    if (!qualified.starts_with("__torch__.") || dot == std::string::npos ||
        qualified.starts_with("__torch__.torch.classes.")) {
      // Not a TorchScript-compiled class (a C++ custom class, for instance): never a module.
      return &classes_.emplace(qualified, info).first->second;
    }
    std::string file = qualified.substr(0, dot);
    std::replace(file.begin(), file.end(), '.', '/');
    file = fl::StrCat(prefix_, "code/", file, ".py");
    const std::string name = qualified.substr(dot + 1);
    absl::StatusOr<const std::string*> code = CodeFile(file);
    if (!code.ok()) return code.status();
    if (*code == nullptr) {
      return Error(fl::StrCat("class ", qualified, " is used in ", prefix_, "data.pkl but ", file,
                              " is missing (corrupt archive?)"));
    }
    std::vector<std::string_view> lines;
    for (std::string_view rest = **code; !rest.empty();) {
      const size_t end = rest.find('\n');
      lines.push_back(rest.substr(0, end));
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    }
    bool found = false;
    bool has_parameters = false;
    for (size_t i = 0; i < lines.size(); ++i) {
      std::string_view line = lines[i];
      if (!line.starts_with(fl::StrCat("class ", name))) continue;
      std::string_view rest = line.substr(6 + name.size());
      if (!rest.starts_with("(") && !rest.starts_with(":")) continue;  // a longer name with this prefix
      found = true;
      info.is_module = rest.starts_with("(Module)");
      for (size_t j = i + 1; j < lines.size() && (lines[j].starts_with(" ") || lines[j].empty()); ++j) {
        std::string_view body = lines[j];
        std::vector<std::string>* target = nullptr;
        std::string_view tail;
        if (body.starts_with("  __parameters__ =")) {
          target = &info.parameters;
          tail = body.substr(18);
          has_parameters = true;
        } else if (body.starts_with("  __buffers__ =")) {
          target = &info.buffers;
          tail = body.substr(15);
        }
        if (target != nullptr && !ParseNameList(tail, target)) {
          return Error(fl::StrCat("cannot read line ", j + 1, " of ", file, " ('", body.substr(0, 120), "')"));
        }
      }
      break;
    }
    if (!found) return Error(fl::StrCat("class ", name, " is not defined in ", file, " (corrupt archive?)"));
    if (info.is_module && !has_parameters) {
      return Error(fl::StrCat("module class ", qualified, " in ", file,
                              " has no __parameters__ line (not written by LibTorch?)"));
    }
    return &classes_.emplace(qualified, std::move(info)).first->second;
  }

  // nullptr when the archive has no such file.
  absl::StatusOr<const std::string*> CodeFile(const std::string& file) {
    if (auto it = code_.find(file); it != code_.end()) return &it->second;
    const ZipEntry* entry = zip_->Find(file);
    if (entry == nullptr) return nullptr;
    if (entry->uncompressed_size > kMaxCodeBytes) {
      return Error(fl::StrCat(file, " is ", entry->uncompressed_size, " bytes, more than this reader accepts"));
    }
    absl::StatusOr<std::string> text = zip_->ReadAll(*entry);
    if (!text.ok()) return text.status();
    return &code_.emplace(file, *std::move(text)).first->second;
  }

  absl::StatusOr<bool> IsModuleObject(PickleRef ref) {
    const PickleNode& node = doc_.at(ref);
    if (node.kind != PickleKind::kObject) return false;
    const PickleNode& cls = doc_.at(node.items[0]);
    if (cls.kind != PickleKind::kGlobal) return false;
    absl::StatusOr<const ClassInfo*> info = LookupClass(cls.text);
    if (!info.ok()) return info.status();
    return (*info)->is_module;
  }

  absl::Status VisitModule(PickleRef ref, const std::string& prefix, int depth) {
    const std::string where =
        prefix.empty() ? "the root module" : fl::StrCat("module '", prefix.substr(0, prefix.size() - 1), "'");
    if (depth > kMaxModuleDepth) {
      return Error(fl::StrCat(where, " is nested more than ", kMaxModuleDepth,
                              " modules deep (a module that contains itself?)"));
    }
    if (++visits_ > kMaxVisits) return Error(fl::StrCat("more than ", kMaxVisits, " modules and tensors"));
    const PickleNode& node = doc_.at(ref);
    const std::string class_name = doc_.at(node.items[0]).text;
    absl::StatusOr<const ClassInfo*> found = LookupClass(class_name);
    if (!found.ok()) return found.status();
    const ClassInfo info = **found;  // a copy: LookupClass may rehash classes_ during the recursion
    if (node.state == kNoPickleRef || doc_.at(node.state).kind != PickleKind::kDict) {
      return Error(fl::StrCat(where, " (", class_name, ") is pickled with ",
                              node.state == kNoPickleRef ? "no state" : doc_.Describe(node.state),
                              " instead of a dict of attributes (a custom __getstate__ is not supported)"));
    }
    // Copied: items of the arena are stable, but a copy keeps this independent of later reads.
    const std::vector<PickleRef> pairs = doc_.at(node.state).items;
    auto key_of = [&](size_t i) -> absl::StatusOr<std::string> {
      const PickleNode& key = doc_.at(pairs[i]);
      if (key.kind != PickleKind::kString) {
        return Error(fl::StrCat(where, " has an attribute named by a ", doc_.Describe(pairs[i])));
      }
      return key.text;
    };
    auto contains = [](const std::vector<std::string>& names, const std::string& name) {
      return std::find(names.begin(), names.end(), name) != names.end();
    };
    for (int pass = 0; pass < 2; ++pass) {  // own parameters, then own buffers
      const std::vector<std::string>& wanted = pass == 0 ? info.parameters : info.buffers;
      for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
        absl::StatusOr<std::string> key = key_of(i);
        if (!key.ok()) return key.status();
        if (!contains(wanted, *key)) continue;
        if (doc_.at(pairs[i + 1]).kind == PickleKind::kNone) continue;  // e.g. Linear(bias=False)
        if (absl::Status s = AddTensor(prefix + *key, pass == 0, pairs[i + 1]); !s.ok()) return s;
      }
    }
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) {  // then submodules, in attribute order
      absl::StatusOr<bool> is_module = IsModuleObject(pairs[i + 1]);
      if (!is_module.ok()) return is_module.status();
      if (!*is_module) continue;
      absl::StatusOr<std::string> key = key_of(i);
      if (!key.ok()) return key.status();
      if (absl::Status s = VisitModule(pairs[i + 1], fl::StrCat(prefix, *key, "."), depth + 1); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> IntAt(PickleRef ref, const std::string& name, std::string_view what) const {
    const PickleNode& n = doc_.at(ref);
    if (n.kind != PickleKind::kInt) {
      return Error(fl::StrCat("tensor '", name, "': its ", what, " is a ", doc_.Describe(ref), ", not an int"));
    }
    return n.integer;
  }

  absl::Status IntTuple(PickleRef ref, const std::string& name, std::string_view what,
                        std::vector<int64_t>* out) const {
    const PickleNode& n = doc_.at(ref);
    if (n.kind != PickleKind::kTuple) {
      return Error(fl::StrCat("tensor '", name, "': its ", what, " is a ", doc_.Describe(ref), ", not a tuple"));
    }
    if (n.items.size() > kMaxDims) {
      return Error(fl::StrCat("tensor '", name, "' has ", n.items.size(), " dimensions (at most ", kMaxDims, ")"));
    }
    for (PickleRef item : n.items) {
      absl::StatusOr<int64_t> v = IntAt(item, name, what);
      if (!v.ok()) return v.status();
      if (*v < 0) return Error(fl::StrCat("tensor '", name, "' has a negative ", what, " entry (", *v, ")"));
      out->push_back(*v);
    }
    return absl::OkStatus();
  }

  // `ref` must be torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks...).
  absl::Status AddTensor(const std::string& name, bool is_parameter, PickleRef ref) {
    if (++visits_ > kMaxVisits) return Error(fl::StrCat("more than ", kMaxVisits, " modules and tensors"));
    const std::string role = is_parameter ? "parameter" : "buffer";
    const PickleNode& call = doc_.at(ref);
    const std::string callee = call.kind == PickleKind::kCall && doc_.at(call.items[0]).kind == PickleKind::kGlobal
                                   ? doc_.at(call.items[0]).text
                                   : "";
    if (callee == "torch._utils._rebuild_qtensor") {
      return Error(fl::StrCat(role, " '", name,
                              "' is a quantized tensor, which is not supported: export the "
                              "float model (before torch.quantization.convert)"));
    }
    if (callee != "torch._utils._rebuild_tensor_v2") {
      return Error(fl::StrCat(role, " '", name, "' is a ", doc_.Describe(ref), ", not a tensor"));
    }
    const PickleNode& args = doc_.at(call.items[1]);
    if (args.items.size() < 4 || doc_.at(args.items[0]).kind != PickleKind::kPersistent) {
      return Error(fl::StrCat(role, " '", name, "': unexpected tensor arguments (", doc_.Describe(call.items[1]), ")"));
    }
    // The persistent id: ('storage', torch.<T>Storage, key, location, number of elements).
    const PickleRef pid_ref = doc_.at(args.items[0]).items[0];
    const PickleNode& pid = doc_.at(pid_ref);
    if (pid.kind != PickleKind::kTuple || pid.items.size() != 5 || doc_.at(pid.items[0]).text != "storage" ||
        doc_.at(pid.items[1]).kind != PickleKind::kGlobal || doc_.at(pid.items[2]).kind != PickleKind::kString) {
      return Error(fl::StrCat(role, " '", name, "': unexpected storage reference (", doc_.Describe(pid_ref), ")"));
    }
    const std::string& storage_type = doc_.at(pid.items[1]).text;
    const std::optional<StorageType> type = StorageTypeOf(storage_type);
    if (!type.has_value()) {
      return Error(fl::StrCat(role, " '", name, "' is stored as ", storage_type,
                              ", a dtype fl cannot carry; supported: float32, float16, bfloat16, float64, int64, "
                              "int32, uint8 (convert it in PyTorch before exporting)"));
    }
    absl::StatusOr<int64_t> offset = IntAt(args.items[1], name, "storage offset");
    if (!offset.ok()) return offset.status();
    if (*offset < 0) return Error(fl::StrCat("tensor '", name, "' has a negative storage offset (", *offset, ")"));
    ScriptTensor tensor;
    tensor.name = name;
    tensor.is_parameter = is_parameter;
    tensor.dtype = type->dtype;
    PendingTensor pending;
    if (absl::Status s = IntTuple(args.items[2], name, "size", &tensor.shape); !s.ok()) return s;
    if (absl::Status s = IntTuple(args.items[3], name, "stride", &pending.stride); !s.ok()) return s;
    if (tensor.shape.size() != pending.stride.size()) {
      return Error(fl::StrCat("tensor '", name, "' has ", tensor.shape.size(), " sizes but ", pending.stride.size(),
                              " strides"));
    }
    // Elements, and the highest storage element touched, with overflow checks (hostile sizes).
    uint64_t elements = 1;
    uint64_t last = static_cast<uint64_t>(*offset);
    bool overflow = false;
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      const uint64_t size = static_cast<uint64_t>(tensor.shape[d]);
      overflow |= __builtin_mul_overflow(elements, size, &elements);
      if (size > 0) {
        uint64_t reach = 0;
        overflow |= __builtin_mul_overflow(size - 1, static_cast<uint64_t>(pending.stride[d]), &reach);
        overflow |= __builtin_add_overflow(last, reach, &last);
      }
    }
    if (overflow || elements > (uint64_t{1} << 40)) {
      return Error(fl::StrCat("tensor '", name, "' has an impossible size (corrupt file)"));
    }
    pending.index = result_.tensors.size();
    pending.storage_key = fl::StrCat(prefix_, "data/", doc_.at(pid.items[2]).text);
    pending.type = *type;
    pending.storage_offset = *offset;
    pending.storage_elements = elements == 0 ? 0 : last + 1;
    // A tensor with more elements than its storage would be an expanded view; refusing those keeps the
    // memory this reader allocates proportional to the file.
    const ZipEntry* storage = zip_->Find(pending.storage_key);
    if (storage == nullptr) {
      return Error(fl::StrCat("the storage of tensor '", name, "' (", pending.storage_key,
                              ") is missing from the archive (corrupt file)"));
    }
    const uint64_t storage_elements = storage->uncompressed_size / type->element_size;
    if (pending.storage_elements > storage_elements) {
      return Error(fl::StrCat("the storage of tensor '", name, "' (", pending.storage_key, ") holds ",
                              storage->uncompressed_size, " bytes but the tensor (shape ",
                              absl::StrJoin(tensor.shape, "x"), ", offset ", *offset, ") needs ",
                              pending.storage_elements * type->element_size, " (corrupt or truncated file)"));
    }
    if (elements > storage_elements) {
      return Error(fl::StrCat("tensor '", name, "' has ", elements, " elements but its storage only ", storage_elements,
                              " (an expanded view): save a contiguous copy (.contiguous())"));
    }
    total_elements_ += elements;
    if (total_elements_ > 4 * zip_->file_size() + 1024) {
      return Error("the tensors have far more elements than the file holds (storages shared too many times)");
    }
    pending_.push_back(std::move(pending));
    result_.tensors.push_back(std::move(tensor));
    return absl::OkStatus();
  }

  // Reads each storage once (CRC-checked) and copies its tensors into the flat image in C order.
  absl::Status ReadValues() {
    result_.values.assign(result_.spec.num_elements(), 0.0f);
    std::vector<size_t> order(pending_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return pending_[a].storage_key < pending_[b].storage_key; });
    std::string bytes;
    std::string loaded_key;
    for (size_t k : order) {
      const PendingTensor& p = pending_[k];
      if (p.storage_key != loaded_key) {
        absl::StatusOr<std::string> read = zip_->ReadAll(*zip_->Find(p.storage_key));
        if (!read.ok()) return read.status();
        bytes = *std::move(read);
        loaded_key = p.storage_key;
      }
      const core::TensorSpec& spec = result_.spec.tensors()[p.index];
      const uint64_t count = spec.num_elements();
      if (count == 0) continue;
      if (p.storage_elements * p.type.element_size > bytes.size()) {
        return Error(fl::StrCat("the storage of tensor '", spec.name, "' (", p.storage_key,
                                ") is shorter than "
                                "its ZIP header says (corrupt file)"));
      }
      const uint8_t* base = reinterpret_cast<const uint8_t*>(bytes.data());
      float* out = result_.values.data() + spec.offset;
      // Odometer over the shape in C order; `at` is the storage element of the current index.
      const size_t dims = spec.shape.size();
      std::vector<int64_t> index(dims, 0);
      uint64_t at = static_cast<uint64_t>(p.storage_offset);
      for (uint64_t e = 0; e < count; ++e) {
        out[e] = ElementToFloat(base + at * p.type.element_size, p.type.dtype);
        for (size_t d = dims; d-- > 0;) {
          if (++index[d] < spec.shape[d]) {
            at += static_cast<uint64_t>(p.stride[d]);
            break;
          }
          at -= static_cast<uint64_t>(p.stride[d]) * static_cast<uint64_t>(spec.shape[d] - 1);
          index[d] = 0;
        }
      }
    }
    return absl::OkStatus();
  }

  std::string path_;
  std::optional<ZipArchive> zip_;
  std::string prefix_;  // "<archive>/"
  PickleDocument doc_;
  std::map<std::string, ClassInfo> classes_;
  std::map<std::string, std::string> code_;
  std::vector<PendingTensor> pending_;
  uint64_t total_elements_ = 0;
  size_t visits_ = 0;
  ScriptModelFile result_;
};

}  // namespace

absl::StatusOr<ScriptModelFile> ReadTorchScriptModel(const std::string& path) { return Reader(path).Read(); }

}  // namespace fl::formats
