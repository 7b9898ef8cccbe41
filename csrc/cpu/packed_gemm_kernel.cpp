#include "cpu/packed_gemm.h"

#include "cpu/cpu_isa.h"
#include "cpu/packed_gemm_kernel_isa.h"

#include <c10/util/Exception.h>

namespace torchops {
namespace cpu {

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
// (off by default on Intel CPUs: there oneDNN's bfloat16 RNN, nn.LSTM's, runs on AMX)
routes::Route packed_avx512_bf16{"rnn", "recurrent_gemm_bf16", "packed_avx512_bf16", c10::DeviceType::CPU,
                                  static_cast<int>(Capability::AVX512),
                                  "bfloat16 with float32 output on CPUs with AVX-512 BF16 (torchops' vdpbf16ps kernel "
                                  "over a weight packed once per call; off by default on Intel CPUs, where oneDNN "
                                  "uses AMX)",
                                  kCpuSuite, !cpu_is_intel()};
routes::Route aten_bf16{"rnn", "recurrent_gemm_bf16", "aten_bf16", c10::DeviceType::CPU, routes::kNoCapability,
                        "every case (ATen's bfloat16 GEMM, rounded to bfloat16)", kCpuSuite};

}  // namespace gemm_route

int packed_gemm_variant() {
#if TORCHOPS_CPU_DISPATCH
  if (gemm_route::packed_avx512.enabled()) return 0;
  if (gemm_route::packed_avx2.enabled()) return 1;
#endif
  return -1;
}

#if TORCHOPS_CPU_DISPATCH
namespace {
const PackedGemmLoops& loops(int variant) { return variant == 0 ? packed_gemm_loops<2>() : packed_gemm_loops<1>(); }
}  // namespace

int64_t packed_gemm_size(int variant, int64_t k, int64_t n) { return loops(variant).pack_size(k, n); }

void packed_gemm_pack(int variant, const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst) {
  loops(variant).pack(b, ldb, trans, k, n, dst);
}

void packed_gemm_compute(int variant, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a,
                         const float* packed, bool accumulate, float* c, int64_t ldc) {
  loops(variant).compute(m, n, k, a, lda, trans_a, packed, accumulate, c, ldc);
}

bool packed_gemm_bf16_available() {
  static const bool cpu_has = isa_level() >= 2 && __builtin_cpu_supports("avx512bf16");
  return cpu_has && gemm_route::packed_avx512_bf16.enabled();
}

int64_t packed_gemm_bf16_size(int64_t k, int64_t n) { return packed_gemm_loops<2>().bf16_pack_size(k, n); }

void packed_gemm_bf16_pack(const uint16_t* b, int64_t ldb, bool trans, int64_t k, int64_t n, uint16_t* dst) {
  packed_gemm_loops<2>().bf16_pack(b, ldb, trans, k, n, dst);
}

void packed_gemm_bf16_compute(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,
                              const uint16_t* packed, bool accumulate, float* c, int64_t ldc) {
  packed_gemm_loops<2>().bf16_compute(m, n, k, a, lda, packed, accumulate, c, ldc);
}

void packed_gemm_bf16_round(const float* src, int64_t n, uint16_t* dst) {
  packed_gemm_loops<2>().bf16_round(src, n, dst);
}

void packed_gemm_bf16_widen(const uint16_t* src, int64_t n, float* dst) {
  packed_gemm_loops<2>().bf16_widen(src, n, dst);
}
#else
// Never called: packed_gemm_variant() is -1 without the AVX2 and AVX-512 builds.
int64_t packed_gemm_size(int, int64_t, int64_t) { TORCH_CHECK(false, "torchops: no packed GEMM in this build"); }
void packed_gemm_pack(int, const float*, int64_t, bool, int64_t, int64_t, float*) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
void packed_gemm_compute(int, int64_t, int64_t, int64_t, const float*, int64_t, bool, const float*, bool, float*,
                         int64_t) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
bool packed_gemm_bf16_available() { return false; }
int64_t packed_gemm_bf16_size(int64_t, int64_t) { TORCH_CHECK(false, "torchops: no packed GEMM in this build"); }
void packed_gemm_bf16_pack(const uint16_t*, int64_t, bool, int64_t, int64_t, uint16_t*) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
void packed_gemm_bf16_compute(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, bool, float*,
                              int64_t) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
void packed_gemm_bf16_round(const float*, int64_t, uint16_t*) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
void packed_gemm_bf16_widen(const uint16_t*, int64_t, float*) {
  TORCH_CHECK(false, "torchops: no packed GEMM in this build");
}
#endif

}  // namespace cpu
}  // namespace torchops
