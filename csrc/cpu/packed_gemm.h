// float32 GEMM with a pre-packed right operand, for the recurrent GEMMs of the CPU time loops
// (rnn_util::StepGemm): the same [K, N] weight multiplies a small [M, K] block (M = a thread's batch
// rows) on every step. MKL's packed GEMM takes its generic path on AMD CPUs (about 21 GFLOP/s of a
// 46 GFLOP/s core for [16, 256] x [256, 1024]); this register-blocked kernel (AVX2 6x16 / AVX-512 8x32
// tiles, B in column panels, A read in place) reaches about 1.5x that. Defined in packed_gemm_kernel.cpp.
#pragma once

#include "common/routes.h"

#include <cstdint>

namespace torchops {
namespace cpu {

// The routes of the recurrent GEMM of the CPU time loops (rnn_util::StepGemm), shared by the two RNN families
// (defined in packed_gemm_kernel.cpp): torchops' packed kernel (on by default except on Intel CPUs, where MKL
// runs its tuned kernels), MKL's packed GEMM, and ATen's GEMM.
namespace gemm_route {
extern routes::Route packed_avx512, packed_avx2, mkl_packed, aten;
// The bfloat16 recurrent GEMM with float32 output of the mixed-precision CPU loops: torchops' AVX-512 BF16
// kernel (on by default except on Intel CPUs, where oneDNN's bfloat16 RNN uses AMX), or else ATen's bfloat16 GEMM.
extern routes::Route packed_avx512_bf16, aten_bf16;
}  // namespace gemm_route

// The build of the kernel a new packed operand uses (0: AVX-512, 1: AVX2 + FMA), by the routes, or -1 when
// neither is enabled or built for this CPU (x86-64 with AVX2 + FMA, GCC builds); callers then use MKL's packed
// GEMM or ATen. An operand is packed and computed with the same variant.
int packed_gemm_variant();

// Floats needed to pack a [k, n] right operand.
int64_t packed_gemm_size(int variant, int64_t k, int64_t n);

// Packs B, element (r, j) = trans ? b[j * ldb + r] : b[r * ldb + j] for r < k, j < n, into dst.
void packed_gemm_pack(int variant, const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst);

// c[m, n] = A @ B (accumulate = false: c is not read) or c += A @ B, A(i, q) = a[i * lda + q] or, with
// trans_a, a[q * lda + i] (a transposed view read in place); k >= 1. Splits the columns over the intra-op
// threads when called outside a parallel region and the product is large.
void packed_gemm_compute(int variant, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a,
                         const float* packed, bool accumulate, float* c, int64_t ldc);

// The bfloat16 GEMM with float32 output (operands as raw bfloat16 bits), in the layout of vdpbf16ps: whether
// its route is enabled and this CPU and build run it (AVX-512 with BF16, GCC builds on x86-64). The callers use
// ATen's bfloat16 GEMM otherwise.
bool packed_gemm_bf16_available();

// bfloat16 elements needed to pack a [k, n] right operand.
int64_t packed_gemm_bf16_size(int64_t k, int64_t n);

// Packs B, element (r, j) = trans ? b[j * ldb + r] : b[r * ldb + j] for r < k, j < n, into dst.
void packed_gemm_bf16_pack(const uint16_t* b, int64_t ldb, bool trans, int64_t k, int64_t n, uint16_t* dst);

// c[m, n] (float32) = A @ B (accumulate = false: c is not read) or c += A @ B, A(i, q) = a[i * lda + q], the
// products summed in float32; k >= 1. Splits the columns over the intra-op threads as packed_gemm_compute.
void packed_gemm_bf16_compute(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                              const uint16_t* packed, bool accumulate, float* c, int64_t ldc);

// dst[i] = src[i] rounded to bfloat16 (to nearest even, as c10::BFloat16), i < n: the loops' per-step outputs
// (one vector instruction per 16 values instead of an ATen copy per small block).
void packed_gemm_bf16_round(const float* src, int64_t n, uint16_t* dst);

// dst[i] = src[i] (bfloat16) as float32, i < n (exact).
void packed_gemm_bf16_widen(const uint16_t* src, int64_t n, float* dst);

}  // namespace cpu
}  // namespace torchops
