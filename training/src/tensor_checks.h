// Private to training: what fl-client checks of a tensor LibTorch handed it before its own code reads the
// tensor's memory. torch::jit::load builds tensors from whatever sizes, strides and storage offsets a file
// declares, without checking that they fit their storage; fl-client's flattening (CopyToFlat) and copying back
// (CopyFromFlat) read and write through them. A file refused by the torch-free vet never gets here, but these
// checks do not rely on it.
#pragma once

#include <torch/torch.h>

#include <string_view>

#include "absl/status/status.h"

namespace fl::training::internal {

// Every element of `tensor` lies inside its storage: a dense (strided) tensor, sizes and storage offset >= 0, no
// negative stride (PyTorch never writes one; LibTorch 1.13 replaces a file's negative stride by the contiguous
// one, which this bound then catches) on a dimension of more than one element, and the last byte it addresses,
// (offset + sum((size_d - 1) * stride_d) + 1) * itemsize, within the storage's bytes, all in checked 64-bit
// arithmetic. InvalidArgument beginning with `name` and saying what does not fit.
absl::Status CheckTensorInStorage(const torch::Tensor& tensor, std::string_view name);

// Every value of a floating-point tensor is finite; InvalidArgument beginning with `name` and naming the first
// NaN or infinity (its flat index in C order and its value). Other dtypes: OK.
absl::Status CheckTensorFinite(const torch::Tensor& tensor, std::string_view name);

}  // namespace fl::training::internal
