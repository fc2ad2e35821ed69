#include "fl/sys/user_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "fl/core/str_cat.h"

namespace fl::sys {

namespace {

std::string Prefix(std::string_view what, const std::string& path) {
  return what.empty() ? path : fl::StrCat(what, " ", path);
}

}  // namespace

std::string_view DescribeFileType(uint32_t st_mode) {
  switch (st_mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

UserFile::UserFile(UserFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      path_(std::move(other.path_)),
      what_(std::move(other.what_)) {}

UserFile& UserFile::operator=(UserFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
    path_ = std::move(other.path_);
    what_ = std::move(other.what_);
  }
  return *this;
}

UserFile::~UserFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status UserFile::ReadAt(uint64_t offset, std::span<uint8_t> out) const {
  if (offset > size_ || out.size() > size_ - offset) {
    return absl::InvalidArgumentError(fl::StrCat(Prefix(what_, path_), ": a read of ", out.size(), " bytes at offset ",
                                                 offset, " reaches past its end (", size_,
                                                 " bytes); the file is truncated or corrupt"));
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(fl::StrCat(Prefix(what_, path_), ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::InvalidArgumentError(fl::StrCat(Prefix(what_, path_), ": ended at byte ", offset + done, " of ",
                                                   size_, " (it shrank while being read)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> UserFile::ReadAll() const {
  std::string out(size_, '\0');
  if (absl::Status s = ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size())); !s.ok()) {
    return s;
  }
  return out;
}

absl::StatusOr<UserFile> OpenUserFile(const std::string& path, std::string_view what, uint64_t max_bytes,
                                      std::string_view hint) {
  const std::string prefix = Prefix(what, path);
  if (path.empty()) return absl::InvalidArgumentError(fl::StrCat(what, ": the path is empty; give a file"));
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer forever. It is cleared below, once the
  // file is known to be regular (where it changes nothing anyway).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(fl::StrCat(prefix, ": no such file"));
    if (err == EACCES) {
      return absl::PermissionDeniedError(fl::StrCat(prefix, ": permission denied; make it readable"));
    }
    return absl::InvalidArgumentError(fl::StrCat(prefix, ": cannot open: ", std::strerror(err)));
  }
  UserFile file;
  file.fd_ = fd;
  file.path_ = path;
  file.what_ = std::string(what);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(fl::StrCat(prefix, ": fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(fl::StrCat(prefix, ": is ", DescribeFileType(st.st_mode),
                                                 ", not a regular file; give the path of a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return absl::InvalidArgumentError(fl::StrCat(prefix, ": ", size, " bytes, over the limit of ", max_bytes,
                                                 " bytes for a ", what.empty() ? "file" : what,
                                                 hint.empty() ? "" : "; ", hint));
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  file.size_ = size;
  return file;
}

absl::StatusOr<std::string> ReadUserFile(const std::string& path, std::string_view what, uint64_t max_bytes,
                                         std::string_view hint) {
  absl::StatusOr<UserFile> file = OpenUserFile(path, what, max_bytes, hint);
  if (!file.ok()) return file.status();
  return file->ReadAll();
}

}  // namespace fl::sys
