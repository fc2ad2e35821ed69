// fl-client's own checks of the tensors LibTorch hands it (issue 27), independent of the torch-free vet: tensors
// built as LibTorch's unpickler builds them from a file (a storage, then the file's storage offset, sizes and
// strides set on the TensorImpl without any bounds check) must be refused by CopyToFlat / CopyFromFlat before
// their memory is read or written, not read out of bounds (SIGSEGV at an offset of 2^62 + 2^28), nor made
// contiguous into a 4 TiB buffer (std::bad_alloc at (2^20, 2^20) over 512 bytes).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fl/training/torch_models.h"
#include "tensor_checks.h"

namespace fl::training {
namespace {

using ::testing::HasSubstr;

// A float tensor over `storage` with the geometry a file declared, set as torch::jit's unpickler sets it
// (rebuildTensor: set_storage_keep_dtype, set_storage_offset, set_sizes_and_strides).
torch::Tensor Rebuilt(const torch::Tensor& storage, int64_t offset, std::vector<int64_t> sizes,
                      std::vector<int64_t> strides) {
  torch::Tensor t = torch::empty({0}, torch::kFloat);
  auto* impl = t.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(storage.storage());
  impl->set_storage_offset(offset);
  impl->set_sizes_and_strides(sizes, strides);
  return t;
}

core::ModelSpec SpecOf(const std::string& name, std::vector<int64_t> shape) {
  core::TensorSpec t;
  t.name = name;
  t.shape = std::move(shape);
  auto spec = core::ModelSpec::Create({t});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(TensorChecks, AViewInsideItsStorageIsCopiedBothWays) {
  const torch::Tensor storage = torch::arange(12, torch::kFloat);
  // Rows 1..2 of a 3 x 4 storage, transposed: offset 4, sizes (4, 2), strides (1, 4).
  torch::Tensor view = Rebuilt(storage, 4, {4, 2}, {1, 4});
  EXPECT_TRUE(internal::CheckTensorInStorage(view, "view").ok());
  const core::ModelSpec spec = SpecOf("view", {4, 2});
  std::vector<float> flat(8);
  ASSERT_TRUE(CopyToFlat({&view, 1}, spec, flat).ok());
  EXPECT_EQ(flat, (std::vector<float>{4, 8, 5, 9, 6, 10, 7, 11}));
  std::vector<float> back(8, -1.0f);
  ASSERT_TRUE(CopyFromFlat(back, spec, {&view, 1}).ok());
  EXPECT_EQ(storage[5].item<float>(), -1.0f);
  EXPECT_EQ(storage[0].item<float>(), 0.0f) << "outside the view: untouched";
}

TEST(TensorChecks, AStorageOffsetFarPastTheStorageIsRefusedBeforeAnyRead) {
  const torch::Tensor storage = torch::zeros({8}, torch::kFloat);
  torch::Tensor bad = Rebuilt(storage, (int64_t{1} << 62) + (int64_t{1} << 28), {2, 4}, {4, 1});
  const core::ModelSpec spec = SpecOf("fc.weight", {2, 4});
  std::vector<float> flat(8);
  const absl::Status to = CopyToFlat({&bad, 1}, spec, flat);
  EXPECT_EQ(to.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(to.message()), HasSubstr("fc.weight"));
  EXPECT_THAT(std::string(to.message()), HasSubstr("storage offset 4611686018695823360"));
  EXPECT_THAT(std::string(to.message()), HasSubstr("addresses more than 2^64 bytes"));
  const absl::Status from = CopyFromFlat(flat, spec, {&bad, 1});
  EXPECT_EQ(from.code(), absl::StatusCode::kInvalidArgument) << "and nothing written through it";
}

TEST(TensorChecks, ATensorLargerThanItsStorageIsRefusedBeforeAnyAllocation) {
  const torch::Tensor storage = torch::zeros({128}, torch::kFloat);  // 512 bytes
  torch::Tensor bad = Rebuilt(storage, 0, {1 << 20, 1 << 20}, {1 << 20, 1});
  const absl::Status s = internal::CheckTensorInStorage(bad, "fc.weight");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("reaches byte 4398046511104 of a storage of 512 bytes"));
  // CopyToFlat would have made it contiguous: 4 TiB.
  const core::ModelSpec spec = SpecOf("fc.weight", {2, 4});
  std::vector<float> flat(8);
  EXPECT_EQ(CopyToFlat({&bad, 1}, spec, flat).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TensorChecks, NegativeStridesAndOverflowingGeometryAreRefused) {
  const torch::Tensor storage = torch::arange(2, torch::kFloat);
  // A file's stride of -1 (elements 1, 0 of the storage): LibTorch 1.13's set_sizes_and_strides silently replaces
  // a negative stride by the contiguous one, so the tensor it builds reads elements 1 and 2, past the storage.
  const absl::Status backwards = internal::CheckTensorInStorage(Rebuilt(storage, 1, {2}, {-1}), "fc.bias");
  EXPECT_EQ(backwards.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(backwards.message()), HasSubstr("reaches byte 12 of a storage of 8 bytes"));
  // offset + (size - 1) * stride fits 64 bits, its byte count does not.
  const absl::Status wraps =
      internal::CheckTensorInStorage(Rebuilt(storage, int64_t{1} << 62, {3}, {int64_t{1} << 62}), "w");
  EXPECT_EQ(wraps.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wraps.message()), HasSubstr("more than 2^64 bytes"));
  // An empty tensor addresses nothing, wherever its offset.
  EXPECT_TRUE(internal::CheckTensorInStorage(Rebuilt(storage, 5, {0, 3}, {3, 1}), "empty").ok());
}

TEST(TensorChecks, NonFiniteValuesAreNamedByElement) {
  torch::Tensor t = torch::zeros({2, 3});
  EXPECT_TRUE(internal::CheckTensorFinite(t, "w").ok());
  t[1][0] = std::numeric_limits<float>::quiet_NaN();
  t[1][2] = std::numeric_limits<float>::infinity();
  const absl::Status s = internal::CheckTensorFinite(t, "tensor 'fc.weight'");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'fc.weight': element 3 (C order) is nan"));
  EXPECT_TRUE(internal::CheckTensorFinite(torch::tensor({1, 2}, torch::kLong), "ints").ok());
}

}  // namespace
}  // namespace fl::training
