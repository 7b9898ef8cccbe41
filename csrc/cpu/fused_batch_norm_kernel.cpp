// CPU kernels of FusedBatchNormV3 / FusedBatchNormGradV3: the loops of the CPU capability in use
// (cpu/fused_batch_norm_kernel_isa.cpp, picked by the family's capability routes, fused_batch_norm/routes.cpp),
// the per-channel factors every build shares, and the stand-in of the cuDNN route.
#include "cpu/cpu_isa.h"
#include "cpu/fused_batch_norm_kernel_isa.h"
#include "fused_batch_norm/cudnn_route.h"
#include "fused_batch_norm/fused_batch_norm.h"

#include <torch/library.h>

#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace torchops {
namespace fbn {
namespace {

// rsqrt(var + eps) as TF's CPU kernels compute it: Eigen evaluates per-channel vectors in 8-float packets
// (TF's x86 builds use AVX), where rsqrt is the CPU's estimate (RSQRTPS) refined by one Newton step, and
// the last C % 8 channels with 1 / sqrt. With it, inference outputs and inference gradients (x_backprop)
// equal TF's bit for bit on the same CPU (the estimate is the CPU's: TF's own results can differ between
// CPU vendors in the last bit in the same way); the error stays <= 2 ulp. (Not inlined: compiled once, here
// at the baseline instruction set and without FMA contraction, whatever the caller's build.)
#if defined(__x86_64__)
// TF's packet rsqrt of a = var + eps, lane by lane: the estimate, one Newton step rounded op by op (these
// intrinsics are never contracted into FMA), and the estimate kept where the step gives NaN (a = 0 or inf:
// 0 * inf). RSQRTPS gives each lane the bits RSQRTSS gives it alone, so one lane or four give the same.
inline __m128 tf_rsqrt_ps(__m128 a) {
  const __m128 r0 = _mm_rsqrt_ps(a);
  const __m128 r2 = _mm_mul_ps(a, r0), half_r = _mm_mul_ps(r0, _mm_set1_ps(-0.5f));
  const __m128 h = _mm_add_ps(_mm_mul_ps(r2, r0), _mm_set1_ps(-1.0f));
  const __m128 r = _mm_add_ps(_mm_mul_ps(half_r, h), r0);
  const __m128 nan = _mm_cmpunord_ps(r, r);
  return _mm_or_ps(_mm_and_ps(nan, r0), _mm_andnot_ps(nan, r));
}
#endif

}  // namespace

template <>
TORCHOPS_FBN_NO_FP_CONTRACT __attribute__((noinline)) float tf_rsqrt<float>(float var, float eps, int64_t c,
                                                                             int64_t C) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
#if defined(__x86_64__)
  if (c < C - C % 8) return _mm_cvtss_f32(tf_rsqrt_ps(_mm_set_ss(var + eps)));
#endif
  return inv_std(var, eps);
}

// float32: the 8-channel packets four channels at a time through tf_rsqrt_ps (one tf_rsqrt call per channel
// had taken ~1.2 us of each 256-channel inference call).
template <>
TORCHOPS_FBN_NO_FP_CONTRACT __attribute__((noinline)) void scaling_factors<float>(const float* var, float eps,
                                                                                  const float* scale, float* out,
                                                                                  int64_t C) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
  int64_t c = 0;
#if defined(__x86_64__)
  const __m128 e = _mm_set1_ps(eps);
  for (; c < C - C % 8; c += 4)
    _mm_storeu_ps(out + c, _mm_mul_ps(tf_rsqrt_ps(_mm_add_ps(_mm_loadu_ps(var + c), e)), _mm_loadu_ps(scale + c)));
#endif
  for (; c < C; ++c) out[c] = scaling_factor(var[c], eps, scale[c], c, C);
}

namespace {

const Kernels& cpu_kernels() {
  static const routes::Route* const slot[2] = {&route::cpu_avx2, &route::cpu_default};
#if TORCHOPS_CPU_DISPATCH
  if (routes::pick(slot, 2) == 0) return cpu_loops<1>();
#else
  routes::pick(slot, 2);
#endif
  return cpu_loops<0>();
}

// The Kernels table: each entry runs the build for this CPU's instruction set.
void cpu_train_forward(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       double eps, at::Tensor& y, at::Tensor& mean_out, at::Tensor& var_out) {
  cpu_kernels().train_forward(L, x, scale, offset, eps, y, mean_out, var_out);
}

void cpu_infer_forward(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       const at::Tensor& mean, const at::Tensor& var, double eps, at::Tensor& y) {
  cpu_kernels().infer_forward(L, x, scale, offset, mean, var, eps, y);
}

void cpu_backward(const Layout& L, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                  const at::Tensor& mu, const at::Tensor& var, double eps, bool training, at::Tensor& dx,
                  at::Tensor& dscale, at::Tensor& doffset) {
  cpu_kernels().backward(L, dy, x, scale, mu, var, eps, training, dx, dscale, doffset);
}

const Kernels kCpuKernels{cpu_train_forward, cpu_infer_forward, cpu_backward, &route::cpu_kernels,
                          {{&route::cpu_cudnn_standin, standin_forward, standin_backward},
                           {&route::cpu_cudnn_standin, standin_inference_forward, nullptr}}};

}  // namespace
}  // namespace fbn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::fbn;
  m.impl("fused_batch_norm_v3", &Impls<kCpuKernels>::fused_batch_norm_v3);
  m.impl("fused_batch_norm_grad_v3", &Impls<kCpuKernels>::fused_batch_norm_grad_v3);
}
