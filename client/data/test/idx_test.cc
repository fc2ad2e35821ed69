// IDX reader: round trips through plain and gzip files, and one test per way a file can be wrong, each
// checking that the error names the file and the problem.
#include "fl/data/idx.h"

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/data/fashion_mnist.h"

namespace fl::data {
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

TEST(SplitTest, ParsesAndNames) {
  EXPECT_EQ(*ParseSplit("train"), Split::kTrain);
  EXPECT_EQ(*ParseSplit("test"), Split::kTest);
  EXPECT_EQ(SplitName(Split::kTest), "test");
  EXPECT_THAT(std::string(fl::ToStd(ParseSplit("valid").status().message())), HasSubstr("unknown dataset split"));
}

}  // namespace
}  // namespace fl::data
