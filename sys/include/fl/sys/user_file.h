// Opening a file a user named (a model, a checkpoint, a data set, a manifest, a trace): the one place every
// reader of such a file starts, so that none of them can be made to block on a FIFO, read /dev/zero until the
// memory is gone, or allocate what a file's header claims before knowing what the file holds.
//
// OpenUserFile opens with O_NONBLOCK (opening a FIFO for reading would otherwise wait for a writer forever),
// fstat()s the open descriptor (so the checks and the reads see the same file, whatever is renamed meanwhile),
// refuses anything but a regular file (symlinks are followed, so a link to /dev/zero is refused as the character
// device it is) and any size above the caller's stated limit, before a byte is read. The size it reports is what
// readers bound their allocations by.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::sys {

class UserFile {
 public:
  UserFile() = default;
  UserFile(UserFile&& other) noexcept;
  UserFile& operator=(UserFile&& other) noexcept;
  UserFile(const UserFile&) = delete;
  UserFile& operator=(const UserFile&) = delete;
  ~UserFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Exactly size() bytes (a file that shrank meanwhile is an error naming it; bytes appended meanwhile are not
  // read).
  absl::StatusOr<std::string> ReadAll() const;
  // pread of out.size() bytes at offset: all of them or an error naming the file (a range past the end
  // included).
  absl::Status ReadAt(uint64_t offset, std::span<uint8_t> out) const;

 private:
  friend absl::StatusOr<UserFile> OpenUserFile(const std::string&, std::string_view, uint64_t, std::string_view);
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
  std::string what_;
};

// `what` names the kind of file in errors ("checkpoint", "link trace"), `max_bytes` is the caller's stated
// limit, `hint` (optional) what to do when the file is over it. Errors: NotFound (no such file),
// PermissionDenied, InvalidArgument (not a regular file; over the limit), each reading
// "<what> <path>: <problem>; <what to do>".
absl::StatusOr<UserFile> OpenUserFile(const std::string& path, std::string_view what, uint64_t max_bytes,
                                      std::string_view hint = {});

// OpenUserFile, then ReadAll.
absl::StatusOr<std::string> ReadUserFile(const std::string& path, std::string_view what, uint64_t max_bytes,
                                         std::string_view hint = {});

// "a FIFO", "a character device", "a directory"... for a stat mode (used in the errors above).
std::string_view DescribeFileType(uint32_t st_mode);

}  // namespace fl::sys
