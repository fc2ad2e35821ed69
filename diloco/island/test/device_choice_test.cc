// ChooseDevice (island.h): which device a rank trains on for every combination of GPUs seen and NCCL
// compiled in, and the errors that name what is missing. Torch-free: the facts are given, so the GPU
// cases are decided here even though this machine has no GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fl/diloco/island/island.h"

namespace fl::diloco {
namespace {

DeviceFacts Facts(int gpus, bool nccl) {
  DeviceFacts f;
  f.cuda_devices = gpus;
  f.nccl = nccl;
  return f;
}

bool Has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

TEST(DeviceChoiceTest, CpuIsTheCpuWhateverTheMachineHas) {
  for (int gpus : {0, 2}) {
    for (bool nccl : {false, true}) {
      absl::StatusOr<DeviceChoice> c = ChooseDevice("cpu", 1, -1, Facts(gpus, nccl));
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_FALSE(c->cuda);
      EXPECT_EQ(c->Name(), "cpu");
    }
  }
}

TEST(DeviceChoiceTest, AutoWithoutGpuOrNcclIsTheCpuAndSaysWhy) {
  absl::StatusOr<DeviceChoice> neither = ChooseDevice("auto", 0, -1, Facts(0, false));
  ASSERT_TRUE(neither.ok()) << neither.status();
  EXPECT_EQ(neither->Name(), "cpu");
  EXPECT_TRUE(Has(neither->reason, "no CUDA device")) << neither->reason;
  EXPECT_TRUE(Has(neither->reason, "no c10d NCCL process group")) << neither->reason;

  absl::StatusOr<DeviceChoice> no_gpu = ChooseDevice("auto", 0, -1, Facts(0, true));
  ASSERT_TRUE(no_gpu.ok()) << no_gpu.status();
  EXPECT_EQ(no_gpu->Name(), "cpu");
  EXPECT_TRUE(Has(no_gpu->reason, "no CUDA device")) << no_gpu->reason;
  EXPECT_FALSE(Has(no_gpu->reason, "NCCL")) << no_gpu->reason;

  // GPUs but a CPU-only build: the GPUs cannot take part in c10d collectives, so the CPU, and the reason
  // says how to use them.
  absl::StatusOr<DeviceChoice> no_nccl = ChooseDevice("auto", 0, -1, Facts(2, false));
  ASSERT_TRUE(no_nccl.ok()) << no_nccl.status();
  EXPECT_EQ(no_nccl->Name(), "cpu");
  EXPECT_TRUE(Has(no_nccl->reason, "2 CUDA device(s)")) << no_nccl->reason;
  EXPECT_TRUE(Has(no_nccl->reason, "rebuild against a CUDA LibTorch")) << no_nccl->reason;
}

TEST(DeviceChoiceTest, AutoAndCudaWithGpusAndNcclTakeTheGpuOfTheirSlot) {
  for (const std::string requested : {"auto", "cuda"}) {
    for (size_t slot = 0; slot < 5; ++slot) {
      absl::StatusOr<DeviceChoice> c = ChooseDevice(requested, slot, -1, Facts(2, true));
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_TRUE(c->cuda);
      EXPECT_EQ(c->index, static_cast<int>(slot % 2));
      EXPECT_EQ(c->Name(), slot % 2 == 0 ? "cuda:0" : "cuda:1");
      EXPECT_TRUE(Has(c->reason, "NCCL")) << c->reason;
    }
  }
}

// fl-island's slot counts ranks over the islands: two islands of two ranks on one 4-GPU machine take
// GPUs 0, 1 (island 0) and 2, 3 (island 1); an island's ranks stay on distinct GPUs whenever R <= GPUs.
TEST(DeviceChoiceTest, SlotsOfAnExperimentOnOneMachineSpreadOverItsGpus) {
  IslandOptions o;
  o.num_shards = 2;
  o.ranks = 2;
  std::vector<std::string> names;
  for (size_t shard = 0; shard < 2; ++shard) {
    for (size_t rank = 0; rank < 2; ++rank) {
      o.shard = shard;
      o.rank = rank;
      absl::StatusOr<DeviceChoice> c = ChooseDevice("cuda", o.device_slot(), -1, Facts(4, true));
      ASSERT_TRUE(c.ok()) << c.status();
      names.push_back(c->Name());
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cuda:0", "cuda:1", "cuda:2", "cuda:3"}));
  o.shard = 1;
  o.rank = 0;
  absl::StatusOr<DeviceChoice> a = ChooseDevice("cuda", o.device_slot(), -1, Facts(2, true));
  o.rank = 1;
  absl::StatusOr<DeviceChoice> b = ChooseDevice("cuda", o.device_slot(), -1, Facts(2, true));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->index, b->index);
}

TEST(DeviceChoiceTest, CudaDeviceFlagPinsTheGpuAndIsCheckedAgainstTheCount) {
  absl::StatusOr<DeviceChoice> pinned = ChooseDevice("cuda", 0, 3, Facts(4, true));
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->Name(), "cuda:3");

  absl::StatusOr<DeviceChoice> too_high = ChooseDevice("cuda", 0, 4, Facts(4, true));
  ASSERT_FALSE(too_high.ok());
  EXPECT_EQ(too_high.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(too_high.status().message()), "--cuda-device 4")) << too_high.status();
  EXPECT_TRUE(Has(std::string(too_high.status().message()), "0..3")) << too_high.status();

  absl::StatusOr<DeviceChoice> negative = ChooseDevice("cpu", 0, -2, Facts(0, false));
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(negative.status().message()), "--cuda-device -2")) << negative.status();
}

TEST(DeviceChoiceTest, CudaWithoutGpuFailsNamingWhatIsMissingAndWhatToDo) {
  absl::StatusOr<DeviceChoice> neither = ChooseDevice("cuda", 0, -1, Facts(0, false));
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(neither.status().message());
  EXPECT_TRUE(Has(m, "LibTorch sees no CUDA device")) << m;
  EXPECT_TRUE(Has(m, "use --device cpu")) << m;
  EXPECT_TRUE(Has(m, "USE_C10D_NCCL")) << m;  // both missing: both named

  absl::StatusOr<DeviceChoice> no_gpu = ChooseDevice("cuda", 0, -1, Facts(0, true));
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_EQ(no_gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(std::string(no_gpu.status().message()), "LibTorch sees no CUDA device")) << no_gpu.status();
  EXPECT_FALSE(Has(std::string(no_gpu.status().message()), "USE_C10D_NCCL")) << no_gpu.status();
}

TEST(DeviceChoiceTest, CudaWithoutNcclFailsNamingTheBuild) {
  absl::StatusOr<DeviceChoice> c = ChooseDevice("cuda", 0, -1, Facts(1, false));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(c.status().message());
  EXPECT_TRUE(Has(m, "without c10d's NCCL process group (USE_C10D_NCCL)")) << m;
  EXPECT_TRUE(Has(m, "use --device cpu")) << m;
}

TEST(DeviceChoiceTest, UnknownDeviceIsInvalidArgumentNamingIt) {
  absl::StatusOr<DeviceChoice> c = ChooseDevice("gpu", 0, -1, Facts(1, true));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Has(std::string(c.status().message()), "--device gpu: use auto, cpu or cuda")) << c.status();
}

}  // namespace
}  // namespace fl::diloco
