// The packed GEMM of the recurrent steps (cpu/packed_gemm.h), one build per CPU capability from AVX2 up (see
// cpu/cpu_isa.h).
#include "cpu/cpu_isa.h"
#include "cpu/packed_gemm_kernel_isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <immintrin.h>

#if TORCHOPS_CPU_CAPABILITY < 1
#error "the packed GEMM is built for AVX2 and AVX-512 only"
#endif

namespace torchops {
namespace cpu {
namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE {
namespace {

// Tiles of kMR rows x kNR columns (two vectors) stay in registers over a block of k: AVX-512 8 x 32
// (16 accumulators of 32 registers; 8 rows divide the usual per-thread batch slices), AVX2 6 x 16 (12 of
// 16). There is no Default build (packed_gemm_variant() wants AVX2).
#if TORCHOPS_CPU_CAPABILITY == 2
typedef __m512 V;
constexpr int kW = 16, kMR = 8;
inline V loadv(const float* p) { return _mm512_loadu_ps(p); }
inline void storev(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V bcast(float s) { return _mm512_set1_ps(s); }
inline V fmav(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V addv(V a, V b) { return _mm512_add_ps(a, b); }
inline V zerov() { return _mm512_setzero_ps(); }
#else
typedef __m256 V;
constexpr int kW = 8, kMR = 6;
inline V loadv(const float* p) { return _mm256_loadu_ps(p); }
inline void storev(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V bcast(float s) { return _mm256_set1_ps(s); }
inline V fmav(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V addv(V a, V b) { return _mm256_add_ps(a, b); }
inline V zerov() { return _mm256_setzero_ps(); }
#endif
constexpr int kNR = 2 * kW;
// k per pass: a 64 KB panel block, from L2 across the row tiles. Each pass loads and stores every C tile once;
// fewer passes beat an L1-sized (16 KB) block by 3-10 % on the LSTM shapes (ab-timed on the AMD machine).
constexpr int64_t kKC = 16384 / kNR;

// Panel p holds columns [p * kNR, p * kNR + kNR) as k rows of kNR floats (zero-padded past n).
int64_t pack_size(int64_t k, int64_t n) { return (n + kNR - 1) / kNR * kNR * k; }

// Panels [p0, p1) of pack().
void pack_panels(int64_t p0, int64_t p1, const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst) {
  for (int64_t j0 = p0 * kNR; j0 < std::min(n, p1 * kNR); j0 += kNR) {
    float* p = dst + j0 * k;
    const int64_t nv = std::min<int64_t>(kNR, n - j0);
    if (nv < kNR) std::fill(p, p + k * kNR, 0.f);
    if (trans) {  // read B's rows (columns of the operand) contiguously
      for (int64_t j = 0; j < nv; ++j) {
        const float* src = b + (j0 + j) * ldb;
        for (int64_t r = 0; r < k; ++r) p[r * kNR + j] = src[r];
      }
    } else {
      if (nv == kNR) {  // inline vector copies (a library memcpy call per 64-128 bytes was ~half the pack)
        for (int64_t r = 0; r < k; ++r) {
          storev(p + r * kNR, loadv(b + r * ldb + j0));
          storev(p + r * kNR + kW, loadv(b + r * ldb + j0 + kW));
        }
        continue;
      }
      for (int64_t r = 0; r < k; ++r) std::memcpy(p + r * kNR, b + r * ldb + j0, nv * sizeof(float));
    }
  }
}

// Panels split over the intra-op threads outside a parallel region (the backward's one-off packs of
// dgates and the transposed input weight, 0.5-6.5 MB, ran on one thread while the other waited).
void pack(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst) {
  const int64_t panels = (n + kNR - 1) / kNR;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, k * kNR));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) { pack_panels(p0, p1, b, ldb, trans, k, n, dst); });
}

// Rows of the tile as named variables: GCC keeps arrays of vector accumulators on the stack (a load and a
// store per multiply-add), named ones in registers.
#if TORCHOPS_CPU_CAPABILITY == 2
#define TORCHOPS_PG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#define TORCHOPS_PG_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif
#define TORCHOPS_PG_ZERO(r) V c0_##r = zerov(), c1_##r = zerov();
#define TORCHOPS_PG_FMA(r)                                           \
  {                                                                  \
    const V ar = bcast(kTransA ? a[q * lda + (r)] : a[(r) * lda + q]); \
    c0_##r = fmav(ar, b0, c0_##r);                                    \
    c1_##r = fmav(ar, b1, c1_##r);                                    \
  }
#define TORCHOPS_PG_STORE(r)                                              \
  {                                                                       \
    float* cr = c + (r) * ldc;                                            \
    storev(cr, accumulate ? addv(loadv(cr), c0_##r) : c0_##r);            \
    storev(cr + kW, accumulate ? addv(loadv(cr + kW), c1_##r) : c1_##r); \
  }

// One full tile: c[kMR, kNR] (+)= A[kMR, kc] @ panel block [kc, kNR]; the sums over k run in order, one
// FMA each. A(r, q) = a[r * lda + q], or a[q * lda + r] with kTransA (the tile's rows then share a line).
template <bool kTransA>
inline void tile(int64_t kc, const float* __restrict a, int64_t lda, const float* __restrict bp, float* __restrict c,
                 int64_t ldc, bool accumulate) {
  TORCHOPS_PG_ROWS(TORCHOPS_PG_ZERO)
  for (int64_t q = 0; q < kc; ++q) {
    const V b0 = loadv(bp + q * kNR), b1 = loadv(bp + q * kNR + kW);
    TORCHOPS_PG_ROWS(TORCHOPS_PG_FMA)
  }
  TORCHOPS_PG_ROWS(TORCHOPS_PG_STORE)
}
#undef TORCHOPS_PG_ROWS
#undef TORCHOPS_PG_ZERO
#undef TORCHOPS_PG_FMA
#undef TORCHOPS_PG_STORE

// A partial tile (rows < kMR or nv < kNR): the rows are copied into a zero-padded block, the full tile
// writes a scratch tile, and its valid part is stored.
void partial_tile(int64_t rows, int64_t kc, const float* a, int64_t lda, bool trans_a, const float* bp, float* c,
                  int64_t ldc, int64_t nv, bool accumulate) {
  alignas(64) float ablock[kMR * kKC];
  alignas(64) float cblock[kMR * kNR];
  if (rows < kMR) {
    std::fill(ablock, ablock + kMR * kc, 0.f);
    for (int64_t r = 0; r < rows; ++r) {
      if (trans_a) {
        for (int64_t q = 0; q < kc; ++q) ablock[r * kc + q] = a[q * lda + r];
      } else {
        std::memcpy(ablock + r * kc, a + r * lda, kc * sizeof(float));
      }
    }
    tile<false>(kc, ablock, kc, bp, cblock, kNR, false);
  } else if (trans_a) {
    tile<true>(kc, a, lda, bp, cblock, kNR, false);
  } else {
    tile<false>(kc, a, lda, bp, cblock, kNR, false);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    const float* t = cblock + r * kNR;
    for (int64_t j = 0; j < nv; ++j) cr[j] = accumulate ? cr[j] + t[j] : t[j];
  }
}

// Panels [p0, p1) of c = (or +=) A @ B.
void compute_panels(int64_t p0, int64_t p1, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                    bool trans_a, const float* packed, bool accumulate, float* c, int64_t ldc) {
  for (int64_t k0 = 0; k0 < k; k0 += kKC) {
    const int64_t kc = std::min(kKC, k - k0);
    const bool acc = accumulate || k0 > 0;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j0 = p * kNR, nv = std::min<int64_t>(kNR, n - j0);
      const float* bp = packed + j0 * k + k0 * kNR;
      for (int64_t i = 0; i < m; i += kMR) {
        const int64_t rows = std::min<int64_t>(kMR, m - i);
        const float* ai = trans_a ? a + k0 * lda + i : a + i * lda + k0;
        if (rows == kMR && nv == kNR && trans_a)
          tile<true>(kc, ai, lda, bp, c + i * ldc + j0, ldc, acc);
        else if (rows == kMR && nv == kNR)
          tile<false>(kc, ai, lda, bp, c + i * ldc + j0, ldc, acc);
        else
          partial_tile(rows, kc, ai, lda, trans_a, bp, c + i * ldc + j0, ldc, nv, acc);
      }
    }
  }
}

void compute(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool trans_a, const float* packed,
             bool accumulate, float* c, int64_t ldc) {
  const int64_t panels = (n + kNR - 1) / kNR;
  // ~256K multiply-adds per task: a step GEMM of one thread's rows stays on that thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, m * k * kNR));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    compute_panels(p0, p1, m, n, k, a, lda, trans_a, packed, accumulate, c, ldc);
  });
}

}  // namespace
}  // namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE

template <>
const PackedGemmLoops& packed_gemm_loops<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
  static const PackedGemmLoops k{pack_size, pack, compute};
  return k;
}

}  // namespace cpu
}  // namespace torchops
