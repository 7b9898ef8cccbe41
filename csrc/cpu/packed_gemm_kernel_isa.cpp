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


#if TORCHOPS_CPU_CAPABILITY == 2
// The bfloat16 GEMM with float32 output (cpu/packed_gemm.h): B in column panels of kBNR columns whose k rows
// come in interleaved pairs, the layout of vdpbf16ps (pair q of column j: B(2q, j), B(2q + 1, j); an odd k's
// last pair zero-padded), A read in place, one 32-bit broadcast per row and pair, kBMR x kBNR tiles of float32
// sums in registers. These functions carry their own target: the AVX-512 build also serves CPUs without BF16,
// so only the callers' check (packed_gemm_bf16_available) may reach them.
#define TORCHOPS_BF16_TARGET __attribute__((target("avx512bf16")))
constexpr int kBMR = 8, kBNR = 32;
// k per pass, even (pairs stay whole): a 64 KB panel block, as the float32 kernel's.
constexpr int64_t kBKC = 65536 / (kBNR * 2);

// Elements of one panel: kBNR columns x the k rows rounded up to pairs.
inline int64_t bf16_panel_size(int64_t k) { return (k + 1) / 2 * 2 * kBNR; }

int64_t bf16_pack_size(int64_t k, int64_t n) { return (n + kBNR - 1) / kBNR * bf16_panel_size(k); }

void bf16_pack_panels(int64_t p0, int64_t p1, const uint16_t* b, int64_t ldb, bool trans, int64_t k, int64_t n,
                      uint16_t* dst) {
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t j0 = p * kBNR, nv = std::min<int64_t>(kBNR, n - j0);
    uint16_t* d = dst + p * bf16_panel_size(k);
    if (nv < kBNR || k % 2) std::fill(d, d + bf16_panel_size(k), uint16_t(0));
    if (trans) {  // read B's rows (columns of the operand) contiguously
      for (int64_t j = 0; j < nv; ++j) {
        const uint16_t* src = b + (j0 + j) * ldb;
        for (int64_t r = 0; r < k; ++r) d[(r / 2) * 2 * kBNR + 2 * j + (r % 2)] = src[r];
      }
    } else {
      int64_t r0 = 0;
      if (nv == kBNR) {  // two rows at a time, interleaved by vector permutes (scalar stores were most of the pack)
        alignas(64) static const uint16_t lo_idx[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
        const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
        for (; r0 + 1 < k; r0 += 2) {
          const __m512i x0 = _mm512_loadu_si512(b + r0 * ldb + j0), x1 = _mm512_loadu_si512(b + (r0 + 1) * ldb + j0);
          _mm512_storeu_si512(d + r0 * kBNR, _mm512_permutex2var_epi16(x0, lo, x1));
          _mm512_storeu_si512(d + r0 * kBNR + kBNR, _mm512_permutex2var_epi16(x0, hi, x1));
        }
      }
      for (int64_t r = r0; r < k; ++r) {
        uint16_t* dr = d + (r / 2) * 2 * kBNR + (r % 2);
        const uint16_t* src = b + r * ldb + j0;
        for (int64_t j = 0; j < nv; ++j) dr[2 * j] = src[j];
      }
    }
  }
}

void bf16_pack(const uint16_t* b, int64_t ldb, bool trans, int64_t k, int64_t n, uint16_t* dst) {
  const int64_t panels = (n + kBNR - 1) / kBNR;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, bf16_panel_size(k)));
  at::parallel_for(0, panels, grain,
                   [&](int64_t p0, int64_t p1) { bf16_pack_panels(p0, p1, b, ldb, trans, k, n, dst); });
}

TORCHOPS_BF16_TARGET inline __m512i bf16_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Named accumulators, as the float32 tile's (GCC keeps arrays of them on the stack).
#define TORCHOPS_PGB_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define TORCHOPS_PGB_ZERO(r) __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
#define TORCHOPS_PGB_DP(r)                                      \
  {                                                             \
    const __m512bh ar = (__m512bh)bf16_pair(a + (r) * lda + 2 * q); \
    c0_##r = _mm512_dpbf16_ps(c0_##r, ar, b0);                  \
    c1_##r = _mm512_dpbf16_ps(c1_##r, ar, b1);                  \
  }
// The odd last k: its pair's second element is zero in A too (what follows A's row may be anything, NaN
// included, and NaN * 0 is NaN).
#define TORCHOPS_PGB_DP_LAST(r)                                                              \
  {                                                                                          \
    const __m512bh ar = (__m512bh)_mm512_set1_epi32(int32_t(a[(r) * lda + kc - 1]));        \
    c0_##r = _mm512_dpbf16_ps(c0_##r, ar, b0);                                               \
    c1_##r = _mm512_dpbf16_ps(c1_##r, ar, b1);                                               \
  }
#define TORCHOPS_PGB_STORE(r)                                                          \
  {                                                                                    \
    float* cr = c + (r) * ldc;                                                         \
    _mm512_storeu_ps(cr, accumulate ? _mm512_add_ps(_mm512_loadu_ps(cr), c0_##r) : c0_##r);           \
    _mm512_storeu_ps(cr + 16, accumulate ? _mm512_add_ps(_mm512_loadu_ps(cr + 16), c1_##r) : c1_##r); \
  }

// c[kBMR, kBNR] (+)= A[kBMR, kc] @ panel block [kc, kBNR].
TORCHOPS_BF16_TARGET void bf16_tile(int64_t kc, const uint16_t* __restrict a, int64_t lda,
                                    const uint16_t* __restrict bp, float* __restrict c, int64_t ldc,
                                    bool accumulate) {
  TORCHOPS_PGB_ROWS(TORCHOPS_PGB_ZERO)
  const int64_t pairs = kc / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * kBNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + q * 2 * kBNR + kBNR);
    TORCHOPS_PGB_ROWS(TORCHOPS_PGB_DP)
  }
  if (kc % 2) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + pairs * 2 * kBNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + pairs * 2 * kBNR + kBNR);
    TORCHOPS_PGB_ROWS(TORCHOPS_PGB_DP_LAST)
  }
  TORCHOPS_PGB_ROWS(TORCHOPS_PGB_STORE)
}
#undef TORCHOPS_PGB_ROWS
#undef TORCHOPS_PGB_ZERO
#undef TORCHOPS_PGB_DP
#undef TORCHOPS_PGB_DP_LAST
#undef TORCHOPS_PGB_STORE

// A partial tile (rows < kBMR or nv < kBNR), through a zero-padded copy of A's rows and a scratch tile.
TORCHOPS_BF16_TARGET void bf16_partial_tile(int64_t rows, int64_t kc, const uint16_t* a, int64_t lda,
                                            const uint16_t* bp, float* c, int64_t ldc, int64_t nv,
                                            bool accumulate) {
  alignas(64) uint16_t ablock[kBMR * kBKC];
  alignas(64) float cblock[kBMR * kBNR];
  if (rows < kBMR) {
    std::fill(ablock, ablock + kBMR * kc, uint16_t(0));
    for (int64_t r = 0; r < rows; ++r) std::memcpy(ablock + r * kc, a + r * lda, kc * sizeof(uint16_t));
    bf16_tile(kc, ablock, kc, bp, cblock, kBNR, false);
  } else {
    bf16_tile(kc, a, lda, bp, cblock, kBNR, false);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* cr = c + r * ldc;
    const float* t = cblock + r * kBNR;
    for (int64_t j = 0; j < nv; ++j) cr[j] = accumulate ? cr[j] + t[j] : t[j];
  }
}

TORCHOPS_BF16_TARGET void bf16_compute_panels(int64_t p0, int64_t p1, int64_t m, int64_t n, int64_t k,
                                              const uint16_t* a, int64_t lda, const uint16_t* packed,
                                              bool accumulate, float* c, int64_t ldc) {
  for (int64_t k0 = 0; k0 < k; k0 += kBKC) {
    const int64_t kc = std::min(kBKC, k - k0);
    const bool acc = accumulate || k0 > 0;
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t j0 = p * kBNR, nv = std::min<int64_t>(kBNR, n - j0);
      const uint16_t* bp = packed + p * bf16_panel_size(k) + k0 * kBNR;
      for (int64_t i = 0; i < m; i += kBMR) {
        const int64_t rows = std::min<int64_t>(kBMR, m - i);
        if (rows == kBMR && nv == kBNR)
          bf16_tile(kc, a + i * lda + k0, lda, bp, c + i * ldc + j0, ldc, acc);
        else
          bf16_partial_tile(rows, kc, a + i * lda + k0, lda, bp, c + i * ldc + j0, ldc, nv, acc);
      }
    }
  }
}

void bf16_compute(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
                  bool accumulate, float* c, int64_t ldc) {
  const int64_t panels = (n + kBNR - 1) / kBNR;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / std::max<int64_t>(1, m * k * kBNR));
  at::parallel_for(0, panels, grain, [&](int64_t p0, int64_t p1) {
    bf16_compute_panels(p0, p1, m, n, k, a, lda, packed, accumulate, c, ldc);
  });
}

// dst[i] = src[i] rounded to bfloat16 (to nearest even, as c10::BFloat16), 16 at a time.
TORCHOPS_BF16_TARGET void bf16_round(const float* src, int64_t n, uint16_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + i)));
  if (i < n) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mk, src + i));
    _mm256_mask_storeu_epi16(dst + i, mk, v);
  }
}

// dst[i] = src[i] (bfloat16) as float32, 16 at a time (exact: the bits shifted into the high half).
void bf16_widen(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
  if (i < n) {
    const __mmask16 mk = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk, src + i));
    _mm512_mask_storeu_ps(dst + i, mk, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
  }
}
#undef TORCHOPS_BF16_TARGET
#endif

}  // namespace
}  // namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE

template <>
const PackedGemmLoops& packed_gemm_loops<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
#if TORCHOPS_CPU_CAPABILITY == 2
  static const PackedGemmLoops k{pack_size, pack, compute, bf16_pack_size, bf16_pack, bf16_compute, bf16_round,
                                 bf16_widen};
#else
  static const PackedGemmLoops k{pack_size, pack, compute, nullptr, nullptr, nullptr, nullptr, nullptr};
#endif
  return k;
}

}  // namespace cpu
}  // namespace torchops
