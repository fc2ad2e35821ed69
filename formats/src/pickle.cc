#include "fl/formats/pickle.h"

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

PickleRef PickleDocument::DictGet(PickleRef dict, std::string_view key) const {
  if (dict >= nodes_.size() || nodes_[dict].kind != PickleKind::kDict) return kNoPickleRef;
  const std::vector<PickleRef>& items = nodes_[dict].items;
  for (size_t i = 0; i + 1 < items.size(); i += 2) {
    const PickleNode& k = nodes_[items[i]];
    if (k.kind == PickleKind::kString && k.text == key) return items[i + 1];
  }
  return kNoPickleRef;
}

std::string PickleDocument::Describe(PickleRef ref) const {
  if (ref >= nodes_.size()) return "nothing";
  const PickleNode& n = nodes_[ref];
  auto short_text = [](const std::string& s) { return s.size() <= 60 ? s : fl::StrCat(s.substr(0, 57), "..."); };
  auto callee = [&](const PickleNode& node) -> std::string {
    if (node.items.empty() || node.items[0] >= nodes_.size()) return "?";
    const PickleNode& c = nodes_[node.items[0]];
    return c.kind == PickleKind::kGlobal ? short_text(c.text) : std::string(PickleKindName(c.kind));
  };
  switch (n.kind) {
    case PickleKind::kNone: return "None";
    case PickleKind::kBool: return n.boolean ? "True" : "False";
    case PickleKind::kInt: return fl::StrCat("int ", n.integer);
    case PickleKind::kFloat: return fl::StrCat("float ", n.real);
    case PickleKind::kString: return fl::StrCat("string '", short_text(n.text), "'");
    case PickleKind::kBytes: return fl::StrCat("bytes of length ", n.text.size());
    case PickleKind::kTuple: return fl::StrCat("tuple of ", n.items.size());
    case PickleKind::kList: return fl::StrCat("list of ", n.items.size());
    case PickleKind::kDict: return fl::StrCat("dict of ", n.items.size() / 2);
    case PickleKind::kGlobal: return fl::StrCat("global ", short_text(n.text));
    case PickleKind::kCall: return fl::StrCat("call of ", callee(n));
    case PickleKind::kObject: return fl::StrCat("object of ", callee(n));
    case PickleKind::kPersistent: return "persistent id";
  }
  return "?";
}

class PickleParser {
 public:
  PickleParser(std::span<const uint8_t> bytes, std::string_view what, const PickleLimits& limits)
      : bytes_(bytes), what_(what), limits_(limits) {}

  absl::StatusOr<PickleDocument> Run() {
    while (true) {
      if (pos_ >= bytes_.size()) {
        return absl::InvalidArgumentError(
            fl::StrCat(what_, ": pickle ends at byte ", bytes_.size(), " without a STOP opcode (truncated file?)"));
      }
      op_offset_ = pos_;
      op_ = bytes_[pos_++];
      bool stop = false;
      if (absl::Status s = Step(&stop); !s.ok()) return s;
      if (stop) return std::move(doc_);
    }
  }

 private:
  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(
        fl::StrCat(what_, ": pickle ", OpcodeLabel(op_), " at byte ", op_offset_, ": ", message));
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
  absl::Status ReadBytes(size_t n, std::string* out) {
    if (absl::Status s = Need(n); !s.ok()) return s;
    out->assign(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status ReadLine(std::string* out) {
    const size_t start = pos_;
    while (pos_ < bytes_.size() && bytes_[pos_] != '\n') ++pos_;
    if (pos_ >= bytes_.size()) return Error("line without its newline (truncated file?)");
    out->assign(reinterpret_cast<const char*>(bytes_.data() + start), pos_ - start);
    ++pos_;
    return absl::OkStatus();
  }

  // --- values and the stack ---------------------------------------------------------------------------
  absl::StatusOr<PickleRef> NewNode(PickleKind kind) {
    if (doc_.nodes_.size() >= limits_.max_values) {
      return Error(fl::StrCat("more than ", limits_.max_values, " values (file too large or hostile)"));
    }
    doc_.nodes_.emplace_back();
    doc_.nodes_.back().kind = kind;
    return static_cast<PickleRef>(doc_.nodes_.size() - 1);
  }
  PickleNode& Node(PickleRef ref) { return doc_.nodes_[ref]; }

  absl::Status Push(PickleRef ref) {
    if (stack_.size() >= limits_.max_stack) {
      return Error(fl::StrCat("more than ", limits_.max_stack, " values on the stack"));
    }
    stack_.push_back(ref);
    return absl::OkStatus();
  }
  absl::Status PushNew(PickleKind kind, PickleRef* made = nullptr) {
    absl::StatusOr<PickleRef> ref = NewNode(kind);
    if (!ref.ok()) return ref.status();
    if (made != nullptr) *made = *ref;
    return Push(*ref);
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
  absl::Status MakeTuple(std::vector<PickleRef> items) {
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(PickleKind::kTuple, &ref); !s.ok()) return s;
    Node(ref).items = std::move(items);
    return absl::OkStatus();
  }
  absl::Status PopTupleOf(size_t n) {
    if (Available() < n) return Error(fl::StrCat("stack underflow (needs ", n, " values)"));
    std::vector<PickleRef> items(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return MakeTuple(std::move(items));
  }
  absl::Status Memoize(uint64_t index) {
    PickleRef top = kNoPickleRef;
    if (absl::Status s = Top(&top); !s.ok()) return s;
    memo_[index] = top;
    return absl::OkStatus();
  }
  absl::Status Recall(uint64_t index) {
    auto it = memo_.find(index);
    if (it == memo_.end()) return Error(fl::StrCat("memo entry ", index, " was never stored"));
    return Push(it->second);
  }
  absl::Status PushInt(int64_t v) {
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(PickleKind::kInt, &ref); !s.ok()) return s;
    Node(ref).integer = v;
    return absl::OkStatus();
  }
  absl::Status PushText(PickleKind kind, size_t length) {
    std::string text;
    if (absl::Status s = ReadBytes(length, &text); !s.ok()) return s;
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(kind, &ref); !s.ok()) return s;
    Node(ref).text = std::move(text);
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
  absl::Status AppendTo(std::vector<PickleRef> values) {
    PickleRef list = kNoPickleRef;
    if (absl::Status s = Top(&list); !s.ok()) return s;
    if (Node(list).kind != PickleKind::kList) {
      return Error(fl::StrCat("appends to a ", PickleKindName(Node(list).kind), ", not a list"));
    }
    std::vector<PickleRef>& items = Node(list).items;
    items.insert(items.end(), values.begin(), values.end());
    return absl::OkStatus();
  }
  absl::Status SetItems(std::vector<PickleRef> pairs) {
    if (pairs.size() % 2 != 0)
      return Error(fl::StrCat("odd number of values (", pairs.size(), ") for key/value pairs"));
    PickleRef dict = kNoPickleRef;
    if (absl::Status s = Top(&dict); !s.ok()) return s;
    if (Node(dict).kind != PickleKind::kDict) {
      return Error(fl::StrCat("sets items of a ", PickleKindName(Node(dict).kind), ", not a dict"));
    }
    std::vector<PickleRef>& items = Node(dict).items;
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
    PickleRef ref = kNoPickleRef;
    if (absl::Status s = PushNew(kind, &ref); !s.ok()) return s;
    Node(ref).items = {callee, args};
    return absl::OkStatus();
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
        marks_.push_back(stack_.size());
        return absl::OkStatus();
      case 'c': {  // GLOBAL
        std::string module;
        std::string name;
        if (absl::Status s = ReadLine(&module); !s.ok()) return s;
        if (absl::Status s = ReadLine(&name); !s.ok()) return s;
        PickleRef ref = kNoPickleRef;
        if (absl::Status s = PushNew(PickleKind::kGlobal, &ref); !s.ok()) return s;
        Node(ref).text = fl::StrCat(module, ".", name);
        return absl::OkStatus();
      }
      case 'N': return PushNew(PickleKind::kNone);
      case 0x88:
      case 0x89: {  // NEWTRUE, NEWFALSE
        PickleRef ref = kNoPickleRef;
        if (absl::Status s = PushNew(PickleKind::kBool, &ref); !s.ok()) return s;
        Node(ref).boolean = op_ == 0x88;
        return absl::OkStatus();
      }
      case 'K':  // BININT1
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
        return PushText((op_ == 'B' || op_ == 'C') ? PickleKind::kBytes : PickleKind::kString, length);
      }
      case ')': return MakeTuple({});
      case 't': {  // TUPLE
        std::vector<PickleRef> items;
        if (absl::Status s = PopMark(&items); !s.ok()) return s;
        return MakeTuple(std::move(items));
      }
      case 0x85: return PopTupleOf(1);
      case 0x86: return PopTupleOf(2);
      case 0x87: return PopTupleOf(3);
      case ']': return PushNew(PickleKind::kList);
      case 'a': {  // APPEND
        PickleRef value = kNoPickleRef;
        if (absl::Status s = Pop(&value); !s.ok()) return s;
        return AppendTo({value});
      }
      case 'e': {  // APPENDS
        std::vector<PickleRef> values;
        if (absl::Status s = PopMark(&values); !s.ok()) return s;
        return AppendTo(std::move(values));
      }
      case '}': return PushNew(PickleKind::kDict);
      case 's': {  // SETITEM
        PickleRef value = kNoPickleRef;
        PickleRef key = kNoPickleRef;
        if (absl::Status s = Pop(&value); !s.ok()) return s;
        if (absl::Status s = Pop(&key); !s.ok()) return s;
        return SetItems({key, value});
      }
      case 'u': {  // SETITEMS
        std::vector<PickleRef> pairs;
        if (absl::Status s = PopMark(&pairs); !s.ok()) return s;
        return SetItems(std::move(pairs));
      }
      case 'q':  // BINPUT
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Memoize(ReadLE(1));
      case 'r':  // LONG_BINPUT
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Memoize(ReadLE(4));
      case 0x94:  // MEMOIZE
        return Memoize(memo_.size());
      case 'h':  // BINGET
        if (absl::Status s = Need(1); !s.ok()) return s;
        return Recall(ReadLE(1));
      case 'j':  // LONG_BINGET
        if (absl::Status s = Need(4); !s.ok()) return s;
        return Recall(ReadLE(4));
      case 'Q': {  // BINPERSID
        PickleRef pid = kNoPickleRef;
        if (absl::Status s = Pop(&pid); !s.ok()) return s;
        PickleRef ref = kNoPickleRef;
        if (absl::Status s = PushNew(PickleKind::kPersistent, &ref); !s.ok()) return s;
        Node(ref).items = {pid};
        return absl::OkStatus();
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
  size_t pos_ = 0;
  size_t op_offset_ = 0;
  uint8_t op_ = 0;
  PickleDocument doc_;
  std::vector<PickleRef> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleRef> memo_;
};

absl::StatusOr<PickleDocument> ParsePickle(std::span<const uint8_t> bytes, std::string_view what,
                                           const PickleLimits& limits) {
  return PickleParser(bytes, what, limits).Run();
}

}  // namespace fl::formats
