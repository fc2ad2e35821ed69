// Fuzz targets of the link profile loader and the Mahimahi trace reader (issue 27), mutated from the seeds in
// emulation/test/corpus/: profiles from YAML bytes (config's strict parser, then ParseLinkProfile; relative trace
// paths resolve in corpus/link_profile-data/), and trace files written to a scratch file (LoadMahimahiTrace reads a
// path). Every input must come back as a value or an error: no crash, no escaping exception, no allocation beyond
// the memory limit. By hand: FL_FUZZ_SECONDS=600 build/<dir>/emulation/emulation_link_profile_fuzz_test
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "fl/config/yaml_fields.h"
#include "fl/emulation/link_profile.h"
#include "fl/testing/mutation_fuzz.h"
#include "fl/testing/scratch_dir.h"

namespace fl::emulation {
namespace {

namespace fs = std::filesystem;

const fs::path kCorpus = fs::path(FL_EMULATION_TEST_DIR) / "corpus";

fl::testing::FuzzOptions Options() {
  fl::testing::FuzzOptions o;
  o.iterations = 2000;
  o.max_input_size = 64 << 10;
  // A profile is a few nodes and a trace at most 4 times its file's size in memory: 1 GiB of address space is
  // far more than either needs, and an input that makes the reader allocate without bound fails.
  o.memory_limit_bytes = size_t{1} << 30;
  return o;
}

TEST(LinkProfileFuzzTest, ProfilesFromYamlBytes) {
  const auto corpus = fl::testing::ReadCorpus((kCorpus / "link_profile").string());
  ASSERT_GE(corpus.size(), 3u);
  size_t parsed = 0;
  fl::testing::RunMutationFuzz(
      "link_profile", corpus,
      [&](std::span<const uint8_t> in) {
        const std::string text(reinterpret_cast<const char*>(in.data()), in.size());
        absl::StatusOr<YAML::Node> node = config::ParseYaml(text, "fuzz.yaml");
        if (!node.ok()) return;
        YamlContext context;
        context.file = "fuzz.yaml";
        context.base_dir = kCorpus / "link_profile-data";
        absl::StatusOr<LinkProfile> p = ParseLinkProfile(*node, context);
        if (p.ok()) {
          ++parsed;
          (void)LinkProfileToYaml(*p);
        }
      },
      Options());
  EXPECT_GE(parsed, corpus.size());  // the seeds themselves are valid
}

TEST(LinkProfileFuzzTest, MahimahiTraces) {
  const auto corpus = fl::testing::ReadCorpus((kCorpus / "trace").string());
  ASSERT_GE(corpus.size(), 3u);
  fl::testing::ScratchDir dir("trace_fuzz");
  const std::string path = dir.File("fuzz.trace");
  fl::testing::FuzzOptions options = Options();
  options.iterations = 800;  // each input is a file written and read: a few seconds
  fl::testing::RunMutationFuzz(
      "mahimahi_trace", corpus,
      [&](std::span<const uint8_t> in) {
        {
          std::ofstream out(path, std::ios::binary | std::ios::trunc);
          out.write(reinterpret_cast<const char*>(in.data()), static_cast<std::streamsize>(in.size()));
        }
        absl::StatusOr<MahimahiTrace> t = LoadMahimahiTrace(path);
        if (t.ok()) {
          EXPECT_GT(t->period_ms, 0u);
          EXPECT_GE(t->MeanRateBps(), 0.0);
        }
      },
      options);
}

}  // namespace
}  // namespace fl::emulation
