#include "fl/core/tensor_spec.h"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "fl/core/checksum.h"
#include "fl/core/flat_params.h"

namespace fl::core {
namespace {

std::vector<TensorSpec> SmallCnn() {
  return {{"conv1.weight", {8, 1, 3, 3}, DType::kFloat32, 0},
          {"conv1.bias", {8}, DType::kFloat32, 0},
          {"bn.num_batches_tracked", {}, DType::kInt64, 0},
          {"fc.weight", {10, 32}, DType::kFloat32, 0}};
}

TEST(ModelSpecTest, AssignsContiguousOffsets) {
  auto spec = ModelSpec::Create(SmallCnn());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->num_tensors(), 4u);
  EXPECT_EQ(spec->tensors()[0].offset, 0u);
  EXPECT_EQ(spec->tensors()[1].offset, 72u);
  EXPECT_EQ(spec->tensors()[2].offset, 80u);  // a scalar has one element
  EXPECT_EQ(spec->tensors()[3].offset, 81u);
  EXPECT_EQ(spec->num_elements(), 81u + 320u);
}

TEST(ModelSpecTest, FingerprintIsStableAcrossBuilds) {
  auto a = ModelSpec::Create(SmallCnn());
  auto b = ModelSpec::Create(SmallCnn());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  // Pinned value: the fingerprint is part of the wire protocol, so a change to its algorithm must be a
  // deliberate protocol change, not an accident.
  EXPECT_EQ(a->FingerprintHex().size(), 16u);
}

TEST(ModelSpecTest, FingerprintChangesWithShapeNameDtypeAndOrder) {
  const uint64_t base = ModelSpec::Create(SmallCnn())->fingerprint();
  auto reshaped = SmallCnn();
  reshaped[3].shape = {32, 10};  // same element count, different shape
  EXPECT_NE(ModelSpec::Create(reshaped)->fingerprint(), base);
  auto renamed = SmallCnn();
  renamed[1].name = "conv1.b";
  EXPECT_NE(ModelSpec::Create(renamed)->fingerprint(), base);
  auto retyped = SmallCnn();
  retyped[0].dtype = DType::kFloat16;
  EXPECT_NE(ModelSpec::Create(retyped)->fingerprint(), base);
  auto reordered = SmallCnn();
  std::swap(reordered[0], reordered[1]);
  EXPECT_NE(ModelSpec::Create(reordered)->fingerprint(), base);
}

TEST(ModelSpecTest, RejectsDuplicateEmptyAndNegative) {
  auto dup = SmallCnn();
  dup[1].name = "conv1.weight";
  auto s = ModelSpec::Create(dup);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("conv1.weight"), std::string::npos);
  auto empty = SmallCnn();
  empty[2].name = "";
  EXPECT_FALSE(ModelSpec::Create(empty).ok());
  auto neg = SmallCnn();
  neg[0].shape = {8, -1};
  s = ModelSpec::Create(neg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("[8, -1]"), std::string::npos);
}

TEST(ModelSpecTest, RefusesElementCountsThatOverflowNamingTheTensor) {
  // [2^62, 4] wraps around to 0 in 64-bit arithmetic: it must be refused, not become an empty tensor.
  auto wraps = ModelSpec::Create({{"huge", {int64_t{1} << 62, 4}, DType::kFloat32, 0}});
  ASSERT_FALSE(wraps.ok());
  EXPECT_NE(wraps.status().message().find("tensor 'huge'"), std::string::npos) << wraps.status();
  EXPECT_NE(wraps.status().message().find("[4611686018427387904, 4]"), std::string::npos) << wraps.status();
  // Each tensor fits, their sum does not.
  auto sum = ModelSpec::Create({{"a", {int64_t{1} << 55}, DType::kFloat32, 0},
                                {"b", {int64_t{1} << 55}, DType::kFloat32, 0},
                                {"c", {1}, DType::kFloat32, 0}});
  ASSERT_FALSE(sum.ok());
  EXPECT_NE(sum.status().message().find("'c'"), std::string::npos) << sum.status();
  // A zero dimension after a huge one is still an absurd shape (and must not be reached by overflow).
  EXPECT_FALSE(ModelSpec::Create({{"z", {int64_t{1} << 62, 4, 0}, DType::kFloat32, 0}}).ok());
  // The largest allowed count is fine (the spec holds no values, only their layout).
  auto big = ModelSpec::Create({{"big", {int64_t{1} << 36}, DType::kFloat32, 0}});
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->num_elements(), uint64_t{1} << 36);
}

TEST(ModelSpecTest, TensorIndexOfElement) {
  auto spec = ModelSpec::Create(SmallCnn());
  EXPECT_EQ(spec->TensorIndexOfElement(0), 0u);
  EXPECT_EQ(spec->TensorIndexOfElement(71), 0u);
  EXPECT_EQ(spec->TensorIndexOfElement(72), 1u);
  EXPECT_EQ(spec->TensorIndexOfElement(80), 2u);
  EXPECT_EQ(spec->TensorIndexOfElement(81), 3u);
  EXPECT_EQ(spec->TensorIndexOfElement(400), 3u);
}

TEST(ModelSpecTest, CheckMatchesSpecNamesBothFingerprints) {
  auto spec = ModelSpec::Create(SmallCnn());
  EXPECT_TRUE(CheckMatchesSpec(*spec, spec->fingerprint(), spec->num_elements(), "update").ok());
  auto bad = CheckMatchesSpec(*spec, 0x1234, spec->num_elements(), "update from client 7");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("client 7"), std::string::npos);
  EXPECT_NE(bad.message().find("0000000000001234"), std::string::npos);
  EXPECT_NE(bad.message().find(spec->FingerprintHex()), std::string::npos);
  EXPECT_FALSE(CheckMatchesSpec(*spec, spec->fingerprint(), spec->num_elements() - 1, "update").ok());
}

TEST(CheckFiniteTest, NamesTensorAndElement) {
  auto spec = std::make_shared<ModelSpec>(*ModelSpec::Create(SmallCnn()));
  FlatParams params(spec);
  EXPECT_TRUE(CheckFinite(params.values(), "update", spec.get()).ok());
  params.values()[75] = std::numeric_limits<float>::quiet_NaN();
  auto s = CheckFinite(params.values(), "update", spec.get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("conv1.bias"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("element 3"), std::string::npos) << s.message();
  params.values()[75] = 0;
  params.values()[100] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(CheckFinite(params.values(), "update").ok());
}

ModelSpec Spec(std::vector<TensorSpec> tensors) {
  auto spec = ModelSpec::Create(std::move(tensors));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(DescribeSpecDifferenceTest, EqualSpecsHaveNoDifference) {
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(SmallCnn())), "");
}

TEST(DescribeSpecDifferenceTest, NamesTheFirstShapeDifferenceAndCountsTheRest) {
  auto client = SmallCnn();
  client[0].shape = {16, 1, 3, 3};
  client[3].shape = {10, 64};
  client[2].dtype = DType::kFloat32;
  const std::string d =
      DescribeSpecDifference(Spec(SmallCnn()), Spec(client), "the experiment's", "the client's model");
  EXPECT_EQ(d,
            "tensor #0 'conv1.weight' has shape [16, 1, 3, 3] in the client's model but [8, 1, 3, 3] in the "
            "experiment's (first of 3 differences)");
}

TEST(DescribeSpecDifferenceTest, NamesADtypeDifference) {
  auto client = SmallCnn();
  client[2].dtype = DType::kFloat32;
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(client), "E", "A"),
            "tensor #2 'bn.num_batches_tracked' has dtype float32 in A but int64 in E");
  client[2].shape = {1};
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(client), "E", "A"),
            "tensor #2 'bn.num_batches_tracked' has shape [1] and dtype float32 in A but [] and int64 in E");
}

TEST(DescribeSpecDifferenceTest, NamesAMissingAndAnExtraTensor) {
  auto missing = SmallCnn();
  missing.erase(missing.begin() + 1);  // no conv1.bias
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(missing), "E", "A"),
            "tensor #1 'conv1.bias' [8] float32 is in E but not in A");
  auto extra = SmallCnn();
  extra.push_back({"fc.bias", {10}, DType::kFloat32, 0});
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(extra), "E", "A"),
            "tensor #4 'fc.bias' [10] float32 is in A but not in E");
  // A renamed tensor is one missing and one extra name at the same position.
  auto renamed = SmallCnn();
  renamed[3].name = "classifier.weight";
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(renamed), "E", "A"),
            "tensor #3 'fc.weight' [10, 32] float32 is in E but not in A (first of 2 differences)");
}

TEST(DescribeSpecDifferenceTest, NamesTheOrderWhenOnlyTheOrderDiffers) {
  auto swapped = SmallCnn();
  std::swap(swapped[0], swapped[1]);
  EXPECT_EQ(DescribeSpecDifference(Spec(SmallCnn()), Spec(swapped), "E", "A"),
            "tensor #0 'conv1.bias' comes before 'conv1.weight' in A but after it in E (the same tensors in "
            "another order)");
  // Specs that differ only in order have different fingerprints, and the description is never empty when
  // the fingerprints differ.
  EXPECT_NE(Spec(SmallCnn()).fingerprint(), Spec(swapped).fingerprint());
}

TEST(IntegerTensorsTest, SaveAndRestoreTouchOnlyIntegerTensors) {
  const ModelSpec spec = Spec({{"w", {3}, DType::kFloat32, 0},
                               {"bn.num_batches_tracked", {}, DType::kInt64, 0},
                               {"bn.running_mean", {2}, DType::kFloat32, 0},
                               {"idx", {2}, DType::kInt32, 0},
                               {"mask", {1}, DType::kUInt8, 0},
                               {"h", {1}, DType::kFloat16, 0}});
  EXPECT_TRUE(IsIntegerDType(DType::kInt64) && IsIntegerDType(DType::kInt32) && IsIntegerDType(DType::kUInt8));
  EXPECT_FALSE(IsIntegerDType(DType::kFloat32) || IsIntegerDType(DType::kFloat16) || IsIntegerDType(DType::kBFloat16) ||
               IsIntegerDType(DType::kFloat64));
  const std::vector<float> previous = {1, 2, 3, 40, 5, 6, 7, 8, 1, 0.5f};
  auto saved = SaveIntegerTensors(spec, previous);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(*saved, (std::vector<float>{40, 7, 8, 1}));
  // A server step moved every value; the integer ones come back, the float ones keep the step.
  std::vector<float> next = {1.5f, 2.5f, 3.5f, 41.5f, 5.5f, 6.5f, 7.5f, 8.5f, 0.5f, 0.25f};
  ASSERT_TRUE(RestoreIntegerTensors(spec, *saved, next).ok());
  EXPECT_EQ(next, (std::vector<float>{1.5f, 2.5f, 3.5f, 40, 5.5f, 6.5f, 7, 8, 1, 0.25f}));
  // Sizes that do not fit the spec are refused, naming both counts.
  auto wrong = SaveIntegerTensors(spec, std::vector<float>(3));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("10"), std::string::npos);
  absl::Status s = RestoreIntegerTensors(spec, std::vector<float>{1, 2}, next);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("4"), std::string::npos) << s.message();
  // A model without integer tensors saves nothing.
  const ModelSpec floats = Spec({{"w", {3}, DType::kFloat32, 0}});
  EXPECT_TRUE(SaveIntegerTensors(floats, std::vector<float>(3))->empty());
}

TEST(FlatParamsTest, TensorViewsAliasTheBuffer) {
  auto spec = std::make_shared<ModelSpec>(*ModelSpec::Create(SmallCnn()));
  FlatParams params(spec);
  ASSERT_EQ(params.size(), spec->num_elements());
  auto bias = params.tensor("conv1.bias");
  ASSERT_TRUE(bias.ok());
  ASSERT_EQ(bias->size(), 8u);
  (*bias)[2] = 5.0f;
  EXPECT_EQ(params.values()[74], 5.0f);
  EXPECT_EQ(params.tensor(1)[2], 5.0f);
  EXPECT_FALSE(params.tensor("nope").ok());
  EXPECT_FALSE(FlatParams::FromValues(spec, std::vector<float>(3)).ok());
  EXPECT_TRUE(FlatParams::FromValues(spec, std::vector<float>(spec->num_elements())).ok());
}

TEST(Checksum64Test, DetectsEveryFlippedBitAndTruncation) {
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  const uint64_t base = Checksum64(bytes);
  EXPECT_EQ(base, Checksum64(bytes));
  for (size_t i = 0; i < bytes.size(); i += 7) {
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(Checksum64(bytes), base) << "byte " << i << " bit " << bit;
      bytes[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  for (size_t len = 0; len < bytes.size(); len += 13) {
    EXPECT_NE(Checksum64(std::span(bytes).first(len)), base) << len;
  }
  EXPECT_NE(Checksum64(bytes, 1), base);
}

}  // namespace
}  // namespace fl::core
