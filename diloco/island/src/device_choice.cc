// Which device a rank trains on (island.h: ChooseDevice). Torch-free so that the decision is tested
// for every combination of GPU count and NCCL without a GPU; ProbeDeviceFacts (island_runtime.cc)
// supplies the real facts.
#include "fl/core/str_cat.h"
#include "fl/diloco/island/island.h"

namespace fl::diloco {

std::string DeviceChoice::Name() const { return cuda ? fl::StrCat("cuda:", index) : std::string("cpu"); }

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& requested, size_t slot, int cuda_device,
                                          const DeviceFacts& facts) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda") {
    return absl::InvalidArgumentError(fl::StrCat("--device ", requested, ": use auto, cpu or cuda"));
  }
  if (cuda_device < -1) {
    return absl::InvalidArgumentError(fl::StrCat(
        "--cuda-device ", cuda_device, ": use a GPU index >= 0, or -1 for (shard x ranks + rank) mod the GPU count"));
  }
  DeviceChoice choice;
  if (requested == "cpu") {
    choice.reason = "--device cpu";
    return choice;
  }
  const bool gpu = facts.cuda_devices > 0;
  const std::string gpus = fl::StrCat("LibTorch sees ", facts.cuda_devices, " CUDA device(s)");
  if (requested == "auto" && !(gpu && facts.nccl)) {
    if (!gpu && !facts.nccl) {
      choice.reason =
          "--device auto: LibTorch sees no CUDA device and this build has no c10d NCCL process group "
          "(a CPU-only LibTorch)";
    } else if (!gpu) {
      choice.reason = "--device auto: LibTorch sees no CUDA device (no GPU or no driver)";
    } else {
      choice.reason = fl::StrCat("--device auto: ", gpus,
                                 " but this build has no c10d NCCL process group; rebuild against a CUDA LibTorch "
                                 "(see docs/diloco-gpu.md) to train on them");
    }
    return choice;
  }
  if (!gpu) {
    std::string message =
        "--device cuda: LibTorch sees no CUDA device (Debian's libtorch is CPU-only); use --device cpu or a "
        "CUDA build of LibTorch on a machine with a GPU";
    if (!facts.nccl) {
      message += "; this build also lacks c10d's NCCL process group (USE_C10D_NCCL): build against a CUDA LibTorch";
    }
    return absl::FailedPreconditionError(message);
  }
  if (!facts.nccl) {
    return absl::FailedPreconditionError(
        "--device cuda: this build was compiled without c10d's NCCL process group (USE_C10D_NCCL); rebuild "
        "against a LibTorch with NCCL or use --device cpu");
  }
  if (cuda_device >= facts.cuda_devices) {
    return absl::InvalidArgumentError(fl::StrCat("--cuda-device ", cuda_device, ": ", gpus, " (0..",
                                                 facts.cuda_devices - 1, "); pick one of those or -1"));
  }
  choice.cuda = true;
  choice.index = cuda_device >= 0 ? cuda_device : static_cast<int>(slot % static_cast<size_t>(facts.cuda_devices));
  choice.reason = fl::StrCat("--device ", requested, ": ", gpus, " and this build has c10d's NCCL process group; ",
                             cuda_device >= 0 ? std::string("GPU given by --cuda-device")
                                              : fl::StrCat("GPU = slot ", slot, " mod ", facts.cuda_devices));
  return choice;
}

}  // namespace fl::diloco
