// The islands manifests: every committed manifest parses and validates; mistakes are errors that name the
// file, the field and the line.
#include "fl/experiment/islands_experiment.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

TEST(IslandsExperimentTest, EveryCommittedManifestLoads) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(FL_DILOCO_MANIFEST_DIR)) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(entry.path().string());
    ASSERT_TRUE(c.ok()) << entry.path() << ": " << c.status();
    EXPECT_FALSE(c->name.empty());
    ++n;
  }
  EXPECT_GE(n, 5u);
  absl::StatusOr<IslandsExperimentConfig> s =
      LoadIslandsExperiment(std::string(FL_DILOCO_MANIFEST_DIR) + "/streaming_overlap_int4.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->fragments, 4u);
  EXPECT_EQ(s->overlap_steps, 5u);
  EXPECT_EQ(s->codec, "int4");
  EXPECT_EQ(s->total_steps, 600u);
}

TEST(IslandsExperimentTest, UnknownFieldNamesFileFieldAndLine) {
  fl::testing::ScratchDir dir("manifest");
  const std::string path = dir.File("bad.yaml");
  std::ofstream(path) << "name: x\nouter:\n  inner_steps: 10\n  fragmnets: 2\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("bad.yaml:4: outer.fragmnets: unknown key; allowed: inner_steps, fragments, strategy, "
                     "overlap_steps, mixing_alpha, optimizer"),
            std::string::npos)
      << msg;
}

// Wrong types and values out of range are refused at load with the line, not by a conversion exception.
TEST(IslandsExperimentTest, WrongTypesAndRangesNameFileLineAndWhatIsAllowed) {
  fl::testing::ScratchDir dir("manifest6");
  const std::string path = dir.File("bad.yaml");
  std::ofstream(path) << "name: x\nislands: two\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message())
                .find("bad.yaml:2: islands: expected an integer, got \"two\"; allowed: an integer in [1, 64]"),
            std::string::npos)
      << c.status();

  std::ofstream(path) << "name: x\nexchange:\n  error_feedback: perhaps\n";
  c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("bad.yaml:3: exchange.error_feedback: expected true or false"),
            std::string::npos)
      << c.status();

  std::ofstream(path) << "name: x\nmodel: [char-lm]\n";
  c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message())
                .find("bad.yaml:2: model: expected a map, got a list; allowed: a map "
                      "with keys name, d_model, layers"),
            std::string::npos)
      << c.status();
}

// model: and inner: keys become fl-island flags; the outer loop and the exchange go into the config.
TEST(IslandsExperimentTest, ModelAndInnerKeysBecomeIslandFlags) {
  absl::StatusOr<IslandsExperimentConfig> d =
      LoadIslandsExperiment(std::string(FL_DILOCO_MANIFEST_DIR) + "/diloco.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  const std::vector<std::string> expected = {"--model", "char-lm", "--d-model",  "64",     "--layers",       "3",
                                             "--heads", "4",       "--context",  "64",     "--batch-size",   "16",
                                             "--seed",  "1",       "--inner-lr", "3.0e-3", "--weight-decay", "0.1",
                                             "--beta1", "0.9",     "--beta2",    "0.95",   "--warmup-steps", "50"};
  EXPECT_EQ(d->island_args, expected);
  EXPECT_EQ(d->total_steps, 600u);
  EXPECT_EQ(d->inner_steps, 100u);
  EXPECT_EQ(d->codec, "int8");
  EXPECT_TRUE(d->error_feedback);
  EXPECT_EQ(d->method, "diloco");
}

TEST(IslandsExperimentTest, ScheduleThatCannotWorkIsRejected) {
  fl::testing::ScratchDir dir("manifest2");
  const std::string path = dir.File("bad.yaml");
  std::ofstream(path) << "name: x\ninner:\n  total_steps: 100\nouter:\n  inner_steps: 100\n  fragments: 3\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("outer.fragments"), std::string::npos) << c.status();
}

TEST(IslandsExperimentTest, UnknownFragmentStrategyIsRejectedAtLoad) {
  fl::testing::ScratchDir dir("manifest4");
  const std::string path = dir.File("bad.yaml");
  std::ofstream(path) << "name: x\nouter:\n  inner_steps: 100\n  fragments: 4\n  strategy: randomised\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(c.status().message());
  EXPECT_NE(msg.find("bad.yaml:5: outer.strategy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'randomised'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("balanced"), std::string::npos) << msg;  // lists what is allowed
  absl::StatusOr<IslandsExperimentConfig> b =
      LoadIslandsExperiment(std::string(FL_DILOCO_MANIFEST_DIR) + "/streaming_balanced_1800.yaml");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->fragment_strategy, "balanced");
}

TEST(IslandsExperimentTest, BadCodecOrOuterOptimizerIsRejectedAtLoad) {
  fl::testing::ScratchDir dir("manifest5");
  const std::string codec = dir.File("codec.yaml");
  std::ofstream(codec) << "name: x\nexchange:\n  codec: int7\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(codec);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("exchange.codec is 'int7'"), std::string::npos) << c.status();
  const std::string outer = dir.File("outer.yaml");
  std::ofstream(outer) << "name: x\nouter:\n  optimizer: adamw-ish\n";
  c = LoadIslandsExperiment(outer);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("outer.optimizer is 'adamw-ish'"), std::string::npos) << c.status();
}

// `wan` resolves a profile name beside the manifests (experiments/profiles/links/) and refuses what it cannot
// shape: a missing profile, and the Gloo data-parallel baseline whose traffic never crosses the ring.
TEST(IslandsExperimentTest, WanLinkResolvesAProfileAndRefusesWhatItCannotShape) {
  absl::StatusOr<IslandsExperimentConfig> d =
      LoadIslandsExperiment(std::string(FL_DILOCO_MANIFEST_DIR) + "/diloco.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NE(d->wan_link.find("profiles/links/wan-100mbit-30ms.yaml"), std::string::npos) << d->wan_link;

  fl::testing::ScratchDir dir("manifest3");
  const std::string missing = dir.File("missing.yaml");
  std::ofstream(missing) << "name: x\nwan: no-such-link\n";
  absl::StatusOr<IslandsExperimentConfig> c = LoadIslandsExperiment(missing);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("no-such-link"), std::string::npos) << c.status();

  const std::string gloo = dir.File("gloo.yaml");
  std::ofstream(gloo) << "name: x\nmode: data-parallel\ndp_transport: gloo\nwan: " << d->wan_link << "\n";
  c = LoadIslandsExperiment(gloo);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("dp_transport"), std::string::npos) << c.status();
}

// 1-bit Adam's bad inputs are refused at load, naming the field, the value and what to do (issue 33).
TEST(IslandsExperimentTest, OneBitAdamBadInputsNameTheFieldAndWhatToDo) {
  fl::testing::ScratchDir dir("manifest-onebit");
  const std::string path = dir.File("bad.yaml");
  auto load = [&](const std::string& extra) {
    std::ofstream(path) << "name: x\nmode: onebit-adam\ninner:\n  total_steps: 600\n" << extra;
    return LoadIslandsExperiment(path);
  };
  absl::StatusOr<IslandsExperimentConfig> ok = load("onebit:\n  warmup_steps: 600\n  chunk: 64\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->onebit_warmup_steps, 600u);
  EXPECT_EQ(ok->onebit_chunk, 64u);
  absl::StatusOr<IslandsExperimentConfig> c = load("onebit:\n  warmup_steps: 700\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message())
                .find("onebit.warmup_steps is '700'; the warm-up is longer than the run (inner.total_steps 600); "
                      "use at most 600"),
            std::string::npos)
      << c.status();
  c = load("onebit:\n  chunk: 100\n");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("onebit.chunk is '100'; the sign1 codec cannot carry it"),
            std::string::npos)
      << c.status();
  EXPECT_NE(std::string(c.status().message()).find("multiple of 8"), std::string::npos) << c.status();
  std::ofstream(path) << "name: x\nmode: onebit-adam\ninner:\n  optimizer: sgd\n";
  c = LoadIslandsExperiment(path);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message())
                .find("inner.optimizer is 'sgd'; 1-bit Adam is Adam with a frozen variance: use adamw"),
            std::string::npos)
      << c.status();
}

// A manifest's name of any length gets its run's CA: "fl-islands-run CA for <name>" is fitted into X.509's 64
// characters (before, a name over 42 characters failed the run with OpenSSL's bare "string too long").
TEST(IslandsExperimentTest, ALongManifestNameStillGetsItsCa) {
  absl::StatusOr<IslandsExperimentConfig> c =
      LoadIslandsExperiment(std::string(FL_DILOCO_MANIFEST_DIR) + "/onebit_table_streaming_fp4.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  c->name = "onebit-table-streaming-fp4-wan-100mbit-40ms-gru-a-name-past-the-limit";
  fl::testing::ScratchDir dir("islands_long_name");
  absl::Status s = ProvisionIslandsPki(*c, dir.File("out"), {"127.0.0.1"});
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(std::filesystem::exists(dir.File("out/pki/ca/ca.crt")));
}

}  // namespace
}  // namespace fl::experiment
