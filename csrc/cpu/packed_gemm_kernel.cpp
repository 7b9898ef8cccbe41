#include "cpu/packed_gemm.h"

#include "cpu/cpu_isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstdlib>
#include <cstring>

namespace torchops {
namespace cpu {
namespace {

#define TORCHOPS_ISA_SELF "cpu/packed_gemm_kernel_isa.h"
#define TORCHOPS_ISA_AVX512 1
#include "cpu/cpu_isa_sections.h"
#undef TORCHOPS_ISA_AVX512
#undef TORCHOPS_ISA_SELF

}  // namespace

bool packed_gemm_available() {
#if TORCHOPS_MULTI_ISA
  static const bool on = [] {
    const char* env = std::getenv("TORCHOPS_CPU_PACKED_GEMM");
    return isa_level() >= 1 && !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
#else
  return false;
#endif
}

#if TORCHOPS_MULTI_ISA
#define TORCHOPS_PGEMM_CALL(fn, ...) \
  (isa_level() == 2 ? isa_avx512::fn(__VA_ARGS__) : isa_level() == 1 ? isa_avx2::fn(__VA_ARGS__) : isa_base::fn(__VA_ARGS__))
#else
#define TORCHOPS_PGEMM_CALL(fn, ...) isa_base::fn(__VA_ARGS__)
#endif

int64_t packed_gemm_size(int64_t k, int64_t n) { return TORCHOPS_PGEMM_CALL(pack_size, k, n); }

void packed_gemm_pack(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst) {
  TORCHOPS_PGEMM_CALL(pack, b, ldb, trans, k, n, dst);
}

void packed_gemm_compute(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a,
                         const float* packed, bool accumulate, float* c, int64_t ldc) {
  TORCHOPS_PGEMM_CALL(compute, m, n, k, a, lda, trans_a, packed, accumulate, c, ldc);
}

#undef TORCHOPS_PGEMM_CALL

}  // namespace cpu
}  // namespace torchops
