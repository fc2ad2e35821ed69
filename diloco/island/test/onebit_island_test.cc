// fl-island's onebit-adam mode end to end: two real fl-island processes on a static ring train a tiny char LM
// with 1-bit Adam and end with the same state (hash) after sending exactly the bytes of W fp32 exchanges and T - W
// sign1 ones; an island of another sync mode on the ring is refused naming both modes; a warm-up longer than the
// run exits 2 naming it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/diloco/net/ring_allreduce.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace {

using fl::testing::FreeLoopbackPort;
using fl::testing::ReadAll;
using fl::testing::ScratchDir;
using fl::testing::Subprocess;

bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// fl-island flags of island `i` of two on a static ring of `endpoints`, a tiny char LM for 20 steps.
std::vector<std::string> Island(size_t i, const std::vector<std::string>& endpoints, const std::string& summary,
                                const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {FL_ISLAND_BIN,
                                   "--insecure",
                                   "--island-id",
                                   fl::StrCat("island-", i),
                                   "--shard",
                                   std::to_string(i),
                                   "--num-shards",
                                   "2",
                                   "--data-endpoint",
                                   endpoints[i],
                                   "--peer",
                                   fl::StrCat("island-0=", endpoints[0]),
                                   "--peer",
                                   fl::StrCat("island-1=", endpoints[1]),
                                   "--total-steps",
                                   "20",
                                   "--summary",
                                   summary,
                                   "--d-model",
                                   "16",
                                   "--layers",
                                   "2",
                                   "--heads",
                                   "2",
                                   "--context",
                                   "16",
                                   "--batch-size",
                                   "4",
                                   "--threads",
                                   "1",
                                   "--warmup-steps",
                                   "5",
                                   "--exchange-timeout-s",
                                   "60"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

struct Pair {
  int rc[2] = {-1, -1};
  std::string log[2];
  nlohmann::json summary[2];
};

Pair RunPair(const ScratchDir& dir, const std::vector<std::string>& extra0, const std::vector<std::string>& extra1) {
  const std::vector<std::string> endpoints = {fl::StrCat("tcp://127.0.0.1:", FreeLoopbackPort()),
                                              fl::StrCat("tcp://127.0.0.1:", FreeLoopbackPort())};
  Pair pair;
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (size_t i = 0; i < 2; ++i) {
    procs.push_back(std::make_unique<Subprocess>(
        Island(i, endpoints, dir.File(fl::StrCat("s", i, ".json")), i == 0 ? extra0 : extra1),
        dir.File(fl::StrCat("log", i))));
  }
  for (size_t i = 0; i < 2; ++i) {
    std::optional<int> rc = procs[i]->Wait(std::chrono::minutes(3));
    pair.rc[i] = rc.has_value() ? *rc : -1;
    pair.log[i] = ReadAll(dir.File(fl::StrCat("log", i)));
    pair.summary[i] = nlohmann::json::parse(ReadAll(dir.File(fl::StrCat("s", i, ".json"))), nullptr, false);
  }
  return pair;
}

TEST(OneBitIslandTest, TwoIslandsEndWithOneStateAfterTheBytesOfWFp32AndTMinusWSign1Exchanges) {
  ScratchDir dir("onebit_island_pair");
  const std::vector<std::string> onebit = {"--mode", "onebit-adam",    "--onebit-warmup-steps",
                                           "5",      "--onebit-chunk", "64"};
  Pair p = RunPair(dir, onebit, onebit);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(p.rc[i], 0) << p.log[i];
    ASSERT_TRUE(p.summary[i].is_object()) << p.log[i];
    EXPECT_EQ(p.summary[i]["steps"], 20);
    EXPECT_EQ(p.summary[i]["syncs"], 20);
    EXPECT_TRUE(Has(p.log[i], "step 6: variance frozen after 5 warm-up steps; momentum in sign1:64")) << p.log[i];
  }
  EXPECT_EQ(p.summary[0]["state_hash"], p.summary[1]["state_hash"]);
  EXPECT_EQ(p.summary[0]["local_model_hash"], p.summary[1]["local_model_hash"]);
  EXPECT_EQ(p.summary[0]["final_eval_loss"], p.summary[1]["final_eval_loss"]);
  // Bytes: 5 exchanges of fp32 gradients, then 15 of sign1 momenta, as the ring's own accounting says.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(p.log[0], m, std::regex("1-bit Adam, ([0-9]+) parameters"))) << p.log[0];
  const size_t n = std::stoul(m[1]);
  for (size_t i = 0; i < 2; ++i) {
    absl::StatusOr<uint64_t> fp32 = fl::diloco::RingBytesSentPerMember(n, 2, i, "fp32", size_t{1} << 20);
    absl::StatusOr<uint64_t> sign1 = fl::diloco::RingBytesSentPerMember(n, 2, i, "sign1:64", size_t{1} << 20);
    ASSERT_TRUE(fp32.ok() && sign1.ok());
    EXPECT_EQ(p.summary[i]["bytes_sent"].get<uint64_t>(), 5 * *fp32 + 15 * *sign1) << "island " << i;
    EXPECT_EQ(p.summary[i]["peak_sync_bytes"].get<uint64_t>(), *fp32);
    EXPECT_LT(*sign1 * 15, *fp32);  // 1 bit a value and a scale per 64 against 32 bits a value, and headers
  }
}

TEST(OneBitIslandTest, AnIslandOfAnotherSyncModeIsRefusedNamingBoth) {
  ScratchDir dir("onebit_island_mixed");
  Pair p = RunPair(dir, {"--mode", "onebit-adam", "--onebit-warmup-steps", "5"},
                   {"--mode", "data-parallel", "--dp-transport", "ring"});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(p.rc[i], 1) << p.log[i];
    EXPECT_TRUE(Has(p.log[i], "every island of a ring must sync the same way")) << p.log[i];
  }
  const std::string both = p.log[0] + p.log[1];
  EXPECT_TRUE(Has(both, "runs sync mode 'data-parallel' but member 'island-0'")) << both;
  EXPECT_TRUE(Has(both, "runs 'onebit-adam'")) << both;
}

// fl-island refuses 1-bit Adam's bad options before it trains, exit code 2 (the rest of the bad inputs, chunk and
// inner optimizer, go through the same OneBitAdamOptions::Validate: onebit_adam_test).
TEST(OneBitIslandTest, AWarmUpLongerThanTheRunExitsTwoNamingIt) {
  ScratchDir dir("onebit_island_bad");
  const std::vector<std::string> endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2"};
  Subprocess proc(Island(0, endpoints, dir.File("s.json"), {"--mode", "onebit-adam", "--onebit-warmup-steps", "30"}),
                  dir.File("log"));
  std::optional<int> rc = proc.Wait(std::chrono::minutes(1));
  const std::string log = ReadAll(dir.File("log"));
  EXPECT_EQ(rc.value_or(-1), 2) << log;
  EXPECT_TRUE(Has(log, "1-bit Adam warm-up of 30 steps is longer than the run (20 steps); use at most 20")) << log;
  EXPECT_TRUE(ReadAll(dir.File("s.json")).empty()) << "a summary was written although nothing trained";
}

}  // namespace
