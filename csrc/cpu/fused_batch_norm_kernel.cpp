// CPU registration of FusedBatchNormV3 / FusedBatchNormGradV3: the kernels of
// fused_batch_norm_kernel_impl.h, baseline build here, AVX2 build in fused_batch_norm_kernel_avx2.cpp.
#include "cpu/cpu_isa.h"

#define TORCHOPS_CPU_ISA base
#include "cpu/fused_batch_norm_kernel_impl.h"
#undef TORCHOPS_CPU_ISA

#include <torch/library.h>

namespace torchops {
namespace fbn {
#if TORCHOPS_HAVE_AVX2_BUILD
namespace avx2 {
const Kernels& kernels();
}
#endif

namespace {

const Kernels& cpu_kernels() {
#if TORCHOPS_HAVE_AVX2_BUILD
  if (cpu::has_avx2()) return avx2::kernels();
#endif
  return base::kernels();
}

ForwardResult fused_batch_norm_v3_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                                      const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                                      double exponential_avg_factor, c10::string_view data_format, bool is_training) {
  return forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training,
                 cpu_kernels());
}

GradResult fused_batch_norm_grad_v3_cpu(const at::Tensor& y_backprop, const at::Tensor& x, const at::Tensor& scale,
                                        const at::Tensor& reserve_space_1, const at::Tensor& reserve_space_2,
                                        const at::Tensor& reserve_space_3, double epsilon,
                                        c10::string_view data_format, bool is_training) {
  return backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon, data_format,
                  is_training, cpu_kernels());
}

}  // namespace
}  // namespace fbn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  m.impl("fused_batch_norm_v3", &torchops::fbn::fused_batch_norm_v3_cpu);
  m.impl("fused_batch_norm_grad_v3", &torchops::fbn::fused_batch_norm_grad_v3_cpu);
}
