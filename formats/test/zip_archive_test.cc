// ZipArchive against archives written by the real writers: Python's zipfile (stored, deflated, ZIP64),
// numpy.savez and torch.save / torch.jit.save, plus corrupt and truncated copies of them.
#include "fl/formats/zip_archive.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fl/testing/python.h"
#include "fl/testing/scratch_dir.h"

namespace fl::formats {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class ZipArchiveTest : public ::testing::Test {
 protected:
  // Runs a Python script whose argv[1] is the scratch directory; fails the test when it fails.
  void Python(const std::string& script, const std::string& module = "") {
    if (!module.empty()) {
      const absl::Status status = fl::testing::RequirePythonModule(module, dir_.File("require.log"));
      ASSERT_TRUE(status.ok()) << status.message();
    }
    auto result = fl::testing::RunPython(script, {dir_.path().string()}, dir_.File("python.log"));
    ASSERT_TRUE(result.ok()) << result.status().message();
  }
  // Every entry read three ways (ReadAll, ForEachChunk, ReadRange of the whole) equals the file `dir/<name>`
  // that the script also wrote next to the archive, under the entry's name with '/' replaced by '_'.
  void ExpectEntriesMatch(const ZipArchive& archive) {
    for (const ZipEntry& entry : archive.entries()) {
      std::string expected_name = entry.name;
      std::replace(expected_name.begin(), expected_name.end(), '/', '_');
      const std::string expected = ReadFile(dir_.File("expected_" + expected_name));
      auto all = archive.ReadAll(entry, uint64_t{1} << 30);
      ASSERT_TRUE(all.ok()) << all.status();
      EXPECT_EQ(*all, expected) << entry.name;
      std::string streamed;
      uint64_t next = 0;
      ASSERT_TRUE(archive
                      .ForEachChunk(entry,
                                    [&](uint64_t offset, std::span<const uint8_t> chunk) {
                                      EXPECT_EQ(offset, next);
                                      EXPECT_LE(chunk.size(), ZipArchive::kChunkBytes);
                                      next += chunk.size();
                                      streamed.append(reinterpret_cast<const char*>(chunk.data()), chunk.size());
                                      return absl::OkStatus();
                                    })
                      .ok());
      EXPECT_EQ(streamed, expected) << entry.name;
      std::string range(expected.size(), '\0');
      ASSERT_TRUE(
          archive.ReadRange(entry, 0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(range.data()), range.size())).ok());
      EXPECT_EQ(range, expected) << entry.name;
    }
  }

  fl::testing::ScratchDir dir_{"zip_test"};
};

// Writes the members given as (name, bytes) into `archive` with `compression`, and each as expected_<name>.
constexpr const char* kWriteMembers = R"PY(
import os, sys, random, zipfile
d = sys.argv[1]
random.seed(7)
members = {
    'empty': b'',
    'small.txt': b'hello, zip\n',
    'dir/random.bin': bytes(random.getrandbits(8) for _ in range(3 * 1024 * 1024 + 17)),
    'dir/text.txt': b''.join(b'line %d of a compressible text\n' % i for i in range(200000)),
}
for name, data in members.items():
    open(os.path.join(d, 'expected_' + name.replace('/', '_')), 'wb').write(data)
def write(path, compression):
    with zipfile.ZipFile(path, 'w', compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
)PY";

TEST_F(ZipArchiveTest, StoredEntries) {
  Python(std::string(kWriteMembers) + "write(os.path.join(d, 'a.zip'), zipfile.ZIP_STORED)\n");
  auto archive = ZipArchive::Open(dir_.File("a.zip"));
  ASSERT_TRUE(archive.ok()) << archive.status();
  ASSERT_EQ(archive->entries().size(), 4u);
  EXPECT_EQ(archive->entries()[2].name, "dir/random.bin");
  for (const ZipEntry& entry : archive->entries()) {
    EXPECT_EQ(entry.method, kZipMethodStored);
    EXPECT_EQ(entry.compressed_size, entry.uncompressed_size);
  }
  EXPECT_EQ(archive->Find("nope"), nullptr);
  ASSERT_NE(archive->Find("small.txt"), nullptr);
  EXPECT_EQ(archive->Find("small.txt")->uncompressed_size, 11u);
  ExpectEntriesMatch(*archive);

  // A range in the middle of a stored entry is one pread of those bytes.
  const ZipEntry& random = *archive->Find("dir/random.bin");
  const std::string expected = ReadFile(dir_.File("expected_dir_random.bin"));
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE(archive->ReadRange(random, 2'000'000, out).ok());
  EXPECT_EQ(std::string(out.begin(), out.end()), expected.substr(2'000'000, 1000));
  // Past the end: an error naming the entry and its size.
  const absl::Status past = archive->ReadRange(random, random.uncompressed_size - 10, out);
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(past.message()), HasSubstr("dir/random.bin"));
}

TEST_F(ZipArchiveTest, DeflatedEntries) {
  Python(std::string(kWriteMembers) + "write(os.path.join(d, 'a.zip'), zipfile.ZIP_DEFLATED)\n");
  auto archive = ZipArchive::Open(dir_.File("a.zip"));
  ASSERT_TRUE(archive.ok()) << archive.status();
  const ZipEntry& text = *archive->Find("dir/text.txt");
  EXPECT_EQ(text.method, kZipMethodDeflate);
  EXPECT_LT(text.compressed_size * 4, text.uncompressed_size);
  ExpectEntriesMatch(*archive);
  // A range of a deflated entry is inflated from the start, keeping only the range.
  const std::string expected = ReadFile(dir_.File("expected_dir_text.txt"));
  std::vector<uint8_t> out(5000);
  ASSERT_TRUE(archive->ReadRange(text, 3'000'000, out).ok());
  EXPECT_EQ(std::string(out.begin(), out.end()), expected.substr(3'000'000, 5000));
}

// numpy.savez writes every member with force_zip64=True: a ZIP64 extra field (id 1, 16 bytes of sizes) in
// the local header, absent from the central one. The members are the .npy files np.save writes.
TEST_F(ZipArchiveTest, NumpySavezZip64LocalHeaders) {
  Python(R"PY(
import os, sys, numpy as np
d = sys.argv[1]
arrays = {'x': np.arange(1000, dtype=np.float32).reshape(10, 100), 'y': np.arange(10, dtype=np.int64)}
np.savez(os.path.join(d, 'a.npz'), **arrays)
for name, a in arrays.items():
    np.save(os.path.join(d, 'expected_' + name + '.npy'), a)
)PY",
         "numpy");
  const std::string path = dir_.File("a.npz");
  // The first local header ("x.npy", 5 bytes of name) really carries the ZIP64 extra field.
  const std::string bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 39u);
  EXPECT_EQ(bytes.substr(28, 2), std::string("\x14\x00", 2));          // extra length 20
  EXPECT_EQ(bytes.substr(35, 4), std::string("\x01\x00\x10\x00", 4));  // ZIP64 extra, 16 bytes
  auto archive = ZipArchive::Open(path);
  ASSERT_TRUE(archive.ok()) << archive.status();
  ASSERT_EQ(archive->entries().size(), 2u);
  EXPECT_NE(archive->Find("x.npy"), nullptr);
  ExpectEntriesMatch(*archive);
}

// ZIP64 in the central directory and the ZIP64 end-of-central-directory record. Real zipfile code, with its
// thresholds lowered so that a small archive takes the paths a >4 GiB or >65535-entry one would.
TEST_F(ZipArchiveTest, Zip64CentralDirectoryAndEndRecord) {
  Python(R"PY(
import os, sys, zipfile
zipfile.ZIP64_LIMIT = 100
zipfile.ZIP_FILECOUNT_LIMIT = 1
d = sys.argv[1]
with zipfile.ZipFile(os.path.join(d, 'a.zip'), 'w', zipfile.ZIP_STORED) as z:
    for i in range(5):
        data = bytes([i]) * (300 + i)
        z.writestr('m%d' % i, data)
        open(os.path.join(d, 'expected_m%d' % i), 'wb').write(data)
    z.writestr('deflated', b'abc' * 1000, zipfile.ZIP_DEFLATED)
    open(os.path.join(d, 'expected_deflated'), 'wb').write(b'abc' * 1000)
)PY");
  const std::string bytes = ReadFile(dir_.File("a.zip"));
  ASSERT_NE(bytes.find(std::string("PK\x06\x06", 4)), std::string::npos) << "no ZIP64 end record was written";
  auto archive = ZipArchive::Open(dir_.File("a.zip"));
  ASSERT_TRUE(archive.ok()) << archive.status();
  ASSERT_EQ(archive->entries().size(), 6u);
  EXPECT_EQ(archive->entries()[4].uncompressed_size, 304u);
  EXPECT_GT(archive->entries()[4].local_header_offset, 100u);
  ExpectEntriesMatch(*archive);
}

// torch.save and torch.jit.save write stored (and some deflated) entries, padding the LOCAL extra field so
// that data is 64-byte aligned (the central directory has no extra field), and always a ZIP64 end record.
TEST_F(ZipArchiveTest, TorchArchivesAlignedData) {
  Python(R"PY(
import os, sys, zipfile, torch
d = sys.argv[1]
torch.save({'w': torch.arange(100, dtype=torch.float32)}, os.path.join(d, 't.pt'))
torch.jit.script(torch.nn.Linear(30, 20)).save(os.path.join(d, 'm.pt'))
for f in ['t.pt', 'm.pt']:
    with zipfile.ZipFile(os.path.join(d, f)) as z:
        for info in z.infolist():
            open(os.path.join(d, 'expected_' + info.filename.replace('/', '_')), 'wb').write(z.read(info))
)PY",
         "torch");
  for (const char* name : {"t.pt", "m.pt"}) {
    auto archive = ZipArchive::Open(dir_.File(name));
    ASSERT_TRUE(archive.ok()) << archive.status();
    ASSERT_FALSE(archive->entries().empty());
    int data_entries = 0;
    for (const ZipEntry& entry : archive->entries()) {
      if (entry.name.find("/data/") != std::string::npos) {
        ++data_entries;
        EXPECT_EQ(entry.data_offset % 64, 0u) << name << " " << entry.name;
        // The padding is in the local header only: the data does not start where the central header's
        // (empty) extra field would put it.
        EXPECT_GT(entry.data_offset, entry.local_header_offset + 30 + entry.name.size()) << entry.name;
      }
    }
    EXPECT_GT(data_entries, 0) << name;
    ExpectEntriesMatch(*archive);
  }
}

// Data aligned by an extra field written through Python's zipfile (in local and central headers alike).
TEST_F(ZipArchiveTest, ExtraFieldPadding) {
  Python(R"PY(
import os, sys, struct, zipfile
d = sys.argv[1]
with zipfile.ZipFile(os.path.join(d, 'a.zip'), 'w', zipfile.ZIP_STORED) as z:
    for i, name in enumerate(['archive/data/0', 'archive/data/1']):
        info = zipfile.ZipInfo(name)
        offset = z.fp.tell() + 30 + len(name) + 4
        pad = (64 - offset % 64) % 64
        info.extra = struct.pack('<HH', 0x4246, pad) + b'Z' * pad
        data = bytes(range(i, i + 100))
        z.writestr(info, data)
        open(os.path.join(d, 'expected_' + name.replace('/', '_')), 'wb').write(data)
)PY");
  auto archive = ZipArchive::Open(dir_.File("a.zip"));
  ASSERT_TRUE(archive.ok()) << archive.status();
  for (const ZipEntry& entry : archive->entries()) EXPECT_EQ(entry.data_offset % 64, 0u) << entry.name;
  ExpectEntriesMatch(*archive);
}

TEST_F(ZipArchiveTest, NotAZipFile) {
  WriteFile(dir_.File("x.pt"), "this is a text file, not an archive\n");
  auto archive = ZipArchive::Open(dir_.File("x.pt"));
  ASSERT_FALSE(archive.ok());
  EXPECT_EQ(archive.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(archive.status().message()),
              HasSubstr(dir_.File("x.pt") + " is not a ZIP archive (no end-of-central-directory record)"));

  WriteFile(dir_.File("empty.npz"), "");
  auto empty = ZipArchive::Open(dir_.File("empty.npz"));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("empty.npz is not a ZIP archive"));

  auto missing = ZipArchive::Open(dir_.File("missing.npz"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("missing.npz"));
}

TEST_F(ZipArchiveTest, TruncatedArchive) {
  Python(std::string(kWriteMembers) + "write(os.path.join(d, 'a.zip'), zipfile.ZIP_STORED)\n");
  const std::string bytes = ReadFile(dir_.File("a.zip"));
  // Cut in the middle of the data: the end record is gone.
  WriteFile(dir_.File("half.zip"), bytes.substr(0, bytes.size() / 2));
  auto half = ZipArchive::Open(dir_.File("half.zip"));
  ASSERT_FALSE(half.ok());
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("half.zip is not a ZIP archive"));
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("truncated"));
  // Cut inside the central directory, keeping the end record (as a broken copy tool might): the central
  // directory no longer parses.
  const size_t cd = bytes.rfind(std::string("PK\x01\x02", 4));
  ASSERT_NE(cd, std::string::npos);
  WriteFile(dir_.File("cut.zip"), bytes.substr(0, cd + 10) + bytes.substr(bytes.size() - 22));
  auto cut = ZipArchive::Open(dir_.File("cut.zip"));
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("cut.zip"));
}

TEST_F(ZipArchiveTest, CrcMismatch) {
  Python(std::string(kWriteMembers) + "write(os.path.join(d, 'a.zip'), zipfile.ZIP_STORED)\n" +
         "write(os.path.join(d, 'b.zip'), zipfile.ZIP_DEFLATED)\n");
  for (const char* name : {"a.zip", "b.zip"}) {
    auto archive = ZipArchive::Open(dir_.File(name));
    ASSERT_TRUE(archive.ok()) << archive.status();
    const ZipEntry entry = *archive->Find("dir/text.txt");
    std::string bytes = ReadFile(dir_.File(name));
    bytes[entry.data_offset + entry.compressed_size / 2] ^= 0x01;
    const std::string corrupt = dir_.File(std::string("corrupt_") + name);
    WriteFile(corrupt, bytes);
    auto reopened = ZipArchive::Open(corrupt);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    auto data = reopened->ReadAll(*reopened->Find("dir/text.txt"), uint64_t{1} << 30);
    ASSERT_FALSE(data.ok()) << name;
    EXPECT_THAT(std::string(data.status().message()), HasSubstr(corrupt)) << data.status();
    EXPECT_THAT(std::string(data.status().message()), HasSubstr("dir/text.txt")) << data.status();
    if (std::string(name) == "a.zip") {
      EXPECT_THAT(std::string(data.status().message()), HasSubstr("fails its CRC-32 check"));
    }
    // The other entries are intact.
    EXPECT_TRUE(reopened->ReadAll(*reopened->Find("small.txt"), uint64_t{1} << 30).ok());
  }
}

TEST_F(ZipArchiveTest, UnsupportedMethodIsRefusedOnRead) {
  Python(R"PY(
import os, sys, zipfile
with zipfile.ZipFile(os.path.join(sys.argv[1], 'a.zip'), 'w', zipfile.ZIP_BZIP2) as z:
    z.writestr('b', b'bzip2 data' * 100)
)PY");
  auto archive = ZipArchive::Open(dir_.File("a.zip"));
  ASSERT_TRUE(archive.ok()) << archive.status();
  auto data = archive->ReadAll(archive->entries()[0], uint64_t{1} << 30);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("compression method 12"));
  EXPECT_THAT(std::string(data.status().message()), HasSubstr("a.zip"));
}

}  // namespace
}  // namespace fl::formats
