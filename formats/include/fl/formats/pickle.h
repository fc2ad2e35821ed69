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
// a container contain itself cannot leak or overflow the C++ stack here. None, True, False, the empty tuple and
// the integers 0..255 are shared values (immutable in Python too), so a list of 2^24 Nones costs its item list
// only; the memo is a dense array (MEMOIZE and the sequential ids picklers write), a map only for ids that skip.
// Consumers that walk the values recursively must bound their depth themselves (cycles are legal pickle).
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

// 32 bytes a value: a pickle is read into an arena of these, with strings in one text buffer and the items of
// containers in their own lists, so that memory per value is small and accounted (PickleLimits).
struct PickleNode {
  PickleKind kind = PickleKind::kNone;
  bool boolean = false;
  PickleRef state = kNoPickleRef;  // kObject / kCall: the BUILD argument
  int64_t integer = 0;
  double real = 0;
  uint32_t slot = 0;    // kString/kBytes/kGlobal: offset in the text buffer; containers: index of the item list
  uint32_t length = 0;  // kString/kBytes/kGlobal: text length
};

// Bounds on what one pickle may cost. A stream of N bytes makes at most N values (each opcode at most one), and
// memory is accounted as values are made (nodes, text, item lists, memo, stack): a pickle whose values would
// take more than min(max_memory_bytes, memory_per_byte * N + 1 MiB) is refused when it gets there, before
// the memory is spent. Real LibTorch pickles take about 10-15 bytes of memory per byte of pickle.
struct PickleLimits {
  size_t max_values = size_t{1} << 24;
  // Open MARKs at once: the nesting depth of tuples/lists/dicts being built.
  size_t max_marks = 4096;
  // Values on the stack at once.
  size_t max_stack = size_t{1} << 22;
  size_t max_memory_bytes = size_t{512} << 20;
  size_t memory_per_byte = 24;
};

class PickleDocument {
 public:
  PickleRef root() const { return root_; }
  const PickleNode& at(PickleRef ref) const { return nodes_[ref]; }
  size_t size() const { return nodes_.size(); }
  // kString/kBytes: the bytes as written; kGlobal: "module.name"; other kinds: empty.
  std::string_view text(PickleRef ref) const;
  // Containers (tuple, list, dict: key, value, ...), kCall/kObject ({callable, args}), kPersistent ({id});
  // other kinds: empty.
  std::span<const PickleRef> items(PickleRef ref) const;
  // The memory the document and its parse were accounted (bytes).
  size_t memory_bytes() const { return memory_bytes_; }

  // For a kDict: the value of the first entry whose key is the string `key`, or kNoPickleRef.
  PickleRef DictGet(PickleRef dict, std::string_view key) const;
  // A short description for error messages, without recursion: "int 5", "string 'cpu'",
  // "tuple of 3", "global torch.FloatStorage", "object of __torch__.Net".
  std::string Describe(PickleRef ref) const;

 private:
  friend class PickleParser;
  std::vector<PickleNode> nodes_;
  std::string text_;
  std::vector<std::vector<PickleRef>> lists_;
  PickleRef root_ = kNoPickleRef;
  size_t memory_bytes_ = 0;
};

// Interprets `bytes` up to its STOP opcode (bytes after STOP are ignored, as Python does). `what` names
// the source in errors ("model.pt: model/data.pkl"). Pickles of 2^31 bytes or more are refused.
absl::StatusOr<PickleDocument> ParsePickle(std::span<const uint8_t> bytes, std::string_view what,
                                           const PickleLimits& limits = {});

}  // namespace fl::formats
