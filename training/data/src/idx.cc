#include "fl/training/data/idx.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "fl/core/str_cat.h"
#include "fl/sys/user_file.h"

namespace fl::training::data {
namespace {

// Where IDX bytes come from: a (possibly gzip-compressed) file or a buffer in memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `size` bytes; returns how many were read (fewer only at the end of the data).
  virtual absl::StatusOr<size_t> Read(uint8_t* out, size_t size) = 0;
  // "decompressed " for gzip files, "" otherwise: qualifies sizes in error messages.
  virtual std::string_view size_qualifier() const = 0;
  // The most bytes the source can deliver in all (header included): what a header's claim is checked against
  // before anything is allocated for it.
  virtual uint64_t bound() const = 0;
  // True when the data ended because a gzip stream was cut short (its end or trailer is missing).
  virtual bool truncated_stream() const { return false; }
};

std::string_view TruncationNote(const ByteSource& source) {
  return source.truncated_stream() ? "; the gzip stream itself is cut short" : "";
}

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  absl::StatusOr<size_t> Read(uint8_t* out, size_t size) override {
    const size_t n = std::min(size, bytes_.size() - pos_);
    if (n > 0) std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  std::string_view size_qualifier() const override { return ""; }
  uint64_t bound() const override { return bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

// Reads plain and gzip files alike through zlib's gz* interface (plain files pass through unchanged).
class FileSource final : public ByteSource {
 public:
  static absl::StatusOr<std::unique_ptr<FileSource>> Open(const std::string& path) {
    // A regular file only, of at most kMaxIdxFileBytes, checked before a byte is read: a FIFO would block the
    // open and /dev/zero would never end.
    absl::StatusOr<fl::sys::UserFile> user = fl::sys::OpenUserFile(
        path, "IDX file", kMaxIdxFileBytes,
        "IDX files of MNIST-like datasets are far smaller; give the dataset's train/t10k -images-idx3-ubyte(.gz) and "
        "-labels-idx1-ubyte(.gz) files");
    if (!user.ok()) return user.status();
    // Peek at the magic ourselves: zlib would silently read a non-gzip `.gz` file as plain data.
    unsigned char magic[2] = {0, 0};
    const size_t got = static_cast<size_t>(std::min<uint64_t>(user->size(), 2));
    if (absl::Status s = user->ReadAt(0, std::span<uint8_t>(magic, got)); !s.ok()) return s;
    const bool gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    const bool gz_name = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
    if (gz_name && !gzip) {
      return absl::InvalidArgumentError(
          got < 2 ? fl::StrCat(path, ": not a gzip file (", got, " bytes long, shorter than the gzip magic)")
                  : absl::StrFormat("%s: not a gzip file (starts with %02x %02x, gzip starts with 1f 8b)", path,
                                    magic[0], magic[1]));
    }
    // zlib reads through its own descriptor (gzclose closes it): a duplicate of the one that was checked, so
    // that what is read is the file that was checked, whatever is renamed meanwhile.
    const int fd = ::fcntl(user->fd(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      return absl::InternalError(fl::StrCat(path, ": cannot duplicate its descriptor: ", std::strerror(errno)));
    gzFile file = gzdopen(fd, "rb");
    if (file == nullptr) {
      ::close(fd);
      return absl::ResourceExhaustedError(fl::StrCat(path, ": cannot open it for reading (zlib: out of memory)"));
    }
    gzbuffer(file, 1 << 18);
    // A plain file delivers its size; deflate inflates at most 1032 times (258-byte matches coded in 2 bits: zlib's
    // "technical details"), so a gzip file of n bytes delivers at most 1032 n.
    const uint64_t bound = gzip ? std::min(kMaxIdxDataBytes, user->size() * 1032) : user->size();
    return std::unique_ptr<FileSource>(new FileSource(path, file, gzip, bound));
  }
  ~FileSource() override { gzclose(file_); }

  absl::StatusOr<size_t> Read(uint8_t* out, size_t size) override {
    size_t total = 0;
    while (total < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - total, 1u << 30));
      const int n = gzread(file_, out + total, chunk);
      if (n < 0) return Error();
      if (n == 0) break;
      total += static_cast<size_t>(n);
      delivered_ += static_cast<uint64_t>(n);
      // A small gzip file can inflate to ~1000 times its size: what it holds is bounded as it is read.
      if (delivered_ > kMaxIdxDataBytes) {
        return absl::InvalidArgumentError(fl::StrCat(
            path_, ": holds more than ", kMaxIdxDataBytes, " ", size_qualifier(),
            "bytes, over the limit for an IDX file (kMaxIdxDataBytes); it is not an MNIST-like IDX file or is a "
            "decompression bomb: give the dataset's own files"));
      }
    }
    if (total < size) {
      int errnum = Z_OK;
      gzerror(file_, &errnum);
      if (errnum == Z_BUF_ERROR) {
        truncated_ = true;  // zlib: "unexpected end of file"
      } else if (errnum != Z_OK) {
        return Error();
      }
    }
    return total;
  }
  std::string_view size_qualifier() const override { return gzip_ ? "decompressed " : ""; }
  uint64_t bound() const override { return bound_; }
  bool truncated_stream() const override { return truncated_; }

 private:
  FileSource(std::string path, gzFile file, bool gzip, uint64_t bound)
      : path_(std::move(path)), file_(file), gzip_(gzip), bound_(bound) {}
  absl::Status Error() {
    int errnum = Z_OK;
    const char* raw = gzerror(file_, &errnum);
    std::string_view message = errnum == Z_ERRNO ? std::strerror(errno) : (raw ? raw : "unknown error");
    // zlib prefixes its messages with the name it was opened under ("<fd:4>: " for gzdopen); we name the file
    // ourselves.
    if (message.starts_with("<fd:")) {
      if (const size_t end = message.find(">: "); end != std::string_view::npos) message.remove_prefix(end + 3);
    }
    return absl::InvalidArgumentError(
        fl::StrCat(path_, gzip_ && errnum != Z_ERRNO ? ": corrupt gzip data: " : ": read error: ", message));
  }

  std::string path_;
  gzFile file_;
  bool gzip_;
  uint64_t bound_;
  bool truncated_ = false;
  uint64_t delivered_ = 0;  // bytes returned by Read so far (decompressed for gzip)
};

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

constexpr size_t kReserve = size_t{256} << 20;  // the most reserved before any data has been read
constexpr size_t kChunk = size_t{64} << 20;     // the most one Read asks for

// Counts what is left in the source (bounded, so that a decompression bomb cannot keep us busy forever).
absl::StatusOr<std::pair<uint64_t, bool>> CountRemaining(ByteSource& source) {
  constexpr uint64_t kMaxCount = kMaxIdxDataBytes;  // a file source refuses more before this
  std::vector<uint8_t> buffer(1 << 16);
  uint64_t count = 0;
  while (count < kMaxCount) {
    auto n = source.Read(buffer.data(), buffer.size());
    if (!n.ok()) return n.status();
    if (*n == 0) return std::make_pair(count, false);
    count += *n;
  }
  return std::make_pair(count, true);
}

absl::Status TruncatedError(const ByteSource& source, std::string_view name, uint64_t expected_total,
                            std::string_view layout, uint64_t got) {
  return absl::InvalidArgumentError(fl::StrCat(name, ": truncated IDX file: expected ", expected_total, " ",
                                               source.size_qualifier(), "bytes (", layout, "), got ", got,
                                               TruncationNote(source)));
}

// Before anything is allocated for a header's claim: the source can deliver that much.
absl::Status CheckClaim(const ByteSource& source, std::string_view name, uint64_t expected_total,
                        std::string_view layout) {
  if (expected_total <= source.bound()) return absl::OkStatus();
  if (source.size_qualifier().empty()) {  // a plain file or a buffer: the bound is what it holds
    return TruncatedError(source, name, expected_total, layout, source.bound());
  }
  return absl::InvalidArgumentError(
      fl::StrCat(name, ": truncated IDX file: expected ", expected_total, " decompressed bytes (", layout,
                 "), more than the file can inflate to (", source.bound(), " bytes at most)"));
}

// Once the payload is read: checks that nothing follows it and that a gzip stream ends properly.
absl::Status CheckEnd(ByteSource& source, std::string_view name, uint64_t expected_total, std::string_view layout) {
  auto rest = CountRemaining(source);
  if (!rest.ok()) return rest.status();
  if (source.truncated_stream()) {
    return absl::InvalidArgumentError(
        fl::StrCat(name,
                   ": truncated gzip stream: the data is complete but the end of the stream (its checksum "
                   "trailer) is missing"));
  }
  if (rest->first > 0) {
    return absl::InvalidArgumentError(fl::StrCat(
        name, ": oversized IDX file: expected ", expected_total, " ", source.size_qualifier(), "bytes (", layout,
        "), got ", rest->second ? "more than " : "", expected_total + rest->first, " (trailing bytes after the data)"));
  }
  return absl::OkStatus();
}

// Reads exactly `expected_total - header_bytes` payload bytes into `payload` and checks that nothing follows.
absl::Status ReadPayload(ByteSource& source, std::string_view name, size_t header_bytes, uint64_t expected_total,
                         std::string_view layout, std::vector<uint8_t>& payload) {
  // Read in chunks rather than allocating what the header claims up front: a corrupt or hostile header
  // with a short file must not make us allocate gigabytes. Real datasets fit the initial reservation.
  if (auto status = CheckClaim(source, name, expected_total, layout); !status.ok()) return status;
  const auto payload_size = static_cast<size_t>(expected_total - header_bytes);
  payload.clear();
  payload.reserve(std::min(payload_size, kReserve));
  size_t total = 0;
  while (total < payload_size) {
    const size_t want = std::min(kChunk, payload_size - total);
    payload.resize(total + want);
    auto n = source.Read(payload.data() + total, want);
    if (!n.ok()) return n.status();
    total += *n;
    if (*n < want) break;
  }
  payload.resize(total);
  if (total < payload_size) return TruncatedError(source, name, expected_total, layout, header_bytes + total);
  return CheckEnd(source, name, expected_total, layout);
}

// Reads the header: magic and `dims.size()` dimensions.
absl::Status ReadHeader(ByteSource& source, std::string_view name, uint32_t expected_magic, std::string_view what,
                        std::span<uint32_t> dims) {
  uint8_t header[16];
  const size_t header_bytes = 4 + 4 * dims.size();
  auto got = source.Read(header, header_bytes);
  if (!got.ok()) return got.status();
  if (*got < header_bytes) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": truncated IDX file: expected at least ", header_bytes, " ",
                                                 source.size_qualifier(), "bytes (the ", what, " header), got ", *got,
                                                 TruncationNote(source)));
  }
  const uint32_t magic = BigEndian32(header);
  if (magic != expected_magic) {
    std::string detail;
    if ((magic >> 16) != 0) {
      detail = "not an IDX file";
    } else if (((magic >> 8) & 0xff) != 0x08) {
      detail = absl::StrFormat("IDX type code 0x%02x, only unsigned bytes (0x08) are supported", (magic >> 8) & 0xff);
    } else {
      detail = absl::StrFormat("%u dimensions, %s have %zu", magic & 0xff, what, dims.size());
    }
    return absl::InvalidArgumentError(absl::StrFormat("%s: bad magic number 0x%08x, expected 0x%08x for IDX %s (%s)",
                                                      std::string(name), magic, expected_magic, std::string(what),
                                                      detail));
  }
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = BigEndian32(header + 4 + 4 * i);
  return absl::OkStatus();
}

// An image file's header, checked: the images' dimensions (no pixels yet) and the file's expected layout.
struct ImagesHeader {
  IdxImages images;
  uint64_t expected_total = 0;  // header + payload bytes
  std::string layout;           // "16-byte header + N x R x C", for messages
};

absl::StatusOr<ImagesHeader> ReadImagesHeader(ByteSource& source, std::string_view name) {
  uint32_t dims[3] = {0, 0, 0};
  if (auto status = ReadHeader(source, name, kIdxImagesMagic, "images", dims); !status.ok()) return status;
  ImagesHeader header;
  IdxImages& images = header.images;
  images.count = dims[0];
  images.rows = dims[1];
  images.cols = dims[2];
  if (images.rows == 0 || images.cols == 0) {
    return absl::InvalidArgumentError(
        fl::StrCat(name, ": invalid image dimensions ", images.rows, " x ", images.cols, " (must be non-zero)"));
  }
  constexpr uint64_t kMaxPayload = kMaxIdxDataBytes - kIdxImagesHeaderBytes;  // refused before allocating
  const uint64_t image_size = uint64_t{images.rows} * images.cols;            // < 2^64: cannot overflow
  if (image_size > kMaxPayload || images.count > kMaxPayload / image_size) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": implausible IDX header: ", images.count, " images of ",
                                                 images.rows, " x ", images.cols, " would be more than ", kMaxPayload,
                                                 " bytes, the limit for an IDX file"));
  }
  header.expected_total = kIdxImagesHeaderBytes + images.count * image_size;
  header.layout =
      fl::StrCat(kIdxImagesHeaderBytes, "-byte header + ", images.count, " x ", images.rows, " x ", images.cols);
  return header;
}

absl::StatusOr<IdxImages> ReadImages(ByteSource& source, std::string_view name) {
  auto header = ReadImagesHeader(source, name);
  if (!header.ok()) return header.status();
  if (auto status = ReadPayload(source, name, kIdxImagesHeaderBytes, header->expected_total, header->layout,
                                header->images.pixels);
      !status.ok()) {
    return status;
  }
  return std::move(header->images);
}

absl::StatusOr<IdxImageRows> ReadImageRows(ByteSource& source, std::string_view name, std::span<const uint32_t> rows) {
  auto header = ReadImagesHeader(source, name);
  if (!header.ok()) return header.status();
  IdxImageRows result;
  result.file_count = header->images.count;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] >= result.file_count) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": row ", rows[i], " (entry ", i, " of the ", rows.size(),
                                                   " rows asked for) is out of range: the file has ", result.file_count,
                                                   " images"));
    }
  }
  // The distinct rows in file order: one pass through the stream collects each of them once, appending as it
  // goes (so a short file with a hostile header allocates no more than it has delivered).
  const bool increasing = std::adjacent_find(rows.begin(), rows.end(), std::greater_equal<>()) == rows.end();
  std::vector<uint32_t> sorted;
  if (!increasing) {
    sorted.assign(rows.begin(), rows.end());
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  }
  const std::span<const uint32_t> distinct = increasing ? rows : std::span<const uint32_t>(sorted);
  const uint64_t image_size = uint64_t{header->images.rows} * header->images.cols;
  const uint64_t payload_size = header->expected_total - kIdxImagesHeaderBytes;
  if (auto status = CheckClaim(source, name, header->expected_total, header->layout); !status.ok()) return status;
  std::vector<uint8_t> kept;
  kept.reserve(static_cast<size_t>(std::min<uint64_t>(distinct.size() * image_size, kReserve)));
  // 1 MiB at a time: a small multiple of zlib's own buffer, and far below a split's size.
  std::vector<uint8_t> buffer(static_cast<size_t>(std::min<uint64_t>(payload_size, uint64_t{1} << 20)));
  uint64_t offset = 0;  // payload bytes read so far
  size_t next = 0;      // the next distinct row to collect
  while (offset < payload_size) {
    const auto want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), payload_size - offset));
    auto n = source.Read(buffer.data(), want);
    if (!n.ok()) return n.status();
    const uint64_t end = offset + *n;
    // Append the part of each wanted image that lies in [offset, end); an image may span two reads.
    while (next < distinct.size()) {
      const uint64_t image_begin = distinct[next] * image_size;
      const uint64_t image_end = image_begin + image_size;
      if (image_begin >= end) break;
      const uint64_t from = std::max(image_begin, offset);
      const uint64_t to = std::min(image_end, end);
      kept.insert(kept.end(), buffer.data() + (from - offset), buffer.data() + (to - offset));
      if (image_end > end) break;
      ++next;
    }
    offset = end;
    if (*n < want) break;
  }
  if (offset < payload_size) {
    return TruncatedError(source, name, header->expected_total, header->layout, kIdxImagesHeaderBytes + offset);
  }
  if (auto status = CheckEnd(source, name, header->expected_total, header->layout); !status.ok()) return status;

  result.images = std::move(header->images);
  result.images.count = static_cast<uint32_t>(rows.size());
  if (increasing) {
    result.images.pixels = std::move(kept);
  } else {
    result.images.pixels.resize(static_cast<size_t>(rows.size() * image_size));
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto at =
          static_cast<size_t>(std::lower_bound(distinct.begin(), distinct.end(), rows[i]) - distinct.begin());
      std::memcpy(result.images.pixels.data() + i * image_size, kept.data() + at * image_size, image_size);
    }
  }
  return result;
}

absl::StatusOr<std::vector<uint8_t>> ReadLabels(ByteSource& source, std::string_view name, uint32_t num_classes) {
  if (num_classes == 0 || num_classes > 256) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": num_classes must be in [1, 256], got ", num_classes));
  }
  uint32_t count = 0;
  if (auto status = ReadHeader(source, name, kIdxLabelsMagic, "labels", std::span<uint32_t>(&count, 1)); !status.ok()) {
    return status;
  }
  if (kIdxLabelsHeaderBytes + uint64_t{count} > kMaxIdxDataBytes) {
    return absl::InvalidArgumentError(fl::StrCat(name, ": implausible IDX header: ", count,
                                                 " labels would be more than ", kMaxIdxDataBytes,
                                                 " bytes, the limit for an IDX file"));
  }
  std::vector<uint8_t> labels;
  const std::string layout = fl::StrCat(kIdxLabelsHeaderBytes, "-byte header + ", count, " labels");
  if (auto status =
          ReadPayload(source, name, kIdxLabelsHeaderBytes, kIdxLabelsHeaderBytes + uint64_t{count}, layout, labels);
      !status.ok()) {
    return status;
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(fl::StrCat(name, ": label ", static_cast<int>(labels[i]), " at index ", i,
                                                   " is out of range [0, ", num_classes, ")"));
    }
  }
  return labels;
}

}  // namespace

absl::StatusOr<IdxImages> LoadIdxImages(std::string_view path) {
  auto source = FileSource::Open(std::string(path));
  if (!source.ok()) return source.status();
  return ReadImages(**source, path);
}

absl::StatusOr<IdxImageRows> LoadIdxImageRows(std::string_view path, std::span<const uint32_t> rows) {
  auto source = FileSource::Open(std::string(path));
  if (!source.ok()) return source.status();
  return ReadImageRows(**source, path, rows);
}

absl::StatusOr<std::vector<uint8_t>> LoadIdxLabels(std::string_view path, uint32_t num_classes) {
  auto source = FileSource::Open(std::string(path));
  if (!source.ok()) return source.status();
  return ReadLabels(**source, path, num_classes);
}

absl::StatusOr<IdxImages> ParseIdxImages(std::span<const uint8_t> bytes, std::string_view name) {
  MemorySource source(bytes);
  return ReadImages(source, name);
}

absl::StatusOr<IdxImageRows> ParseIdxImageRows(std::span<const uint8_t> bytes, std::string_view name,
                                               std::span<const uint32_t> rows) {
  MemorySource source(bytes);
  return ReadImageRows(source, name, rows);
}

absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(std::span<const uint8_t> bytes, std::string_view name,
                                                    uint32_t num_classes) {
  MemorySource source(bytes);
  return ReadLabels(source, name, num_classes);
}

}  // namespace fl::training::data
