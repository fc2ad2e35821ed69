// Partitioners: coverage (every index exactly once), determinism, the statistical shape of each kind, spec
// parsing, and pinned hashes that guard the reproducibility of recorded experiments.
#include "fl/training/data/partition.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"

namespace fl::training::data {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(fl::ToStd(status.message())); }

// 10 balanced classes, interleaved: 600 examples each. (A pure function of i: part of the pinned tests.)
std::vector<uint8_t> BalancedLabels(size_t n = 6000) {
  std::vector<uint8_t> labels(n);
  for (size_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>((i * 7919) % 10);
  return labels;
}

// Unbalanced: class c has about (c + 1) * 100 examples, shuffled by a fixed formula.
std::vector<uint8_t> UnbalancedLabels() {
  std::vector<uint8_t> labels;
  for (int c = 0; c < 10; ++c)
    labels.insert(labels.end(), static_cast<size_t>((c + 1) * 100 + c), static_cast<uint8_t>(c));
  for (size_t i = 0; i < labels.size(); ++i) std::swap(labels[i], labels[(i * 2654435761u) % labels.size()]);
  return labels;
}

uint64_t Fnv1a(const std::vector<uint32_t>& indices) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (uint32_t index : indices) {
    for (int b = 0; b < 4; ++b) {
      hash ^= (index >> (8 * b)) & 0xff;
      hash *= 0x100000001b3ULL;
    }
  }
  return hash;
}

std::vector<PartitionSpec> AllKinds() {
  return {PartitionSpec::Iid(),          PartitionSpec::Dirichlet(0.1, 0),
          PartitionSpec::Dirichlet(0.5), PartitionSpec::Dirichlet(1000.0),
          PartitionSpec::Shards(1),      PartitionSpec::Shards(3)};
}

void ExpectExactCover(const std::vector<std::vector<uint32_t>>& parts, size_t n, const std::string& what) {
  std::vector<int> seen(n, 0);
  for (const auto& part : parts) {
    EXPECT_TRUE(std::is_sorted(part.begin(), part.end())) << what;
    for (uint32_t index : part) {
      ASSERT_LT(index, n) << what;
      ++seen[index];
    }
  }
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << what << ": index " << i;
}

// --- PartitionSpec ---

TEST(PartitionSpecTest, ParsesEveryKind) {
  auto iid = PartitionSpec::Parse("iid");
  ASSERT_TRUE(iid.ok()) << iid.status();
  EXPECT_EQ(*iid, PartitionSpec::Iid());

  auto dirichlet = PartitionSpec::Parse("dirichlet:0.1");
  ASSERT_TRUE(dirichlet.ok()) << dirichlet.status();
  EXPECT_EQ(dirichlet->kind, PartitionKind::kDirichlet);
  EXPECT_EQ(dirichlet->alpha, 0.1);
  EXPECT_EQ(dirichlet->min_examples, kDefaultDirichletMinExamples);
  EXPECT_EQ(dirichlet->max_attempts, kDefaultDirichletMaxAttempts);

  auto options = PartitionSpec::Parse("dirichlet:0.5:min=10:attempts=50");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->alpha, 0.5);
  EXPECT_EQ(options->min_examples, 10u);
  EXPECT_EQ(options->max_attempts, 50u);

  auto shards = PartitionSpec::Parse("shards:2");
  ASSERT_TRUE(shards.ok()) << shards.status();
  EXPECT_EQ(*shards, PartitionSpec::Shards(2));
}

TEST(PartitionSpecTest, ToStringRoundTrips) {
  for (const std::string text : {"iid", "dirichlet:0.1", "dirichlet:1000", "dirichlet:0.3:min=0",
                                 "dirichlet:2.5:min=7:attempts=3", "shards:2"}) {
    auto spec = PartitionSpec::Parse(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(spec->ToString(), text);
    EXPECT_EQ(*PartitionSpec::Parse(spec->ToString()), *spec);
  }
  EXPECT_EQ(PartitionKindName(PartitionKind::kShards), "shards");
}

TEST(PartitionSpecTest, RejectsWithClearErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "unknown partition kind ''"},
      {"noniid", "unknown partition kind 'noniid'"},
      {"lda:0.5", "unknown partition kind 'lda'"},
      {"IID", "unknown partition kind 'IID'"},
      {"iid:4", "iid takes no parameters"},
      {"dirichlet", "dirichlet needs a concentration"},
      {"dirichlet:", "must be a finite number, got ''"},
      {"dirichlet:abc", "must be a finite number, got 'abc'"},
      {"dirichlet:0.5x", "must be a finite number, got '0.5x'"},
      {"dirichlet:inf", "must be a finite number"},
      {"dirichlet:nan", "must be a finite number"},
      {"dirichlet:0", "alpha must be a finite number > 0, got 0"},
      {"dirichlet:-1", "alpha must be a finite number > 0, got -1"},
      {"dirichlet:0.5:min=-1", "min must be a non-negative integer"},
      {"dirichlet:0.5:attempts=0", "attempts must be at least 1"},
      {"dirichlet:0.5:balance", "unknown dirichlet option 'balance'"},
      {"shards", "shards takes one parameter"},
      {"shards:0", "shards per client must be at least 1"},
      {"shards:two", "must be a non-negative integer, got 'two'"},
      {"shards:2:3", "shards takes one parameter"},
  };
  for (const auto& [text, expected] : cases) {
    auto spec = PartitionSpec::Parse(text);
    ASSERT_FALSE(spec.ok()) << "'" << text << "' parsed";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(Message(spec.status()), HasSubstr(expected)) << text;
    EXPECT_THAT(Message(spec.status()), HasSubstr("'" + text + "'")) << text;
  }
}

// --- properties common to every kind ---

TEST(PartitionTest, EveryIndexExactlyOnce) {
  for (const auto& labels : {BalancedLabels(), UnbalancedLabels()}) {
    for (const PartitionSpec& spec : AllKinds()) {
      for (uint32_t clients : {1u, 2u, 7u, 100u}) {
        auto parts = Partition(spec, labels, clients, 3);
        ASSERT_TRUE(parts.ok()) << spec.ToString() << " x " << clients << ": " << parts.status();
        ASSERT_EQ(parts->size(), clients);
        ExpectExactCover(*parts, labels.size(), fl::StrCat(spec.ToString(), " x ", clients));
      }
    }
  }
}

TEST(PartitionTest, SameSeedSameResultDifferentSeedDifferentResult) {
  const auto labels = BalancedLabels();
  for (const PartitionSpec& spec : AllKinds()) {
    auto a = Partition(spec, labels, 10, 42);
    auto b = Partition(spec, labels, 10, 42);
    auto c = Partition(spec, labels, 10, 43);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << spec.ToString();
    EXPECT_EQ(*a, *b) << spec.ToString();
    EXPECT_NE(*a, *c) << spec.ToString();
  }
}

TEST(PartitionTest, PartitionForIsThatClientsPart) {
  const auto labels = UnbalancedLabels();
  for (const PartitionSpec& spec : AllKinds()) {
    auto all = Partition(spec, labels, 9, 5);
    ASSERT_TRUE(all.ok());
    for (uint32_t i = 0; i < 9; ++i) {
      auto mine = PartitionFor(i, spec, labels, 9, 5);
      ASSERT_TRUE(mine.ok()) << mine.status();
      EXPECT_EQ(*mine, (*all)[i]);
    }
  }
  auto out_of_range = PartitionFor(9, PartitionSpec::Iid(), labels, 9, 5);
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_THAT(Message(out_of_range.status()), HasSubstr("client index 9 is out of range for 9 clients"));
}

TEST(PartitionTest, RejectsImpossibleRequests) {
  const auto labels = BalancedLabels(50);
  auto none = Partition(PartitionSpec::Iid(), labels, 0, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(Message(none.status()), HasSubstr("at least 1"));

  for (const PartitionSpec& spec : AllKinds()) {
    auto too_many = Partition(spec, labels, 51, 1);
    ASSERT_FALSE(too_many.ok()) << spec.ToString();
    EXPECT_THAT(Message(too_many.status()), HasSubstr("more clients (51) than examples (50)"));
  }
  EXPECT_TRUE(Partition(PartitionSpec::Iid(), labels, 50, 1).ok());

  auto shards = Partition(PartitionSpec::Shards(3), labels, 20, 1);
  ASSERT_FALSE(shards.ok());
  EXPECT_THAT(Message(shards.status()), HasSubstr("20 clients x 3 shards = 60 shards, more than the 50 examples"));

  PartitionSpec invalid = PartitionSpec::Dirichlet(-0.5);
  auto bad_alpha = Partition(invalid, labels, 2, 1);
  ASSERT_FALSE(bad_alpha.ok());
  EXPECT_THAT(Message(bad_alpha.status()), HasSubstr("alpha must be"));
}

// --- IID ---

TEST(IidPartitionTest, SizesDifferByAtMostOne) {
  const auto labels = BalancedLabels(6007);
  for (uint32_t clients : {1u, 3u, 10u, 64u, 6007u}) {
    auto parts = Partition(PartitionSpec::Iid(), labels, clients, 11);
    ASSERT_TRUE(parts.ok());
    size_t lo = SIZE_MAX, hi = 0;
    for (const auto& part : *parts) {
      lo = std::min(lo, part.size());
      hi = std::max(hi, part.size());
    }
    EXPECT_LE(hi - lo, 1u) << clients;
    EXPECT_EQ(lo, 6007u / clients);
  }
}

TEST(IidPartitionTest, LabelMixFollowsTheDataset) {
  const auto labels = BalancedLabels();
  auto parts = Partition(PartitionSpec::Iid(), labels, 10, 1);
  ASSERT_TRUE(parts.ok());
  for (const auto& part : *parts) {
    auto histogram = LabelHistogram(labels, part, 10);
    ASSERT_TRUE(histogram.ok());
    for (uint32_t count : *histogram) {
      EXPECT_GT(count, 30u);  // expectation 60, sd ~7.3
      EXPECT_LT(count, 90u);
    }
  }
}

// --- Dirichlet ---

double MeanMaxClassShare(const std::vector<std::vector<uint32_t>>& parts, const std::vector<uint8_t>& labels) {
  double total = 0;
  int counted = 0;
  for (const auto& part : parts) {
    if (part.empty()) continue;
    auto histogram = LabelHistogram(labels, part, 10);
    total +=
        static_cast<double>(*std::max_element(histogram->begin(), histogram->end())) / static_cast<double>(part.size());
    ++counted;
  }
  return total / counted;
}

TEST(DirichletPartitionTest, SmallAlphaIsVerySkewed) {
  const auto labels = BalancedLabels();
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto parts = Partition(PartitionSpec::Dirichlet(0.1), labels, 20, seed);
    ASSERT_TRUE(parts.ok()) << parts.status();
    EXPECT_GT(MeanMaxClassShare(*parts, labels), 0.5) << seed;
  }
}

TEST(DirichletPartitionTest, LargeAlphaIsNearlyUniform) {
  const auto labels = BalancedLabels();
  auto parts = Partition(PartitionSpec::Dirichlet(1000.0), labels, 20, 1);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_LT(MeanMaxClassShare(*parts, labels), 0.13);
  for (const auto& part : *parts) {
    EXPECT_NEAR(static_cast<double>(part.size()), 300.0, 20.0);  // Dir(1000) proportions: sd ~1.5% of 300
    auto histogram = LabelHistogram(labels, part, 10);
    for (uint32_t count : *histogram) {
      EXPECT_NEAR(static_cast<double>(count) / static_cast<double>(part.size()), 0.1, 0.03);
    }
  }
}

TEST(DirichletPartitionTest, TinyAlphaGivesOneClassPerClientWithoutUnderflow) {
  // Gamma(1e-6) draws underflow a double (they are ~exp(-1e6)); in log space the proportions still
  // normalise, and the largest one is so far ahead of the others that each class goes to one client whole.
  const auto labels = BalancedLabels();
  auto parts = Partition(PartitionSpec::Dirichlet(1e-6, 0), labels, 5, 9);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ExpectExactCover(*parts, labels.size(), "dirichlet:1e-06");
  for (const auto& part : *parts) {
    if (part.empty()) continue;
    auto histogram = LabelHistogram(labels, part, 10);
    for (uint32_t count : *histogram) EXPECT_TRUE(count == 0 || count == 600);  // each class goes whole
  }
}

TEST(DirichletPartitionTest, ResamplesUntilEveryClientHasTheMinimum) {
  const auto labels = BalancedLabels();
  // A seed whose first draw (the unconstrained result) leaves some client under the minimum.
  int resampled = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    auto unconstrained = Partition(PartitionSpec::Dirichlet(0.5, 0), labels, 20, seed);
    ASSERT_TRUE(unconstrained.ok());
    size_t smallest = SIZE_MAX;
    for (const auto& part : *unconstrained) smallest = std::min(smallest, part.size());
    if (smallest >= 150) continue;
    auto constrained = Partition(PartitionSpec::Dirichlet(0.5, 150), labels, 20, seed);
    ASSERT_TRUE(constrained.ok()) << constrained.status();
    for (const auto& part : *constrained) EXPECT_GE(part.size(), 150u);
    EXPECT_NE(*constrained, *unconstrained);
    ExpectExactCover(*constrained, labels.size(), "dirichlet:0.5:min=150");
    ++resampled;
  }
  EXPECT_GT(resampled, 5);
}

TEST(DirichletPartitionTest, ReportsAnUnreachableMinimum) {
  const auto labels = BalancedLabels();
  auto impossible = Partition(PartitionSpec::Dirichlet(0.5, 700), labels, 10, 1);
  ASSERT_FALSE(impossible.ok());
  EXPECT_THAT(Message(impossible.status()), HasSubstr("10 clients with at least 700 examples each"));

  PartitionSpec spec = PartitionSpec::Dirichlet(0.01, 100);
  spec.max_attempts = 5;
  auto unlucky = Partition(spec, labels, 50, 1);
  ASSERT_FALSE(unlucky.ok());
  EXPECT_EQ(unlucky.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(unlucky.status()), HasSubstr("none of 5 draws gave every client at least 100 examples"));
  EXPECT_THAT(Message(unlucky.status()), HasSubstr("dirichlet:0.01:min=0"));
}

// --- Shards ---

// Positions of `labels` in the stable label-sorted order.
std::vector<uint32_t> SortedPositions(const std::vector<uint8_t>& labels) {
  std::vector<uint32_t> order(labels.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return labels[a] < labels[b]; });
  std::vector<uint32_t> position(labels.size());
  for (uint32_t p = 0; p < order.size(); ++p) position[order[p]] = p;
  return position;
}

TEST(ShardsPartitionTest, EachClientIsItsShardsOfTheLabelSortedOrder) {
  // The guarantee: a client's examples are s runs of nearly equal length, contiguous in the label-sorted
  // order (so each spans few labels), on balanced and unbalanced data alike.
  for (const auto& labels : {BalancedLabels(), UnbalancedLabels()}) {
    const auto position = SortedPositions(labels);
    for (uint32_t s : {1u, 2u, 5u}) {
      const uint32_t clients = 30;
      auto parts = Partition(PartitionSpec::Shards(s), labels, clients, 8);
      ASSERT_TRUE(parts.ok()) << parts.status();
      const size_t shard_lo = labels.size() / (clients * s);
      for (const auto& part : *parts) {
        std::vector<uint32_t> positions;
        for (uint32_t index : part) positions.push_back(position[index]);
        std::sort(positions.begin(), positions.end());
        // Count runs of consecutive positions; a run may merge two adjacent shards of the same client.
        size_t runs = positions.empty() ? 0 : 1;
        for (size_t i = 1; i < positions.size(); ++i) runs += positions[i] != positions[i - 1] + 1;
        EXPECT_LE(runs, s);
        EXPECT_GE(part.size(), s * shard_lo);
        EXPECT_LE(part.size(), s * (shard_lo + 1));
      }
    }
  }
}

TEST(ShardsPartitionTest, AtMostShardsPerClientLabelsWhenShardsAlignWithClasses) {
  const auto labels = BalancedLabels();  // 600 per class; 50 clients x 2 shards of 60 -> 10 shards per class
  auto parts = Partition(PartitionSpec::Shards(2), labels, 50, 12);
  ASSERT_TRUE(parts.ok());
  int clients_with_two = 0;
  for (const auto& part : *parts) {
    auto histogram = LabelHistogram(labels, part, 10);
    const auto classes = std::count_if(histogram->begin(), histogram->end(), [](uint32_t c) { return c > 0; });
    EXPECT_GE(classes, 1);
    EXPECT_LE(classes, 2);
    clients_with_two += classes == 2;
  }
  EXPECT_GT(clients_with_two, 25);  // shards are drawn at random: most clients get two different classes
}

// --- helpers ---

TEST(LabelHistogramTest, CountsAndValidates) {
  const std::vector<uint8_t> labels = {0, 1, 1, 2, 2, 2};
  auto histogram = LabelHistogram(labels, std::vector<uint32_t>{1, 3, 4, 5}, 4);
  ASSERT_TRUE(histogram.ok());
  EXPECT_EQ(*histogram, (std::vector<uint32_t>{0, 1, 3, 0}));
  auto bad_index = LabelHistogram(labels, std::vector<uint32_t>{6}, 4);
  ASSERT_FALSE(bad_index.ok());
  EXPECT_THAT(Message(bad_index.status()), HasSubstr("index 6 is out of range for 6 examples"));
  auto bad_label = LabelHistogram(labels, std::vector<uint32_t>{5}, 2);
  ASSERT_FALSE(bad_label.ok());
  EXPECT_THAT(Message(bad_label.status()), HasSubstr("example 5 has label 2, not in [0, 2)"));
}

TEST(TrainValidationSplitTest, DisjointCompleteDeterministic) {
  std::vector<uint32_t> indices;
  for (uint32_t i = 0; i < 1000; ++i) indices.push_back(i * 3 + 1);
  auto split = SplitTrainValidation(indices, 0.1, 77);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->validation.size(), 100u);
  EXPECT_EQ(split->train.size(), 900u);
  std::vector<uint32_t> both = split->train;
  both.insert(both.end(), split->validation.begin(), split->validation.end());
  std::sort(both.begin(), both.end());
  EXPECT_EQ(both, indices);
  EXPECT_TRUE(std::is_sorted(split->validation.begin(), split->validation.end()));
  EXPECT_EQ(SplitTrainValidation(indices, 0.1, 77)->validation, split->validation);
  EXPECT_NE(SplitTrainValidation(indices, 0.1, 78)->validation, split->validation);
  EXPECT_TRUE(SplitTrainValidation(indices, 0.0, 77)->validation.empty());
  auto bad = SplitTrainValidation(indices, 1.0, 77);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Message(bad.status()), HasSubstr("validation fraction must be in [0, 1)"));
}

// --- pinned reproducibility ---

TEST(PartitionReproducibilityTest, PinnedHashesOfClientZero) {
  // PINNED. A partition is part of every recorded experiment: replaying a record re-derives each client's
  // data from (spec, dataset, number of clients, seed). If one of these hashes changes, every recorded
  // experiment with that partition kind silently trains on different data; change the RNG streams, the
  // samplers, the cut rules or the output order only deliberately, and update these constants and the
  // changelog in the same change. (FNV-1a over client 0's sorted indices as little-endian uint32s.)
  const auto labels = BalancedLabels();
  const std::vector<std::pair<std::string, uint64_t>> pinned = {
      {"iid", 3525586068021890634ULL},
      {"dirichlet:0.1", 11286268576097683877ULL},
      {"dirichlet:0.5:min=10", 794929161469245795ULL},
      {"dirichlet:100", 5203626758558484936ULL},
      {"shards:2", 9788548748917608315ULL},
  };
  for (const auto& [text, expected] : pinned) {
    auto spec = PartitionSpec::Parse(text);
    ASSERT_TRUE(spec.ok());
    auto mine = PartitionFor(0, *spec, labels, 10, 20240601);
    ASSERT_TRUE(mine.ok()) << mine.status();
    EXPECT_EQ(Fnv1a(*mine), expected) << text;
  }
}

}  // namespace
}  // namespace fl::training::data
