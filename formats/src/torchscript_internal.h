// Private to formats: what the TorchScript model reader (torchscript_archive.cc) and the archive check
// (torchscript_check.cc) share: the stated limits, the storage types LibTorch writes, and the one resolution of
// a pickled tensor reference against its storage record, with checked arithmetic.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/core/tensor_spec.h"
#include "fl/formats/pickle.h"
#include "fl/formats/zip_archive.h"

namespace fl::formats::torchscript {

// --- limits (docs/input-limits.md says why each number) --------------------------------------------------------
// The .pt file itself: the server holds the model as fp32 in memory, about as large as the file; no model of
// this testbed comes near.
inline constexpr uint64_t kMaxModelFileBytes = uint64_t{16} << 30;
// data.pkl: LibTorch writes about 80 bytes a tensor (names live in the code files). The parse's memory budget
// (ArchivePickleLimits: 512 MiB, about 13 bytes of memory a byte of such a pickle) is what binds first, near
// 480,000 tensors; larger is a pickle built to cost memory.
inline constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;
// constants.pkl and each *.debug_pkl: constants and source ranges, kilobytes in real models.
inline constexpr uint64_t kMaxSidePickleBytes = uint64_t{64} << 20;
// One TorchScript source file (code/**.py): generated class and method text, kilobytes to a few MB for traced
// models of thousands of operations.
inline constexpr uint64_t kMaxCodeFileBytes = uint64_t{16} << 20;
// All source files together.
inline constexpr uint64_t kMaxCodeBytes = uint64_t{64} << 20;
// Lines of one source file.
inline constexpr uint64_t kMaxCodeLines = 500'000;
// Consecutive blank lines: LibTorch 1.13's lexer recurses once per blank line (60,000 overflow the 8 MiB main
// stack, far fewer a 1 MiB thread stack); generated code has none in a row.
inline constexpr uint64_t kMaxCodeBlankRun = 256;
// Nesting of ( [ {: LibTorch's parser recurses per level (10,000 overflow an 8 MiB stack).
inline constexpr uint64_t kMaxCodeNesting = 64;
// Leading spaces of a line (blocks nest by 2 in generated code: 128 nested blocks).
inline constexpr uint64_t kMaxCodeIndent = 256;
// Dimensions of a tensor (LibTorch's own limit is 64 too).
inline constexpr size_t kMaxDims = 64;

inline constexpr std::string_view kExportHint =
    "export the model in PyTorch with torch.jit.script(model).save(path) or "
    "torch.jit.trace(model, example_input).save(path)";

// A torch.<X>Storage global as LibTorch's pickler writes it (toString(ScalarType) + "Storage").
struct StorageType {
  std::string_view global;  // "torch.FloatStorage"
  size_t element_size = 0;
  std::optional<core::DType> dtype;  // set for the dtypes fl carries
  bool floating = false;             // its values can be NaN/Inf
};
std::optional<StorageType> StorageTypeOf(std::string_view global);

// A tensor reference torch._utils._rebuild_tensor_v2((persistent id), offset, size, stride, ...) resolved
// against the archive: the storage record exists, holds the element count the persistent id declares, and the
// tensor's elements lie inside that count (sizes and strides non-negative, checked arithmetic throughout).
struct TensorRef {
  std::string storage_key;  // "<archive>/data/<key>"
  StorageType type;
  uint64_t storage_numel = 0;  // the persistent id's count: what LibTorch's storage will claim to hold
  uint64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  uint64_t elements = 0;  // product of shape
  uint64_t extent = 0;    // highest storage element touched + 1 (0 when empty)
};

// `label` names the tensor in errors ("parameter 'fc.weight'", "a tensor in constants.pkl"); `storage_dir` is
// "<archive>/data/" or "<archive>/constants/". Errors read "<path>: <label> ...".
absl::StatusOr<TensorRef> ResolveTensor(const std::string& path, const PickleDocument& doc, PickleRef call,
                                        const ZipArchive& zip, const std::string& storage_dir,
                                        const std::string& label);

// The callee of a kCall node when it is a global ("torch._utils._rebuild_tensor_v2"), else "".
std::string_view CalleeOf(const PickleDocument& doc, PickleRef ref);

// Records each storage's first (type, count) and refuses a second reference that differs: LibTorch keeps the
// first storage it loads under a key, so a second view would read it as another type or past its end.
class StorageCatalog {
 public:
  absl::Status Add(const std::string& path, const TensorRef& ref, const std::string& label);

 private:
  struct Seen {
    std::string_view global;
    uint64_t numel;
  };
  std::map<std::string, Seen> seen_;
};

// Pickle limits for the files LibTorch unpickles: values and memory bounded by the pickle's size.
PickleLimits ArchivePickleLimits();

}  // namespace fl::formats::torchscript
