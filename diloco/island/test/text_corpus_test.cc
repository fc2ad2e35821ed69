// The fortunes corpus: entries split at "%" lines, a deterministic vocabulary, a deterministic split and
// contiguous shards; checked on a small directory the test writes, and on the installed package.
#include "fl/diloco/island/text_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "fl/testing/scratch_dir.h"

namespace fl::diloco {
namespace {

TEST(TextCorpusTest, SplitsEntriesAndSkipsIndexFiles) {
  fl::testing::ScratchDir dir("corpus");
  std::ofstream(dir.File("b")) << "ba\n%\nab\n";
  std::ofstream(dir.File("a")) << "c\n%\n%\n";
  std::ofstream(dir.File("a.dat")) << "zzzz";  // strfile index: ignored
  std::ofstream(dir.File("a.u8")) << "yyyy";   // UTF-8 copy: ignored
  absl::StatusOr<CharCorpus> c = LoadCharCorpus(dir.path().string(), 50);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_entries, 3u);  // "c", "ba", "ab" (file a first, the empty entry dropped)
  EXPECT_EQ(c->vocab, "\nabc");   // ascending bytes; '\n' always present
  std::string text;
  for (uint8_t id : c->train) text.push_back(c->vocab[id]);
  std::string eval;
  for (uint8_t id : c->eval) eval.push_back(c->vocab[id]);
  const std::string all = text + eval;
  EXPECT_EQ(all.size() - static_cast<size_t>(std::count(all.begin(), all.end(), '\n')), 5u);  // c, ba, ab
  EXPECT_EQ(text.find('%'), std::string::npos);
  absl::StatusOr<CharCorpus> again = LoadCharCorpus(dir.path().string(), 50);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->train, c->train);
  EXPECT_EQ(again->eval, c->eval);
}

// A corpus directory whose files add up to more than the stated 256 MiB is refused before the file that
// passes the limit is read (a sparse file: it costs the test no disk and no time), naming that file.
TEST(TextCorpusTest, ACorpusOverTheLimitIsRefusedBeforeItIsRead) {
  fl::testing::ScratchDir dir("corpus_big");
  std::ofstream(dir.File("a")) << "small\n%\nfortune\n";
  std::filesystem::resize_file(
      [&] {
        std::ofstream(dir.File("b")) << "";
        return dir.File("b");
      }(),
      uint64_t{300} << 20);
  absl::StatusOr<CharCorpus> c = LoadCharCorpus(dir.path().string());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
  EXPECT_NE(c.status().message().find(dir.File("b")), absl::string_view::npos) << c.status();
  EXPECT_NE(c.status().message().find("over the limit"), absl::string_view::npos) << c.status();
}

TEST(TextCorpusTest, EmptyDirectoryNamesThePackage) {
  fl::testing::ScratchDir dir("corpus_empty");
  absl::StatusOr<CharCorpus> c = LoadCharCorpus(dir.path().string());
  ASSERT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("fortunes-min"), absl::string_view::npos);
}

TEST(TextCorpusTest, FortunesPackageShardsAreContiguousAndCoverTheTrainingText) {
  absl::StatusOr<CharCorpus> c = LoadCharCorpus(kDefaultFortunesDir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->train.size(), 50000u);
  EXPECT_GT(c->eval.size(), 3000u);
  EXPECT_LT(c->vocab_size(), 128u);
  size_t total = 0;
  for (size_t s = 0; s < 3; ++s) {
    absl::StatusOr<std::span<const uint8_t>> shard = TrainShard(*c, s, 3, 65);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(shard->data(), c->train.data() + total);
    total += shard->size();
  }
  EXPECT_EQ(total, c->train.size());
  EXPECT_FALSE(TrainShard(*c, 3, 3, 65).ok());
  EXPECT_FALSE(TrainShard(*c, 0, 1, c->train.size() + 1).ok());
}

}  // namespace
}  // namespace fl::diloco
