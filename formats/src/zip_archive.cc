#include "fl/formats/zip_archive.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::formats {
namespace {

// Record signatures (APPNOTE.TXT 4.3).
constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectorySignature = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirectorySignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;

constexpr size_t kLocalHeaderBytes = 30;
constexpr size_t kCentralHeaderBytes = 46;
constexpr size_t kEndOfCentralDirectoryBytes = 22;
constexpr size_t kZip64LocatorBytes = 20;
constexpr size_t kZip64EndOfCentralDirectoryBytes = 56;
constexpr size_t kMaxCommentBytes = 0xFFFF;

constexpr uint16_t kFlagEncrypted = 0x0001;
// Deflate cannot expand more than ~1032:1, so a larger claimed ratio is a corrupt header (and allocating the
// claimed size could exhaust memory).
constexpr uint64_t kMaxDeflateRatio = 1100;
constexpr size_t kInputChunkBytes = size_t{256} << 10;
// The central directory is read whole: about 60 bytes an entry (400,000 tensors of a TorchScript file take
// 25 MB), so 256 MiB is millions of entries; a larger one is a header built to cost memory.
constexpr uint64_t kMaxCentralDirectoryBytes = uint64_t{256} << 20;

uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t Le64(const uint8_t* p) { return static_cast<uint64_t>(Le32(p)) | (static_cast<uint64_t>(Le32(p + 4)) << 32); }

std::string Hex32(uint32_t value) { return absl::StrFormat("0x%08x", value); }

}  // namespace

// The open file, shared by copies of an archive and closed with the last of them.
struct ZipArchive::File {
  fl::sys::UserFile user;  // closes the descriptor with the last copy of the archive
  int fd = -1;
  std::string path;
  // Per entry: its CRC-32 and size were checked by VerifyCrc (only successes are remembered).
  std::unique_ptr<std::atomic<bool>[]> verified;

  // Reads exactly out.size() bytes at `offset`; a short file is an error naming what was being read.
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out, std::string_view what) const {
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return absl::InternalError(fl::StrCat(path, ": reading ", what, " (", out.size(), " bytes at offset ", offset,
                                              "): ", std::strerror(errno)));
      }
      if (n == 0) {
        return absl::DataLossError(fl::StrCat(path, ": truncated: reading ", what, " (", out.size(),
                                              " bytes at offset ", offset, ") hit the end of the file after ", done,
                                              " bytes"));
      }
      done += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
};

absl::StatusOr<ZipArchive> ZipArchive::Open(const std::string& path, std::string_view what, uint64_t max_bytes) {
  // Regular files only, opened without blocking (a FIFO), the size known before a byte is read.
  absl::StatusOr<fl::sys::UserFile> user = fl::sys::OpenUserFile(path, what, max_bytes);
  if (!user.ok()) return user.status();
  auto file = std::make_shared<File>();
  file->user = *std::move(user);
  file->path = path;
  file->fd = file->user.fd();
  const uint64_t file_size = file->user.size();

  // The end-of-central-directory record is the last 22 bytes, unless a comment (at most 64 KiB) follows it:
  // search backwards for its signature in the tail of the file.
  const uint64_t tail_size = std::min<uint64_t>(file_size, kEndOfCentralDirectoryBytes + kMaxCommentBytes);
  std::vector<uint8_t> tail(tail_size);
  if (auto status = file->ReadAt(file_size - tail_size, tail, "the end of the file"); !status.ok()) return status;
  const std::string not_zip = fl::StrCat(path, " is not a ZIP archive (no end-of-central-directory record): ");
  if (file_size < kEndOfCentralDirectoryBytes) {
    return absl::InvalidArgumentError(
        fl::StrCat(not_zip, "the file has only ", file_size, " bytes; it is empty or truncated"));
  }
  int64_t eocd_in_tail = -1;
  for (int64_t i = static_cast<int64_t>(tail_size - kEndOfCentralDirectoryBytes); i >= 0; --i) {
    const uint8_t* p = tail.data() + i;
    if (Le32(p) != kEndOfCentralDirectorySignature) continue;
    // A real record's comment ends at (or, leniently, before) the end of the file.
    if (static_cast<uint64_t>(i) + kEndOfCentralDirectoryBytes + Le16(p + 20) <= tail_size) {
      eocd_in_tail = i;
      break;
    }
  }
  if (eocd_in_tail < 0) {
    const bool starts_like_zip = tail_size == file_size && tail_size >= 4 && Le32(tail.data()) == kLocalHeaderSignature;
    return absl::InvalidArgumentError(fl::StrCat(
        not_zip,
        starts_like_zip ? "it starts like one, so it is probably truncated (an interrupted download or save?)"
                        : "it is some other kind of file, or a truncated archive",
        "; expected a .npz written by numpy.savez or a .pt written by torch.jit.save"));
  }
  const uint64_t eocd_offset = file_size - tail_size + static_cast<uint64_t>(eocd_in_tail);
  const uint8_t* eocd = tail.data() + eocd_in_tail;
  const uint16_t disk_number = Le16(eocd + 4);
  const uint16_t cd_disk = Le16(eocd + 6);
  uint64_t num_entries = Le16(eocd + 10);
  uint64_t cd_size = Le32(eocd + 12);
  uint64_t cd_offset = Le32(eocd + 16);

  // ZIP64: a locator just before the record points to the ZIP64 end-of-central-directory record, whose
  // 64-bit counts and offsets replace the saturated 16/32-bit ones.
  if (eocd_offset >= kZip64LocatorBytes) {
    uint8_t locator[kZip64LocatorBytes];
    if (auto status = file->ReadAt(eocd_offset - kZip64LocatorBytes, locator, "the ZIP64 locator"); !status.ok()) {
      return status;
    }
    if (Le32(locator) == kZip64LocatorSignature) {
      const uint64_t zip64_offset = Le64(locator + 8);
      if (zip64_offset + kZip64EndOfCentralDirectoryBytes > eocd_offset) {
        return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt ZIP64 locator: the ZIP64 end record at offset ",
                                                     zip64_offset, " lies beyond the end record at ", eocd_offset));
      }
      uint8_t record[kZip64EndOfCentralDirectoryBytes];
      if (auto status = file->ReadAt(zip64_offset, record, "the ZIP64 end-of-central-directory record"); !status.ok()) {
        return status;
      }
      if (Le32(record) != kZip64EndOfCentralDirectorySignature) {
        return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt ZIP64 end-of-central-directory record at offset ",
                                                     zip64_offset, " (bad signature)"));
      }
      if (Le32(record + 16) != 0 || Le32(record + 20) != 0) {
        return absl::UnimplementedError(fl::StrCat(path, ": multi-disk (split) ZIP archives are not supported"));
      }
      num_entries = Le64(record + 32);
      cd_size = Le64(record + 40);
      cd_offset = Le64(record + 48);
    }
  }
  if (disk_number != 0 || cd_disk != 0) {
    return absl::UnimplementedError(fl::StrCat(path, ": multi-disk (split) ZIP archives are not supported"));
  }
  if (cd_offset > eocd_offset || cd_size > eocd_offset - cd_offset) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt or truncated ZIP archive: the central directory (",
                                                 cd_size, " bytes at offset ", cd_offset,
                                                 ") does not end before the end record at offset ", eocd_offset));
  }
  if (cd_size > kMaxCentralDirectoryBytes) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": the ZIP central directory is ", cd_size,
                                                 " bytes, over the limit of ", kMaxCentralDirectoryBytes,
                                                 " (millions of entries): not an archive numpy or torch writes"));
  }
  if (num_entries > cd_size / kCentralHeaderBytes) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt ZIP archive: ", num_entries,
                                                 " entries cannot fit a central directory of ", cd_size, " bytes"));
  }

  std::vector<uint8_t> cd(cd_size);
  if (auto status = file->ReadAt(cd_offset, cd, "the central directory"); !status.ok()) return status;
  ZipArchive archive;
  archive.path_ = path;
  archive.file_size_ = file_size;
  archive.entries_.reserve(num_entries);
  size_t pos = 0;
  for (uint64_t i = 0; i < num_entries; ++i) {
    const std::string where =
        fl::StrCat(path, ": corrupt ZIP central directory (entry ", i, " at offset ", cd_offset + pos, "): ");
    if (pos + kCentralHeaderBytes > cd.size() || Le32(cd.data() + pos) != kCentralHeaderSignature) {
      return absl::InvalidArgumentError(fl::StrCat(where, "bad signature or past the end"));
    }
    const uint8_t* h = cd.data() + pos;
    ZipEntry entry;
    entry.flags = Le16(h + 8);
    entry.method = Le16(h + 10);
    entry.crc32 = Le32(h + 16);
    entry.compressed_size = Le32(h + 20);
    entry.uncompressed_size = Le32(h + 24);
    const size_t name_len = Le16(h + 28);
    const size_t extra_len = Le16(h + 30);
    const size_t comment_len = Le16(h + 32);
    const uint16_t disk_start = Le16(h + 34);
    entry.local_header_offset = Le32(h + 42);
    if (pos + kCentralHeaderBytes + name_len + extra_len + comment_len > cd.size()) {
      return absl::InvalidArgumentError(fl::StrCat(where, "name, extra field or comment runs past the directory"));
    }
    entry.name.assign(reinterpret_cast<const char*>(h + kCentralHeaderBytes), name_len);
    // The ZIP64 extra field holds, in this order, exactly those of the four values saturated above.
    const uint8_t* extra = h + kCentralHeaderBytes + name_len;
    for (size_t e = 0; e + 4 <= extra_len;) {
      const uint16_t id = Le16(extra + e);
      const size_t size = Le16(extra + e + 2);
      if (e + 4 + size > extra_len) break;
      if (id == kZip64ExtraId) {
        const uint8_t* field = extra + e + 4;
        size_t at = 0;
        auto take = [&](uint64_t& value) -> bool {
          if (at + 8 > size) return false;
          value = Le64(field + at);
          at += 8;
          return true;
        };
        bool ok = true;
        if (entry.uncompressed_size == 0xFFFFFFFFu) ok = ok && take(entry.uncompressed_size);
        if (entry.compressed_size == 0xFFFFFFFFu) ok = ok && take(entry.compressed_size);
        if (entry.local_header_offset == 0xFFFFFFFFu) ok = ok && take(entry.local_header_offset);
        if (!ok) {
          return absl::InvalidArgumentError(fl::StrCat(where, "ZIP64 extra field of '", entry.name, "' is too short"));
        }
      }
      e += 4 + size;
    }
    if (disk_start != 0 && disk_start != 0xFFFF) {
      return absl::UnimplementedError(fl::StrCat(path, ": multi-disk (split) ZIP archives are not supported"));
    }
    pos += kCentralHeaderBytes + name_len + extra_len + comment_len;

    // The data starts after the LOCAL header's name and extra field, whose lengths may differ from the
    // central ones (TorchScript pads the local extra field to align tensor data to 64 bytes).
    uint8_t local[kLocalHeaderBytes];
    if (entry.local_header_offset + kLocalHeaderBytes > cd_offset) {
      return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt ZIP archive: the local header of '", entry.name,
                                                   "' (offset ", entry.local_header_offset,
                                                   ") is not before the central directory"));
    }
    if (auto status =
            file->ReadAt(entry.local_header_offset, local, fl::StrCat("the local header of '", entry.name, "'"));
        !status.ok()) {
      return status;
    }
    if (Le32(local) != kLocalHeaderSignature) {
      return absl::InvalidArgumentError(fl::StrCat(path, ": corrupt ZIP archive: no local header for '", entry.name,
                                                   "' at offset ", entry.local_header_offset));
    }
    entry.data_offset = entry.local_header_offset + kLocalHeaderBytes + Le16(local + 26) + Le16(local + 28);
    if (entry.data_offset > cd_offset || entry.compressed_size > cd_offset - entry.data_offset) {
      return absl::DataLossError(fl::StrCat(path, ": corrupt or truncated ZIP archive: the data of '", entry.name,
                                            "' (", entry.compressed_size, " bytes at offset ", entry.data_offset,
                                            ") runs into the central directory at offset ", cd_offset));
    }
    archive.entries_.push_back(std::move(entry));
  }
  // An index by name, and no name twice: a duplicate is legal ZIP but never written by numpy or torch, and
  // readers disagree on which copy counts (Python's zipfile takes the last, LibTorch's miniz the first), so
  // a file could mean one thing to this reader and another to LibTorch.
  if (archive.entries_.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(fl::StrCat(path, ": too many ZIP entries"));
  }
  archive.by_name_.resize(archive.entries_.size());
  for (uint32_t i = 0; i < archive.by_name_.size(); ++i) archive.by_name_[i] = i;
  const std::vector<ZipEntry>& entries = archive.entries_;
  std::stable_sort(archive.by_name_.begin(), archive.by_name_.end(),
                   [&](uint32_t a, uint32_t b) { return entries[a].name < entries[b].name; });
  for (size_t i = 1; i < archive.by_name_.size(); ++i) {
    const ZipEntry& a = entries[archive.by_name_[i - 1]];
    const ZipEntry& b = entries[archive.by_name_[i]];
    if (a.name == b.name) {
      return absl::InvalidArgumentError(fl::StrCat(
          path, ": the ZIP archive holds the entry '", a.name, "' twice (entries ", archive.by_name_[i - 1], " and ",
          archive.by_name_[i],
          "); numpy and torch never write a name twice and readers disagree on which copy counts: write the file "
          "again"));
    }
  }
  file->verified = std::make_unique<std::atomic<bool>[]>(archive.entries_.size());
  archive.file_ = std::move(file);
  return archive;
}

const ZipEntry* ZipArchive::Find(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [&](uint32_t index, std::string_view key) { return entries_[index].name < key; });
  if (it == by_name_.end() || entries_[*it].name != name) return nullptr;
  return &entries_[*it];
}

absl::Status ZipArchive::CheckReadable(const ZipEntry& entry) const {
  if (entry.flags & kFlagEncrypted) {
    return absl::UnimplementedError(
        fl::StrCat(path_, ": entry '", entry.name, "' is encrypted; encrypted ZIP archives are not supported"));
  }
  if (entry.method == kZipMethodStored) {
    if (entry.compressed_size != entry.uncompressed_size) {
      return absl::InvalidArgumentError(fl::StrCat(path_, ": corrupt ZIP archive: stored entry '", entry.name, "' has ",
                                                   entry.compressed_size, " bytes but claims ", entry.uncompressed_size,
                                                   " uncompressed"));
    }
    return absl::OkStatus();
  }
  if (entry.method == kZipMethodDeflate) {
    if (entry.uncompressed_size > entry.compressed_size * kMaxDeflateRatio + 1024) {
      return absl::InvalidArgumentError(fl::StrCat(path_, ": corrupt ZIP archive: deflated entry '", entry.name,
                                                   "' claims ", entry.uncompressed_size, " bytes from ",
                                                   entry.compressed_size, " compressed, beyond what deflate can do"));
    }
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      fl::StrCat(path_, ": entry '", entry.name, "' uses compression method ", entry.method,
                 "; only stored (0) and deflate (8) are supported: re-write the archive with Python's zipfile "
                 "(ZIP_STORED or ZIP_DEFLATED), e.g. numpy.savez / numpy.savez_compressed"));
}

absl::Status ZipArchive::Stream(const ZipEntry& entry, uint64_t limit, bool check_crc, const ChunkSink& sink) const {
  if (auto status = CheckReadable(entry); !status.ok()) return status;
  const std::string what = fl::StrCat("entry '", entry.name, "'");
  const uint64_t end = std::min(limit, entry.uncompressed_size);
  uLong crc = ::crc32(0L, Z_NULL, 0);
  if (entry.method == kZipMethodStored) {
    std::vector<uint8_t> buffer(static_cast<size_t>(std::min<uint64_t>(kChunkBytes, std::max<uint64_t>(end, 1))));
    for (uint64_t offset = 0; offset < end;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), end - offset));
      std::span<uint8_t> chunk(buffer.data(), n);
      if (auto status = file_->ReadAt(entry.data_offset + offset, chunk, what); !status.ok()) return status;
      if (check_crc) crc = ::crc32(crc, chunk.data(), static_cast<uInt>(n));
      if (auto status = sink(offset, chunk); !status.ok()) return status;
      offset += n;
    }
  } else {
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return absl::InternalError("zlib inflateInit2 failed");
    struct Ender {
      z_stream* z;
      ~Ender() { inflateEnd(z); }
    } ender{&z};
    std::vector<uint8_t> input(
        static_cast<size_t>(std::min<uint64_t>(kInputChunkBytes, std::max<uint64_t>(entry.compressed_size, 1))));
    std::vector<uint8_t> output(
        static_cast<size_t>(std::min<uint64_t>(kChunkBytes, std::max<uint64_t>(entry.uncompressed_size, 1))));
    uint64_t consumed = 0;  // compressed bytes read from the file
    uint64_t produced = 0;  // uncompressed bytes handed to the sink
    bool finished = false;
    while (!finished && produced < end) {
      if (z.avail_in == 0 && consumed < entry.compressed_size) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(input.size(), entry.compressed_size - consumed));
        if (auto status = file_->ReadAt(entry.data_offset + consumed, std::span<uint8_t>(input.data(), n), what);
            !status.ok()) {
          return status;
        }
        consumed += n;
        z.next_in = input.data();
        z.avail_in = static_cast<uInt>(n);
      }
      z.next_out = output.data();
      z.avail_out = static_cast<uInt>(output.size());
      const int ret = inflate(&z, Z_NO_FLUSH);
      const size_t n = output.size() - z.avail_out;
      if (ret == Z_STREAM_END) {
        finished = true;
      } else if (ret == Z_BUF_ERROR && n == 0 && z.avail_in == 0 && consumed >= entry.compressed_size) {
        return absl::DataLossError(fl::StrCat(path_, ": corrupt ZIP archive: the deflate stream of '", entry.name,
                                              "' ends early, after ", produced, " of ", entry.uncompressed_size,
                                              " bytes"));
      } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
        return absl::DataLossError(fl::StrCat(
            path_, ": corrupt ZIP archive: inflating '", entry.name, "' failed after ", produced,
            " bytes: ", z.msg != nullptr ? z.msg : "zlib error ", z.msg != nullptr ? "" : std::to_string(ret)));
      }
      if (produced + n > entry.uncompressed_size) {
        return absl::DataLossError(fl::StrCat(path_, ": corrupt ZIP archive: '", entry.name,
                                              "' inflates to more than the ", entry.uncompressed_size,
                                              " bytes its header claims"));
      }
      if (n > 0) {
        if (check_crc) crc = ::crc32(crc, output.data(), static_cast<uInt>(n));
        const size_t give = static_cast<size_t>(std::min<uint64_t>(n, end - produced));
        if (auto status = sink(produced, std::span<const uint8_t>(output.data(), give)); !status.ok()) return status;
        produced += n;
      }
    }
    if (check_crc && produced != entry.uncompressed_size) {
      return absl::DataLossError(fl::StrCat(path_, ": corrupt ZIP archive: '", entry.name, "' inflates to ", produced,
                                            " bytes, its header claims ", entry.uncompressed_size));
    }
  }
  if (check_crc && static_cast<uint32_t>(crc) != entry.crc32) {
    return absl::DataLossError(fl::StrCat(path_, ": entry '", entry.name, "' fails its CRC-32 check (the archive says ",
                                          Hex32(entry.crc32), ", the data gives ", Hex32(static_cast<uint32_t>(crc)),
                                          "): the file is corrupt; write it again"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ZipArchive::ReadAll(const ZipEntry& entry, uint64_t max_bytes,
                                                std::string_view what) const {
  if (auto status = CheckReadable(entry); !status.ok()) return status;
  // The declared size is bounded by the caller's limit before anything is allocated; a deflated entry's
  // declared size is only a header field, so its buffer grows with the data actually inflated (Stream stops
  // with an error past the declared size) instead of being allocated up front.
  if (entry.uncompressed_size > max_bytes) {
    return absl::InvalidArgumentError(fl::StrCat(path_, ": ", what, " '", entry.name, "' is ", entry.uncompressed_size,
                                                 " bytes uncompressed, over the limit of ", max_bytes,
                                                 " bytes for it (docs/input-limits.md); the file is not one "
                                                 "numpy or torch writes for this testbed"));
  }
  constexpr uint64_t kReserveCap = uint64_t{16} << 20;
  std::string data;
  data.reserve(static_cast<size_t>(entry.method == kZipMethodStored ? entry.uncompressed_size
                                                                    : std::min(entry.uncompressed_size, kReserveCap)));
  auto status = Stream(entry, std::numeric_limits<uint64_t>::max(), /*check_crc=*/true,
                       [&](uint64_t, std::span<const uint8_t> chunk) {
                         data.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
                         return absl::OkStatus();
                       });
  if (!status.ok()) return status;
  return data;
}

absl::Status ZipArchive::ReadRange(const ZipEntry& entry, uint64_t offset, std::span<uint8_t> out) const {
  if (offset > entry.uncompressed_size || out.size() > entry.uncompressed_size - offset) {
    return absl::OutOfRangeError(fl::StrCat(path_, ": reading ", out.size(), " bytes at offset ", offset, " of '",
                                            entry.name, "', which has only ", entry.uncompressed_size, " bytes"));
  }
  if (auto status = CheckReadable(entry); !status.ok()) return status;
  if (out.empty()) return absl::OkStatus();
  if (entry.method == kZipMethodStored) {
    return file_->ReadAt(entry.data_offset + offset, out, fl::StrCat("entry '", entry.name, "'"));
  }
  const uint64_t end = offset + out.size();
  return Stream(entry, end, /*check_crc=*/false, [&](uint64_t at, std::span<const uint8_t> chunk) {
    const uint64_t from = std::max(at, offset);
    const uint64_t to = std::min(at + chunk.size(), end);
    if (from < to)
      std::memcpy(out.data() + (from - offset), chunk.data() + (from - at), static_cast<size_t>(to - from));
    return absl::OkStatus();
  });
}

absl::Status ZipArchive::VerifyCrc(const ZipEntry& entry) const {
  const bool indexed = !entries_.empty() && &entry >= entries_.data() && &entry < entries_.data() + entries_.size();
  std::atomic<bool>* done = indexed ? &file_->verified[static_cast<size_t>(&entry - entries_.data())] : nullptr;
  if (done != nullptr && done->load(std::memory_order_acquire)) return absl::OkStatus();
  absl::Status status = Stream(entry, std::numeric_limits<uint64_t>::max(), /*check_crc=*/true,
                               [](uint64_t, std::span<const uint8_t>) { return absl::OkStatus(); });
  if (status.ok() && done != nullptr) done->store(true, std::memory_order_release);
  return status;
}

absl::Status ZipArchive::ForEachChunk(const ZipEntry& entry, const ChunkSink& sink) const {
  return Stream(entry, std::numeric_limits<uint64_t>::max(), /*check_crc=*/true, sink);
}

}  // namespace fl::formats
