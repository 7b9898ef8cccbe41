// CPU kernels of FusedBatchNormV3 / FusedBatchNormGradV3, compiled for the baseline ISA and for
// AVX2+FMA (the loops in fused_batch_norm_kernel_isa.h; see csrc/cpu/cpu_isa.h) and picked at run time by the
// family's CPU capability routes (fused_batch_norm/routes.cpp).
//
// Two loop orders, both reading memory front to back:
//  * channels-first ([N, C, spatial], inner > 1): one task per channel; the channel's runs are summed,
//    then normalised while still in cache (one trip to memory for statistics + output).
//  * channels-last ([rows, C], inner == 1): each thread accumulates per-channel partial sums over a
//    block of rows (inner loop over contiguous channels), partials are combined, then a row pass.
// SIMD sums of U are flushed into double totals every few elements (kRowBlock*, kRunChunk).
#include "common/fused_batch_norm_math.h"
#include "cpu/cpu_isa.h"
#include "fused_batch_norm/fused_batch_norm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>
#include <cstdint>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Normalisation rounds as TF's CPU kernels (x86 builds without FMA): (x - mean) * alpha, then + offset,
// two roundings. Only the functions marked with this are compiled without FMA contraction: the
// statistics and gradient sums keep it (their order differs from TF's anyway, and they are faster with it).
#if defined(__GNUC__) && !defined(__clang__)
#define TORCHOPS_FBN_NO_FP_CONTRACT __attribute__((optimize("fp-contract=off")))
#define TORCHOPS_FBN_NO_FP_CONTRACT_BODY
#elif defined(__clang__)
#define TORCHOPS_FBN_NO_FP_CONTRACT
#define TORCHOPS_FBN_NO_FP_CONTRACT_BODY _Pragma("clang fp contract(off)")
#else
#define TORCHOPS_FBN_NO_FP_CONTRACT
#define TORCHOPS_FBN_NO_FP_CONTRACT_BODY
#endif

namespace torchops {
namespace fbn {
namespace {

// rsqrt(var + eps) as TF's CPU kernels compute it: Eigen evaluates per-channel vectors in 8-float packets
// (TF's x86 builds use AVX), where rsqrt is the CPU's estimate (RSQRTPS) refined by one Newton step, and
// the last C % 8 channels with 1 / sqrt. With it, inference outputs and inference gradients (x_backprop)
// equal TF's bit for bit on the same CPU (the estimate is the CPU's: TF's own results can differ between
// CPU vendors in the last bit in the same way); the error stays <= 2 ulp. double and other architectures:
// 1 / sqrt. (Not inlined: compiled once, without FMA contraction, whatever the caller's instruction set.)
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

template <typename U>
inline U tf_rsqrt(U var, U eps, int64_t c, int64_t C) {
  (void)c;
  (void)C;
  return inv_std(var, eps);
}
template <>
TORCHOPS_FBN_NO_FP_CONTRACT __attribute__((noinline)) float tf_rsqrt<float>(float var, float eps, int64_t c,
                                                                             int64_t C) {
  TORCHOPS_FBN_NO_FP_CONTRACT_BODY
#if defined(__x86_64__)
  if (c < C - C % 8) return _mm_cvtss_f32(tf_rsqrt_ps(_mm_set_ss(var + eps)));
#endif
  return inv_std(var, eps);
}

// The normalisation factor rsqrt(var + eps) * scale, as TF computes it (training and inference).
template <typename U>
inline U scaling_factor(U var, U eps, U scale, int64_t c, int64_t C) {
  return tf_rsqrt(var, eps, c, C) * scale;
}

// out[c] = scaling_factor(var[c], eps, scale[c], c, C) for every channel. float32: the 8-channel packets four
// channels at a time through tf_rsqrt_ps (one tf_rsqrt call per channel had taken ~1.2 us of each 256-channel
// inference call).
template <typename U>
void scaling_factors(const U* var, U eps, const U* scale, U* out, int64_t C) {
  for (int64_t c = 0; c < C; ++c) out[c] = scaling_factor(var[c], eps, scale[c], c, C);
}
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

#define TORCHOPS_ISA_SELF "cpu/fused_batch_norm_kernel_isa.h"
#define TORCHOPS_ISA_AVX512 0  // 32-byte vectors gain nothing from AVX-512: level 2 uses the AVX2 build
#include "cpu/cpu_isa_sections.h"
#undef TORCHOPS_ISA_AVX512
#undef TORCHOPS_ISA_SELF

const Kernels& cpu_kernels() {
  static const routes::Route* const slot[2] = {&route::cpu_avx2, &route::cpu_default};
#if TORCHOPS_MULTI_ISA
  if (routes::pick(slot, 2) == 0) return isa_avx2::kernels();
  return isa_base::kernels();
#else
  routes::pick(slot, 2);
  return isa_base::kernels();
#endif
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

const Kernels kCpuKernels{cpu_train_forward, cpu_infer_forward, cpu_backward};

}  // namespace
}  // namespace fbn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::fbn;
  m.impl("fused_batch_norm_v3", &Impls<kCpuKernels>::fused_batch_norm_v3);
  m.impl("fused_batch_norm_grad_v3", &Impls<kCpuKernels>::fused_batch_norm_grad_v3);
}
