#include "fl/formats/npy.h"

#include <errno.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::formats {
namespace {

// Headers are a few hundred bytes; anything near this is not an array numpy wrote.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;
// Nesting of tuples/lists in a header: numpy writes one level (the shape tuple); a structured descr's lists are
// skipped without recursion. The parser recurses per level, so a header of 65,000 '(' would overflow the stack.
constexpr int kMaxHeaderNesting = 16;
// A whole .npy read into memory (LoadNpy): a stated bound; data sets of this testbed are far smaller, and
// clients read their rows of an .npz (NpzFile::ReadRows) instead.
constexpr uint64_t kMaxNpyFileBytes = uint64_t{16} << 30;

struct DTypeInfo {
  DType dtype;
  char kind;  // numpy's kind character: b, i, u, f
  size_t size;
  std::string_view name;
  std::string_view descr;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kBool, 'b', 1, "bool", "|b1"},       {DType::kInt8, 'i', 1, "int8", "|i1"},
    {DType::kUInt8, 'u', 1, "uint8", "|u1"},     {DType::kInt16, 'i', 2, "int16", "<i2"},
    {DType::kUInt16, 'u', 2, "uint16", "<u2"},   {DType::kInt32, 'i', 4, "int32", "<i4"},
    {DType::kUInt32, 'u', 4, "uint32", "<u4"},   {DType::kInt64, 'i', 8, "int64", "<i8"},
    {DType::kUInt64, 'u', 8, "uint64", "<u8"},   {DType::kFloat16, 'f', 2, "float16", "<f2"},
    {DType::kFloat32, 'f', 4, "float32", "<f4"}, {DType::kFloat64, 'f', 8, "float64", "<f8"},
};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

// A Python literal as numpy writes it in a header: a string, a bool, None, an integer or a tuple.
struct Value {
  enum Kind { kString, kBool, kNone, kInt, kTuple } kind = kNone;
  std::string text;
  bool boolean = false;
  uint64_t integer = 0;
  std::vector<Value> items;
};

// Recursive descent over the dict literal: {'key': value, ...}. Returns an error message, or "".
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}

  std::string ParseDict(std::vector<std::pair<std::string, Value>>& out) {
    SkipSpace();
    if (!Eat('{')) return "it does not start with '{'";
    for (;;) {
      SkipSpace();
      if (Eat('}')) break;
      Value key;
      if (auto error = ParseValue(key, 1); !error.empty()) return error;
      if (key.kind != Value::kString) return "a key is not a string";
      SkipSpace();
      if (!Eat(':')) return "expected ':' after key '" + key.text + "'";
      Value value;
      if (auto error = ParseValue(value, 1); !error.empty()) return error;
      out.emplace_back(key.text, std::move(value));
      SkipSpace();
      if (Eat(',')) continue;
      SkipSpace();
      if (Eat('}')) break;
      return "expected ',' or '}' after the value of '" + key.text + "'";
    }
    SkipSpace();
    if (pos_ != text_.size()) return "unexpected text after the closing '}'";
    return "";
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool EatWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) == word) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  std::string ParseValue(Value& value, int depth) {
    if (depth > kMaxHeaderNesting) {
      return "tuples nested more than " + std::to_string(kMaxHeaderNesting) + " deep";
    }
    SkipSpace();
    if (pos_ >= text_.size()) return "it ends early";
    const char c = text_[pos_];
    if (c == '\'' || c == '"') {
      ++pos_;
      value.kind = Value::kString;
      while (pos_ < text_.size() && text_[pos_] != c) {
        if (text_[pos_] == '\\') return "escapes in strings are not supported";
        value.text.push_back(text_[pos_++]);
      }
      if (!Eat(c)) return "a string is not terminated";
      return "";
    }
    if (c == '(') {
      ++pos_;
      value.kind = Value::kTuple;
      for (;;) {
        SkipSpace();
        if (Eat(')')) return "";
        Value item;
        if (auto error = ParseValue(item, depth + 1); !error.empty()) return error;
        value.items.push_back(std::move(item));
        SkipSpace();
        if (Eat(',')) continue;
        SkipSpace();
        if (Eat(')')) return "";
        return "expected ',' or ')' in a tuple";
      }
    }
    if (c == '[') {
      value.kind = Value::kNone;
      value.text = "list";
      // A list is only valid as a structured dtype's descr: skip it so that the caller can say so.
      int open = 0;
      for (; pos_ < text_.size(); ++pos_) {
        if (text_[pos_] == '[') ++open;
        if (text_[pos_] == ']' && --open == 0) {
          ++pos_;
          return "";
        }
      }
      return "a list is not terminated";
    }
    if (EatWord("True")) {
      value.kind = Value::kBool;
      value.boolean = true;
      return "";
    }
    if (EatWord("False")) {
      value.kind = Value::kBool;
      return "";
    }
    if (EatWord("None")) {
      value.kind = Value::kNone;
      return "";
    }
    if (c >= '0' && c <= '9') {
      value.kind = Value::kInt;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        const uint64_t digit = static_cast<uint64_t>(text_[pos_] - '0');
        if (value.integer > (std::numeric_limits<uint64_t>::max() - digit) / 10) return "an integer is too large";
        value.integer = value.integer * 10 + digit;
        ++pos_;
      }
      Eat('L');  // Python 2 long literals, in files written by old numpy versions
      return "";
    }
    return std::string("unexpected character '") + c + "'";
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// The dtype of a descr, or an error saying what to do instead.
absl::StatusOr<DType> ParseDescr(std::string_view descr, std::string_view name) {
  if (descr.size() >= 2) {
    const char order = descr[0];
    const char kind = descr[1];
    const std::string_view size_text = descr.substr(2);
    size_t size = 0;
    bool size_ok = !size_text.empty() && size_text.size() <= 2;
    for (char c : size_text) {
      if (c < '0' || c > '9') size_ok = false;
      size = size * 10 + static_cast<size_t>(c - '0');
    }
    if (kind == 'O') {
      return absl::InvalidArgumentError(
          fl::StrCat(name, ": dtype '", descr,
                     "' is an object array (Python objects, readable only with pickle); store numbers instead, e.g. "
                     "np.asarray(a, dtype=np.float32), and save without allow_pickle"));
    }
    if (size_ok && (order == '<' || order == '|' || order == '>' || order == '=')) {
      for (const DTypeInfo& info : kDTypes) {
        if (info.kind != kind || info.size != size) continue;
        if (order == '>' && size > 1) {
          return absl::InvalidArgumentError(fl::StrCat(
              name, ": dtype '", descr, "' is big-endian; only little-endian arrays are read: save a.astype('<",
              std::string(1, kind), size, "') instead"));
        }
        // '=' (native) never appears in files numpy writes (it writes '<' or '>'), and the other orders
        // mean nothing for one-byte types.
        if (order == '=' && size > 1) break;
        return info.dtype;
      }
    }
  }
  return absl::InvalidArgumentError(
      fl::StrCat(name, ": dtype '", descr,
                 "' is not supported; arrays of bool, int8/16/32/64, uint8/16/32/64 or float16/32/64 are read: convert "
                 "with a.astype(np.float32) (features, targets) or a.astype(np.int64) (labels, tokens)"));
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
std::string_view DTypeDescr(DType dtype) { return Info(dtype).descr; }
size_t DTypeSize(DType dtype) { return Info(dtype).size; }
bool IsFloatingPoint(DType dtype) { return Info(dtype).kind == 'f'; }
bool IsInteger(DType dtype) { return Info(dtype).kind == 'i' || Info(dtype).kind == 'u'; }

uint64_t NpyHeader::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

uint64_t NpyHeader::row_elements() const {
  uint64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string NpyHeader::ShapeString() const {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1) text += ",";
  return text + ")";
}

absl::StatusOr<uint64_t> NpyHeaderSize(std::span<const uint8_t> preamble, std::string_view name) {
  if (preamble.size() < 10 || std::memcmp(preamble.data(), kNpyMagic.data(), kNpyMagic.size()) != 0) {
    return absl::InvalidArgumentError(
        fl::StrCat(name, " is not a NumPy .npy array (no \\x93NUMPY magic); write it with np.save or np.savez"));
  }
  const uint8_t major = preamble[6];
  if (major == 1) return uint64_t{10} + (preamble[8] | (uint64_t{preamble[9]} << 8));
  if (major == 2 || major == 3) {
    if (preamble.size() < kNpyPreambleBytes) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": truncated .npy header"));
    }
    const uint64_t length =
        preamble[8] | (uint64_t{preamble[9]} << 8) | (uint64_t{preamble[10]} << 16) | (uint64_t{preamble[11]} << 24);
    if (length > kMaxHeaderBytes) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": .npy header of ", length, " bytes is implausibly large"));
    }
    return 12 + length;
  }
  return absl::InvalidArgumentError(fl::StrCat(name, ": .npy format version ", static_cast<int>(major), ".",
                                               static_cast<int>(preamble[7]),
                                               " is not supported (1.0, 2.0 and 3.0 are); save it with this numpy"));
}

absl::StatusOr<NpyHeader> ParseNpyHeader(std::span<const uint8_t> bytes, std::string_view name) {
  auto size = NpyHeaderSize(bytes, name);
  if (!size.ok()) return size.status();
  if (bytes.size() < *size) {
    return absl::InvalidArgumentError(
        fl::StrCat(name, ": truncated .npy header (", bytes.size(), " of ", *size, " bytes)"));
  }
  NpyHeader header;
  header.major_version = bytes[6];
  header.minor_version = bytes[7];
  header.data_offset = *size;
  const size_t dict_start = header.major_version == 1 ? 10 : 12;
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + dict_start, *size - dict_start);
  std::vector<std::pair<std::string, Value>> dict;
  if (auto error = HeaderParser(text).ParseDict(dict); !error.empty()) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": the .npy header is not the dict numpy writes (", error,
                                                 "): ", text.substr(0, 200), text.size() > 200 ? "..." : ""));
  }
  const Value* descr = nullptr;
  const Value* fortran = nullptr;
  const Value* shape = nullptr;
  for (const auto& [key, value] : dict) {
    if (key == "descr") descr = &value;
    if (key == "fortran_order") fortran = &value;
    if (key == "shape") shape = &value;
  }
  if (descr == nullptr || fortran == nullptr || shape == nullptr) {
    return absl::InvalidArgumentError(
        fl::StrCat(name, ": the .npy header lacks 'descr', 'fortran_order' or 'shape': ", text));
  }
  if (descr->kind != Value::kString) {
    return absl::InvalidArgumentError(
        fl::StrCat(name,
                   ": a structured (record) dtype is not supported; save each field as its own array, e.g. "
                   "np.savez(path, x=a['x'], y=a['y'])"));
  }
  auto dtype = ParseDescr(descr->text, name);
  if (!dtype.ok()) return dtype.status();
  header.descr = descr->text;
  header.dtype = *dtype;
  if (fortran->kind != Value::kBool) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": 'fortran_order' is not True or False: ", text));
  }
  header.fortran_order = fortran->boolean;
  if (shape->kind != Value::kTuple) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": 'shape' is not a tuple: ", text));
  }
  uint64_t bytes_total = DTypeSize(header.dtype);
  for (const Value& d : shape->items) {
    if (d.kind != Value::kInt) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": 'shape' holds something other than integers: ", text));
    }
    header.shape.push_back(d.integer);
    if (MulOverflows(bytes_total, d.integer, &bytes_total)) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": shape ", text, " is too large"));
    }
  }
  // Fortran order matters only when two or more dimensions exceed 1; numpy sets the flag for any
  // F-contiguous array, so refuse only when the layouts actually differ.
  size_t non_trivial = 0;
  for (uint64_t d : header.shape) non_trivial += d > 1 ? 1 : 0;
  if (header.fortran_order && non_trivial > 1) {
    return absl::InvalidArgumentError(fl::StrCat(
        name, ": the array ", header.ShapeString(),
        " is stored in Fortran (column-major) order; only C order is read: save np.ascontiguousarray(a) instead"));
  }
  return header;
}

absl::StatusOr<NpyArray> LoadNpy(const std::string& path) {
  // A regular file of known size (not a FIFO, not /dev/zero); the header first, then exactly the data it
  // declares, once the file's size agrees with it.
  absl::StatusOr<fl::sys::UserFile> file = fl::sys::OpenUserFile(
      path, "NumPy array", kMaxNpyFileBytes, "clients read their rows of an .npz instead (np.savez)");
  if (!file.ok()) return file.status();
  std::vector<uint8_t> preamble(static_cast<size_t>(std::min<uint64_t>(kNpyPreambleBytes, file->size())));
  if (absl::Status s = file->ReadAt(0, preamble); !s.ok()) return s;
  auto header_size = NpyHeaderSize(preamble, path);
  if (!header_size.ok()) return header_size.status();
  if (*header_size > file->size()) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": truncated .npy header (", file->size(),
                                                 " bytes, the header alone needs ", *header_size, ")"));
  }
  std::vector<uint8_t> header_bytes(static_cast<size_t>(*header_size));
  if (absl::Status s = file->ReadAt(0, header_bytes); !s.ok()) return s;
  auto header = ParseNpyHeader(header_bytes, path);
  if (!header.ok()) return header.status();
  if (file->size() - header->data_offset != header->data_bytes()) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": the header says ", header->descr, " ", header->ShapeString(),
                                                 " (", header->data_bytes(), " bytes of data) but the file has ",
                                                 file->size() - header->data_offset,
                                                 "; it is truncated or corrupt: save it again"));
  }
  NpyArray array;
  array.data.resize(static_cast<size_t>(header->data_bytes()));
  if (absl::Status s = file->ReadAt(header->data_offset, array.data); !s.ok()) return s;
  array.header = std::move(*header);
  return array;
}

// ---------------------------------------------------------------------------------------------------------------
// NpzFile

absl::StatusOr<NpzFile> NpzFile::Open(const std::string& path) {
  auto archive = ZipArchive::Open(path, "NumPy archive");
  if (!archive.ok()) return archive.status();
  return NpzFile(std::move(*archive));
}

std::vector<std::string> NpzFile::ArrayNames() const {
  std::vector<std::string> names;
  for (const ZipEntry& entry : archive_.entries()) {
    if (entry.name.size() > 4 && entry.name.ends_with(".npy"))
      names.push_back(entry.name.substr(0, entry.name.size() - 4));
  }
  return names;
}

bool NpzFile::Has(std::string_view name) const { return archive_.Find(fl::StrCat(name, ".npy")) != nullptr; }

std::string NpzFile::Describe(std::string_view name) const { return fl::StrCat(path(), ":", name); }

absl::StatusOr<const ZipEntry*> NpzFile::Member(std::string_view name) const {
  const ZipEntry* entry = archive_.Find(fl::StrCat(name, ".npy"));
  if (entry != nullptr) return entry;
  std::string present;
  for (const std::string& array : ArrayNames()) present += (present.empty() ? "" : ", ") + array;
  return absl::NotFoundError(
      fl::StrCat(path(), " has no array '", name, "' (it has: ", present.empty() ? "no arrays" : present, ")"));
}

absl::StatusOr<NpyHeader> NpzFile::ReadHeader(const ZipEntry& entry, std::string_view name) const {
  const std::string described = Describe(name);
  std::vector<uint8_t> preamble(static_cast<size_t>(std::min<uint64_t>(kNpyPreambleBytes, entry.uncompressed_size)));
  if (auto status = archive_.ReadRange(entry, 0, preamble); !status.ok()) return status;
  auto size = NpyHeaderSize(preamble, described);
  if (!size.ok()) return size.status();
  if (*size > entry.uncompressed_size) {
    return absl::InvalidArgumentError(fl::StrCat(described, ": truncated .npy header (", entry.uncompressed_size,
                                                 " bytes, the header alone needs ", *size, ")"));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(*size));
  if (auto status = archive_.ReadRange(entry, 0, bytes); !status.ok()) return status;
  auto header = ParseNpyHeader(bytes, described);
  if (!header.ok()) return header.status();
  if (entry.uncompressed_size != header->data_offset + header->data_bytes()) {
    return absl::InvalidArgumentError(
        fl::StrCat(described, ": the header says ", header->descr, " ", header->ShapeString(), " (",
                   header->data_bytes(), " bytes of data) but the member holds ",
                   entry.uncompressed_size - header->data_offset, "; the file is corrupt: save it again"));
  }
  return header;
}

absl::StatusOr<NpyHeader> NpzFile::Header(std::string_view name) const {
  auto entry = Member(name);
  if (!entry.ok()) return entry.status();
  return ReadHeader(**entry, name);
}

absl::StatusOr<std::vector<uint8_t>> NpzFile::ReadAll(std::string_view name) const {
  auto entry = Member(name);
  if (!entry.ok()) return entry.status();
  auto header = ReadHeader(**entry, name);
  if (!header.ok()) return header.status();
  // The data grows with what is actually inflated (the stream stops with an error past the declared size and
  // checks the CRC), so a deflated member that claims gigabytes costs only what it really holds.
  constexpr uint64_t kReserveCap = uint64_t{16} << 20;
  std::vector<uint8_t> data;
  data.reserve(static_cast<size_t>((*entry)->method == kZipMethodStored ? header->data_bytes()
                                                                        : std::min(header->data_bytes(), kReserveCap)));
  const uint64_t begin = header->data_offset;
  auto status = archive_.ForEachChunk(**entry, [&](uint64_t offset, std::span<const uint8_t> chunk) {
    const uint64_t end = offset + chunk.size();
    if (end > begin) {
      const uint64_t from = std::max(offset, begin);
      data.insert(data.end(), chunk.begin() + static_cast<ptrdiff_t>(from - offset), chunk.end());
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return data;
}

absl::StatusOr<std::vector<uint8_t>> NpzFile::ReadRows(std::string_view name, std::span<const uint32_t> rows) const {
  auto entry_or = Member(name);
  if (!entry_or.ok()) return entry_or.status();
  const ZipEntry& entry = **entry_or;
  auto header = ReadHeader(entry, name);
  if (!header.ok()) return header.status();
  if (header->shape.empty()) {
    return absl::InvalidArgumentError(fl::StrCat(Describe(name), " is a scalar (shape ()), it has no rows"));
  }
  const uint64_t num_rows = header->rows();
  for (uint32_t row : rows) {
    if (row >= num_rows) {
      return absl::OutOfRangeError(fl::StrCat(Describe(name), ": row ", row, " is outside [0, ", num_rows, ")"));
    }
  }
  const uint64_t row_bytes = header->row_bytes();
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes * rows.size()));
  if (row_bytes == 0 || rows.empty()) return out;

  if (entry.method == kZipMethodStored) {
    // Runs of consecutive rows (in request order) are one read each.
    for (size_t i = 0; i < rows.size();) {
      size_t j = i + 1;
      while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
      std::span<uint8_t> target(out.data() + i * row_bytes, (j - i) * row_bytes);
      if (auto status = archive_.ReadRange(entry, header->data_offset + rows[i] * row_bytes, target); !status.ok()) {
        return status;
      }
      i = j;
    }
    // The rows alone carry no CRC: the whole member is checked once per archive (streamed, one chunk in
    // memory), so flipped bytes in a stored member are refused, not trained on.
    if (auto status = archive_.VerifyCrc(entry); !status.ok()) return status;
    return out;
  }

  // Deflated: one pass through the member. Each distinct row is copied, as it streams by, to the output
  // slot of its first request; repeated requests are filled from that slot afterwards.
  std::vector<std::pair<uint32_t, size_t>> order;  // (row, first output slot), by row
  order.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) order.emplace_back(rows[i], i);
  std::sort(order.begin(), order.end());
  std::vector<std::pair<size_t, size_t>> repeats;  // (slot, slot to copy from)
  size_t unique = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (unique > 0 && order[unique - 1].first == order[i].first) {
      repeats.emplace_back(order[i].second, order[unique - 1].second);
    } else {
      order[unique++] = order[i];
    }
  }
  order.resize(unique);
  size_t next = 0;
  const uint64_t data_offset = header->data_offset;
  auto status = archive_.ForEachChunk(entry, [&](uint64_t offset, std::span<const uint8_t> chunk) {
    const uint64_t chunk_end = offset + chunk.size();
    while (next < order.size()) {
      const uint64_t row_begin = data_offset + order[next].first * row_bytes;
      const uint64_t row_end = row_begin + row_bytes;
      if (row_begin >= chunk_end) break;
      const uint64_t from = std::max(row_begin, offset);
      const uint64_t to = std::min(row_end, chunk_end);
      if (from < to) {
        std::memcpy(out.data() + order[next].second * row_bytes + (from - row_begin), chunk.data() + (from - offset),
                    static_cast<size_t>(to - from));
      }
      if (row_end > chunk_end) break;  // the rest of this row is in the next chunk
      ++next;
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  for (const auto& [slot, source] : repeats) {
    std::memcpy(out.data() + slot * row_bytes, out.data() + source * row_bytes, static_cast<size_t>(row_bytes));
  }
  return out;
}

}  // namespace fl::formats
