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

class ZipArchive {
 public:
  // Reads the end-of-central-directory record, the central directory and the local headers (not the data).
  // Errors name the file: "x.pt is not a ZIP archive (no end-of-central-directory record): ...".
  static absl::StatusOr<ZipArchive> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  uint64_t file_size() const { return file_size_; }
  // nullptr when absent. With duplicate names (legal in ZIP, never written by numpy or torch) the last one
  // wins, as in Python's zipfile.
  const ZipEntry* Find(std::string_view name) const;

  // The whole uncompressed entry, CRC-checked.
  absl::StatusOr<std::string> ReadAll(const ZipEntry& entry) const;

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
};

}  // namespace fl::formats
