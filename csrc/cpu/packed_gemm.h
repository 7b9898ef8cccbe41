// float32 GEMM with a pre-packed right operand, for the recurrent GEMMs of the CPU time loops
// (rnn_util::StepGemm): the same [K, N] weight multiplies a small [M, K] block (M = a thread's batch
// rows) on every step. MKL's packed GEMM takes its generic path on AMD CPUs (about 21 GFLOP/s of a
// 46 GFLOP/s core for [16, 256] x [256, 1024]); this register-blocked kernel (AVX2 6x16 / AVX-512 8x32
// tiles, B in column panels, A read in place) reaches about 1.5x that. Defined in packed_gemm_kernel.cpp.
#pragma once

#include <cstdint>

namespace torchops {
namespace cpu {

// Whether the kernel is built for this CPU (x86-64 with AVX2 + FMA, GCC builds) and not switched off
// with TORCHOPS_CPU_PACKED_GEMM=0 (read once); callers otherwise use MKL's packed GEMM or ATen.
bool packed_gemm_available();

// Floats needed to pack a [k, n] right operand.
int64_t packed_gemm_size(int64_t k, int64_t n);

// Packs B, element (r, j) = trans ? b[j * ldb + r] : b[r * ldb + j] for r < k, j < n, into dst.
void packed_gemm_pack(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst);

// c[m, n] = A @ B (accumulate = false: c is not read) or c += A @ B, A(i, q) = a[i * lda + q] or, with
// trans_a, a[q * lda + i] (a transposed view read in place); k >= 1. Splits the columns over the intra-op
// threads when called outside a parallel region and the product is large.
void packed_gemm_compute(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a,
                         const float* packed, bool accumulate, float* c, int64_t ldc);

}  // namespace cpu
}  // namespace torchops
