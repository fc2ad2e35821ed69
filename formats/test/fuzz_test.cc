// Fuzz targets of the torch-free readers (testing/include/fl/testing/mutation_fuzz.h), one per reader, each from its
// seed corpus in formats/test/corpus/<reader>/ (written by `hostile_files.py --corpus`). The suite runs a fixed
// number of mutated inputs per target (a few seconds); by hand, for as long as you like:
//
//   FL_FUZZ_SECONDS=600 FL_FUZZ_SEED=7 build/release/formats/formats_fuzz_test --gtest_filter='*TorchScript*'
//
// Each target must return normally (any Status is fine); the run holds RLIMIT_AS at kMemoryLimit, so an input
// that makes a reader allocate without bound fails as std::bad_alloc instead of taking the machine.
#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/formats/npy.h"
#include "fl/formats/pickle.h"
#include "fl/formats/torchscript_archive.h"
#include "fl/formats/zip_archive.h"
#include "fl/testing/mutation_fuzz.h"
#include "fl/testing/scratch_dir.h"

#ifndef FL_FORMATS_TEST_SOURCE_DIR
#error "FL_FORMATS_TEST_SOURCE_DIR must name formats/test (set in formats/CMakeLists.txt)"
#endif

namespace fl::formats {
namespace {

// Inputs are at most 1 MiB; every reader's bounds keep it within a small multiple of that plus the limits of
// docs/input-limits.md, far below this.
constexpr size_t kMemoryLimit = size_t{1} << 30;

std::vector<std::vector<uint8_t>> Corpus(const std::string& reader) {
  auto corpus = fl::testing::ReadCorpus(std::string(FL_FORMATS_TEST_SOURCE_DIR) + "/corpus/" + reader);
  EXPECT_FALSE(corpus.empty()) << "no seeds in formats/test/corpus/" << reader;
  return corpus;
}

fl::testing::FuzzOptions Options(size_t iterations = 1500) {
  fl::testing::FuzzOptions options;
  options.iterations = iterations;
  options.memory_limit_bytes = kMemoryLimit;
#if defined(__SANITIZE_ADDRESS__)
  options.memory_limit_bytes = 0;  // AddressSanitizer reserves terabytes of shadow address space
#endif
  return options;
}

// Readers that take a path: each input is written to one scratch file first.
class FileTarget {
 public:
  explicit FileTarget(const std::string& name) : path_(dir_.File(name)) {}
  const std::string& Write(std::span<const uint8_t> bytes) {
    std::ofstream(path_, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path_;
  }

 private:
  fl::testing::ScratchDir dir_{"formats_fuzz"};
  std::string path_;
};

TEST(FormatsFuzzTest, Pickle) {
  const size_t runs = fl::testing::RunMutationFuzz(
      "pickle", Corpus("pickle"),
      [](std::span<const uint8_t> bytes) {
        auto doc = ParsePickle(bytes, "fuzz.pkl");
        if (!doc.ok()) return;
        // Every value described (no recursion: cycles are legal) and every container's items in range.
        for (PickleRef ref = 0; ref < doc->size(); ++ref) {
          (void)doc->Describe(ref);
          for (PickleRef item : doc->items(ref)) ASSERT_LT(item, doc->size());
        }
      },
      Options(20000));  // in memory: cheap
  EXPECT_GT(runs, 0u);
}

TEST(FormatsFuzzTest, ZipArchive) {
  std::vector<std::vector<uint8_t>> corpus = Corpus("zip");
  for (const char* other : {"npz", "torchscript"}) {
    for (auto& seed : Corpus(other)) corpus.push_back(std::move(seed));
  }
  FileTarget file("fuzz.zip");
  const size_t runs = fl::testing::RunMutationFuzz(
      "zip", corpus,
      [&](std::span<const uint8_t> bytes) {
        auto zip = ZipArchive::Open(file.Write(bytes));
        if (!zip.ok()) return;
        for (const ZipEntry& entry : zip->entries()) {
          (void)zip->ReadAll(entry, 4 << 20);
          uint8_t head[16];
          if (entry.uncompressed_size >= sizeof head) (void)zip->ReadRange(entry, 0, head);
          (void)zip->VerifyCrc(entry);
        }
      },
      Options());
  EXPECT_GT(runs, 0u);
}

TEST(FormatsFuzzTest, Npy) {
  FileTarget file("fuzz.npy");
  const size_t runs = fl::testing::RunMutationFuzz(
      "npy", Corpus("npy"),
      [&](std::span<const uint8_t> bytes) {
        (void)ParseNpyHeader(bytes, "fuzz.npy");
        auto array = LoadNpy(file.Write(bytes));
        if (array.ok()) {
          ASSERT_EQ(array->data.size(), array->header.data_bytes());
        }
      },
      Options());
  EXPECT_GT(runs, 0u);
}

TEST(FormatsFuzzTest, Npz) {
  FileTarget file("fuzz.npz");
  const size_t runs = fl::testing::RunMutationFuzz(
      "npz", Corpus("npz"),
      [&](std::span<const uint8_t> bytes) {
        auto npz = NpzFile::Open(file.Write(bytes));
        if (!npz.ok()) return;
        for (const std::string& name : npz->ArrayNames()) {
          auto header = npz->Header(name);
          if (!header.ok()) continue;
          (void)npz->ReadAll(name);
          if (header->rows() > 0 && !header->shape.empty()) {
            const uint32_t rows[] = {0, static_cast<uint32_t>(std::min<uint64_t>(header->rows() - 1, 1000)), 0};
            auto read = npz->ReadRows(name, rows);
            if (read.ok()) {
              ASSERT_EQ(read->size(), 3 * header->row_bytes());
            }
          }
        }
      },
      Options());
  EXPECT_GT(runs, 0u);
}

TEST(FormatsFuzzTest, TorchScript) {
  FileTarget file("fuzz.pt");
  const size_t runs = fl::testing::RunMutationFuzz(
      "torchscript", Corpus("torchscript"),
      [&](std::span<const uint8_t> bytes) {
        const std::string& path = file.Write(bytes);
        auto model = ReadTorchScriptModel(path);
        if (model.ok()) {
          ASSERT_EQ(model->values.size(), model->spec.num_elements());
        }
        (void)CheckTorchScriptFile(path);
      },
      Options());
  EXPECT_GT(runs, 0u);
}

}  // namespace
}  // namespace fl::formats
