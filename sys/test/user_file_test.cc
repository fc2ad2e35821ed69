// OpenUserFile / ReadUserFile: regular files only (a FIFO neither blocks nor is read, /dev/zero and a link to
// it are refused as character devices), sizes bounded before a byte is read, errors naming the file.
#include "fl/sys/user_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/testing/scratch_dir.h"

namespace fl::sys {
namespace {

using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

TEST(UserFileTest, ReadsARegularFileWhole) {
  fl::testing::ScratchDir dir;
  Write(dir.File("a.txt"), "hello");
  absl::StatusOr<std::string> got = ReadUserFile(dir.File("a.txt"), "manifest", 1024);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "hello");
}

TEST(UserFileTest, AFifoIsRefusedWithoutBlocking) {
  fl::testing::ScratchDir dir;
  const std::string fifo = dir.File("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No writer ever opens it: a plain open() for reading would wait forever (the CTest timeout guards).
  absl::StatusOr<UserFile> got = OpenUserFile(fifo, "checkpoint", 1024);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("checkpoint " + fifo));
  EXPECT_THAT(got.status().message(), HasSubstr("a FIFO, not a regular file"));
}

TEST(UserFileTest, DevZeroAndASymlinkToItAreRefusedAsCharacterDevices) {
  fl::testing::ScratchDir dir;
  const std::string link = dir.File("model.pt");
  std::filesystem::create_symlink("/dev/zero", link);
  for (const std::string& path : {std::string("/dev/zero"), link}) {
    absl::StatusOr<std::string> got = ReadUserFile(path, "data file", 1 << 20);
    ASSERT_FALSE(got.ok()) << path;
    EXPECT_THAT(got.status().message(), HasSubstr(path));
    EXPECT_THAT(got.status().message(), HasSubstr("a character device"));
  }
}

TEST(UserFileTest, ADirectoryIsRefused) {
  fl::testing::ScratchDir dir;
  absl::StatusOr<UserFile> got = OpenUserFile(dir.path().string(), "link trace", 1024);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("a directory"));
}

TEST(UserFileTest, AFileOverTheLimitIsRefusedBeforeReadingWithTheHint) {
  fl::testing::ScratchDir dir;
  Write(dir.File("big"), std::string(2000, 'x'));
  absl::StatusOr<std::string> got = ReadUserFile(dir.File("big"), "manifest", 1000, "split it");
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("2000 bytes, over the limit of 1000 bytes for a manifest"));
  EXPECT_THAT(got.status().message(), HasSubstr("split it"));
}

TEST(UserFileTest, AMissingFileIsNotFoundNamingIt) {
  absl::StatusOr<UserFile> got = OpenUserFile("/nonexistent/x.yaml", "manifest", 10);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(got.status().message(), HasSubstr("manifest /nonexistent/x.yaml: no such file"));
}

TEST(UserFileTest, ReadAtPastTheEndIsAnErrorNotAShortRead) {
  fl::testing::ScratchDir dir;
  Write(dir.File("f"), "0123456789");
  absl::StatusOr<UserFile> file = OpenUserFile(dir.File("f"), "archive", 100);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), 10u);
  uint8_t buf[4];
  ASSERT_TRUE(file->ReadAt(6, buf).ok());
  EXPECT_EQ(buf[0], '6');
  absl::Status past = file->ReadAt(8, buf);
  EXPECT_FALSE(past.ok());
  EXPECT_THAT(past.message(), HasSubstr("reaches past its end"));
  // An offset whose sum with the length would wrap around is refused too.
  EXPECT_FALSE(file->ReadAt(~uint64_t{0} - 1, buf).ok());
}

}  // namespace
}  // namespace fl::sys
