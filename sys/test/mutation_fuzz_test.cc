// The fuzz harness every reader's fuzz target uses (testing/include/fl/testing/mutation_fuzz.h): it runs the corpus
// first, then a fixed number of mutations that a seed decides (so a failure in the suite reproduces), mutations
// actually change the inputs, and a crash saves the input that caused it.
#include "fl/testing/mutation_fuzz.h"

#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include <gtest/gtest.h>

namespace fl::testing {
namespace {

// Byte vectors compared as strings: GCC 12 at -O3 warns (-Wstringop-overread, a known false positive) on
// operator== of std::vector<uint8_t>.
std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::vector<std::vector<uint8_t>> Corpus() { return {{'h', 'e', 'l', 'l', 'o'}, std::vector<uint8_t>(64, 0x41)}; }

TEST(MutationFuzzTest, RunsTheCorpusFirstThenTheStatedNumberOfMutations) {
  const auto corpus = Corpus();
  std::vector<std::vector<uint8_t>> seen;
  FuzzOptions options;
  options.iterations = 300;
  const size_t runs = RunMutationFuzz(
      "harness_count", corpus, [&](std::span<const uint8_t> in) { seen.emplace_back(in.begin(), in.end()); }, options);
  EXPECT_EQ(runs, corpus.size() + 300);
  ASSERT_EQ(seen.size(), runs);
  EXPECT_EQ(Str(seen[0]), Str(corpus[0]));
  EXPECT_EQ(Str(seen[1]), Str(corpus[1]));
  // Mutations change the inputs: most of them differ from both seeds, and from each other.
  std::set<std::string> distinct;
  for (size_t i = 2; i < seen.size(); ++i) distinct.insert(Str(seen[i]));
  EXPECT_GT(distinct.size(), 150u);
}

TEST(MutationFuzzTest, TheSameSeedGivesTheSameInputs) {
  if (std::getenv("FL_FUZZ_SEED") != nullptr || std::getenv("FL_FUZZ_SECONDS") != nullptr) {
    GTEST_SKIP() << "FL_FUZZ_SEED/FL_FUZZ_SECONDS set by hand";
  }
  const auto corpus = Corpus();
  auto collect = [&](uint64_t seed) {
    std::vector<std::string> seen;
    FuzzOptions options;
    options.seed = seed;
    options.iterations = 100;
    RunMutationFuzz(
        "harness_seed", corpus, [&](std::span<const uint8_t> in) { seen.emplace_back(in.begin(), in.end()); }, options);
    return seen;
  };
  EXPECT_EQ(collect(5), collect(5));
  EXPECT_NE(collect(5), collect(6));
}

TEST(MutationFuzzTest, ACrashSavesTheInputThatCausedIt) {
  const std::string saved = fuzz_internal::CrashPath("harness_crash");
  ::unlink(saved.c_str());
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child crashes on the second seed; the handler saves it and re-raises.
    RunMutationFuzz("harness_crash", Corpus(), [](std::span<const uint8_t> in) {
      if (in.size() == 64) ::abort();
    });
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited instead of crashing";
  EXPECT_EQ(WTERMSIG(status), SIGABRT);
  std::ifstream in(saved, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, Str(Corpus()[1]));
  ::unlink(saved.c_str());
}

}  // namespace
}  // namespace fl::testing
