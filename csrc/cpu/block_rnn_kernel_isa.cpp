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
const StepKernels& cpu_step_kernels<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
  static const StepKernels k{gru_gates_cpu,    gru_output_cpu,   gru_backward_a_cpu,
                             gru_backward_b_cpu, lstm_forward_cpu, lstm_backward_cpu};
  return k;
}

}  // namespace brnn
}  // namespace torchops
