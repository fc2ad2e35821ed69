// Fuzz target of the manifest loaders (issue 27): experiment manifests (ParseManifest, from YAML bytes) and islands
// manifests (LoadIslandsExperiment, from a scratch file), mutated from the
// seeds in experiments/test/corpus/. Every input must come back as a manifest or an error: no crash, no abort, no
// escaping exception, no allocation beyond the run's memory limit. The suite runs a fixed number of inputs;
// by hand: FL_FUZZ_SECONDS=600 build/<dir>/experiments/experiments_manifest_fuzz_test
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "fl/experiment/manifest.h"
#include "fl/testing/mutation_fuzz.h"
#include "fl/testing/scratch_dir.h"
#include "fl/experiment/islands_experiment.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(FL_EXPERIMENTS_DIR) / "test" / "corpus";

fl::testing::FuzzOptions Options() {
  fl::testing::FuzzOptions o;
  o.iterations = 1500;
  // A manifest is at most 4 MiB of YAML and 250,000 nodes (about 115 MB in yaml-cpp): 2 GiB of address space
  // holds that with the process's own, and an input that makes a loader allocate without bound fails.
  o.memory_limit_bytes = size_t{2} << 30;
  o.max_input_size = 64 << 10;
  return o;
}

TEST(ManifestFuzzTest, ExperimentManifests) {
  const auto corpus = fl::testing::ReadCorpus((kCorpus / "manifest").string());
  ASSERT_GE(corpus.size(), 3u);
  // Profile names resolve in the repository's profiles; relative trace paths in manifest-data/.
  const ManifestOptions options{fs::path(FL_EXPERIMENTS_DIR) / "profiles"};
  size_t parsed = 0;
  const size_t runs = fl::testing::RunMutationFuzz(
      "experiment_manifest", corpus,
      [&](std::span<const uint8_t> in) {
        const std::string text(reinterpret_cast<const char*>(in.data()), in.size());
        absl::StatusOr<Manifest> m = ParseManifest(text, "fuzz.yaml", kCorpus / "manifest-data", options);
        if (m.ok()) {
          ++parsed;
          (void)ResolvedManifestJson(*m);  // what a run stores: must not fail on anything the loader accepted
        }
      },
      Options());
  EXPECT_GT(runs, corpus.size());
  EXPECT_GE(parsed, corpus.size());  // the seeds themselves are valid
}

TEST(ManifestFuzzTest, IslandsManifests) {
  const auto corpus = fl::testing::ReadCorpus((kCorpus / "islands").string());
  ASSERT_GE(corpus.size(), 2u);
  fl::testing::ScratchDir dir("islands_fuzz");
  // Beside the repository's experiments/, as the seeds are, so that named link profiles resolve the same way.
  const std::string path = dir.File("islands.yaml");
  fl::testing::FuzzOptions o = Options();
  o.iterations = 800;
  fl::testing::RunMutationFuzz(
      "islands_manifest", corpus,
      [&](std::span<const uint8_t> in) {
        {
          std::ofstream out(path, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
        }
        (void)fl::experiment::LoadIslandsExperiment(path);
      },
      o);
}

}  // namespace
}  // namespace fl::experiment
