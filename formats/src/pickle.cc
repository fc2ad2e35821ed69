#include "fl/formats/pickle.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"

namespace fl::formats {
namespace {

// Every opcode of pickle protocols 0-5 (Lib/pickletools.py), so that a refusal names what it saw.
std::string_view OpcodeName(uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return "";
  }
}

std::string OpcodeLabel(uint8_t op) {
  std::string_view name = OpcodeName(op);
  std::string byte = (op >= 0x20 && op < 0x7f) ? absl::StrFormat("'%c'", op) : absl::StrFormat("0x%02x", op);
  if (name.empty()) return fl::StrCat("unknown opcode ", byte);
  return fl::StrCat("opcode ", byte, " (", name, ")");
}

}  // namespace

std::string_view PickleKindName(PickleKind kind) {
  switch (kind) {
    case PickleKind::kNone: return "None";
    case PickleKind::kBool: return "bool";
    case PickleKind::kInt: return "int";
    case PickleKind::kFloat: return "float";
    case PickleKind::kString: return "string";
    case PickleKind::kBytes: return "bytes";
    case PickleKind::kTuple: return "tuple";
    case PickleKind::kList: return "list";
    case PickleKind::kDict: return "dict";
    case PickleKind::kGlobal: return "global";
    case PickleKind::kCall: return "call";
    case PickleKind::kObject: return "object";
    case PickleKind::kPersistent: return "persistent id";
  }
  return "?";
}

namespace {
bool HasText(PickleKind kind) {
  return kind == PickleKind::kString || kind == PickleKind::kBytes || kind == PickleKind::kGlobal;
}
bool HasItems(PickleKind kind) {
  return kind == PickleKind::kTuple || kind == PickleKind::kList || kind == PickleKind::kDict ||
         kind == PickleKind::kCall || kind == PickleKind::kObject || kind == PickleKind::kPersistent;
}
}  // namespace

std::string_view PickleDocument::text(PickleRef ref) const {
  if (ref >= nodes_.size() || !HasText(nodes_[ref].kind)) return {};
  return std::string_view(text_).substr(nodes_[ref].slot, nodes_[ref].length);
}

std::span<const PickleRef> PickleDocument::items(PickleRef ref) const {
  if (ref >= nodes_.size() || !HasItems(nodes_[ref].kind)) return {};
  return lists_[nodes_[ref].slot];
}

PickleRef PickleDocument::DictGet(PickleRef dict, std::string_view key) const {
  if (dict >= nodes_.size() || nodes_[dict].kind != PickleKind::kDict) return kNoPickleRef;
  std::span<const PickleRef> entries = items(dict);
  for (size_t i = 0; i + 1 < entries.size(); i += 2) {
    if (nodes_[entries[i]].kind == PickleKind::kString && text(entries[i]) == key) return entries[i + 1];
  }
  return kNoPickleRef;
}

std::string PickleDocument::Describe(PickleRef ref) const {
  if (ref >= nodes_.size()) return "nothing";
  const PickleNode& n = nodes_[ref];
  auto short_text = [](std::string_view s) {
    return s.size() <= 60 ? std::string(s) : fl::StrCat(s.substr(0, 57), "...");
  };
  auto callee = [&](PickleRef node) -> std::string {
    std::span<const PickleRef> of = items(node);
    if (of.empty() || of[0] >= nodes_.size()) return "?";
    const PickleNode& c = nodes_[of[0]];
    return c.kind == PickleKind::kGlobal ? short_text(text(of[0])) : std::string(PickleKindName(c.kind));
  };
  switch (n.kind) {
    case PickleKind::kNone: return "None";
    case PickleKind::kBool: return n.boolean ? "True" : "False";
    case PickleKind::kInt: return fl::StrCat("int ", n.integer);
    case PickleKind::kFloat: return fl::StrCat("float ", n.real);
    case PickleKind::kString: return fl::StrCat("string '", short_text(text(ref)), "'");
    case PickleKind::kBytes: return fl::StrCat("bytes of length ", n.length);
    case PickleKind::kTuple: return fl::StrCat("tuple of ", items(ref).size());
    case PickleKind::kList: return fl::StrCat("list of ", items(ref).size());
    case PickleKind::kDict: return fl::StrCat("dict of ", items(ref).size() / 2);
    case PickleKind::kGlobal: return fl::StrCat("global ", short_text(text(ref)));
    case PickleKind::kCall: return fl::StrCat("call of ", callee(ref));
    case PickleKind::kObject: return fl::StrCat("object of ", callee(ref));
    case PickleKind::kPersistent: return "persistent id";
  }
  return "?";
}

class PickleParser {
 public:
  PickleParser(std::span<const uint8_t> bytes, std::string_view what, const PickleLimits& limits)
      : bytes_(bytes), what_(what), limits_(limits) {
    const size_t proportional = limits.memory_per_byte * bytes.size() + (size_t{1} << 20);
    budget_ = std::min(limits.max_memory_bytes, proportional);
    small_ints_.fill(kNoPickleRef);
  }

  absl::StatusOr<PickleDocument> Run() {
    if (bytes_.size() >= (size_t{1} << 31)) {
      return absl::InvalidArgumentError(
          fl::StrCat(what_, ": pickle of ", bytes_.size(), " bytes is over the limit of 2^31 bytes"));
    }
    while (true) {
      if (pos_ >= bytes_.size()) {
        return absl::InvalidArgumentError(
            fl::StrCat(what_, ": pickle ends at byte ", bytes_.size(), " without a STOP opcode (truncated file?)"));
      }
      op_offset_ = pos_;
      op_ = bytes_[pos_++];
      bool stop = false;
      if (absl::Status s = Step(&stop); !s.ok()) return s;
      if (stop) {
        doc_.memory_bytes_ = accounted_;
        return std::move(doc_);
      }
    }
  }

 private:
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(
        fl::StrCat(what_, ": pickle ", OpcodeLabel(op_), " at byte ", op_offset_, ": ", message));
  }

  // --- memory ------------------------------------------------------------------------------------------
  // Every growing buffer grows through here: the new capacity is accounted, and refused over the budget,
  // before it is allocated. Doubling keeps the amortised cost linear.
  absl::Status Account(size_t bytes) {
    if (bytes > budget_ - accounted_) {
      return Error(fl::StrCat("the pickle's values would take more than ", budget_, " bytes of memory (", bytes_.size(),
                              " bytes of pickle; the limit is min(", limits_.max_memory_bytes, ", ",
                              limits_.memory_per_byte,
                              " bytes per byte of pickle + 1 MiB)): not a pickle LibTorch writes for a model"));
    }
    accounted_ += bytes;
    return absl::OkStatus();
  }
  template <typename Vector>
  absl::Status Reserve(Vector& v, size_t more) {
    const size_t need = v.size() + more;
    if (need <= v.capacity()) return absl::OkStatus();
    const size_t grown = std::max({need, v.capacity() * 2, size_t{16}});
    if (absl::Status s = Account((grown - v.capacity()) * sizeof(typename Vector::value_type)); !s.ok()) return s;
    v.reserve(grown);
    return absl::OkStatus();
  }

  // --- reading operands -------------------------------------------------------------------------------
  absl::Status Need(size_t n) const {
    if (bytes_.size() - pos_ < n) {
      return Error(fl::StrCat("needs ", n, " more bytes but the pickle ends ", bytes_.size() - pos_,
                              " bytes later (truncated file?)"));
    }
    return absl::OkStatus();
  }
  uint64_t ReadLE(size_t n) {  // caller checked Need(n)
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{bytes_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  absl::Status ReadLine(std::string_view* out) {
    const size_t start = pos_;
    while (pos_ < bytes_.size() && bytes_[pos_] != '\n') ++pos_;
    if (pos_ >= bytes_.size()) return Error("line without its newline (truncated file?)");
    *out = std::string_view(reinterpret_cast<const char*>(bytes_.data() + start), pos_ - start);
    ++pos_;
    return absl::OkStatus();
  }

  // --- values and the stack ---------------------------------------------------------------------------
  absl::StatusOr<PickleRef> NewNode(PickleKind kind) {
    if (doc_.nodes_.size() >= limits_.max_values) {
      return Error(fl::StrCat("more than ", limits_.max_values, " values (file too large or hostile)"));
    }
    if (absl::Status s = Reserve(doc_.nodes_, 1); !s.ok()) return s;
    doc_.nodes_.emplace_back();
    doc_.nodes_.back().kind = kind;
    return static_cast<PickleRef>(doc_.nodes_.size() - 1);
  }
  PickleNode& Node(PickleRef ref) { return doc_.nodes_[ref]; }
  std::vector<PickleRef>& ItemsOf(PickleRef ref) { return doc_.lists_[Node(ref).slot]; }

  // A value holding `text` in the document's text buffer.
  absl::Status PushText(PickleKind kind, std::string_view a, std::string_view b = {}, std::string_view sep = {}) {
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(kind, &ref); !s.ok()) return s;
    const size_t length = a.size() + sep.size() + b.size();
    if (absl::Status s = Reserve(doc_.text_, length); !s.ok()) return s;
    Node(ref).slot = static_cast<uint32_t>(doc_.text_.size());
    Node(ref).length = static_cast<uint32_t>(length);
    doc_.text_.append(a).append(sep).append(b);
    return absl::OkStatus();
  }
  // A container value owning `items`.
  absl::Status PushContainer(PickleKind kind, std::vector<PickleRef> items, PickleRef* made = nullptr) {
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(kind, &ref); !s.ok()) return s;
    if (absl::Status s = Reserve(doc_.lists_, 1); !s.ok()) return s;
    if (absl::Status s = Account(items.capacity() * sizeof(PickleRef)); !s.ok()) return s;
    Node(ref).slot = static_cast<uint32_t>(doc_.lists_.size());
    doc_.lists_.push_back(std::move(items));
    if (made != nullptr) *made = ref;
    return absl::OkStatus();
  }

  absl::Status Push(PickleRef ref) {
    if (stack_.size() >= limits_.max_stack) {
      return Error(fl::StrCat("more than ", limits_.max_stack, " values on the stack"));
    }
    if (absl::Status s = Reserve(stack_, 1); !s.ok()) return s;
    stack_.push_back(ref);
    return absl::OkStatus();
  }
  absl::Status PushNew(PickleKind kind, PickleRef* made = nullptr) {
    absl::StatusOr<PickleRef> ref = NewNode(kind);
    if (!ref.ok()) return ref.status();
    if (made != nullptr) *made = *ref;
    return Push(*ref);
  }
  // None, True, False, () and the integers 0..255: made once, shared (immutable values).
  absl::Status PushShared(PickleRef* slot, PickleKind kind, bool boolean, int64_t integer) {
    if (*slot == kNoPickleRef) {
      if (kind == PickleKind::kTuple) {
        PickleRef ref = kNoPickleRef;
        if (absl::Status s = PushContainer(kind, {}, &ref); !s.ok()) return s;
        *slot = ref;
        return absl::OkStatus();
      }
      if (absl::Status s = PushNew(kind, slot); !s.ok()) return s;
      Node(*slot).boolean = boolean;
      Node(*slot).integer = integer;
      return absl::OkStatus();
    }
    return Push(*slot);
  }
  // Values above the innermost MARK: what an opcode may pop.
  size_t Available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }
  absl::Status Pop(PickleRef* out) {
    if (Available() == 0) {
      return Error(stack_.empty() ? "stack underflow (the stack is empty)"
                                  : "stack underflow (nothing above the last MARK)");
    }
    *out = stack_.back();
    stack_.pop_back();
    return absl::OkStatus();
  }
  absl::Status Top(PickleRef* out) const {
    if (Available() == 0) return Error("stack underflow (nothing to act on)");
    *out = stack_.back();
    return absl::OkStatus();
  }
  // Pops everything above the innermost MARK and the MARK itself.
  absl::Status PopMark(std::vector<PickleRef>* out) {
    if (marks_.empty()) return Error("no MARK to pop to");
    const size_t at = marks_.back();
    marks_.pop_back();
    out->assign(stack_.begin() + static_cast<std::ptrdiff_t>(at), stack_.end());
    stack_.resize(at);
    return absl::OkStatus();
  }
  absl::Status PopTupleOf(size_t n) {
    if (Available() < n) return Error(fl::StrCat("stack underflow (needs ", n, " values)"));
    std::vector<PickleRef> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return PushContainer(PickleKind::kTuple, std::move(items));
  }
  absl::Status Memoize(uint64_t index) {
    PickleRef top = kNoPickleRef;
    if (absl::Status s = Top(&top); !s.ok()) return s;
    if (index < memo_.size()) {
      memo_[index] = top;
    } else if (index == memo_.size()) {
      if (absl::Status s = Reserve(memo_, 1); !s.ok()) return s;
      memo_.push_back(top);
    } else {
      // An id that skips ahead (never written by Python's or LibTorch's pickler, which number them in order).
      constexpr size_t kSparseEntryBytes = 64;  // an unordered_map node and its bucket
      if (sparse_memo_.find(index) == sparse_memo_.end()) {
        if (absl::Status s = Account(kSparseEntryBytes); !s.ok()) return s;
      }
      sparse_memo_[index] = top;
    }
    return absl::OkStatus();
  }
  absl::Status Recall(uint64_t index) {
    if (index < memo_.size()) return Push(memo_[index]);
    auto it = sparse_memo_.find(index);
    if (it == sparse_memo_.end()) return Error(fl::StrCat("memo entry ", index, " was never stored"));
    return Push(it->second);
  }
  absl::Status PushInt(int64_t v) {
    if (v >= 0 && v < static_cast<int64_t>(small_ints_.size())) {
      return PushShared(&small_ints_[static_cast<size_t>(v)], PickleKind::kInt, false, v);
    }
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(PickleKind::kInt, &ref); !s.ok()) return s;
    Node(ref).integer = v;
    return absl::OkStatus();
  }
  absl::Status TextLength(size_t width, size_t* length) {
    if (absl::Status s = Need(width); !s.ok()) return s;
    const uint64_t n = ReadLE(width);
    if (n > bytes_.size() - pos_) {
      return Error(
          fl::StrCat("length ", n, " exceeds the ", bytes_.size() - pos_, " bytes left (truncated or corrupt)"));
    }
    *length = static_cast<size_t>(n);
    return absl::OkStatus();
  }
  // Appends `values` to the list at stack top (APPEND, APPENDS).
  absl::Status AppendTo(std::span<const PickleRef> values) {
    PickleRef list = kNoPickleRef;
    if (absl::Status s = Top(&list); !s.ok()) return s;
    if (Node(list).kind != PickleKind::kList) {
      return Error(fl::StrCat("appends to a ", PickleKindName(Node(list).kind), ", not a list"));
    }
    std::vector<PickleRef>& items = ItemsOf(list);
    if (absl::Status s = Reserve(items, values.size()); !s.ok()) return s;
    items.insert(items.end(), values.begin(), values.end());
    return absl::OkStatus();
  }
  absl::Status SetItems(std::span<const PickleRef> pairs) {
    if (pairs.size() % 2 != 0)
      return Error(fl::StrCat("odd number of values (", pairs.size(), ") for key/value pairs"));
    PickleRef dict = kNoPickleRef;
    if (absl::Status s = Top(&dict); !s.ok()) return s;
    if (Node(dict).kind != PickleKind::kDict) {
      return Error(fl::StrCat("sets items of a ", PickleKindName(Node(dict).kind), ", not a dict"));
    }
    std::vector<PickleRef>& items = ItemsOf(dict);
    if (absl::Status s = Reserve(items, pairs.size()); !s.ok()) return s;
    items.insert(items.end(), pairs.begin(), pairs.end());
    return absl::OkStatus();
  }
  // REDUCE and NEWOBJ: callable/class and an argument tuple become one inert node.
  absl::Status Apply(PickleKind kind) {
    PickleRef args = kNoPickleRef;
    PickleRef callee = kNoPickleRef;
    if (absl::Status s = Pop(&args); !s.ok()) return s;
    if (absl::Status s = Pop(&callee); !s.ok()) return s;
    if (Node(args).kind != PickleKind::kTuple) {
      return Error(fl::StrCat("arguments are a ", PickleKindName(Node(args).kind), ", not a tuple"));
    }
    return PushContainer(kind, {callee, args});
  }

  absl::Status Step(bool* stop) {
    switch (op_) {
      case 0x80: {  // PROTO
        if (absl::Status s = Need(1); !s.ok()) return s;
        const uint64_t version = ReadLE(1);
        if (version > 5) return Error(fl::StrCat("protocol ", version, " is newer than 5"));
        return absl::OkStatus();
      }
      case '.': {  // STOP
        if (!marks_.empty()) return Error(fl::StrCat(marks_.size(), " MARK(s) left open at STOP"));
        if (stack_.size() != 1) {
          return Error(fl::StrCat("STOP with ", stack_.size(), " values on the stack (expected exactly one)"));
        }
        doc_.root_ = stack_.back();
        *stop = true;
        return absl::OkStatus();
      }
      case '(':  // MARK
        if (marks_.size() >= limits_.max_marks) {
          return Error(fl::StrCat("more than ", limits_.max_marks, " nested MARKs (structure too deep)"));
        }
        if (absl::Status s = Reserve(marks_, 1); !s.ok()) return s;
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case 'c': {  // GLOBAL
        std::string_view module;
        std::string_view name;
        if (absl::Status s = ReadLine(&module); !s.ok()) return s;
        if (absl::Status s = ReadLine(&name); !s.ok()) return s;
        return PushText(PickleKind::kGlobal, module, name, ".");
      }
      case 'N': return PushShared(&none_, PickleKind::kNone, false, 0);
      case 0x88: return PushShared(&true_, PickleKind::kBool, true, 0);    // NEWTRUE
      case 0x89: return PushShared(&false_, PickleKind::kBool, false, 0);  // NEWFALSE
      case 'K':                                                            // BININT1
        if (absl::Status s = Need(1); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(ReadLE(1)));
      case 'M':  // BININT2
        if (absl::Status s = Need(2); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(ReadLE(2)));
      case 'J':  // BININT: signed 32-bit
        if (absl::Status s = Need(4); !s.ok()) return s;
        return PushInt(static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(ReadLE(4)))));
      case 0x8a: {  // LONG1: n-byte little-endian two's complement
        if (absl::Status s = Need(1); !s.ok()) return s;
        const size_t n = static_cast<size_t>(ReadLE(1));
        if (n > 8) return Error(fl::StrCat("integer of ", n, " bytes does not fit in 64 bits"));
        if (absl::Status s = Need(n); !s.ok()) return s;
        uint64_t v = ReadLE(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        return PushInt(static_cast<int64_t>(v));
      }
      case 'G': {  // BINFLOAT: big-endian IEEE double
        if (absl::Status s = Need(8); !s.ok()) return s;
        uint64_t bits = 0;
        for (int i = 0; i < 8; ++i) bits = (bits << 8) | bytes_[pos_ + static_cast<size_t>(i)];
        pos_ += 8;
        PickleRef ref = kNoPickleRef;
        if (absl::Status s = PushNew(PickleKind::kFloat, &ref); !s.ok()) return s;
        Node(ref).real = std::bit_cast<double>(bits);
        return absl::OkStatus();
      }
      case 'X':    // BINUNICODE
      case 'T':    // BINSTRING
      case 'U':    // SHORT_BINSTRING
      case 0x8c:   // SHORT_BINUNICODE
      case 'B':    // BINBYTES
      case 'C': {  // SHORT_BINBYTES
        const size_t width = (op_ == 'U' || op_ == 0x8c || op_ == 'C') ? 1 : 4;
        size_t length = 0;
        if (absl::Status s = TextLength(width, &length); !s.ok()) return s;
        const std::string_view text(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
        pos_ += length;
        return PushText((op_ == 'B' || op_ == 'C') ? PickleKind::kBytes : PickleKind::kString, text);
      }
      case ')': return PushShared(&empty_tuple_, PickleKind::kTuple, false, 0);
      case 't': {  // TUPLE
        std::vector<PickleRef> items;
        if (absl::Status s = PopMark(&items); !s.ok()) return s;
        return PushContainer(PickleKind::kTuple, std::move(items));
      }
      case 0x85: return PopTupleOf(1);
      case 0x86: return PopTupleOf(2);
      case 0x87: return PopTupleOf(3);
      case ']': return PushContainer(PickleKind::kList, {});
      case 'a': {  // APPEND
        PickleRef value = kNoPickleRef;
        if (absl::Status s = Pop(&value); !s.ok()) return s;
        return AppendTo(std::span<const PickleRef>(&value, 1));
      }
      case 'e': {  // APPENDS
        std::vector<PickleRef> values;
        if (absl::Status s = PopMark(&values); !s.ok()) return s;
        return AppendTo(values);
      }
      case '}': return PushContainer(PickleKind::kDict, {});
      case 's': {  // SETITEM
        PickleRef pair[2] = {kNoPickleRef, kNoPickleRef};
        if (absl::Status s = Pop(&pair[1]); !s.ok()) return s;
        if (absl::Status s = Pop(&pair[0]); !s.ok()) return s;
        return SetItems(pair);
      }
      case 'u': {  // SETITEMS
        std::vector<PickleRef> pairs;
        if (absl::Status s = PopMark(&pairs); !s.ok()) return s;
        return SetItems(pairs);
      }
      case 'q':  // BINPUT
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Memoize(ReadLE(1));
      case 'r':  // LONG_BINPUT
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Memoize(ReadLE(4));
      case 0x94:  // MEMOIZE
        return Memoize(memo_.size() + sparse_memo_.size());
      case 'h':  // BINGET
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Recall(ReadLE(1));
      case 'j':  // LONG_BINGET
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Recall(ReadLE(4));
      case 'Q': {  // BINPERSID
        PickleRef pid = kNoPickleRef;
        if (absl::Status s = Pop(&pid); !s.ok()) return s;
        return PushContainer(PickleKind::kPersistent, {pid});
      }
      case 'R': return Apply(PickleKind::kCall);
      case 0x81: return Apply(PickleKind::kObject);
      case 'b': {  // BUILD
        PickleRef state = kNoPickleRef;
        PickleRef target = kNoPickleRef;
        if (absl::Status s = Pop(&state); !s.ok()) return s;
        if (absl::Status s = Top(&target); !s.ok()) return s;
        PickleNode& t = Node(target);
        if (t.kind != PickleKind::kObject && t.kind != PickleKind::kCall) {
          return Error(fl::StrCat("builds a ", PickleKindName(t.kind), ", not an object"));
        }
        if (t.state != kNoPickleRef) return Error("builds the same object twice");
        t.state = state;
        return absl::OkStatus();
      }
      default:
        return Error(OpcodeName(op_).empty() ? "not a pickle opcode (corrupt file?)"
                                             : "not supported by this reader (not written by LibTorch)");
    }
  }

  std::span<const uint8_t> bytes_;
  std::string_view what_;
  PickleLimits limits_;
  size_t budget_ = 0;     // bytes of memory this parse may account
  size_t accounted_ = 0;  // bytes accounted so far (capacities of every buffer below and in doc_)
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  uint8_t op_ = 0;
  PickleDocument doc_;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::vector<PickleRef> memo_;  // dense: ids 0, 1, 2... as picklers write them
  std::unordered_map<uint64_t, PickleRef> sparse_memo_;
  PickleRef none_ = kNoPickleRef;
  PickleRef true_ = kNoPickleRef;
  PickleRef false_ = kNoPickleRef;
  PickleRef empty_tuple_ = kNoPickleRef;
  std::array<PickleRef, 256> small_ints_{};
};

absl::StatusOr<PickleDocument> ParsePickle(std::span<const uint8_t> bytes, std::string_view what,
                                           const PickleLimits& limits) {
  return PickleParser(bytes, what, limits).Run();
}

}  // namespace fl::formats
