// The CPU loops of FusedBatchNormV3 / GradV3, one table per CPU capability build of
// cpu/fused_batch_norm_kernel_isa.cpp (Default and AVX2; see cpu/cpu_isa.h), and the per-channel factors
// every build shares, compiled once (cpu/fused_batch_norm_kernel.cpp).
#pragma once

#include "cpu/cpu_isa.h"
#include "common/fused_batch_norm_math.h"
#include "fused_batch_norm/fused_batch_norm.h"

#include <cstdint>

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

TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE(Kernels, cpu_loops);

// rsqrt(var + eps) as TF's CPU kernels compute it (float32: cpu/fused_batch_norm_kernel.cpp explains how);
// double and other architectures: 1 / sqrt.
template <typename U>
inline U tf_rsqrt(U var, U eps, int64_t c, int64_t C) {
  (void)c;
  (void)C;
  return inv_std(var, eps);
}
template <>
float tf_rsqrt<float>(float var, float eps, int64_t c, int64_t C);

// The normalisation factor rsqrt(var + eps) * scale, as TF computes it (training and inference).
template <typename U>
inline U scaling_factor(U var, U eps, U scale, int64_t c, int64_t C) {
  return tf_rsqrt(var, eps, c, C) * scale;
}

// out[c] = scaling_factor(var[c], eps, scale[c], c, C) for every channel.
template <typename U>
void scaling_factors(const U* var, U eps, const U* scale, U* out, int64_t C) {
  for (int64_t c = 0; c < C; ++c) out[c] = scaling_factor(var[c], eps, scale[c], c, C);
}
template <>
void scaling_factors<float>(const float* var, float eps, const float* scale, float* out, int64_t C);

}  // namespace fbn
}  // namespace torchops
