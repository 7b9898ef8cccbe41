// CPU kernels of the GRU / LSTM block ops: the fused per-step elementwise kernels (the GEMMs and the
// time loop are in csrc/block_rnn/ops.cpp). Rows (batch entries) are split across threads; each row is a
// plain loop over the cell dimension, with restrict-qualified pointers and compile-time peephole /
// gate-gradient switches, over the branch-free math of common/block_rnn_math.h so that it vectorizes.
#include "block_rnn/block_rnn.h"
#include "cpu/cpu_isa.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

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
namespace {

constexpr int64_t kGrainElems = 4096;  // elements per parallel task (a step of B*C <= 4K elements runs
                                        // on one thread: no fork/join for a few microseconds of work)

inline int64_t row_grain(int64_t C) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)); }

template <typename T>
using opm = at::opmath_type<T>;

// Row kernels, compiled three times: for the baseline ISA, AVX2+FMA and AVX-512 (x86-64 with GCC),
// picked at run time by the step kernels' CPU capability routes (csrc/cpu/cpu_isa.h, block_rnn/routes.cpp).
// They are in block_rnn_kernel_isa.h.
#define TORCHOPS_ISA_SELF "cpu/block_rnn_kernel_isa.h"
#define TORCHOPS_ISA_AVX512 1
#include "cpu/cpu_isa_sections.h"
#undef TORCHOPS_ISA_AVX512
#undef TORCHOPS_ISA_SELF

#define TORCHOPS_PICK(...) TORCHOPS_ISA_PICK(route::cpu_step_kernels.slot, __VA_ARGS__)

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
        TORCHOPS_PICK(gru_gates_row<scalar_t>)(C, ru + b * 2 * C, hp + b * C, rp + b * C, up + b * C, hrp + b * C);
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
        TORCHOPS_PICK(gru_output_row<scalar_t>)(C, cb + b * C, up + b * C, hp + b * C, cp + b * C, hout + b * C);
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
          TORCHOPS_PICK(gru_backward_a_row<scalar_t, true>)(C, hg + o, cr + o, gu + o, gc + o, up + o, cp + o, hp + o,
              dh + o, dcb + o, drbu + 2 * o + C);
        } else {
          TORCHOPS_PICK(gru_backward_a_row<scalar_t, false>)(C, hg + o, cr + o, nullptr, nullptr, up + o, cp + o,
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
          TORCHOPS_PICK(gru_backward_b_row<scalar_t, true, true>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else if (gates)
          TORCHOPS_PICK(gru_backward_b_row<scalar_t, true, false>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else if (want_hr)
          TORCHOPS_PICK(gru_backward_b_row<scalar_t, false, true>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
              drbu + 2 * o, part + o, h);
        else
          TORCHOPS_PICK(gru_backward_b_row<scalar_t, false, false>)(C, dhr + o, g, dhp + o, rp + o, up + o, hp + o,
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
          TORCHOPS_PICK(lstm_forward_row<scalar_t, true>)(C, gr + off.i, gr + off.ci, gr + off.f, gr + off.o, csp + s,
              pi, pf, po, fb, clip, ip + s, csout + s, fp + s, op + s, cip + s, cop + s, hp + s);
        } else {
          TORCHOPS_PICK(lstm_forward_row<scalar_t, false>)(C, gr + off.i, gr + off.ci, gr + off.f, gr + off.o,
              csp + s, pi, pf, po, fb, clip, ip + s, csout + s, fp + s, op + s, cip + s, cop + s, hp + s);
        }
      }
    });
  });
}

#define TORCHOPS_LSTM_BWD_ROW(P, G)                                                                         \
  TORCHOPS_PICK(lstm_backward_row<scalar_t, P, G>)(                                                         \
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
#undef TORCHOPS_PICK

const Kernels kCpuKernels{gru_gates_cpu, gru_output_cpu, gru_backward_a_cpu, gru_backward_b_cpu,
                          lstm_forward_cpu, lstm_backward_cpu, c10::DeviceType::CPU,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace
}  // namespace brnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::brnn;
  m.impl("gru_block_cell", &Impls<kCpuKernels>::gru_block_cell);
  m.impl("gru_block_cell_grad", &Impls<kCpuKernels>::gru_block_cell_grad);
  m.impl("_gru_block_cell_backward", &Impls<kCpuKernels>::gru_block_cell_backward);
  m.impl("block_gru", &Impls<kCpuKernels>::block_gru);
  m.impl("block_gru_grad", &Impls<kCpuKernels>::block_gru_grad);
  m.impl("lstm_block_cell", &Impls<kCpuKernels>::lstm_block_cell);
  m.impl("lstm_block_cell_grad", &Impls<kCpuKernels>::lstm_block_cell_grad);
  m.impl("_lstm_block_cell_backward", &Impls<kCpuKernels>::lstm_block_cell_backward);
  m.impl("block_lstm", &Impls<kCpuKernels>::block_lstm);
  m.impl("block_lstm_v2", &Impls<kCpuKernels>::block_lstm_v2);
  m.impl("block_lstm_grad", &Impls<kCpuKernels>::block_lstm_grad);
  m.impl("block_lstm_grad_v2", &Impls<kCpuKernels>::block_lstm_grad_v2);
  m.impl("_block_lstm_backward", &Impls<kCpuKernels>::block_lstm_backward);
}

