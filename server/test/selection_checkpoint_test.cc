#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "fl/server/checkpoint.h"
#include "fl/server/selection.h"
#include "fl/testing/scratch_dir.h"

namespace fl::server {
namespace {

TEST(SelectionTest, SizeFollowsFractionAndMinimums) {
  EXPECT_EQ(*SelectionSize({0.5, 2, 2}, 10), 5u);
  EXPECT_EQ(*SelectionSize({0.1, 2, 2}, 10), 2u);  // min_clients wins
  EXPECT_EQ(*SelectionSize({1.0, 2, 2}, 3), 3u);
  EXPECT_EQ(*SelectionSize({0.34, 1, 1}, 3), 2u);  // ceil
  EXPECT_FALSE(SelectionSize({1.0, 2, 4}, 3).ok());
  EXPECT_FALSE(SelectionSize({1.0, 1, 0}, 0).ok());
}

TEST(SelectionTest, SeededAndIndependentOfInputOrder) {
  std::vector<std::string> ids = {"a", "b", "c", "d", "e", "f", "g", "h"};
  auto first = SelectClients(ids, 3, 42, 1, 1);
  std::vector<std::string> shuffled = {"h", "c", "a", "e", "g", "b", "f", "d"};
  EXPECT_EQ(SelectClients(shuffled, 3, 42, 1, 1), first);
  EXPECT_EQ(first.size(), 3u);
  std::set<std::string> unique(first.begin(), first.end());
  EXPECT_EQ(unique.size(), 3u);
  // Another round or attempt draws differently (with 56 possible subsets, a collision in all of these
  // would mean the round is not mixed in).
  int same = 0;
  for (uint64_t round = 2; round < 12; ++round) same += SelectClients(ids, 3, 42, round, 1) == first;
  EXPECT_LT(same, 3);
  EXPECT_NE(SelectClients(ids, 3, 42, 1, 2), first);
}

TEST(SelectionTest, EveryClientIsEventuallySelected) {
  std::vector<std::string> ids = {"a", "b", "c", "d", "e"};
  std::map<std::string, int> count;
  for (uint64_t round = 1; round <= 500; ++round) {
    for (const auto& id : SelectClients(ids, 2, 7, round, 1)) ++count[id];
  }
  for (const auto& id : ids) EXPECT_NEAR(count[id], 200, 50) << id;  // 2 of 5 over 500 rounds
}

Checkpoint Sample() {
  Checkpoint c;
  c.experiment_id = "exp-1";
  c.round = 7;
  c.model_version = 7;
  c.spec = *core::ModelSpec::Create({{"w", {2, 3}, core::DType::kFloat32, 0}, {"b", {3}, core::DType::kFloat32, 0}});
  c.model_name = "tiny";
  c.values = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  c.optimizer.optimizer = "fedavgm";
  c.optimizer.step_count = 7;
  c.optimizer.buffers.push_back({"momentum", {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f}});
  c.created_unix_ms = 123;
  return c;
}

TEST(CheckpointTest, RoundTripsEverything) {
  fl::testing::ScratchDir dir("fl_ckpt");
  const std::string path = CheckpointPath(dir.path().string(), 7);
  EXPECT_TRUE(path.ends_with("round-000007.ckpt")) << path;
  ASSERT_TRUE(SaveCheckpoint(Sample(), path).ok());
  auto back = LoadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->experiment_id, "exp-1");
  EXPECT_EQ(back->round, 7u);
  EXPECT_EQ(back->spec.fingerprint(), Sample().spec.fingerprint());
  EXPECT_EQ(back->values, Sample().values);
  EXPECT_EQ(back->optimizer.optimizer, "fedavgm");
  EXPECT_EQ(back->optimizer.step_count, 7u);
  ASSERT_EQ(back->optimizer.buffers.size(), 1u);
  EXPECT_EQ(back->optimizer.buffers[0].values, Sample().optimizer.buffers[0].values);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(CheckpointTest, DetectsCorruptionAndTruncation) {
  fl::testing::ScratchDir dir("fl_ckpt");
  const std::string path = dir.File("c.ckpt");
  ASSERT_TRUE(SaveCheckpoint(Sample(), path).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto write = [&](const std::string& b) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  write(flipped);
  auto r = LoadCheckpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum"), absl::string_view::npos);
  write(bytes.substr(0, bytes.size() - 20));
  EXPECT_FALSE(LoadCheckpoint(path).ok());
  write("not a checkpoint at all");
  r = LoadCheckpoint(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("magic"), absl::string_view::npos);
  EXPECT_EQ(LoadCheckpoint(dir.File("missing.ckpt")).status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, PruneKeepsRecentRounds) {
  fl::testing::ScratchDir dir("fl_ckpt");
  for (uint64_t r = 0; r < 5; ++r) {
    Checkpoint c = Sample();
    c.round = r;
    ASSERT_TRUE(SaveCheckpoint(c, CheckpointPath(dir.path().string(), r)).ok());
  }
  ASSERT_TRUE(PruneCheckpoints(dir.path().string(), 3).ok());
  for (uint64_t r = 0; r < 5; ++r) {
    EXPECT_EQ(std::filesystem::exists(CheckpointPath(dir.path().string(), r)), r >= 3) << r;
  }
}

}  // namespace
}  // namespace fl::server
