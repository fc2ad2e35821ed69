// IDX reader: round trips through plain and gzip files, and one test per way a file can be wrong, each
// checking that the error names the file and the problem.
#include "fl/training/data/idx.h"

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "fl/core/str_cat.h"
#include "fl/training/data/fashion_mnist.h"

namespace fl::training::data {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(fl::ToStd(status.message())); }

void PutBigEndian32(std::vector<uint8_t>& out, uint32_t value) {
  out.push_back(static_cast<uint8_t>(value >> 24));
  out.push_back(static_cast<uint8_t>(value >> 16));
  out.push_back(static_cast<uint8_t>(value >> 8));
  out.push_back(static_cast<uint8_t>(value));
}

std::vector<uint8_t> ImagesFile(uint32_t count, uint32_t rows, uint32_t cols, uint32_t magic = kIdxImagesMagic) {
  std::vector<uint8_t> out;
  PutBigEndian32(out, magic);
  PutBigEndian32(out, count);
  PutBigEndian32(out, rows);
  PutBigEndian32(out, cols);
  for (uint64_t i = 0; i < uint64_t{count} * rows * cols; ++i) out.push_back(static_cast<uint8_t>(i * 37 + 11));
  return out;
}

std::vector<uint8_t> LabelsFile(const std::vector<uint8_t>& labels, uint32_t magic = kIdxLabelsMagic) {
  std::vector<uint8_t> out;
  PutBigEndian32(out, magic);
  PutBigEndian32(out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

// Images whose pixels never repeat with a short period (ImagesFile's repeat every 16 images of 28 x 28), so that
// an image read from the wrong place cannot pass for the right one.
std::vector<uint8_t> DistinctImagesFile(uint32_t count, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> out = ImagesFile(count, rows, cols);
  for (size_t i = kIdxImagesHeaderBytes; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>((uint64_t{i} * 0x9E3779B97F4A7C15ULL) >> 56);
  }
  return out;
}

// Image `row` of an images file written by ImagesFile / DistinctImagesFile.
std::vector<uint8_t> ImageOf(const std::vector<uint8_t>& file, uint32_t row, size_t image_size) {
  const auto begin = file.begin() + static_cast<std::ptrdiff_t>(kIdxImagesHeaderBytes + row * image_size);
  return std::vector<uint8_t>(begin, begin + static_cast<std::ptrdiff_t>(image_size));
}

std::vector<uint8_t> Gzip(const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> out(compressBound(static_cast<uLong>(bytes.size())) + 64);
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  stream.next_in = const_cast<Bytef*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) / fl::StrCat("fl_idx_test_", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(IdxTest, ReadsPlainAndGzipImagesAlike) {
  const auto bytes = ImagesFile(3, 2, 4);
  for (const std::string& path : {Write("a-images", bytes), Write("a-images.gz", Gzip(bytes))}) {
    auto images = LoadIdxImages(path);
    ASSERT_TRUE(images.ok()) << images.status();
    EXPECT_EQ(images->count, 3u);
    EXPECT_EQ(images->rows, 2u);
    EXPECT_EQ(images->cols, 4u);
    EXPECT_EQ(images->pixels, std::vector<uint8_t>(bytes.begin() + 16, bytes.end()));
  }
}

TEST_F(IdxTest, ReadsPlainAndGzipLabelsAlike) {
  const std::vector<uint8_t> labels = {0, 9, 3, 3, 7};
  for (const std::string& path : {Write("l", LabelsFile(labels)), Write("l.gz", Gzip(LabelsFile(labels)))}) {
    auto got = LoadIdxLabels(path, 10);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, labels);
  }
}

TEST_F(IdxTest, ReadsAnEmptyButWellFormedFile) {
  auto images = LoadIdxImages(Write("empty", ImagesFile(0, 28, 28)));
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->count, 0u);
  EXPECT_TRUE(images->pixels.empty());
}

TEST_F(IdxTest, ParsesFromMemory) {
  const auto bytes = ImagesFile(2, 3, 3);
  auto images = ParseIdxImages(bytes, "mem");
  ASSERT_TRUE(images.ok()) << images.status();
  EXPECT_EQ(images->pixels.size(), 18u);
  auto labels = ParseIdxLabels(LabelsFile({1, 2}), "mem", 3);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, (std::vector<uint8_t>{1, 2}));
}

TEST_F(IdxTest, MissingFileIsNotFoundAndNamesThePath) {
  const std::string path = (dir_ / "nope.gz").string();
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(images.status()), HasSubstr(path));
}

TEST_F(IdxTest, BadMagicLabelsFileReadAsImages) {
  const std::string path = Write("labels-as-images", LabelsFile({1, 2, 3, 4, 5, 6, 7, 8}));
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message = Message(images.status());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("bad magic number 0x00000801"));
  EXPECT_THAT(message, HasSubstr("expected 0x00000803"));
  EXPECT_THAT(message, HasSubstr("1 dimensions"));
}

TEST_F(IdxTest, BadMagicNotAnIdxFile) {
  std::vector<uint8_t> bytes(64, 'x');
  const std::string path = Write("junk.gz", Gzip(bytes));
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr("bad magic number 0x78787878"));
  EXPECT_THAT(Message(labels.status()), HasSubstr("not an IDX file"));
  EXPECT_THAT(Message(labels.status()), HasSubstr(path));
}

TEST_F(IdxTest, BadMagicUnsupportedTypeCode) {
  const std::string path = Write("float-images", ImagesFile(1, 2, 2, 0x00000d03));  // 0x0d: float32
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("type code 0x0d"));
}

TEST_F(IdxTest, TruncatedPlainFileNamesBothSizes) {
  auto bytes = ImagesFile(10, 28, 28);  // 16 + 7840 = 7856 bytes
  bytes.resize(bytes.size() - 100);
  const std::string path = Write("short-images", bytes);
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  const std::string message = Message(images.status());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("truncated IDX file: expected 7856 bytes"));
  EXPECT_THAT(message, HasSubstr("16-byte header + 10 x 28 x 28"));
  EXPECT_THAT(message, HasSubstr("got 7756"));
}

// Issue 27: a header's claim is checked against the limit and against what the file can hold before anything is
// allocated for it (before the fix, a 2 GiB claim passed the 16 GiB plausibility bound and the reader reserved
// 256 MiB and grew its buffer in 64 MiB steps for a file of a few bytes).
TEST_F(IdxTest, HeaderClaimsBeyondTheLimitOrTheFileAreRefusedBeforeReading) {
  // 2048 images of 1024 x 1024: 2 GiB, over kMaxIdxDataBytes.
  std::vector<uint8_t> header = ImagesFile(0, 1024, 1024);
  header[6] = 0x08;  // count = 2048 (big-endian 0x00000800)
  const std::string claim = Write("claims-2gib.gz", Gzip(header));
  auto images = LoadIdxImages(claim);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr(claim));
  EXPECT_THAT(Message(images.status()), HasSubstr("implausible IDX header: 2048 images of 1024 x 1024"));
  EXPECT_THAT(Message(images.status()), HasSubstr("the limit for an IDX file"));
  // Labels: 2^31 of them in an 8-byte file.
  auto labels = LoadIdxLabels(Write("labels-2g", {0, 0, 8, 1, 0x80, 0, 0, 0}), 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr("implausible IDX header: 2147483648 labels"));
  // Within the limit, but more than the file can hold: a plain file holds its size, a gzip file at most 1032
  // times its size (deflate's largest ratio).
  header[6] = 0x01;  // 256 images of 1024 x 1024: 256 MiB
  auto plain = LoadIdxImages(Write("claims-256mib", header));
  ASSERT_FALSE(plain.ok());
  EXPECT_THAT(Message(plain.status()), HasSubstr("truncated IDX file: expected 268435472 bytes"));
  EXPECT_THAT(Message(plain.status()), HasSubstr("got 16"));
  const std::string gz = Write("claims-256mib.gz", Gzip(header));
  auto inflated = LoadIdxImages(gz);
  ASSERT_FALSE(inflated.ok());
  EXPECT_THAT(Message(inflated.status()), HasSubstr("more than the file can inflate to"));
}

// A FIFO or a device is refused before it is opened for reading (a FIFO would block the open forever).
TEST_F(IdxTest, FifosAndDevicesAreRefusedNamingThePath) {
  const std::string fifo = (dir_ / "fifo-idx3-ubyte").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto images = LoadIdxImages(fifo);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("IDX file " + fifo + ": is a FIFO, not a regular file"));
  auto labels = LoadIdxLabels("/dev/zero", 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr("IDX file /dev/zero: is a character device"));
}

TEST_F(IdxTest, TruncatedHeader) {
  const std::string path = Write("tiny", {0, 0, 8, 1, 0, 0});
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr("truncated IDX file: expected at least 8 bytes"));
  EXPECT_THAT(Message(labels.status()), HasSubstr("got 6"));
}

TEST_F(IdxTest, TruncatedPayloadInsideCompleteGzipStream) {
  auto bytes = LabelsFile(std::vector<uint8_t>(500, 4));
  bytes.resize(bytes.size() - 20);
  const std::string path = Write("short-labels.gz", Gzip(bytes));
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  const std::string message = Message(labels.status());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("truncated IDX file: expected 508 decompressed bytes"));
  EXPECT_THAT(message, HasSubstr("got 488"));
}

TEST_F(IdxTest, TruncatedGzipStream) {
  const auto gz = Gzip(ImagesFile(20, 28, 28));
  const std::string path = Write("cut.gz", std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  const std::string message = Message(images.status());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("truncated"));
  EXPECT_THAT(message, HasSubstr("the gzip stream itself is cut short"));
}

TEST_F(IdxTest, GzipWithoutItsTrailer) {
  const auto gz = Gzip(ImagesFile(2, 5, 5));
  const std::string path = Write("no-trailer.gz", std::vector<uint8_t>(gz.begin(), gz.end() - 8));
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("truncated gzip stream"));
  EXPECT_THAT(Message(images.status()), HasSubstr(path));
}

TEST_F(IdxTest, CorruptGzipChecksum) {
  auto gz = Gzip(ImagesFile(2, 5, 5));
  gz[gz.size() - 8] ^= 0xff;  // first byte of the CRC-32 trailer
  const std::string path = Write("bad-crc.gz", gz);
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("corrupt gzip data: incorrect data check"));
  EXPECT_THAT(Message(images.status()), HasSubstr(path));
}

TEST_F(IdxTest, ExtraBytesInPlainFile) {
  auto bytes = LabelsFile({1, 2, 3});
  bytes.push_back(0);
  bytes.push_back(0);
  const std::string path = Write("long-labels", bytes);
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  const std::string message = Message(labels.status());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("oversized IDX file: expected 11 bytes (8-byte header + 3 labels), got 13"));
}

TEST_F(IdxTest, ExtraBytesInGzipFile) {
  auto bytes = ImagesFile(4, 28, 28);
  bytes.resize(bytes.size() + 784, 0);
  const std::string path = Write("long-images.gz", Gzip(bytes));
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(
      Message(images.status()),
      HasSubstr("oversized IDX file: expected 3152 decompressed bytes (16-byte header + 4 x 28 x 28), got 3936"));
}

TEST_F(IdxTest, LabelOutOfRange) {
  const std::string path = Write("labels.gz", Gzip(LabelsFile({0, 1, 9, 11, 2})));
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr(path));
  EXPECT_THAT(Message(labels.status()), HasSubstr("label 11 at index 3 is out of range [0, 10)"));
  EXPECT_TRUE(LoadIdxLabels(path, 12).ok());
  EXPECT_FALSE(LoadIdxLabels(path, 0).ok());
}

TEST_F(IdxTest, GzNameButNotGzip) {
  const std::string path = Write("plain-labels.gz", LabelsFile({1, 2, 3}));
  auto labels = LoadIdxLabels(path, 10);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr(path));
  EXPECT_THAT(Message(labels.status()), HasSubstr("not a gzip file (starts with 00 00"));
}

TEST_F(IdxTest, ZeroImageDimensions) {
  const std::string path = Write("flat", ImagesFile(5, 0, 28));
  auto images = LoadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("invalid image dimensions 0 x 28"));
}

TEST_F(IdxTest, ImplausibleHeaderIsRejectedBeforeAllocating) {
  std::vector<uint8_t> bytes;
  PutBigEndian32(bytes, kIdxImagesMagic);
  for (int i = 0; i < 3; ++i) PutBigEndian32(bytes, 0xffffffffu);
  auto images = ParseIdxImages(bytes, "huge");
  ASSERT_FALSE(images.ok());
  EXPECT_THAT(Message(images.status()), HasSubstr("implausible IDX header"));
}

// --- LoadIdxImageRows: only some images of a file ---

TEST_F(IdxTest, ImageRowsAreTheFilesImagesInTheOrderAsked) {
  // 3,000 images of 28 x 28 (2.35 MB): more than one 1 MiB read, so some images span two reads.
  const auto bytes = DistinctImagesFile(3000, 28, 28);
  const std::vector<std::vector<uint32_t>> cases = {
      {0, 1, 2, 1337, 1338, 2999},  // increasing (a partition's rows): stored as read
      {2999, 0, 1337, 0, 5},        // any order, a row twice
      {},                           // nothing kept
  };
  for (const std::string& path : {Write("rows", bytes), Write("rows.gz", Gzip(bytes))}) {
    for (const auto& rows : cases) {
      auto got = LoadIdxImageRows(path, rows);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->file_count, 3000u);
      EXPECT_EQ(got->images.count, rows.size());
      EXPECT_EQ(got->images.rows, 28u);
      EXPECT_EQ(got->images.cols, 28u);
      std::vector<uint8_t> expected;
      for (uint32_t row : rows) {
        const auto image = ImageOf(bytes, row, 784);
        expected.insert(expected.end(), image.begin(), image.end());
      }
      EXPECT_EQ(got->images.pixels, expected) << path << ", " << rows.size() << " rows";
    }
  }
}

TEST_F(IdxTest, ImageRowsOfEveryImageEqualTheWholeFile) {
  const auto bytes = DistinctImagesFile(1500, 28, 28);
  std::vector<uint32_t> all(1500);
  std::iota(all.begin(), all.end(), 0u);
  auto whole = ParseIdxImages(bytes, "mem");
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto rows = ParseIdxImageRows(bytes, "mem", all);
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->images.count, whole->count);
  EXPECT_EQ(rows->images.pixels, whole->pixels);
}

TEST_F(IdxTest, ImageRowOutOfRangeNamesTheRowAndTheCount) {
  const std::string path = Write("few.gz", Gzip(ImagesFile(4, 28, 28)));
  const std::vector<uint32_t> rows = {0, 3, 4};
  auto got = LoadIdxImageRows(path, rows);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(got.status()), HasSubstr(path));
  EXPECT_THAT(Message(got.status()),
              HasSubstr("row 4 (entry 2 of the 3 rows asked for) is out of range: the file has 4 images"));
}

TEST_F(IdxTest, ImageRowsOfATruncatedFileNameBothSizes) {
  auto bytes = DistinctImagesFile(10, 28, 28);
  bytes.resize(bytes.size() - 100);  // the last image is cut short: a row before it is no excuse
  const std::vector<uint32_t> rows = {1, 2};
  for (const std::string& path : {Write("short-images", bytes), Write("short-images.gz", Gzip(bytes))}) {
    auto got = LoadIdxImageRows(path, rows);
    ASSERT_FALSE(got.ok()) << path;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(got.status()), HasSubstr(path));
    EXPECT_THAT(Message(got.status()), HasSubstr("truncated IDX file: expected 7856 "));
    EXPECT_THAT(Message(got.status()), HasSubstr("bytes (16-byte header + 10 x 28 x 28), got 7756"));
  }
}

TEST_F(IdxTest, ImageRowsOfACutGzipStream) {
  const auto gz = Gzip(DistinctImagesFile(20, 28, 28));
  const std::string path = Write("cut.gz", std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
  const std::vector<uint32_t> rows = {0};
  auto got = LoadIdxImageRows(path, rows);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(Message(got.status()), HasSubstr(path));
  EXPECT_THAT(Message(got.status()), HasSubstr("truncated IDX file"));
  EXPECT_THAT(Message(got.status()), HasSubstr("the gzip stream itself is cut short"));
}

TEST_F(IdxTest, ImageRowsOfAFileWithTrailingBytes) {
  auto bytes = ImagesFile(4, 28, 28);
  bytes.resize(bytes.size() + 784, 0);
  const std::string path = Write("long-images.gz", Gzip(bytes));
  const std::vector<uint32_t> rows = {0};
  auto got = LoadIdxImageRows(path, rows);
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(
      Message(got.status()),
      HasSubstr("oversized IDX file: expected 3152 decompressed bytes (16-byte header + 4 x 28 x 28), got 3936"));
}

TEST_F(IdxTest, ImageRowsCheckTheHeaderAsTheWholeFileRead) {
  const std::vector<uint32_t> rows = {0};
  auto flat = LoadIdxImageRows(Write("flat", ImagesFile(5, 0, 28)), rows);
  ASSERT_FALSE(flat.ok());
  EXPECT_THAT(Message(flat.status()), HasSubstr("invalid image dimensions 0 x 28"));
  auto labels = LoadIdxImageRows(Write("labels", LabelsFile(std::vector<uint8_t>(20, 1))), rows);
  ASSERT_FALSE(labels.ok());
  EXPECT_THAT(Message(labels.status()), HasSubstr("bad magic number"));
  auto missing = LoadIdxImageRows((dir_ / "nope.gz").string(), rows);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// --- LoadFashionMnist on small fake dataset directories ---

TEST_F(IdxTest, FashionMnistMissingFileSaysHowToInstall) {
  auto dataset = LoadFashionMnist(dir_.string(), Split::kTest);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(dataset.status()), HasSubstr("t10k-images-idx3-ubyte.gz"));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("apt-get install dataset-fashion-mnist"));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("deploy/install-deps.sh"));
}

TEST_F(IdxTest, FashionMnistReadsUncompressedFiles) {
  Write("t10k-images-idx3-ubyte", ImagesFile(3, 28, 28));
  Write("t10k-labels-idx1-ubyte", LabelsFile({4, 0, 9}));
  auto dataset = LoadFashionMnist(dir_.string(), Split::kTest);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->name, "fashion-mnist/test");
  EXPECT_EQ(dataset->num_examples, 3u);
  EXPECT_EQ(dataset->num_classes, 10u);
  EXPECT_EQ(dataset->labels, (std::vector<uint8_t>{4, 0, 9}));
  EXPECT_EQ(dataset->image(2).size(), 784u);
  EXPECT_EQ(dataset->image(2)[0], dataset->pixels[2 * 784]);
}

TEST_F(IdxTest, FashionMnistCountMismatch) {
  Write("train-images-idx3-ubyte.gz", Gzip(ImagesFile(3, 28, 28)));
  Write("train-labels-idx1-ubyte.gz", Gzip(LabelsFile({1, 2, 3, 4})));
  auto dataset = LoadFashionMnist(dir_.string(), Split::kTrain);
  ASSERT_FALSE(dataset.ok());
  const std::string message = Message(dataset.status());
  EXPECT_THAT(message, HasSubstr("count mismatch"));
  EXPECT_THAT(message, HasSubstr("train-images-idx3-ubyte.gz has 3 images"));
  EXPECT_THAT(message, HasSubstr("train-labels-idx1-ubyte.gz has 4 labels"));
}

TEST_F(IdxTest, FashionMnistWrongImageSize) {
  Write("train-images-idx3-ubyte", ImagesFile(2, 32, 32));
  Write("train-labels-idx1-ubyte", LabelsFile({1, 2}));
  auto dataset = LoadFashionMnist(dir_.string(), Split::kTrain);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(Message(dataset.status()), HasSubstr("images are 32 x 32, Fashion-MNIST images are 28 x 28"));
}

TEST_F(IdxTest, FashionMnistRowsAreTheWholeSplitsRows) {
  const auto images = DistinctImagesFile(5, 28, 28);
  Write("t10k-images-idx3-ubyte.gz", Gzip(images));
  Write("t10k-labels-idx1-ubyte.gz", Gzip(LabelsFile({4, 0, 9, 1, 7})));
  auto labels = LoadFashionMnistLabels(dir_.string(), Split::kTest);
  ASSERT_TRUE(labels.ok()) << labels.status();
  EXPECT_EQ(*labels, (std::vector<uint8_t>{4, 0, 9, 1, 7}));
  const std::vector<uint32_t> rows = {3, 0, 4};
  auto dataset = LoadFashionMnistRows(dir_.string(), Split::kTest, rows);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->name, "fashion-mnist/test");
  EXPECT_EQ(dataset->num_examples, 3u);
  EXPECT_EQ(dataset->rows, 28u);
  EXPECT_EQ(dataset->cols, 28u);
  EXPECT_EQ(dataset->num_classes, 10u);
  EXPECT_EQ(dataset->labels, (std::vector<uint8_t>{1, 4, 7}));
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::span<const uint8_t> image = dataset->image(i);
    EXPECT_EQ(std::vector<uint8_t>(image.begin(), image.end()), ImageOf(images, rows[i], 784)) << i;
  }
}

TEST_F(IdxTest, FashionMnistRowsMissingImagesSaysHowToInstall) {
  Write("train-labels-idx1-ubyte.gz", Gzip(LabelsFile({1, 2})));
  // The labels are there, the images are not: both calls say so before any reading.
  auto labels = LoadFashionMnistLabels(dir_.string(), Split::kTrain);
  ASSERT_FALSE(labels.ok());
  EXPECT_EQ(labels.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(labels.status()), HasSubstr("train-images-idx3-ubyte.gz"));
  EXPECT_THAT(Message(labels.status()), HasSubstr("apt-get install dataset-fashion-mnist"));
  const std::vector<uint32_t> rows = {0};
  auto dataset = LoadFashionMnistRows(dir_.string(), Split::kTrain, rows);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(dataset.status()), HasSubstr("train-images-idx3-ubyte.gz"));
}

TEST_F(IdxTest, FashionMnistRowOutOfRangeNamesTheSplitsSize) {
  Write("train-images-idx3-ubyte.gz", Gzip(ImagesFile(3, 28, 28)));
  Write("train-labels-idx1-ubyte.gz", Gzip(LabelsFile({1, 2, 3})));
  const std::vector<uint32_t> rows = {0, 3};
  auto dataset = LoadFashionMnistRows(dir_.string(), Split::kTrain, rows);
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(dataset.status()),
              HasSubstr("Fashion-MNIST train: row 3 (entry 1 of the 2 rows asked for) is out of range for the "
                        "split's 3 examples"));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("train-labels-idx1-ubyte.gz"));
}

TEST_F(IdxTest, FashionMnistRowsTruncatedImagesFile) {
  auto images = ImagesFile(3, 28, 28);
  images.resize(images.size() - 10);
  const std::string path = Write("train-images-idx3-ubyte.gz", Gzip(images));
  Write("train-labels-idx1-ubyte.gz", Gzip(LabelsFile({1, 2, 3})));
  const std::vector<uint32_t> rows = {0};
  auto dataset = LoadFashionMnistRows(dir_.string(), Split::kTrain, rows);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(Message(dataset.status()), HasSubstr(path));
  EXPECT_THAT(Message(dataset.status()),
              HasSubstr("truncated IDX file: expected 2368 decompressed bytes (16-byte header + 3 x 28 x 28), got "
                        "2358"));
}

TEST_F(IdxTest, FashionMnistRowsCountMismatchAndWrongImageSize) {
  Write("train-images-idx3-ubyte.gz", Gzip(ImagesFile(3, 28, 28)));
  Write("train-labels-idx1-ubyte.gz", Gzip(LabelsFile({1, 2, 3, 4})));
  const std::vector<uint32_t> rows = {0};
  auto dataset = LoadFashionMnistRows(dir_.string(), Split::kTrain, rows);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(Message(dataset.status()), HasSubstr("count mismatch"));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("train-images-idx3-ubyte.gz has 3 images"));
  EXPECT_THAT(Message(dataset.status()), HasSubstr("train-labels-idx1-ubyte.gz has 4 labels"));
  Write("train-images-idx3-ubyte.gz", Gzip(ImagesFile(4, 32, 32)));
  dataset = LoadFashionMnistRows(dir_.string(), Split::kTrain, rows);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(Message(dataset.status()), HasSubstr("images are 32 x 32, Fashion-MNIST images are 28 x 28"));
}

TEST(SplitTest, ParsesAndNames) {
  EXPECT_EQ(*ParseSplit("train"), Split::kTrain);
  EXPECT_EQ(*ParseSplit("test"), Split::kTest);
  EXPECT_EQ(SplitName(Split::kTest), "test");
  EXPECT_THAT(std::string(fl::ToStd(ParseSplit("valid").status().message())), HasSubstr("unknown dataset split"));
}

}  // namespace
}  // namespace fl::training::data
