// CPU step kernels of the GRU / LSTM block ops, one build per CPU capability (see cpu/cpu_isa.h): rows
// (batch entries) split across threads, each row a plain loop over the cell dimension with restrict-qualified
// pointers and compile-time peephole / gate-gradient switches, over the branch-free math of
// common/block_rnn_math.h so that it vectorizes.
#include "cpu/block_rnn_kernel_isa.h"
#include "cpu/cpu_isa.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

// The math's selects (clamps) only if-convert, and so vectorize, when floating point comparisons are
// not treated as trapping; and a * b + c stays two roundings (no FMA contraction), as in TF's CPU
// kernels, so that the gate math reproduces TF's results. Applies to the functions defined below.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math", "fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif
#include "common/block_rnn_math.h"

namespace torchops {
namespace brnn {
namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE {
namespace {

constexpr int64_t kGrainElems = 4096;  // elements per parallel task (a step of B*C <= 4K elements runs
                                        // on one thread: no fork/join for a few microseconds of work)

inline int64_t row_grain(int64_t C) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)); }

template <typename T>
using opm = at::opmath_type<T>;

// Row kernels: one batch row, a loop over the cell dimension.
template <typename T>
void gru_gates_row(int64_t C, const T* __restrict ru, const T* __restrict hp, T* __restrict r, T* __restrict u,
                   T* __restrict hr) {
  using U = opm<T>;
  for (int64_t c = 0; c < C; ++c) {
    const GruGates<U> g = gru_gates<U>(static_cast<U>(ru[c]), static_cast<U>(ru[C + c]), static_cast<U>(hp[c]));
    r[c] = static_cast<T>(g.r);
    u[c] = static_cast<T>(g.u);
    hr[c] = static_cast<T>(g.hr);
  }
}

template <typename T>
void gru_output_row(int64_t C, const T* __restrict cb, const T* __restrict u, const T* __restrict hp,
                    T* __restrict c, T* __restrict h) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const GruOutput<U> o = gru_output<U>(static_cast<U>(cb[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    c[k] = static_cast<T>(o.c);
    h[k] = static_cast<T>(o.h);
  }
}

template <typename T, bool GATES>
void gru_backward_a_row(int64_t C, const T* __restrict hg, const T* __restrict carry, const T* __restrict gu,
                        const T* __restrict gc, const T* __restrict u, const T* __restrict c,
                        const T* __restrict hp, T* __restrict dh, T* __restrict dcb, T* __restrict dub) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const U d = static_cast<U>(hg[k]) + static_cast<U>(carry[k]);
    const GruBwdA<U> o = gru_backward_a<U>(d, GATES ? static_cast<U>(gu[k]) : U(0),
                                           GATES ? static_cast<U>(gc[k]) : U(0), static_cast<U>(u[k]),
                                           static_cast<U>(c[k]), static_cast<U>(hp[k]));
    dh[k] = static_cast<T>(d);
    dcb[k] = static_cast<T>(o.d_c_bar);
    dub[k] = static_cast<T>(o.d_u_bar);
  }
}

template <typename T, bool GATES, bool HR>
void gru_backward_b_row(int64_t C, const T* __restrict dhr, const T* __restrict gr, const T* __restrict dh,
                        const T* __restrict r, const T* __restrict u, const T* __restrict hp, T* __restrict drb,
                        T* __restrict part, T* __restrict hr) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const GruBwdB<U> o =
        gru_backward_b<U>(static_cast<U>(dhr[k]), GATES ? static_cast<U>(gr[k]) : U(0), static_cast<U>(dh[k]),
                          static_cast<U>(r[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    drb[k] = static_cast<T>(o.d_r_bar);
    part[k] = static_cast<T>(o.d_h_prev_part);
    if (HR) hr[k] = static_cast<T>(o.hr);
  }
}

template <typename T, bool PEEP>
void lstm_forward_row(int64_t C, const T* __restrict gi, const T* __restrict gci, const T* __restrict gf,
                      const T* __restrict go, const T* __restrict csp, const T* __restrict wci,
                      const T* __restrict wcf, const T* __restrict wco, opm<T> fb, opm<T> clip, T* __restrict i,
                      T* __restrict cs, T* __restrict f, T* __restrict o, T* __restrict ci, T* __restrict co,
                      T* __restrict h) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const LstmForward<U> r = lstm_forward<U>(
        static_cast<U>(gi[k]), static_cast<U>(gci[k]), static_cast<U>(gf[k]), static_cast<U>(go[k]),
        static_cast<U>(csp[k]), PEEP ? static_cast<U>(wci[k]) : U(0), PEEP ? static_cast<U>(wcf[k]) : U(0),
        PEEP ? static_cast<U>(wco[k]) : U(0), fb, clip, PEEP);
    i[k] = static_cast<T>(r.i);
    cs[k] = static_cast<T>(r.cs);
    f[k] = static_cast<T>(r.f);
    o[k] = static_cast<T>(r.o);
    ci[k] = static_cast<T>(r.ci);
    co[k] = static_cast<T>(r.co);
    h[k] = static_cast<T>(r.h);
  }
}

#if TORCHOPS_CPU_CAPABILITY == 2
// The AVX-512 build's LstmBf16Rows: TensorFlow's sigmoid and tanh algorithms and coefficients
// (common/block_rnn_math.h) with fused multiply-adds, 2^m by vscalefps, and the outputs rounded by
// vcvtneps2bf16 (to nearest even). Not bit for bit TensorFlow's float32 math (the outputs are bfloat16, which
// TensorFlow computes differently anyway); within a few float32 ulp of it. Only the bfloat16 loop reaches it, and only where the CPU has AVX-512 BF16
// (its GEMM needs it too), so it carries its own target like the packed GEMM's bfloat16 functions.
#define TORCHOPS_BF16_TARGET __attribute__((target("avx512bf16")))

TORCHOPS_BF16_TARGET inline __m512 v_sigmoid(__m512 a) {
  using namespace eigen_logistic;
  auto k = [](float v) { return _mm512_set1_ps(v); };
  const __m512 x = _mm512_mul_ps(_mm512_min_ps(k(kHi), a), k(0.5f));
  const __m512 m =
      _mm512_roundscale_ps(_mm512_fmadd_ps(x, k(kLog2e), k(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(m, k(kLn2Hi), x);
  r = _mm512_fnmadd_ps(m, k(kLn2Lo), r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 p_even = _mm512_fmadd_ps(r2, k(kEven[0]), k(kEven[1]));
  const __m512 p_odd = _mm512_fmadd_ps(r2, k(kOdd[0]), k(kOdd[1]));
  __m512 p = _mm512_fmadd_ps(r, p_odd, p_even);
  p = _mm512_fmadd_ps(r2, p, _mm512_add_ps(r, k(1.0f)));
  __m512 e = _mm512_scalef_ps(p, m);
  e = _mm512_mul_ps(e, e);
  const __m512 s = _mm512_div_ps(e, _mm512_add_ps(k(1.0f), e));
  return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(a, k(kZeroBelow), _CMP_LT_OQ), s);
}

TORCHOPS_BF16_TARGET inline __m512 v_tanh(__m512 a) {
  using namespace eigen_tanh;
  auto k = [](float v) { return _mm512_set1_ps(v); };
  const __m512 x = _mm512_max_ps(k(-kClamp), _mm512_min_ps(k(kClamp), a));
  const __m512 x2 = _mm512_mul_ps(x, x), x3 = _mm512_mul_ps(x2, x);
  __m512 p = k(kP[0]), q = k(kQ[0]);
  for (int j = 1; j < 4; ++j) p = _mm512_fmadd_ps(p, x2, k(kP[j]));
  for (int j = 1; j < 5; ++j) q = _mm512_fmadd_ps(q, x2, k(kQ[j]));
  return _mm512_div_ps(_mm512_fmadd_ps(x3, p, x), q);
}

TORCHOPS_BF16_TARGET inline void v_store_bf16(uint16_t* p, __mmask16 mk, __m512 v) {
  _mm256_mask_storeu_epi16(p, mk, (__m256i)_mm512_cvtneps_pbh(v));
}

template <bool PEEP, bool CLIP>
TORCHOPS_BF16_TARGET void lstm_forward_bf16_row_v(const LstmBf16Rows& a, int64_t r) {
  const int64_t g0 = r * a.ldg, s = r * a.ldo;
  float* const cs = a.cs + r * a.ldcs;
  const __m512 fb = _mm512_set1_ps(a.forget_bias), clip = _mm512_set1_ps(a.cell_clip),
               nclip = _mm512_set1_ps(-a.cell_clip);
  for (int64_t k = 0; k < a.n; k += 16) {
    const __mmask16 mk = a.n - k >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << (a.n - k)) - 1);
    auto ld = [&](const float* p) { return _mm512_maskz_loadu_ps(mk, p + k); };
    const __m512 csp = ld(cs);
    __m512 gi = _mm512_add_ps(ld(a.g_i + g0), ld(a.b_i)), gf = _mm512_add_ps(ld(a.g_f + g0), ld(a.b_f));
    const __m512 gci = _mm512_add_ps(ld(a.g_ci + g0), ld(a.b_ci)), go = _mm512_add_ps(ld(a.g_o + g0), ld(a.b_o));
    if (PEEP) gi = _mm512_fmadd_ps(csp, ld(a.wci), gi);
    gf = _mm512_add_ps(gf, fb);
    if (PEEP) gf = _mm512_fmadd_ps(csp, ld(a.wcf), gf);
    const __m512 i = v_sigmoid(gi), ci = v_tanh(gci), f = v_sigmoid(gf);
    __m512 c = _mm512_fmadd_ps(i, ci, _mm512_mul_ps(f, csp));
    if (CLIP) c = _mm512_min_ps(clip, _mm512_max_ps(nclip, c));
    const __m512 co = v_tanh(c);
    const __m512 o = v_sigmoid(PEEP ? _mm512_fmadd_ps(c, ld(a.wco), go) : go);
    _mm512_mask_storeu_ps(cs + k, mk, c);
    v_store_bf16(a.i + s + k, mk, i);
    v_store_bf16(a.cs_out + s + k, mk, c);
    v_store_bf16(a.f + s + k, mk, f);
    v_store_bf16(a.o + s + k, mk, o);
    v_store_bf16(a.ci + s + k, mk, ci);
    v_store_bf16(a.co + s + k, mk, co);
    v_store_bf16(a.h + s + k, mk, _mm512_mul_ps(o, co));
  }
}

void lstm_forward_bf16_rows(const LstmBf16Rows& a) {
  const bool clip = a.cell_clip > 0.f;
  for (int64_t r = 0; r < a.rows; ++r) {
    if (a.use_peephole)
      clip ? lstm_forward_bf16_row_v<true, true>(a, r) : lstm_forward_bf16_row_v<true, false>(a, r);
    else
      clip ? lstm_forward_bf16_row_v<false, true>(a, r) : lstm_forward_bf16_row_v<false, false>(a, r);
  }
}
#undef TORCHOPS_BF16_TARGET
#else
// x rounded to bfloat16 (to nearest even, NaN to 0x7fc0), as c10::BFloat16, in integer operations that
// vectorize in every build.
inline uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const uint16_t r = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return x != x ? uint16_t(0x7fc0) : r;
}

// One row of LstmBf16Rows: the float32 math of lstm_forward_row<float>, each output rounded once.
template <bool PEEP>
void lstm_forward_bf16_row(int64_t n, const float* __restrict gi, const float* __restrict gci,
                           const float* __restrict gf, const float* __restrict go, const float* __restrict bi,
                           const float* __restrict bci, const float* __restrict bf, const float* __restrict bo,
                           const float* __restrict wci, const float* __restrict wcf, const float* __restrict wco,
                           float fb, float clip, float* __restrict cs, uint16_t* __restrict i,
                           uint16_t* __restrict cso, uint16_t* __restrict f, uint16_t* __restrict o,
                           uint16_t* __restrict ci, uint16_t* __restrict co, uint16_t* __restrict h) {
  for (int64_t k = 0; k < n; ++k) {
    const LstmForward<float> v =
        lstm_forward<float>(gi[k] + bi[k], gci[k] + bci[k], gf[k] + bf[k], go[k] + bo[k], cs[k],
                            PEEP ? wci[k] : 0.f, PEEP ? wcf[k] : 0.f, PEEP ? wco[k] : 0.f, fb, clip, PEEP);
    cs[k] = v.cs;
    i[k] = bf16_bits(v.i);
    cso[k] = bf16_bits(v.cs);
    f[k] = bf16_bits(v.f);
    o[k] = bf16_bits(v.o);
    ci[k] = bf16_bits(v.ci);
    co[k] = bf16_bits(v.co);
    h[k] = bf16_bits(v.h);
  }
}

// On the calling thread: the bfloat16 loop calls it from its batch-slice threads.
void lstm_forward_bf16_rows(const LstmBf16Rows& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t g = r * a.ldg, s = r * a.ldo;
    (a.use_peephole ? lstm_forward_bf16_row<true> : lstm_forward_bf16_row<false>)(
        a.n, a.g_i + g, a.g_ci + g, a.g_f + g, a.g_o + g, a.b_i, a.b_ci, a.b_f, a.b_o, a.wci, a.wcf, a.wco,
        a.forget_bias, a.cell_clip, a.cs + r * a.ldcs, a.i + s, a.cs_out + s, a.f + s, a.o + s, a.ci + s, a.co + s,
        a.h + s);
  }
}
#endif

template <typename T, bool PEEP, bool GATES>
void lstm_backward_row(int64_t C, const T* __restrict i, const T* __restrict cs, const T* __restrict f,
                       const T* __restrict o, const T* __restrict ci, const T* __restrict co,
                       const T* __restrict csp, const T* __restrict wci, const T* __restrict wcf,
                       const T* __restrict wco, const T* __restrict hg, const T* __restrict dhc,
                       const T* __restrict csg, const T* __restrict gi, const T* __restrict gf,
                       const T* __restrict go, const T* __restrict gci, const T* __restrict gco, T* __restrict di,
                       T* __restrict dci, T* __restrict df, T* __restrict dout, T* __restrict dcs) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const U dh = static_cast<U>(hg[k]) + static_cast<U>(dhc[k]);
    const U dcs_in = static_cast<U>(csg[k]) + static_cast<U>(dcs[k]);
    const LstmBackward<U> r = lstm_backward<U>(
        static_cast<U>(i[k]), static_cast<U>(cs[k]), static_cast<U>(f[k]), static_cast<U>(o[k]),
        static_cast<U>(ci[k]), static_cast<U>(co[k]), static_cast<U>(csp[k]), PEEP ? static_cast<U>(wci[k]) : U(0),
        PEEP ? static_cast<U>(wcf[k]) : U(0), PEEP ? static_cast<U>(wco[k]) : U(0), dh, dcs_in,
        GATES ? static_cast<U>(gi[k]) : U(0), GATES ? static_cast<U>(gf[k]) : U(0),
        GATES ? static_cast<U>(go[k]) : U(0), GATES ? static_cast<U>(gci[k]) : U(0),
        GATES ? static_cast<U>(gco[k]) : U(0), PEEP, GATES);
    di[k] = static_cast<T>(r.di);
    dci[k] = static_cast<T>(r.dci);
    df[k] = static_cast<T>(r.df);
    dout[k] = static_cast<T>(r.do_);
    dcs[k] = static_cast<T>(r.cs_prev_grad);
  }
}

// ------------------------------------------------------------------------------------------------
// GRU
// ------------------------------------------------------------------------------------------------

void gru_gates_cpu(const at::Tensor& ru_bar, const at::Tensor& h_prev, const at::Tensor& r, const at::Tensor& u,
                   const at::Tensor& hr) {
  const int64_t B = h_prev.size(0), C = h_prev.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_cpu", [&] {
    const scalar_t *ru = cptr<scalar_t>(ru_bar), *hp = cptr<scalar_t>(h_prev);
    scalar_t *rp = mptr<scalar_t>(r), *up = mptr<scalar_t>(u), *hrp = mptr<scalar_t>(hr);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        (gru_gates_row<scalar_t>)(C, ru + b * 2 * C, hp + b * C, rp + b * C, up + b * C, hrp + b * C);
    });
  });
}

void gru_output_cpu(const at::Tensor& c_bar, const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& c,
                    const at::Tensor& h) {
  const int64_t B = h_prev.size(0), C = h_prev.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_cpu", [&] {
    const scalar_t *cb = cptr<scalar_t>(c_bar), *up = cptr<scalar_t>(u), *hp = cptr<scalar_t>(h_prev);
    scalar_t *cp = mptr<scalar_t>(c), *hout = mptr<scalar_t>(h);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b)
        (gru_output_row<scalar_t>)(C, cb + b * C, up + b * C, hp + b * C, cp + b * C, hout + b * C);
    });
  });
}

void gru_backward_a_cpu(const at::Tensor& h_grad, const at::Tensor& dh_carry, const at::Tensor& g_u,
                        const at::Tensor& g_c, const at::Tensor& u, const at::Tensor& c, const at::Tensor& h_prev,
                        const at::Tensor& dh_out, const at::Tensor& d_c_bar, const at::Tensor& d_rbu) {
  const int64_t B = h_prev.size(0), C = h_prev.size(1);
  const bool gates = g_u.defined();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_grad_cpu", [&] {
    const scalar_t *hg = cptr<scalar_t>(h_grad), *cr = cptr<scalar_t>(dh_carry), *gu = cptr<scalar_t>(g_u),
                   *gc = cptr<scalar_t>(g_c), *up = cptr<scalar_t>(u), *cp = cptr<scalar_t>(c),
                   *hp = cptr<scalar_t>(h_prev);
    scalar_t *dh = mptr<scalar_t>(dh_out), *dcb = mptr<scalar_t>(d_c_bar), *drbu = mptr<scalar_t>(d_rbu);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t o = b * C;
        if (gates) {
          (gru_backward_a_row<scalar_t, true>)(C, hg + o, cr + o, gu + o, gc + o, up + o, cp + o, hp + o,
              dh + o, dcb + o, drbu + 2 * o + C);
        } else {
          (gru_backward_a_row<scalar_t, false>)(C, hg + o, cr + o, nullptr, nullptr, up + o, cp + o,
              hp + o, dh + o, dcb + o, drbu + 2 * o + C);
        }
      }
    });
  });
}

void gru_backward_b_cpu(const at::Tensor& d_hr, const at::Tensor& g_r, const at::Tensor& dh, const at::Tensor& r,
                        const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& d_rbu,
                        const at::Tensor& dh_part, const at::Tensor& hr) {
  const int64_t B = h_prev.size(0), C = h_prev.size(1);
  const bool gates = g_r.defined(), want_hr = hr.defined();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_grad_cpu", [&] {
    const scalar_t *dhr = cptr<scalar_t>(d_hr), *gr = cptr<scalar_t>(g_r), *dhp = cptr<scalar_t>(dh),
                   *rp = cptr<scalar_t>(r), *up = cptr<scalar_t>(u), *hp = cptr<scalar_t>(h_prev);
    scalar_t *drbu = mptr<scalar_t>(d_rbu), *part = mptr<scalar_t>(dh_part), *hrp = mptr<scalar_t>(hr);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t o = b * C;
        const scalar_t* g = gates ? gr + o : nullptr;
        scalar_t* h = want_hr ? hrp + o : nullptr;
        if (gates && want_hr)
          (gru_backward_b_row<scalar_t, true, true>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else if (gates)
          (gru_backward_b_row<scalar_t, true, false>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else if (want_hr)
          (gru_backward_b_row<scalar_t, false, true>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else
          (gru_backward_b_row<scalar_t, false, false>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
      }
    });
  });
}

// ------------------------------------------------------------------------------------------------
// LSTM
// ------------------------------------------------------------------------------------------------

void lstm_forward_cpu(const at::Tensor& gates, const at::Tensor& cs_prev, const at::Tensor& wci,
                      const at::Tensor& wcf, const at::Tensor& wco, double forget_bias, double cell_clip,
                      bool use_peephole, bool ifco, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                      const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const at::Tensor& h) {
  const int64_t B = cs_prev.size(0), C = cs_prev.size(1);
  const GateOffsets off = gate_offsets(ifco, C);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cs_prev.scalar_type(), "lstm_block_cell_cpu", [&] {
    using U = opm<scalar_t>;
    const scalar_t *g = cptr<scalar_t>(gates), *csp = cptr<scalar_t>(cs_prev), *pi = cptr<scalar_t>(wci),
                   *pf = cptr<scalar_t>(wcf), *po = cptr<scalar_t>(wco);
    scalar_t *ip = mptr<scalar_t>(i), *csout = mptr<scalar_t>(cs), *fp = mptr<scalar_t>(f), *op = mptr<scalar_t>(o),
             *cip = mptr<scalar_t>(ci), *cop = mptr<scalar_t>(co), *hp = mptr<scalar_t>(h);
    const U fb = static_cast<U>(forget_bias), clip = static_cast<U>(cell_clip);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const scalar_t* gr = g + b * 4 * C;
        const int64_t s = b * C;
        if (use_peephole) {
          (lstm_forward_row<scalar_t, true>)(C, gr + off.i, gr + off.ci, gr + off.f, gr + off.o, csp + s,
              pi, pf, po, fb, clip, ip + s, csout + s, fp + s, op + s, cip + s, cop + s, hp + s);
        } else {
          (lstm_forward_row<scalar_t, false>)(C, gr + off.i, gr + off.ci, gr + off.f, gr + off.o,
              csp + s, pi, pf, po, fb, clip, ip + s, csout + s, fp + s, op + s, cip + s, cop + s, hp + s);
        }
      }
    });
  });
}

#define TORCHOPS_LSTM_BWD_ROW(P, G)                                                                         \
  (lstm_backward_row<scalar_t, P, G>)(                                                         \
      C, ip + s, csp_ + s, fp + s, op + s, cip + s, cop + s, cprev + s, pi, pf, po, hg + s, dhc + s, csg + s, \
      G ? gi + s : nullptr, G ? gf + s : nullptr, G ? go + s : nullptr, G ? gci + s : nullptr,               \
      G ? gco + s : nullptr, dgr + off.i, dgr + off.ci, dgr + off.f, dgr + off.o, dcs + s)

void lstm_backward_cpu(const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                       const at::Tensor& ci, const at::Tensor& co, const at::Tensor& cs_prev, const at::Tensor& wci,
                       const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& h_grad,
                       const at::Tensor& dh_carry, const at::Tensor& cs_grad, const at::Tensor& g_i,
                       const at::Tensor& g_f, const at::Tensor& g_o, const at::Tensor& g_ci, const at::Tensor& g_co,
                       bool use_peephole, bool ifco, const at::Tensor& dgates, const at::Tensor& dcs_carry) {
  const int64_t B = cs_prev.size(0), C = cs_prev.size(1);
  const GateOffsets off = gate_offsets(ifco, C);
  const bool gates = g_i.defined();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cs_prev.scalar_type(), "lstm_block_cell_grad_cpu", [&] {
    const scalar_t *ip = cptr<scalar_t>(i), *csp_ = cptr<scalar_t>(cs), *fp = cptr<scalar_t>(f),
                   *op = cptr<scalar_t>(o), *cip = cptr<scalar_t>(ci), *cop = cptr<scalar_t>(co),
                   *cprev = cptr<scalar_t>(cs_prev), *pi = cptr<scalar_t>(wci), *pf = cptr<scalar_t>(wcf),
                   *po = cptr<scalar_t>(wco), *hg = cptr<scalar_t>(h_grad), *dhc = cptr<scalar_t>(dh_carry),
                   *csg = cptr<scalar_t>(cs_grad), *gi = cptr<scalar_t>(g_i), *gf = cptr<scalar_t>(g_f),
                   *go = cptr<scalar_t>(g_o), *gci = cptr<scalar_t>(g_ci), *gco = cptr<scalar_t>(g_co);
    scalar_t *dg = mptr<scalar_t>(dgates), *dcs = mptr<scalar_t>(dcs_carry);
    at::parallel_for(0, B, row_grain(C), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t s = b * C;
        scalar_t* dgr = dg + 4 * s;
        if (use_peephole && gates)
          TORCHOPS_LSTM_BWD_ROW(true, true);
        else if (use_peephole)
          TORCHOPS_LSTM_BWD_ROW(true, false);
        else if (gates)
          TORCHOPS_LSTM_BWD_ROW(false, true);
        else
          TORCHOPS_LSTM_BWD_ROW(false, false);
      }
    });
  });
}

#undef TORCHOPS_LSTM_BWD_ROW

}  // namespace
}  // namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE

template <>
const CpuStepKernels& cpu_step_kernels<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
  static const CpuStepKernels k{{gru_gates_cpu, gru_output_cpu, gru_backward_a_cpu, gru_backward_b_cpu,
                                 lstm_forward_cpu, lstm_backward_cpu},
                                lstm_forward_bf16_rows};
  return k;
}

}  // namespace brnn
}  // namespace torchops
