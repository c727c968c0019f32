#pragma once

// Fashion-MNIST from Debian's dataset-fashion-mnist (gzipped IDX files), as tensors.

#include <ATen/core/Tensor.h>

#include <string>

namespace drpc {
namespace demo {

// A gzipped IDX file of bytes as a uint8 tensor of its shape. Throws std::runtime_error.
at::Tensor read_idx(const std::string& path);

// Images as float [N, 784], normalized with the data set's mean and deviation.
at::Tensor images(const std::string& path);

}  // namespace demo
}  // namespace drpc
