// A read-only ZIP archive: the container of NumPy's .npz files and of PyTorch's TorchScript .pt files.
//
// Open() reads the end-of-central-directory record (ZIP64 too), the central directory and each entry's
// 30-byte local header (whose name and extra lengths give where the data starts: TorchScript pads the LOCAL
// extra field so that tensor data is 64-byte aligned, and the central directory does not repeat that
// padding). No entry data is read until asked for, and then only what is asked for, with pread: the file
// stays on disk (and in the page cache, which is shared between processes), never copied whole into memory.
//
// Supported: stored (method 0) and deflated (method 8) entries; ZIP64 sizes and offsets (in the extra field
// of local and central headers, and the ZIP64 end-of-central-directory record and locator), as written by
// Python's zipfile (np.savez uses force_zip64=True) and by PyTorch's archive writer. Refused with a clear
// error: other compression methods, encrypted entries, multi-disk archives.
//
// Hostile archives (docs/input-limits.md): the file is opened through fl::sys::OpenUserFile (regular files
// only, never blocking on a FIFO, its size known before a byte is read); an archive that names an entry twice is
// refused at Open (readers disagree on which copy counts: LibTorch's loader has taken a short duplicate storage
// and read heap memory past it); ReadAll refuses an entry whose declared size is over the caller's stated limit
// before allocating, and every read that streams a whole entry stops with an error as soon as it inflates past
// the declared size, and checks the CRC-32.
//
// A ZipArchive is cheap to copy (the open file is shared) and its const methods are safe to call from
// several threads at once (pread has no shared file position).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::formats {

inline constexpr uint16_t kZipMethodStored = 0;
inline constexpr uint16_t kZipMethodDeflate = 8;

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflate; others refused on read with a clear error
  uint16_t flags = 0;   // general purpose bit flags (bit 0: encrypted, refused on read)
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint32_t crc32 = 0;
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;  // absolute file offset of the entry's data (after the local header + extra)
};

// The largest archive Open accepts unless told otherwise: far beyond any data set or model of this testbed,
// yet a stated bound (the reader preads only what it is asked for, so the size itself costs nothing; what it
// does bound is what a caller may later read whole).
inline constexpr uint64_t kMaxZipArchiveBytes = uint64_t{64} << 30;

class ZipArchive {
 public:
  // Reads the end-of-central-directory record, the central directory and the local headers (not the data).
  // Errors name the file: "x.pt is not a ZIP archive (no end-of-central-directory record): ...". `what` names
  // the kind of file in the errors of fl::sys::OpenUserFile ("TorchScript model /p/x.pt: is a FIFO, ...").
  static absl::StatusOr<ZipArchive> Open(const std::string& path, std::string_view what = "ZIP archive",
                                         uint64_t max_bytes = kMaxZipArchiveBytes);

  const std::string& path() const { return path_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  uint64_t file_size() const { return file_size_; }
  // nullptr when absent. O(log entries): names are unique (Open refuses duplicates).
  const ZipEntry* Find(std::string_view name) const;

  // The whole uncompressed entry, CRC-checked. An entry declaring more than `max_bytes` is refused before
  // anything is allocated (the error names the entry, its size and the limit); `what` names the kind of
  // entry in that error ("the model's pickle", "a code file").
  absl::StatusOr<std::string> ReadAll(const ZipEntry& entry, uint64_t max_bytes, std::string_view what = "entry") const;

  // Streams the whole entry and checks its size and CRC-32 (memory: one chunk), once per entry and archive:
  // later calls for the same entry return the first answer without reading again.
  absl::Status VerifyCrc(const ZipEntry& entry) const;

  // Reads [offset, offset + out.size()) of the uncompressed entry into out. Stored entries: one pread of
  // just those bytes. Deflated entries: inflates from the start of the entry up to the end of the range
  // (O(offset) time, bounded memory) — fine for headers, slow for random access far into a large member.
  // No CRC check (the rest of the entry is not read).
  absl::Status ReadRange(const ZipEntry& entry, uint64_t offset, std::span<uint8_t> out) const;

  // Streams the uncompressed entry through `sink` in chunks of at most kChunkBytes (inflate for method 8),
  // in order, with bounded memory; the CRC-32 and the size are checked at the end. A sink error stops the
  // stream and is returned as is.
  using ChunkSink = std::function<absl::Status(uint64_t offset, std::span<const uint8_t> chunk)>;
  absl::Status ForEachChunk(const ZipEntry& entry, const ChunkSink& sink) const;

  static constexpr size_t kChunkBytes = size_t{1} << 20;

 private:
  struct File;
  ZipArchive() = default;
  // Inflates `entry` from its start, handing chunks to sink; stops (OK) after `limit` uncompressed bytes
  // when check_crc is false. Shared by ForEachChunk and ReadRange.
  absl::Status Stream(const ZipEntry& entry, uint64_t limit, bool check_crc, const ChunkSink& sink) const;
  absl::Status CheckReadable(const ZipEntry& entry) const;

  std::string path_;
  uint64_t file_size_ = 0;
  std::shared_ptr<const File> file_;
  std::vector<ZipEntry> entries_;
  std::vector<uint32_t> by_name_;  // indices of entries_, sorted by name: Find's binary search
};

}  // namespace fl::formats
