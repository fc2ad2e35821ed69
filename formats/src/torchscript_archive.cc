#include "fl/formats/torchscript_archive.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "fl/core/str_cat.h"
#include "fl/formats/pickle.h"
#include "fl/formats/zip_archive.h"
#include "fl/sys/user_file.h"
#include "torchscript_internal.h"

namespace fl::formats {
namespace {

using torchscript::kExportHint;
using torchscript::StorageType;
using torchscript::TensorRef;

// Module trees deeper than this are refused (a pickle can make an object contain itself).
constexpr int kMaxModuleDepth = 256;
// Modules and tensors visited: bounds a hostile pickle whose modules share children exponentially.
constexpr size_t kMaxVisits = size_t{1} << 20;
// An entry read whole (data.pkl, a code file, a storage) inflates to at most this many times the whole file's
// size: LibTorch stores every entry uncompressed, and a re-zipped pickle or tensor deflates 2-10x, while a
// deflate bomb reaches 1000x (a 1 MB file whose data.pkl inflates to 1 GB).
constexpr uint64_t kMaxInflation = 16;

struct ClassInfo {
  bool is_module = false;
  std::unordered_set<std::string> parameters;
  std::unordered_set<std::string> buffers;
};

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
bool ParseNameList(std::string_view text, std::unordered_set<std::string>* names) {
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
    names->emplace(text.substr(i + 1, end - i - 1));
    i = end + 1;
    skip_spaces();
    if (i < text.size() && text[i] == ',') ++i;
  }
}

struct PendingTensor {
  size_t index = 0;  // position in the spec
  TensorRef ref;
};

class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  absl::StatusOr<ScriptModelFile> Read() {
    if (absl::Status s = OpenArchive(); !s.ok()) return s;
    const ZipEntry* pickle_entry = zip_->Find(prefix_ + "data.pkl");
    absl::StatusOr<std::string> pickle_bytes =
        ReadEntry(*pickle_entry, torchscript::kMaxPickleBytes, "the module pickle");
    if (!pickle_bytes.ok()) return pickle_bytes.status();
    absl::StatusOr<PickleDocument> doc = ParsePickle(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(pickle_bytes->data()), pickle_bytes->size()),
        fl::StrCat(path_, ": ", prefix_, "data.pkl"), torchscript::ArchivePickleLimits());
    if (!doc.ok()) return doc.status();
    doc_ = *std::move(doc);
    pickle_bytes->clear();
    pickle_bytes->shrink_to_fit();

    const PickleNode& root = doc_.at(doc_.root());
    if (root.kind != PickleKind::kObject || doc_.at(doc_.items(doc_.root())[0]).kind != PickleKind::kGlobal) {
      return Error(fl::StrCat("the root of ", prefix_, "data.pkl is a ", doc_.Describe(doc_.root()),
                              ", not a TorchScript module; ", kExportHint));
    }
    result_.root_class = std::string(doc_.text(doc_.items(doc_.root())[0]));
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

  // An entry read whole, bounded by the limit for its kind and by kMaxInflation times the file's size.
  // All entries read together inflate to at most the same multiple (plus 1 MiB), so that many small deflated
  // storages cannot make the reader inflate gigabytes one at a time either.
  absl::StatusOr<std::string> ReadEntry(const ZipEntry& entry, uint64_t kind_limit, std::string_view what) {
    const uint64_t by_file = kMaxInflation * zip_->file_size() + 4096;
    const uint64_t total_limit = kMaxInflation * zip_->file_size() + (uint64_t{1} << 20);
    const uint64_t limit = std::min(kind_limit, by_file);
    if (entry.uncompressed_size > limit) return zip_->ReadAll(entry, limit, what);  // refused, naming the limit
    inflated_ += entry.uncompressed_size;
    if (inflated_ > total_limit) {
      return Error(fl::StrCat("reading ", what, " '", entry.name, "' takes what the archive's entries inflate to past ",
                              total_limit, " bytes, ", kMaxInflation,
                              " times the file's size (deflate bombs?); LibTorch stores entries uncompressed"));
    }
    return zip_->ReadAll(entry, limit, what);
  }

  absl::Status OpenArchive() {
    absl::StatusOr<ZipArchive> zip = ZipArchive::Open(path_, "TorchScript model", torchscript::kMaxModelFileBytes);
    if (!zip.ok()) {
      if (zip.status().code() != absl::StatusCode::kInvalidArgument ||
          zip.status().message().find("is not a ZIP archive") == std::string_view::npos) {
        return zip.status();  // not a regular file, too large, missing: the message names the file already
      }
      // A legacy (pre-1.6) torch.save file is a bare pickle: protocol 2 starts with 0x80 0x02.
      bool legacy = false;
      if (absl::StatusOr<fl::sys::UserFile> file =
              fl::sys::OpenUserFile(path_, "TorchScript model", torchscript::kMaxModelFileBytes);
          file.ok() && file->size() >= 2) {
        uint8_t head[2] = {0, 0};
        legacy = file->ReadAt(0, head).ok() && head[0] == 0x80 && head[1] == 0x02;
      }
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
      absl::StatusOr<std::string> text = zip_->ReadAll(*order, 64, "the byte order record");
      if (!text.ok()) return text.status();
      if (*text != "little") {
        return Error(fl::StrCat("its tensors are stored in '", text->substr(0, 16), "' byte order (", prefix_,
                                "byteorder); only little-endian files are supported (save the model on a "
                                "little-endian machine)"));
      }
    }
    return absl::OkStatus();
  }

  // Class headers: "__torch__.a.b.C" is `class C` in <archive>/code/__torch__/a/b.py. Each file is read and
  // indexed once (every class in it), so a lookup is a map search whatever the number of classes.
  absl::StatusOr<const ClassInfo*> LookupClass(const std::string& qualified) {
    if (auto it = classes_.find(qualified); it != classes_.end()) return &it->second;
    const size_t dot = qualified.rfind('.');
    if (!qualified.starts_with("__torch__.") || dot == std::string::npos ||
        qualified.starts_with("__torch__.torch.classes.")) {
      // Not a TorchScript-compiled class (a C++ custom class, for instance): never a module.
      return &classes_.emplace(qualified, ClassInfo{}).first->second;
    }
    std::string file = qualified.substr(0, dot);
    std::replace(file.begin(), file.end(), '.', '/');
    file = fl::StrCat(prefix_, "code/", file, ".py");
    const std::string module = qualified.substr(0, dot + 1);
    if (indexed_files_.insert(file).second) {
      if (absl::Status s = IndexCodeFile(file, module); !s.ok()) return s;
    }
    if (auto it = classes_.find(qualified); it != classes_.end()) return &it->second;
    if (zip_->Find(file) == nullptr) {
      return Error(fl::StrCat("class ", qualified, " is used in ", prefix_, "data.pkl but ", file,
                              " is missing (corrupt archive?)"));
    }
    return Error(fl::StrCat("class ", qualified.substr(dot + 1), " is not defined in ", file, " (corrupt archive?)"));
  }

  // Every `class NAME(...)` / `class NAME:` of a code file, with its __parameters__ and __buffers__ lines.
  absl::Status IndexCodeFile(const std::string& file, const std::string& module) {
    const ZipEntry* entry = zip_->Find(file);
    if (entry == nullptr) return absl::OkStatus();
    code_bytes_ += entry->uncompressed_size;
    if (code_bytes_ > torchscript::kMaxCodeBytes) {
      return Error(fl::StrCat("code file '", file, "' (", entry->uncompressed_size,
                              " bytes) takes the code files over the limit of ", torchscript::kMaxCodeBytes,
                              " bytes for all of them (docs/input-limits.md)"));
    }
    absl::StatusOr<std::string> code = ReadEntry(*entry, torchscript::kMaxCodeFileBytes, "the code file");
    if (!code.ok()) return code.status();
    ClassInfo* current = nullptr;
    std::string current_name;
    bool current_has_parameters = false;
    auto finish = [&]() -> absl::Status {
      if (current != nullptr && current->is_module && !current_has_parameters) {
        return Error(fl::StrCat("module class ", module, current_name, " in ", file,
                                " has no __parameters__ line (not written by LibTorch?)"));
      }
      return absl::OkStatus();
    };
    size_t line_number = 0;
    for (std::string_view rest = *code; !rest.empty();) {
      const size_t end = rest.find('\n');
      const std::string_view line = rest.substr(0, end);
      rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
      ++line_number;
      if (line.starts_with("class ")) {
        if (absl::Status s = finish(); !s.ok()) return s;
        const std::string_view after = line.substr(6);
        const size_t name_end = after.find_first_of("(:");
        current = nullptr;
        if (name_end == std::string_view::npos) continue;
        current_name = std::string(after.substr(0, name_end));
        auto [it, inserted] = classes_.emplace(fl::StrCat(module, current_name), ClassInfo{});
        if (!inserted) {
          return Error(fl::StrCat("class ", current_name, " is defined twice in ", file, " (corrupt archive?)"));
        }
        current = &it->second;
        current->is_module = after.substr(name_end).starts_with("(Module)");
        current_has_parameters = false;
        continue;
      }
      if (!line.starts_with(" ") && !line.empty()) {  // the class body ended
        if (absl::Status s = finish(); !s.ok()) return s;
        current = nullptr;
        continue;
      }
      if (current == nullptr) continue;
      std::unordered_set<std::string>* target = nullptr;
      std::string_view tail;
      if (line.starts_with("  __parameters__ =")) {
        target = &current->parameters;
        tail = line.substr(18);
        current_has_parameters = true;
      } else if (line.starts_with("  __buffers__ =")) {
        target = &current->buffers;
        tail = line.substr(15);
      }
      if (target != nullptr && !ParseNameList(tail, target)) {
        return Error(fl::StrCat("cannot read line ", line_number, " of ", file, " ('", line.substr(0, 120), "')"));
      }
    }
    return finish();
  }

  absl::StatusOr<bool> IsModuleObject(PickleRef ref) {
    const PickleNode& node = doc_.at(ref);
    if (node.kind != PickleKind::kObject) return false;
    const PickleRef cls = doc_.items(ref)[0];
    if (doc_.at(cls).kind != PickleKind::kGlobal) return false;
    absl::StatusOr<const ClassInfo*> info = LookupClass(std::string(doc_.text(cls)));
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
    const std::string class_name(doc_.text(doc_.items(ref)[0]));
    absl::StatusOr<const ClassInfo*> info = LookupClass(class_name);
    if (!info.ok()) return info.status();
    if (node.state == kNoPickleRef || doc_.at(node.state).kind != PickleKind::kDict) {
      return Error(fl::StrCat(where, " (", class_name, ") is pickled with ",
                              node.state == kNoPickleRef ? "no state" : doc_.Describe(node.state),
                              " instead of a dict of attributes (a custom __getstate__ is not supported)"));
    }
    // The arena does not move while the document lives: the span stays valid through the recursion.
    const std::span<const PickleRef> pairs = doc_.items(node.state);
    auto key_of = [&](size_t i) -> absl::StatusOr<std::string_view> {
      if (doc_.at(pairs[i]).kind != PickleKind::kString) {
        return Error(fl::StrCat(where, " has an attribute named by a ", doc_.Describe(pairs[i])));
      }
      return doc_.text(pairs[i]);
    };
    for (int pass = 0; pass < 2; ++pass) {  // own parameters, then own buffers: a set lookup per attribute
      const std::unordered_set<std::string>& wanted = pass == 0 ? (*info)->parameters : (*info)->buffers;
      if (wanted.empty()) continue;
      for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
        absl::StatusOr<std::string_view> key = key_of(i);
        if (!key.ok()) return key.status();
        if (!wanted.contains(std::string(*key))) continue;
        if (doc_.at(pairs[i + 1]).kind == PickleKind::kNone) continue;  // e.g. Linear(bias=False)
        if (absl::Status s = AddTensor(fl::StrCat(prefix, *key), pass == 0, pairs[i + 1]); !s.ok()) return s;
      }
    }
    for (size_t i = 0; i + 1 < pairs.size(); i += 2) {  // then submodules, in attribute order
      absl::StatusOr<bool> is_module = IsModuleObject(pairs[i + 1]);
      if (!is_module.ok()) return is_module.status();
      if (!*is_module) continue;
      absl::StatusOr<std::string_view> key = key_of(i);
      if (!key.ok()) return key.status();
      if (absl::Status s = VisitModule(pairs[i + 1], fl::StrCat(prefix, *key, "."), depth + 1); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // `ref` must be torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks...).
  absl::Status AddTensor(const std::string& name, bool is_parameter, PickleRef ref) {
    if (++visits_ > kMaxVisits) return Error(fl::StrCat("more than ", kMaxVisits, " modules and tensors"));
    const std::string role = is_parameter ? "parameter" : "buffer";
    const std::string_view callee = torchscript::CalleeOf(doc_, ref);
    if (callee == "torch._utils._rebuild_qtensor") {
      return Error(fl::StrCat(role, " '", name,
                              "' is a quantized tensor, which is not supported: export the "
                              "float model (before torch.quantization.convert)"));
    }
    if (callee != "torch._utils._rebuild_tensor_v2") {
      return Error(fl::StrCat(role, " '", name, "' is a ", doc_.Describe(ref), ", not a tensor"));
    }
    const std::string label = fl::StrCat("tensor '", name, "'");
    absl::StatusOr<TensorRef> tensor_ref =
        torchscript::ResolveTensor(path_, doc_, ref, *zip_, fl::StrCat(prefix_, "data/"), label);
    if (!tensor_ref.ok()) return tensor_ref.status();
    if (!tensor_ref->type.dtype.has_value()) {
      return Error(fl::StrCat(role, " '", name, "' is stored as ", tensor_ref->type.global,
                              ", a dtype fl cannot carry; supported: float32, float16, bfloat16, float64, int64, "
                              "int32, uint8 (convert it in PyTorch before exporting)"));
    }
    if (absl::Status s = catalog_.Add(path_, *tensor_ref, label); !s.ok()) return s;
    // A tensor with more elements than its storage would be an expanded view; refusing those keeps the
    // memory this reader allocates proportional to the file.
    if (tensor_ref->elements > tensor_ref->storage_numel) {
      return Error(fl::StrCat("tensor '", name, "' has ", tensor_ref->elements, " elements but its storage only ",
                              tensor_ref->storage_numel,
                              " (an expanded view): save a contiguous copy (.contiguous())"));
    }
    total_elements_ += tensor_ref->elements;
    if (total_elements_ > 4 * zip_->file_size() + 1024) {
      return Error("the tensors have far more elements than the file holds (storages shared too many times)");
    }
    ScriptTensor tensor;
    tensor.name = name;
    tensor.is_parameter = is_parameter;
    tensor.dtype = *tensor_ref->type.dtype;
    tensor.shape = tensor_ref->shape;
    pending_.push_back(PendingTensor{result_.tensors.size(), *std::move(tensor_ref)});
    result_.tensors.push_back(std::move(tensor));
    return absl::OkStatus();
  }

  // Reads each storage once (CRC-checked, bounded by its declared size) and copies its tensors into the flat
  // image in C order; a value that is not finite in float32 is refused, naming the tensor.
  absl::Status ReadValues() {
    result_.values.assign(result_.spec.num_elements(), 0.0f);
    std::vector<size_t> order(pending_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return pending_[a].ref.storage_key < pending_[b].ref.storage_key; });
    std::string bytes;
    std::string loaded_key;
    for (size_t k : order) {
      const TensorRef& p = pending_[k].ref;
      const core::TensorSpec& spec = result_.spec.tensors()[pending_[k].index];
      const uint64_t count = spec.num_elements();
      if (count == 0) continue;
      if (p.storage_key != loaded_key) {
        bytes.clear();
        bytes.shrink_to_fit();
        // The record holds exactly the declared elements in files LibTorch writes.
        absl::StatusOr<std::string> read =
            ReadEntry(*zip_->Find(p.storage_key), p.storage_numel * p.type.element_size, "the tensor storage");
        if (!read.ok()) return read.status();
        bytes = *std::move(read);
        loaded_key = p.storage_key;
      }
      if (p.extent * p.type.element_size > bytes.size()) {  // checked against the header by ResolveTensor
        return Error(fl::StrCat("the storage of tensor '", spec.name, "' (", p.storage_key,
                                ") is shorter than its ZIP header says (corrupt file)"));
      }
      const uint8_t* base = reinterpret_cast<const uint8_t*>(bytes.data());
      float* out = result_.values.data() + spec.offset;
      // Odometer over the shape in C order; `at` is the storage element of the current index.
      const size_t dims = spec.shape.size();
      std::vector<int64_t> index(dims, 0);
      uint64_t at = p.offset;
      for (uint64_t e = 0; e < count; ++e) {
        out[e] = ElementToFloat(base + at * p.type.element_size, *p.type.dtype);
        if (!std::isfinite(out[e])) {
          return Error(fl::StrCat(
              result_.tensors[pending_[k].index].is_parameter ? "parameter" : "buffer", " '", spec.name,
              "' holds a value that is not finite (", out[e], " at element ", e,
              p.type.dtype == core::DType::kFloat64 ? ", or a float64 beyond float32's range" : "",
              "): fl carries finite float32 models only; fix the model in PyTorch (torch.nan_to_num) and export it "
              "again"));
        }
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
  std::unordered_set<std::string> indexed_files_;
  uint64_t code_bytes_ = 0;
  uint64_t inflated_ = 0;  // declared sizes of the entries read whole so far
  torchscript::StorageCatalog catalog_;
  std::vector<PendingTensor> pending_;
  uint64_t total_elements_ = 0;
  size_t visits_ = 0;
  ScriptModelFile result_;
};

}  // namespace

absl::StatusOr<ScriptModelFile> ReadTorchScriptModel(const std::string& path) { return Reader(path).Read(); }

}  // namespace fl::formats
