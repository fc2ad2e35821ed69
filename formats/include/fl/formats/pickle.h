// A minimal, strictly bounded pickle interpreter: enough of Python's pickle protocol (up to 5) to read
// the pickles LibTorch writes into TorchScript archives (data.pkl, constants.pkl), never executing
// anything. GLOBAL, REDUCE, NEWOBJ, BUILD and BINPERSID do not import or call: they become inert nodes
// (kGlobal, kCall, kObject, kPersistent) that a reader of a particular format interprets itself
// (torchscript_archive.h knows what `torch._utils._rebuild_tensor_v2` and `__torch__.*` objects mean).
//
// Supported opcodes (those LibTorch's Pickler emits, plus their common protocol-2..4 siblings):
//   PROTO STOP MARK GLOBAL NONE NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1 BINFLOAT
//   BINUNICODE SHORT_BINUNICODE BINSTRING SHORT_BINSTRING BINBYTES SHORT_BINBYTES
//   EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 EMPTY_LIST APPEND APPENDS EMPTY_DICT SETITEM SETITEMS
//   BINPUT LONG_BINPUT BINGET LONG_BINGET MEMOIZE BINPERSID REDUCE NEWOBJ BUILD
// Anything else (text-mode opcodes, INST/OBJ, frames, out-of-band buffers...), a truncated stream, a stack
// underflow, a missing MARK, a memo miss or a structure over the limits below is an InvalidArgument that
// names the opcode and its byte offset. Hostile input never crashes the parser: every length is checked
// against the bytes left, and the values live in one arena (indices, not pointers), so a pickle that makes
// a container contain itself cannot leak or overflow the C++ stack here. Consumers that walk the values
// recursively must bound their depth themselves (cycles are legal pickle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::formats {

// Index of a value in its PickleDocument.
using PickleRef = uint32_t;
inline constexpr PickleRef kNoPickleRef = 0xffffffffu;

enum class PickleKind : uint8_t {
  kNone,
  kBool,
  kInt,         // BININT*, LONG1 (up to 8 bytes)
  kFloat,       // BINFLOAT
  kString,      // (SHORT_)BINUNICODE, (SHORT_)BINSTRING: text holds the bytes as written
  kBytes,       // (SHORT_)BINBYTES
  kTuple,       // items
  kList,        // items
  kDict,        // items: key, value, key, value... in insertion order (duplicates kept as written)
  kGlobal,      // GLOBAL: text is "module.name" (e.g. "torch._utils._rebuild_tensor_v2")
  kCall,        // REDUCE: items = {callable, args tuple}; state set by a following BUILD, if any
  kObject,      // NEWOBJ: items = {class, args tuple}; state set by BUILD
  kPersistent,  // BINPERSID: items = {persistent id}
};

std::string_view PickleKindName(PickleKind kind);

struct PickleNode {
  PickleKind kind = PickleKind::kNone;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  std::vector<PickleRef> items;
  PickleRef state = kNoPickleRef;  // kObject / kCall: the BUILD argument
};

struct PickleLimits {
  // Values created (each opcode creates at most one, so a stream of N bytes never exceeds N + 3).
  size_t max_values = size_t{1} << 24;
  // Open MARKs at once: the nesting depth of tuples/lists/dicts being built.
  size_t max_marks = 4096;
  // Values on the stack at once.
  size_t max_stack = size_t{1} << 22;
};

class PickleDocument {
 public:
  PickleRef root() const { return root_; }
  const PickleNode& at(PickleRef ref) const { return nodes_[ref]; }
  size_t size() const { return nodes_.size(); }

  // For a kDict: the value of the first entry whose key is the string `key`, or kNoPickleRef.
  PickleRef DictGet(PickleRef dict, std::string_view key) const;
  // A short description for error messages, without recursion: "int 5", "string 'cpu'",
  // "tuple of 3", "global torch.FloatStorage", "object of __torch__.Net".
  std::string Describe(PickleRef ref) const;

 private:
  friend class PickleParser;
  std::vector<PickleNode> nodes_;
  PickleRef root_ = kNoPickleRef;
};

// Interprets `bytes` up to its STOP opcode (bytes after STOP are ignored, as Python does). `what` names
// the source in errors ("model.pt: model/data.pkl").
absl::StatusOr<PickleDocument> ParsePickle(std::span<const uint8_t> bytes, std::string_view what,
                                           const PickleLimits& limits = {});

}  // namespace fl::formats
