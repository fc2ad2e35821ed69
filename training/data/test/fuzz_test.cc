// Fuzz targets of training/data's readers of users' files (issue 27): the IDX reader (images and labels, plain and
// gzip, whole and by rows, from memory and from files) and LoadClientData for each format (an .npz for each task,
// a text corpus, a Fashion-MNIST folder). Seeds: training/data/test/corpus/<target>/ (small real files written by
// corpus/make_corpus.py). Every input must give a value or an error, never a crash, an escaping exception or an
// allocation past the run's address-space limit.
//
// The suite runs a fixed number of inputs per target (a few seconds in all); by hand, for longer:
//   FL_FUZZ_SECONDS=600 build/release/training/data/data_fuzz_test --gtest_filter='*Npz*'
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fl/training/data/client_data.h"
#include "fl/training/data/idx.h"
#include "fl/testing/mutation_fuzz.h"
#include "fl/testing/scratch_dir.h"

namespace fl::training::data {
namespace {

using fl::testing::FuzzOptions;
using fl::testing::ReadCorpus;
using fl::testing::RunMutationFuzz;

std::string CorpusDir(const std::string& target) { return std::string(FL_DATA_CORPUS_DIR) + "/" + target; }

// Small inputs (the seeds are a few KB) and an address-space limit well above what the readers may allocate
// for them, far below what an unbounded reader would: a header's claim followed without a bound fails as
// std::bad_alloc, an escaping exception, which fails the test and saves the input.
FuzzOptions Options(size_t iterations) {
  FuzzOptions o;
  o.iterations = iterations;
  o.max_input_size = 64 << 10;
  o.memory_limit_bytes = size_t{2} << 30;
  return o;
}

// A new file each time (removed, then created): truncating a file in place makes ext4 flush it at close
// (auto_da_alloc), which made every input cost a disk write.
void WriteFile(const std::string& path, std::span<const uint8_t> bytes) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::vector<uint8_t>> Seeds(const std::string& target) {
  auto corpus = ReadCorpus(CorpusDir(target));
  EXPECT_FALSE(corpus.empty()) << "no seeds in " << CorpusDir(target) << " (run make_corpus.py there)";
  return corpus;
}

DataOptions OptionsFor(const std::string& path, Task task, uint32_t client_index) {
  DataOptions o;
  o.path = path;
  o.task = task;
  o.num_clients = 2;
  o.client_index = client_index;
  o.seq_len = 4;
  return o;
}

// The seeds are valid inputs of their readers, so that mutations start from files that get past every check.
TEST(DataFuzzTest, SeedsAreReadWithoutError) {
  const std::string dir = FL_DATA_CORPUS_DIR;
  for (const char* name : {"plain_3x4x5", "gzip_3x4x5.gz", "plain_2x28x28"}) {
    const auto images = LoadIdxImages(dir + "/idx_images/" + name);
    EXPECT_TRUE(images.ok()) << name << ": " << images.status();
  }
  for (const char* name : {"plain_6", "gzip_6.gz"}) {
    const auto labels = LoadIdxLabels(dir + "/idx_labels/" + name, 10);
    EXPECT_TRUE(labels.ok()) << name << ": " << labels.status();
  }
  const std::pair<const char*, Task> npz[] = {{"classification.npz", Task::kClassification},
                                              {"classification_uint8_client_id.npz", Task::kClassification},
                                              {"regression_compressed.npz", Task::kRegression},
                                              {"next_token.npz", Task::kNextToken}};
  for (const auto& [name, task] : npz) {
    const auto data = LoadClientData(OptionsFor(dir + "/npz/" + name, task, 1));
    EXPECT_TRUE(data.ok()) << name << ": " << data.status();
  }
  for (const char* name : {"verse", "bytes"}) {
    const auto data = LoadClientData(OptionsFor(dir + "/text/" + name, Task::kNextToken, 1));
    EXPECT_TRUE(data.ok()) << name << ": " << data.status();
  }
}

TEST(DataFuzzTest, IdxImages) {
  fl::testing::ScratchDir dir("data_fuzz_idx_images");
  const std::string plain = dir.File("images-idx3-ubyte");
  const std::string gz = dir.File("images-idx3-ubyte.gz");
  const uint32_t rows[] = {2, 0, 2, 1};
  const size_t runs = RunMutationFuzz(
      "idx_images", Seeds("idx_images"),
      [&](std::span<const uint8_t> bytes) {
        (void)ParseIdxImages(bytes, "fuzz");
        (void)ParseIdxImageRows(bytes, "fuzz", rows);
        // From a file: gzip when the bytes start with its magic (the reader decides by content), plain otherwise.
        const bool gzip = bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
        const std::string& path = gzip ? gz : plain;
        WriteFile(path, bytes);
        (void)LoadIdxImages(path);
        (void)LoadIdxImageRows(path, rows);
      },
      Options(20000));
  EXPECT_GT(runs, 0u);
  std::cout << runs << " inputs\n";
}

TEST(DataFuzzTest, IdxLabels) {
  fl::testing::ScratchDir dir("data_fuzz_idx_labels");
  const std::string plain = dir.File("labels-idx1-ubyte");
  const std::string gz = dir.File("labels-idx1-ubyte.gz");
  const size_t runs = RunMutationFuzz(
      "idx_labels", Seeds("idx_labels"),
      [&](std::span<const uint8_t> bytes) {
        (void)ParseIdxLabels(bytes, "fuzz", 10);
        const bool gzip = bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b;
        const std::string& path = gzip ? gz : plain;
        WriteFile(path, bytes);
        (void)LoadIdxLabels(path, 10);
      },
      Options(20000));
  EXPECT_GT(runs, 0u);
  std::cout << runs << " inputs\n";
}

TEST(DataFuzzTest, LoadClientDataNpzForEveryTask) {
  fl::testing::ScratchDir dir("data_fuzz_npz");
  const std::string path = dir.File("data.npz");
  const size_t runs = RunMutationFuzz(
      "client_data_npz", Seeds("npz"),
      [&](std::span<const uint8_t> bytes) {
        WriteFile(path, bytes);
        for (Task task : {Task::kClassification, Task::kRegression, Task::kNextToken}) {
          (void)LoadClientData(OptionsFor(path, task, 1));
        }
        DataOptions natural = OptionsFor(path, Task::kClassification, 0);
        natural.partition = "natural";
        (void)LoadClientData(natural);
      },
      Options(10000));
  EXPECT_GT(runs, 0u);
  std::cout << runs << " inputs\n";
}

TEST(DataFuzzTest, LoadClientDataTextCorpus) {
  fl::testing::ScratchDir dir("data_fuzz_text");
  const std::string file = dir.File("corpus");
  // A folder of two texts as well: the mutated one and a fixed one, joined.
  std::filesystem::create_directories(dir.File("folder"));
  const std::string in_folder = dir.File("folder/a");
  std::ofstream(dir.File("folder/b")) << "a fixed second text of the folder\n";
  const size_t runs = RunMutationFuzz(
      "client_data_text", Seeds("text"),
      [&](std::span<const uint8_t> bytes) {
        WriteFile(file, bytes);
        WriteFile(in_folder, bytes);
        (void)LoadClientData(OptionsFor(file, Task::kNextToken, 1));
        (void)LoadClientData(OptionsFor(dir.File("folder"), Task::kNextToken, 0));
      },
      Options(8000));
  EXPECT_GT(runs, 0u);
  std::cout << runs << " inputs\n";
}

TEST(DataFuzzTest, LoadClientDataFashionMnistFolder) {
  // A Fashion-MNIST folder whose training images are the fuzzed input; the other three files are valid (6
  // training labels, 2 test images and labels), so that inputs get past them.
  fl::testing::ScratchDir dir("data_fuzz_fashion");
  const std::string folder = dir.path().string();
  auto idx = [](uint32_t magic, std::vector<uint32_t> dims, size_t payload) {
    std::vector<uint8_t> out;
    dims.insert(dims.begin(), magic);
    for (uint32_t v : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
    }
    for (size_t i = 0; i < payload; ++i) out.push_back(static_cast<uint8_t>((i * 7) % 10));
    return out;
  };
  WriteFile(folder + "/train-labels-idx1-ubyte", idx(kIdxLabelsMagic, {6}, 6));
  WriteFile(folder + "/t10k-images-idx3-ubyte", idx(kIdxImagesMagic, {2, 28, 28}, 2 * 28 * 28));
  WriteFile(folder + "/t10k-labels-idx1-ubyte", idx(kIdxLabelsMagic, {2}, 2));
  const std::string images = folder + "/train-images-idx3-ubyte";
  const size_t runs = RunMutationFuzz(
      "client_data_fashion", Seeds("fashion"),
      [&](std::span<const uint8_t> bytes) {
        WriteFile(images, bytes);
        (void)LoadClientData(OptionsFor(folder, Task::kClassification, 1));
      },
      Options(8000));
  EXPECT_GT(runs, 0u);
  std::cout << runs << " inputs\n";
}

}  // namespace
}  // namespace fl::training::data
