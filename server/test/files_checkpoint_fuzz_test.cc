// Fuzz target of LoadCheckpoint (issue 27): checkpoints mutated from the seeds in server/test/corpus/checkpoint/,
// written to a scratch file and loaded. Every input must come back as a checkpoint or an error (no crash, no
// escaping exception, no allocation beyond the memory limit: the header's declared sizes are checked against the
// file before anything is allocated), and a loaded one is consistent (values match the spec, all finite).
// By hand: FL_FUZZ_SECONDS=600 build/<dir>/server/server_files_checkpoint_fuzz_test
// The seeds are what SaveCheckpoint writes (TheSeedsAreWhatSaveCheckpointWritesNow checks it; FL_WRITE_CORPUS=1
// writes them anew when the format changes).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "fl/server/checkpoint.h"
#include "fl/testing/mutation_fuzz.h"
#include "fl/testing/scratch_dir.h"

namespace fl::server {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(FL_SERVER_TEST_DIR) / "corpus" / "checkpoint";

Checkpoint Seed(int variant) {
  Checkpoint c;
  c.experiment_id = "fuzz-exp";
  c.round = 3 + variant;
  c.model_version = 3 + variant;
  std::vector<core::TensorSpec> tensors = {{"conv.weight", {2, 1, 3, 3}, core::DType::kFloat32, 0},
                                           {"conv.bias", {2}, core::DType::kFloat32, 0}};
  if (variant >= 1) tensors.push_back({"bn.num_batches_tracked", {}, core::DType::kInt64, 0});
  c.spec = *core::ModelSpec::Create(tensors);
  c.model_name = "fuzz";
  for (uint64_t i = 0; i < c.spec.num_elements(); ++i) c.values.push_back(0.25f * static_cast<float>(i) - 2.0f);
  if (variant == 1) {
    c.optimizer.optimizer = "fedavgm";
    c.optimizer.step_count = 4;
    c.optimizer.buffers.push_back({"momentum", std::vector<float>(c.values.size(), 0.5f)});
  }
  if (variant == 2) {
    c.optimizer.optimizer = "fedadam";
    c.optimizer.step_count = 5;
    c.optimizer.buffers.push_back({"m", std::vector<float>(c.values.size(), 0.1f)});
    c.optimizer.buffers.push_back({"v", std::vector<float>(c.values.size(), 0.01f)});
    c.task = "regression";
  }
  c.created_unix_ms = 1700000000000 + variant;
  return c;
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The committed seeds are the checkpoints SaveCheckpoint writes today for Seed(0..2): when the format changes this
// fails, and FL_WRITE_CORPUS=1 writes them anew into server/test/corpus/checkpoint/ (then commit them).
TEST(FilesCheckpointFuzzTest, TheSeedsAreWhatSaveCheckpointWritesNow) {
  const bool write = std::getenv("FL_WRITE_CORPUS") != nullptr;
  fl::testing::ScratchDir dir("checkpoint_seeds");
  if (write) fs::create_directories(kCorpus);
  for (int v = 0; v < 3; ++v) {
    const std::string name = "seed-" + std::to_string(v) + ".ckpt";
    const fs::path path = write ? kCorpus / name : dir.path() / name;
    ASSERT_TRUE(SaveCheckpoint(Seed(v), path.string()).ok()) << path;
    if (!write) {
      EXPECT_TRUE(ReadBytes(path) == ReadBytes(kCorpus / name))
          << name << " differs from what SaveCheckpoint writes now; FL_WRITE_CORPUS=1 writes the seeds anew";
    }
  }
}

TEST(FilesCheckpointFuzzTest, LoadCheckpoint) {
  const auto corpus = fl::testing::ReadCorpus(kCorpus.string());
  ASSERT_GE(corpus.size(), 3u) << kCorpus;
  fl::testing::ScratchDir dir("checkpoint_fuzz");
  const std::string path = dir.File("fuzz.ckpt");
  fl::testing::FuzzOptions options;
  options.iterations = 3000;
  options.max_input_size = 64 << 10;
  // A checkpoint is read whole and its values copied once: 1 GiB of address space is far more than a 64 KiB
  // input needs, and a header that made the loader allocate what it declares would fail.
  options.memory_limit_bytes = size_t{1} << 30;
  size_t loaded = 0;
  fl::testing::RunMutationFuzz(
      "checkpoint", corpus,
      [&](std::span<const uint8_t> in) {
        {
          std::ofstream out(path, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
        }
        absl::StatusOr<Checkpoint> c = LoadCheckpoint(path);
        if (!c.ok()) {
          EXPECT_NE(c.status().message().find(path), absl::string_view::npos) << c.status();  // names the file
          return;
        }
        ++loaded;
        EXPECT_EQ(c->values.size(), c->spec.num_elements());
        for (float v : c->values) EXPECT_TRUE(std::isfinite(v));
      },
      options);
  EXPECT_GE(loaded, corpus.size());  // the seeds themselves load
}

}  // namespace
}  // namespace fl::server
