// CUDA kernel of the accumulators' in-place accumulation: accum (+)= gradient on the current stream,
// accum in the opmath dtype (float for half/bfloat16). Both contiguous (see csrc/accumulator/ops.cpp).
#include "accumulator/add_checks.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>

namespace torchops {
namespace accumulator {
namespace {

template <typename T, typename U, bool COPY>
__global__ void accumulate_kernel(U* __restrict__ acc, const T* __restrict__ g, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (COPY)
      acc[i] = static_cast<U>(g[i]);
    else
      acc[i] += static_cast<U>(g[i]);
  }
}

void accumulator_add_cuda(const at::Tensor& accum, const at::Tensor& gradient, bool copy) {
  check_accumulator_add(accum, gradient);
  TORCH_CHECK(accum.is_cuda() && gradient.is_cuda() && accum.device() == gradient.device(),
              "_accumulator_add_ (CUDA): expected accum and gradient on one CUDA device, got ", accum.device(),
              " and ", gradient.device());
  const int64_t n = gradient.numel();
  if (n == 0) return;
  c10::cuda::CUDAGuard guard(gradient.device());
  auto stream = at::cuda::getCurrentCUDAStream();
  const int threads = 256;
  const int64_t max_blocks = static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 8;
  const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, max_blocks)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gradient.scalar_type(), "_accumulator_add_", [&] {
    using U = at::opmath_type<scalar_t>;
    U* acc = accum.mutable_data_ptr<U>();
    const scalar_t* g = gradient.const_data_ptr<scalar_t>();
    if (copy)
      accumulate_kernel<scalar_t, U, true><<<blocks, threads, 0, stream>>>(acc, g, n);
    else
      accumulate_kernel<scalar_t, U, false><<<blocks, threads, 0, stream>>>(acc, g, n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace
}  // namespace accumulator
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CUDA, m) {
  m.impl("_accumulator_add_", &torchops::accumulator::accumulator_add_cuda);
}
