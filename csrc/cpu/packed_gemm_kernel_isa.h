// The packed GEMM's loops (cpu/packed_gemm.h), one table per CPU capability build of
// cpu/packed_gemm_kernel_isa.cpp (AVX2 and AVX-512; see cpu/cpu_isa.h); the bfloat16 entries need AVX-512 BF16.
#pragma once

#include "cpu/cpu_isa.h"

#include <cstdint>

namespace torchops {
namespace cpu {

struct PackedGemmLoops {
  int64_t (*pack_size)(int64_t k, int64_t n);
  void (*pack)(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst);
  void (*compute)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a, const float* packed,
                  bool accumulate, float* c, int64_t ldc);
  // bfloat16 operands (raw bits), float32 out: the AVX-512 build's, null in the AVX2 build.
  int64_t (*bf16_pack_size)(int64_t k, int64_t n);
  void (*bf16_pack)(const uint16_t* b, int64_t ldb, bool trans, int64_t k, int64_t n, uint16_t* dst);
  void (*bf16_compute)(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
                       bool accumulate, float* c, int64_t ldc);
  void (*bf16_round)(const float* src, int64_t n, uint16_t* dst);
  void (*bf16_widen)(const uint16_t* src, int64_t n, float* dst);
};

TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE(PackedGemmLoops, packed_gemm_loops);

}  // namespace cpu
}  // namespace torchops
