// NumPy arrays: the .npy format (versions 1.0, 2.0 and 3.0) and .npz archives of them.
//
// An .npy file is the magic "\x93NUMPY", a version (major, minor), the header length (2 bytes little-endian
// in 1.0, 4 bytes in 2.0 and 3.0), and a Python dict literal padded with spaces and a newline:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 1, 28, 28), }
// followed by the elements in C order. See numpy/lib/format.py.
//
// Read here: little-endian (or byte-sized) bool, int8/16/32/64, uint8/16/32/64, float16/32/64 in C order.
// Refused with the numpy call that fixes it: big-endian arrays (a.astype('<f4')), Fortran order
// (np.ascontiguousarray(a)), object arrays, strings, structured dtypes and the rest.
//
// An .npz file (np.savez / np.savez_compressed) is a ZIP archive with one `<name>.npy` member per array.
// NpzFile reads a member's header, the whole array, or just some rows (slices along the first axis) — the
// rows alone are read from disk for stored members (np.savez), and deflated members (np.savez_compressed)
// are inflated once, keeping only those rows, so memory is O(rows requested), never O(array).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/formats/zip_archive.h"

namespace fl::formats {

enum class DType : uint8_t {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
};

std::string_view DTypeName(DType dtype);   // numpy's name: "float32", "uint8", "bool", ...
std::string_view DTypeDescr(DType dtype);  // the little-endian descr numpy writes: "<f4", "|u1", "|b1", ...
size_t DTypeSize(DType dtype);             // bytes per element
bool IsFloatingPoint(DType dtype);         // float16/32/64
bool IsInteger(DType dtype);               // signed or unsigned integers (not bool)

inline constexpr std::string_view kNpyMagic = "\x93NUMPY";
inline constexpr size_t kNpyPreambleBytes = 12;  // magic, version, and a 4-byte length (2-byte in 1.0)

struct NpyHeader {
  uint8_t major_version = 1;
  uint8_t minor_version = 0;
  std::string descr;  // as written, e.g. "<f4"
  DType dtype = DType::kFloat32;
  bool fortran_order = false;
  std::vector<uint64_t> shape;
  uint64_t data_offset = 0;  // bytes from the start of the .npy to its first element

  uint64_t num_elements() const;  // product of shape (1 for a scalar)
  uint64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  uint64_t row_elements() const;  // product of shape[1:]
  uint64_t row_bytes() const { return row_elements() * DTypeSize(dtype); }
  uint64_t data_bytes() const { return num_elements() * DTypeSize(dtype); }
  std::string ShapeString() const;  // numpy's repr: "(60000, 1, 28, 28)", "(5,)", "()"
};

// The number of bytes of header (magic to the end of the dict: NpyHeader::data_offset) announced by the
// first kNpyPreambleBytes (or more) bytes of an .npy. `name` is used in error messages.
absl::StatusOr<uint64_t> NpyHeaderSize(std::span<const uint8_t> preamble, std::string_view name);

// Parses and validates an .npy header; `bytes` holds at least the whole header (NpyHeaderSize bytes). Tuples
// nested more than 16 deep are refused (numpy writes one level), so hostile nesting cannot exhaust the stack.
// Errors name `name` (e.g. "data.npz:x_train") and say how to re-save the array in a readable form.
absl::StatusOr<NpyHeader> ParseNpyHeader(std::span<const uint8_t> bytes, std::string_view name);

// A whole .npy file read into memory (the data bytes only, after the header).
struct NpyArray {
  NpyHeader header;
  std::vector<uint8_t> data;
};
// A regular file only (fl::sys::OpenUserFile: not a FIFO or /dev/zero), its size agreeing with its header before
// the data is allocated.
absl::StatusOr<NpyArray> LoadNpy(const std::string& path);

class NpzFile {
 public:
  static absl::StatusOr<NpzFile> Open(const std::string& path);

  const std::string& path() const { return archive_.path(); }
  const ZipArchive& archive() const { return archive_; }
  // The arrays in the archive (members named `<name>.npy`), in archive order, without the ".npy".
  std::vector<std::string> ArrayNames() const;
  bool Has(std::string_view name) const;

  // The header of array `name` (read from the file on each call: a few hundred bytes). NotFound names the
  // arrays present.
  absl::StatusOr<NpyHeader> Header(std::string_view name) const;
  // The whole array's data bytes (C order, little-endian), CRC-checked; the buffer grows with the data actually
  // inflated, never allocated from a deflated member's claimed size.
  absl::StatusOr<std::vector<uint8_t>> ReadAll(std::string_view name) const;
  // The data bytes of rows[0], rows[1], ... (slices along the first axis, each header.row_bytes() long) in
  // that order; a row may repeat. Stored members: pread of just those rows (consecutive rows in one read),
  // and the whole member's CRC checked once per NpzFile (streamed: flipped bytes are refused, not trained
  // on). Deflated members: inflated once, keeping only the requested rows; CRC-checked. Memory: the result
  // only.
  absl::StatusOr<std::vector<uint8_t>> ReadRows(std::string_view name, std::span<const uint32_t> rows) const;

  // "<path>:<name>", as error messages name an array.
  std::string Describe(std::string_view name) const;

 private:
  explicit NpzFile(ZipArchive archive) : archive_(std::move(archive)) {}
  absl::StatusOr<const ZipEntry*> Member(std::string_view name) const;
  absl::StatusOr<NpyHeader> ReadHeader(const ZipEntry& entry, std::string_view name) const;

  ZipArchive archive_;
};

}  // namespace fl::formats
