// The islands launcher (RunIslandsExperiment, behind fl-experiment and fl-islands-run) with the real fl-coordinator
// and fl-island binaries: a tiny manifest runs to the end with equal hashes and its result file; an island that
// fails stops the experiment at once with an error naming its log, and the coordinator is stopped with it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "fl/core/str_cat.h"
#include "fl/experiment/islands_experiment.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::experiment {
namespace {

// A tiny char-lm manifest: 2 islands, DiLoCo H=10, 20 inner steps (2 outer steps).
std::string TinyManifest(const std::string& extra_model_field) {
  return std::string(
             "name: launch-test\nmethod: diloco\nmode: diloco\nislands: 2\nranks_per_island: 1\n"
             "threads_per_rank: 1\nmodel:\n  name: char-lm\n  d_model: 16\n  layers: 2\n  heads: 2\n"
             "  context: 16\n  batch_size: 4\n") +
         extra_model_field +
         "inner:\n  lr: 3.0e-3\n  warmup_steps: 5\n  total_steps: 20\nouter:\n  inner_steps: 10\n"
         "exchange:\n  codec: int8\n  error_feedback: true\n";
}

LaunchPaths Paths(const std::string& out) {
  LaunchPaths p;  // advertise 127.0.0.1, every part (no step): the local launcher
  p.fl_island = FL_ISLAND_BIN;
  p.fl_coordinator = FL_COORDINATOR_BIN;
  p.out_dir = out;
  return p;
}

bool LoopbackPortAcceptsConnections(int port) {
  const int fd = fl::testing::ConnectLoopback(port);
  if (fd >= 0) close(fd);
  return fd >= 0;
}

TEST(IslandsLaunchTest, TinyManifestRunsToTheEndWithEqualHashes) {
  fl::testing::ScratchDir dir("launch-ok");
  const std::string manifest = dir.File("tiny.yaml");
  std::ofstream(manifest) << TinyManifest("");
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string out = dir.File("out");
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, Paths(out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->hashes_equal);
  EXPECT_GT(result->bytes_sent, 0u);
  EXPECT_GT(result->final_eval_loss, 0.0);
  EXPECT_EQ(result->units, 2u * 20u * 4u * 16u);  // islands x steps x batch x context
  EXPECT_TRUE(std::filesystem::exists(out + "/result.json"));
  EXPECT_TRUE(std::filesystem::exists(out + "/records.db"));
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// 1-bit Adam with membership windows (onebit.window_steps): the launcher starts fl-coordinator with
// --sync-mode onebit-adam and windows of 5 steps, the islands join it instead of a static ring, and both end
// with one state after committing the run's 4 windows.
TEST(IslandsLaunchTest, OneBitAdamWithWindowsRunsThroughTheCoordinator) {
  fl::testing::ScratchDir dir("launch-onebit");
  const std::string manifest = dir.File("onebit.yaml");
  std::string text = TinyManifest("");
  text.replace(text.find("mode: diloco"), 12, "mode: onebit-adam");
  text.replace(text.find("codec: int8"), 11, "codec: fp32");
  text += "onebit:\n  warmup_steps: 5\n  chunk: 64\n  window_steps: 5\n";
  std::ofstream(manifest) << text;
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->UsesCoordinator());
  const std::string out = dir.File("out");
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, Paths(out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->hashes_equal);
  const std::string log = Slurp(out + "/island-0-rank0.log");
  EXPECT_NE(log.find("1-bit Adam through the coordinator"), std::string::npos) << log;
  EXPECT_NE(log.find("membership windows of 5 steps"), std::string::npos) << log;
  // One "sync" line per committed window: 20 steps / 5.
  size_t windows = 0;
  std::ifstream metrics(out + "/island-0.jsonl");
  for (std::string line; std::getline(metrics, line);) windows += line.find("\"event\":\"sync\"") != std::string::npos;
  EXPECT_EQ(windows, 4u);
  // A window that does not divide the run is refused, naming the field.
  std::ofstream(manifest) << std::regex_replace(text, std::regex("window_steps: 5"), "window_steps: 7");
  absl::StatusOr<IslandsExperimentConfig> bad = LoadIslandsExperiment(manifest);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("onebit.window_steps is '7'"), std::string::npos) << bad.status();
}

// Secure by default: the launcher provisions a CA for the run, the coordinator serves mutual TLS and the ring runs
// CurveZMQ; the numbers are those of the same run in plaintext (`security: insecure`), up to the rounding of the
// ring's summation order.
TEST(IslandsLaunchTest, TheSameRunOverMutualTlsAndCurveEqualsPlaintext) {
  fl::testing::ScratchDir dir("launch-tls");
  const std::string secure_manifest = dir.File("secure.yaml"), plain_manifest = dir.File("plain.yaml");
  std::ofstream(secure_manifest) << TinyManifest("");
  std::ofstream(plain_manifest) << TinyManifest("") << "security: insecure\n";
  absl::StatusOr<IslandsExperimentConfig> secure = LoadIslandsExperiment(secure_manifest);
  absl::StatusOr<IslandsExperimentConfig> plain = LoadIslandsExperiment(plain_manifest);
  ASSERT_TRUE(secure.ok()) << secure.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(secure->security, "tls");
  EXPECT_EQ(plain->security, "insecure");
  const std::string secure_out = dir.File("secure"), plain_out = dir.File("plain");
  absl::StatusOr<IslandsExperimentResult> a = RunIslandsExperiment(*secure, Paths(secure_out));
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<IslandsExperimentResult> b = RunIslandsExperiment(*plain, Paths(plain_out));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(a->hashes_equal);
  EXPECT_TRUE(b->hashes_equal);
  // Not bit for bit across runs: the ring order is the islands' join order, which differs from run to run, and
  // with it the order of the fp32 sums (two plaintext runs differ the same way). Same work, same bytes, and the
  // same loss up to that rounding.
  EXPECT_NEAR(a->final_eval_loss, b->final_eval_loss, 1e-3 * b->final_eval_loss);
  EXPECT_EQ(a->units, b->units);
  EXPECT_EQ(a->bytes_sent, b->bytes_sent);
  // What ran secured: the run's own CA with the ring's keys, the coordinator said so, nobody warned of plaintext.
  EXPECT_TRUE(std::filesystem::exists(secure_out + "/pki/ca/ca.crt"));
  EXPECT_TRUE(std::filesystem::exists(secure_out + "/pki/islands/island-1.curve.pub"));
  EXPECT_NE(
      Slurp(secure_out + "/coordinator.log").find("mutual TLS, revocation list " + secure_out + "/pki/ca/crl.pem"),
      std::string::npos)
      << Slurp(secure_out + "/coordinator.log");
  EXPECT_EQ(Slurp(secure_out + "/island-0-rank0.log").find("plaintext"), std::string::npos);
  EXPECT_NE(Slurp(plain_out + "/island-0-rank0.log").find("--insecure: plaintext"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(plain_out + "/pki"));
}

// --advertise: every process binds and advertises the given host, and the coordinator's certificate names it (the
// islands verify it against the address they dial). 127.0.0.2 is this machine's too, but not 127.0.0.1: a process
// left on 127.0.0.1 would not be reached, and a certificate without it would fail the handshake.
TEST(IslandsLaunchTest, AdvertisedHostIsWhereEveryProcessListensAndWhatTheCertificateNames) {
  fl::testing::ScratchDir dir("launch-advertise");
  const std::string manifest = dir.File("tiny.yaml");
  std::ofstream(manifest) << TinyManifest("");
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  LaunchPaths paths = Paths(dir.File("out"));
  paths.advertise = "127.0.0.2";
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, paths);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->hashes_equal);
  const std::string log = Slurp(dir.File("out/coordinator.log"));
  for (const char* island : {"island-0", "island-1"}) {
    EXPECT_NE(log.find(fl::StrCat("'", island, "' asks to join (1 ranks, data tcp://127.0.0.2:")), std::string::npos)
        << log;
  }
  EXPECT_EQ(log.find("127.0.0.1:"), std::string::npos) << log;

  paths.advertise = "192.0.2.1";  // TEST-NET-1: never this machine's
  result = RunIslandsExperiment(*config, paths);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  EXPECT_NE(std::string(result.status().message()).find("cannot bind '192.0.2.1'"), std::string::npos)
      << result.status();
}

TEST(IslandsLaunchTest, FailingIslandStopsTheExperimentAndItsCoordinator) {
  fl::testing::ScratchDir dir("launch-fail");
  const std::string manifest = dir.File("bad-model.yaml");
  // d_model 15 is not divisible by 2 heads: every fl-island refuses the model and exits non-zero, while the
  // coordinator would wait for its islands for ever.
  std::string text = TinyManifest("");
  text.replace(text.find("d_model: 16"), 11, "d_model: 15");
  std::ofstream(manifest) << text;
  absl::StatusOr<IslandsExperimentConfig> config = LoadIslandsExperiment(manifest);
  ASSERT_TRUE(config.ok()) << config.status();
  const std::string out = dir.File("out");
  absl::StatusOr<IslandsExperimentResult> result = RunIslandsExperiment(*config, Paths(out));
  ASSERT_FALSE(result.ok());
  const std::string msg(result.status().message());
  EXPECT_NE(msg.find("fl-island island-"), std::string::npos) << msg;
  EXPECT_NE(msg.find("-rank0.log"), std::string::npos) << msg;
  // The coordinator was stopped: its port no longer accepts connections.
  std::ifstream port_file(out + "/coordinator.port");
  int port = 0;
  ASSERT_TRUE(port_file >> port);
  EXPECT_FALSE(LoopbackPortAcceptsConnections(port)) << "coordinator on port " << port << " still running";
  // The log of the island that failed (named in the error: whichever island failed first; the others are
  // stopped, possibly before they log anything) says why.
  std::smatch failed;
  ASSERT_TRUE(std::regex_search(msg, failed, std::regex(R"(island-\d+-rank\d+\.log)"))) << msg;
  std::ifstream log(out + "/" + failed[0].str());
  const std::string log_text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(log_text.find("heads dividing d_model"), std::string::npos) << log_text;
}

}  // namespace
}  // namespace fl::experiment
