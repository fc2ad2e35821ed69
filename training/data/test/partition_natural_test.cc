// Partitions of any dataset: int64 labels give exactly the uint8 partitions (so Fashion-MNIST read from an
// .npz is split as from its IDX files), labels beyond 255, unlabelled IID parts, and the natural partition
// by client id.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/training/data/partition.h"

namespace fl::training::data {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(fl::ToStd(status.message())); }

std::vector<uint8_t> SkewedLabels() {
  // Classes 0..9 with gaps (no 4, no 7) and unequal sizes: empty classes must not shift any draw.
  std::vector<uint8_t> labels;
  for (size_t i = 0; i < 5000; ++i) {
    uint8_t label = static_cast<uint8_t>((i * 7919 + i / 13) % 10);
    if (label == 4 || label == 7) label = static_cast<uint8_t>(label * 2 % 10);
    labels.push_back(label);
  }
  return labels;
}

TEST(PartitionLabelsTest, Int64LabelsGiveTheUint8Partitions) {
  const std::vector<uint8_t> small = SkewedLabels();
  const std::vector<int64_t> wide(small.begin(), small.end());
  for (const char* text : {"iid", "dirichlet:0.1:min=0", "dirichlet:0.5", "dirichlet:100", "shards:1", "shards:3"}) {
    auto spec = PartitionSpec::Parse(text);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto a = Partition(*spec, std::span<const uint8_t>(small), 17, 99);
    auto b = Partition(*spec, std::span<const int64_t>(wide), 17, 99);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*a, *b) << text;
    auto mine = PartitionFor(3, *spec, std::span<const int64_t>(wide), 17, 99);
    ASSERT_TRUE(mine.ok());
    EXPECT_EQ(*mine, (*a)[3]) << text;
  }
}

TEST(PartitionLabelsTest, LabelsBeyond255AndSparseLabels) {
  // 1000 classes, and the same data with labels spread far apart: the same classes, the same partition.
  std::vector<int64_t> dense(20000), sparse(20000);
  for (size_t i = 0; i < dense.size(); ++i) {
    dense[i] = static_cast<int64_t>((i * 7919) % 1000);
    sparse[i] = dense[i] * 1'000'000'007LL;
  }
  auto a = Partition(PartitionSpec::Shards(2), std::span<const int64_t>(dense), 50, 1);
  auto b = Partition(PartitionSpec::Shards(2), std::span<const int64_t>(sparse), 50, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*a, *b);
  // A shard of the label-sorted order is contiguous in label: 100 shards of 200 examples over classes of 20
  // span at most 11 labels each, so a client with 2 shards sees at most 22 of the 1000.
  std::set<int64_t> seen;
  for (uint32_t index : (*a)[0]) seen.insert(dense[index]);
  EXPECT_LE(seen.size(), 22u);
}

TEST(PartitionLabelsTest, NegativeLabelIsAnError) {
  const std::vector<int64_t> labels = {0, 1, 2, -3, 1, 0};
  auto parts = Partition(PartitionSpec::Dirichlet(0.5), std::span<const int64_t>(labels), 2, 1);
  ASSERT_FALSE(parts.ok());
  EXPECT_THAT(Message(parts.status()), HasSubstr("example 3 has label -3"));
  // IID does not look at labels at all.
  EXPECT_TRUE(Partition(PartitionSpec::Iid(), std::span<const int64_t>(labels), 2, 1).ok());
}

TEST(PartitionLabelsTest, IidForUnlabelledDataIsTheIidPart) {
  const std::vector<uint8_t> labels = SkewedLabels();
  for (uint32_t k = 0; k < 7; ++k) {
    auto expected = PartitionFor(k, PartitionSpec::Iid(), labels, 7, 123);
    auto actual = PartitionIidFor(k, labels.size(), 7, 123);
    ASSERT_TRUE(actual.ok()) << actual.status();
    EXPECT_EQ(*actual, *expected);
  }
  EXPECT_FALSE(PartitionIidFor(7, 100, 7, 1).ok());
  auto too_many = PartitionIidFor(0, 3, 5, 1);
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(Message(too_many.status()), HasSubstr("more clients (5) than examples (3)"));
}

TEST(NaturalPartitionTest, ParsesAndNeedsClientIds) {
  auto spec = PartitionSpec::Parse("natural");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, PartitionKind::kNatural);
  EXPECT_EQ(spec->ToString(), "natural");
  EXPECT_EQ(PartitionKindName(PartitionKind::kNatural), "natural");
  EXPECT_FALSE(PartitionSpec::Parse("natural:3").ok());
  // Labels alone cannot give a natural partition.
  const std::vector<uint8_t> labels(100, 1);
  auto parts = Partition(*spec, labels, 2, 1);
  ASSERT_FALSE(parts.ok());
  EXPECT_THAT(Message(parts.status()), HasSubstr("client_id"));
}

TEST(NaturalPartitionTest, DistinctIdsSortedThenDealtRoundRobin) {
  // ids (sorted distinct): -5, 3, 10, 42, 77 -> with 2 clients: client 0 gets -5, 10, 77; client 1 gets 3, 42.
  const std::vector<int64_t> ids = {42, 3, -5, 10, 42, 77, 3, 10, -5, 77, 77};
  auto parts = PartitionNatural(ids, 2);
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ((*parts)[0], (std::vector<uint32_t>{2, 3, 5, 7, 8, 9, 10}));
  EXPECT_EQ((*parts)[1], (std::vector<uint32_t>{0, 1, 4, 6}));
  // One client per id.
  auto five = PartitionNatural(ids, 5);
  ASSERT_TRUE(five.ok());
  EXPECT_EQ((*five)[3], (std::vector<uint32_t>{0, 4}));  // id 42
  auto mine = PartitionNaturalFor(1, ids, 2);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(*mine, (*parts)[1]);
  // More clients than ids: an error naming both numbers.
  auto six = PartitionNatural(ids, 6);
  ASSERT_FALSE(six.ok());
  EXPECT_THAT(Message(six.status()), HasSubstr("6 clients but the data have only 5 distinct client ids"));
  EXPECT_FALSE(PartitionNaturalFor(2, ids, 2).ok());
}

}  // namespace
}  // namespace fl::training::data
