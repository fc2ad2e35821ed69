// 1-bit Adam through fl-coordinator with real processes (onebit_membership.h): three fl-island processes in
// `onebit-adam` (tiny char LM, windows of 10 steps, over mutual TLS and CurveZMQ), one SIGKILLed mid-run, a new one
// joining later: the survivors finish, the late joiner copies the committed state (verified by its hash) and
// continues, and all three end with the same state hash; an island of another sync mode is refused at admission
// naming both modes, at a onebit-adam coordinator and at a diloco one.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/pki/pki.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace {

using fl::testing::FreeLoopbackPort;
using fl::testing::ReadAll;
using fl::testing::ScratchDir;
using fl::testing::Subprocess;
namespace pki = fl::pki;

bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

size_t CountLines(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += Has(line, needle);
  return n;
}

int ReadPortFile(const std::string& path) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A tiny char LM, and 1-bit Adam's W = 20 exact steps, then sign1 with 64 values a scale.
const std::vector<std::string> kTinyModel = {"--model",   "char-lm", "--d-model",      "16", "--layers",     "2",
                                             "--heads",   "2",       "--context",      "16", "--batch-size", "4",
                                             "--threads", "1",       "--warmup-steps", "5",  "--inner-lr",   "3e-3"};
const std::vector<std::string> kOneBit = {"--onebit-warmup-steps", "20", "--onebit-chunk", "64"};

// fl-coordinator on a free port with `args`; its address, or "" (the log says why).
std::string StartCoordinator(const ScratchDir& dir, const std::vector<std::string>& args,
                             std::unique_ptr<Subprocess>* server) {
  *server = std::make_unique<Subprocess>(
      Concat({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"), "--db", ""}, args),
      dir.File("coordinator.log"));
  const int port = ReadPortFile(dir.File("port"));
  return port > 0 ? fl::StrCat("127.0.0.1:", port) : std::string();
}

TEST(OneBitChurnTest, AKilledIslandLeavesAndALateJoinerContinuesWithTheSameState) {
  ScratchDir dir("onebit_churn");
  const pki::Paths keys{dir.File("pki")};
  ASSERT_TRUE(pki::CreateCa(keys.dir, {}).ok());
  pki::IssueOptions server_cert;
  server_cert.ip_addresses = {"127.0.0.1"};
  ASSERT_TRUE(pki::Issue(keys.dir, pki::Kind::kServer, "coordinator", server_cert).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(pki::Issue(keys.dir, pki::Kind::kIsland, fl::StrCat("island-", i), {}).ok());
  // 60 windows of 10 steps (T = 600); the fp32 warm-up codec; error feedback on.
  std::unique_ptr<Subprocess> server;
  const std::string coordinator = StartCoordinator(dir,
                                                   {"--sync-mode",
                                                    "onebit-adam",
                                                    "--inner-steps",
                                                    "10",
                                                    "--outer-steps",
                                                    "60",
                                                    "--min-islands",
                                                    "3",
                                                    "--codec",
                                                    "fp32",
                                                    "--error-feedback",
                                                    "--heartbeat-timeout-ms",
                                                    "3000",
                                                    "--exchange-timeout-ms",
                                                    "5000",
                                                    "--barrier-timeout-ms",
                                                    "20000",
                                                    "--tls-cert",
                                                    keys.Cert(pki::Kind::kServer, "coordinator"),
                                                    "--tls-key",
                                                    keys.Key(pki::Kind::kServer, "coordinator"),
                                                    "--tls-client-ca",
                                                    keys.CaCert()},
                                                   &server);
  ASSERT_FALSE(coordinator.empty()) << ReadAll(dir.File("coordinator.log"));
  auto start_island = [&](int i) {
    const std::string id = fl::StrCat("island-", i);
    std::vector<std::string> args = {FL_ISLAND_BIN,
                                     "--island-id",
                                     id,
                                     "--shard",
                                     std::to_string(i % 3),
                                     "--num-shards",
                                     "3",
                                     "--coordinator",
                                     coordinator,
                                     "--data-endpoint",
                                     fl::StrCat("tcp://127.0.0.1:", FreeLoopbackPort()),
                                     "--summary",
                                     dir.File(id + ".json"),
                                     "--metrics",
                                     dir.File(id + ".jsonl"),
                                     "--tls-ca",
                                     keys.CaCert(),
                                     "--tls-cert",
                                     keys.Cert(pki::Kind::kIsland, id),
                                     "--tls-key",
                                     keys.Key(pki::Kind::kIsland, id)};
    args = Concat(Concat(Concat(args, kTinyModel), kOneBit), {"--mode", "onebit-adam"});
    return std::make_unique<Subprocess>(args, dir.File(id + ".log"));
  };
  std::vector<std::unique_ptr<Subprocess>> islands;
  for (int i = 0; i < 3; ++i) islands.push_back(start_island(i));
  // Committed windows as island-0 records them (one "sync" line per window).
  auto wait_for_windows = [&](size_t n) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(4);
    while (CountLines(dir.File("island-0.jsonl"), "\"sync\"") < n && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return CountLines(dir.File("island-0.jsonl"), "\"sync\"");
  };
  // Past the warm-up (2 windows), so that the killed window has residuals on both sides of the ring.
  ASSERT_GE(wait_for_windows(4), 4u) << ReadAll(dir.File("island-0.log"));
  islands[2]->Kill(SIGKILL);
  ASSERT_TRUE(islands[2]->Wait(std::chrono::seconds(10)).has_value());
  const size_t at_kill = CountLines(dir.File("island-0.jsonl"), "\"sync\"");
  ASSERT_GE(wait_for_windows(at_kill + 3), at_kill + 3) << ReadAll(dir.File("island-0.log"));
  islands.push_back(start_island(3));
  for (int i : {0, 1, 3}) {
    std::optional<int> rc = islands[i]->Wait(std::chrono::minutes(5));
    ASSERT_TRUE(rc.has_value()) << "island " << i << " did not finish";
    EXPECT_EQ(*rc, 0) << ReadAll(dir.File(fl::StrCat("island-", i, ".log")));
  }
  auto summary = [&](int i) {
    return nlohmann::json::parse(ReadAll(dir.File(fl::StrCat("island-", i, ".json"))), nullptr, false);
  };
  nlohmann::json a = summary(0), b = summary(1), late = summary(3);
  ASSERT_TRUE(a.is_object() && b.is_object() && late.is_object());
  EXPECT_EQ(a["state_hash"], b["state_hash"]);
  EXPECT_EQ(a["state_hash"], late["state_hash"]);
  EXPECT_EQ(a["local_model_hash"], late["local_model_hash"]);
  EXPECT_EQ(a["final_eval_loss"], late["final_eval_loss"]);
  // The joiner copied one committed state (model, m, v, step, options and the folded residuals: 4 vectors of
  // the model's size and a header) and started at a window boundary after the kill, so it ran fewer steps.
  // (A window that failed after the join would be run again, so the joiner's steps are at least 600 - first.)
  EXPECT_EQ(late["late_joined"], true);
  EXPECT_GE(late["state_loads"].get<uint64_t>(), 1u);
  const uint64_t first = late["first_step"].get<uint64_t>();
  EXPECT_GE(first, 70u);  // after at least 4 + 3 committed windows
  EXPECT_EQ(first % 10, 0u);
  EXPECT_GE(late["steps"].get<uint64_t>(), 600 - first);
  EXPECT_LT(late["steps"].get<uint64_t>(), a["steps"].get<uint64_t>());
  EXPECT_GT(late["state_load_bytes"].get<uint64_t>(), 0u);
  // The survivors committed every window once; the joiner the windows after its copy. Every committed window
  // past the warm-up ended with a fold.
  EXPECT_EQ(a["outer_steps"], 60);
  EXPECT_EQ(late["outer_steps"].get<uint64_t>(), (600 - first) / 10);
  EXPECT_GT(a["fold_bytes_sent"].get<uint64_t>(), 0u);
  const std::string log0 = ReadAll(dir.File("island-0.log"));
  EXPECT_TRUE(Has(log0, "momentum in sign1:64")) << log0;
  EXPECT_TRUE(Has(ReadAll(dir.File("island-3.log")), "loaded the 1-bit Adam state after window"));
  server->Kill(SIGTERM);
  server->Wait(std::chrono::seconds(20));
}

// An island is admitted only in the coordinator's sync mode: the refusal names both modes and what to do.
TEST(OneBitChurnTest, AnIslandOfAnotherSyncModeIsRefusedAtAdmissionNamingBoth) {
  struct Case {
    std::string coordinator_mode, island_mode;
  };
  for (const Case& c : {Case{"onebit-adam", "diloco"}, Case{"diloco", "onebit-adam"}}) {
    ScratchDir dir(fl::StrCat("onebit_mode_", c.coordinator_mode));
    std::unique_ptr<Subprocess> server;
    const std::string coordinator = StartCoordinator(
        dir, {"--insecure", "--sync-mode", c.coordinator_mode, "--inner-steps", "10", "--outer-steps", "2"}, &server);
    ASSERT_FALSE(coordinator.empty()) << ReadAll(dir.File("coordinator.log"));
    std::vector<std::string> args =
        Concat({FL_ISLAND_BIN, "--insecure", "--island-id", "island-0", "--coordinator", coordinator, "--data-endpoint",
                fl::StrCat("tcp://127.0.0.1:", FreeLoopbackPort()), "--summary", dir.File("s.json")},
               Concat(kTinyModel, kOneBit));
    args.push_back("--mode");
    args.push_back(c.island_mode);
    Subprocess island(args, dir.File("island.log"));
    std::optional<int> rc = island.Wait(std::chrono::minutes(1));
    const std::string log = ReadAll(dir.File("island.log"));
    EXPECT_EQ(rc.value_or(-1), 1) << log;
    EXPECT_TRUE(Has(log, fl::StrCat("island 'island-0' syncs with mode '", c.island_mode,
                                    "' but this coordinator's islands sync with '", c.coordinator_mode, "'")))
        << log;
    EXPECT_TRUE(Has(log, fl::StrCat("--sync-mode ", c.island_mode))) << log;
    EXPECT_TRUE(ReadAll(dir.File("s.json")).empty()) << "a refused island wrote a summary";
  }
}

}  // namespace
