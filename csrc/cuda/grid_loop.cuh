// Launch shape shared by the element-wise CUDA kernels of the RNN families (csrc/cuda/block_rnn_kernel.cu,
// csrc/cuda/cudnn_rnn_kernel.cu): blocks of kThreads threads, grid-stride loops with int64 indices, so any
// element count runs with at most 2^20 blocks.
#pragma once

#include <algorithm>
#include <cstdint>

namespace torchops {
namespace cuda_grid {

constexpr int kThreads = 256;

inline int num_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(1) << 20)));
}

}  // namespace cuda_grid
}  // namespace torchops

#define TORCHOPS_GRID_LOOP(idx, n)                                                             \
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < (n); \
       idx += static_cast<int64_t>(blockDim.x) * gridDim.x)
