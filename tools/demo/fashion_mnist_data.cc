#include "tools/demo/fashion_mnist_data.h"

#include <ATen/ATen.h>
#include <zlib.h>

#include <stdexcept>
#include <vector>

namespace drpc {
namespace demo {

// Reads a gzipped IDX file into a uint8 tensor of its shape.
at::Tensor read_idx(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path + " (install dataset-fashion-mnist: tools/demo.sh does)");
  auto read_u32 = [&]() {
    unsigned char b[4];
    if (gzread(f, b, 4) != 4) throw std::runtime_error("truncated " + path);
    return (uint32_t(b[0]) << 24) | (uint32_t(b[1]) << 16) | (uint32_t(b[2]) << 8) | b[3];
  };
  const uint32_t magic = read_u32();
  const int dims = magic & 0xff;
  if ((magic >> 8) != 0x08 || dims < 1 || dims > 3) throw std::runtime_error(path + " is not an IDX file of bytes");
  std::vector<int64_t> sizes;
  for (int d = 0; d < dims; ++d) sizes.push_back(read_u32());
  at::Tensor t = at::empty(sizes, at::kByte);
  const int64_t n = t.numel();
  if (gzread(f, t.data_ptr(), n) != n) throw std::runtime_error("truncated " + path);
  gzclose(f);
  return t;
}

at::Tensor images(const std::string& path) {
  at::Tensor raw = read_idx(path);
  return ((raw.to(at::kFloat).reshape({raw.size(0), -1}) / 255.0) - 0.2860) / 0.3530;
}

}  // namespace demo
}  // namespace drpc
