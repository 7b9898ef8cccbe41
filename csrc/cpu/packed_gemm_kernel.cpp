#include "cpu/packed_gemm.h"

#include "cpu/cpu_isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
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

namespace gemm_route {

using routes::Capability;
using routes::kCpuSuite;

routes::Route packed_avx512{"rnn", "recurrent_gemm", "packed_avx512", c10::DeviceType::CPU,
                             static_cast<int>(Capability::AVX512),
                             "float32 (torchops' register-blocked kernel over a weight packed once per call)",
                             kCpuSuite, !cpu_is_intel()};
routes::Route packed_avx2{"rnn", "recurrent_gemm", "packed_avx2", c10::DeviceType::CPU,
                          static_cast<int>(Capability::AVX2), "float32 (as packed_avx512, AVX2 + FMA build)",
                          kCpuSuite, !cpu_is_intel()};
routes::Route mkl_packed{"rnn", "recurrent_gemm", "mkl_packed", c10::DeviceType::CPU, routes::kNoCapability,
                         "float32 where torch's MKL exports its packed GEMM (cblas_sgemm_pack)", kCpuSuite};
routes::Route aten{"rnn", "recurrent_gemm", "aten", c10::DeviceType::CPU, routes::kNoCapability,
                   "every case (at::mm / at::addmm)", kCpuSuite};

}  // namespace gemm_route

int packed_gemm_variant() {
#if TORCHOPS_MULTI_ISA
  if (gemm_route::packed_avx512.enabled()) return 0;
  if (gemm_route::packed_avx2.enabled()) return 1;
#endif
  return -1;
}

#if TORCHOPS_MULTI_ISA
#define TORCHOPS_PGEMM_CALL(fn, ...) (variant == 0 ? isa_avx512::fn(__VA_ARGS__) : isa_avx2::fn(__VA_ARGS__))
#else
#define TORCHOPS_PGEMM_CALL(fn, ...) isa_base::fn(__VA_ARGS__)
#endif

int64_t packed_gemm_size(int variant, int64_t k, int64_t n) { return TORCHOPS_PGEMM_CALL(pack_size, k, n); }

void packed_gemm_pack(int variant, const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst) {
  TORCHOPS_PGEMM_CALL(pack, b, ldb, trans, k, n, dst);
}

void packed_gemm_compute(int variant, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a,
                         const float* packed, bool accumulate, float* c, int64_t ldc) {
  TORCHOPS_PGEMM_CALL(compute, m, n, k, a, lda, trans_a, packed, accumulate, c, ldc);
}

#undef TORCHOPS_PGEMM_CALL

}  // namespace cpu
}  // namespace torchops
