// The per-step fused elementwise kernels of the GRU / LSTM block ops, the part of a backend's table (Kernels,
// block_rnn.h) that every device implements; its own header, so that the CPU capability builds
// (cpu/block_rnn_kernel_isa.cpp) need no more than ATen's tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchops {
namespace brnn {

// Data pointers of optional tensors (nullptr when undefined), for the CPU and CUDA kernels alike.
template <typename T>
inline const T* cptr(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}
template <typename T>
inline T* mptr(const at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr<T>() : nullptr;
}

// One step of the CPU bfloat16 LSTM forward over raw rows (block_rnn/ops.cpp): `rows` batch rows of `n` cells,
// the float32 GEMM sums of gate q at g_q[r * ldg + j] plus the float32 bias b_q[j]; the float32 cell state at
// cs[r * ldcs + j] read as cs_prev and overwritten with the new state; the seven outputs (i, cs, f, o, ci, co, h)
// rounded once to bfloat16 (raw bits) at out_q[r * ldo + j]. Peepholes (float32, [n]) are read only with
// use_peephole.
struct LstmBf16Rows {
  int64_t rows, n, ldg, ldcs, ldo;
  const float *g_i, *g_ci, *g_f, *g_o, *b_i, *b_ci, *b_f, *b_o, *wci, *wcf, *wco;
  float forget_bias, cell_clip;
  bool use_peephole;
  float* cs;
  uint16_t *i, *cs_out, *f, *o, *ci, *co, *h;
};

// Per-device fused elementwise kernels of one time step. Every tensor argument is a contiguous
// [B, n] matrix of the storage dtype (n = C, 2C or 4C as noted); `optional` ones may be undefined
// (= zeros). Rows are B = size(0) > 0 and C > 0 whenever they are called.
struct StepKernels {
  // ru_bar [B,2C] -> r, u, hr = h_prev * r.
  void (*gru_gates)(const at::Tensor& ru_bar, const at::Tensor& h_prev, const at::Tensor& r, const at::Tensor& u,
                    const at::Tensor& hr);
  // c_bar [B,C] -> c = tanh(c_bar), h = u * (h_prev - c) + c.
  void (*gru_output)(const at::Tensor& c_bar, const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& c,
                     const at::Tensor& h);
  // dh = h_grad (optional) + dh_carry (optional) -> dh_out; d_c_bar; d_rbu[:, C:] = d_u_bar.
  // g_u, g_c optional.
  void (*gru_backward_a)(const at::Tensor& h_grad, const at::Tensor& dh_carry, const at::Tensor& g_u,
                         const at::Tensor& g_c, const at::Tensor& u, const at::Tensor& c, const at::Tensor& h_prev,
                         const at::Tensor& dh_out, const at::Tensor& d_c_bar, const at::Tensor& d_rbu);
  // d_hr [B,C] -> d_rbu[:, :C] = d_r_bar, dh_part = d_hr * r + dh * u, hr (optional) = h_prev * r.
  void (*gru_backward_b)(const at::Tensor& d_hr, const at::Tensor& g_r, const at::Tensor& dh, const at::Tensor& r,
                         const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& d_rbu,
                         const at::Tensor& dh_part, const at::Tensor& hr);
  // gates [B,4C] (layout per ifco) -> i, cs, f, o, ci, co, h.
  void (*lstm_forward)(const at::Tensor& gates, const at::Tensor& cs_prev, const at::Tensor& wci,
                       const at::Tensor& wcf, const at::Tensor& wco, double forget_bias, double cell_clip,
                       bool use_peephole, bool ifco, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                       const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const at::Tensor& h);
  // One step of the LSTM backward. dh = h_grad + dh_carry, dcs = cs_grad + dcs_carry (each optional);
  // writes dgates [B,4C] (layout per ifco) and overwrites dcs_carry with cs_prev_grad.
  void (*lstm_backward)(const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                        const at::Tensor& ci, const at::Tensor& co, const at::Tensor& cs_prev,
                        const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                        const at::Tensor& h_grad, const at::Tensor& dh_carry, const at::Tensor& cs_grad,
                        const at::Tensor& g_i, const at::Tensor& g_f, const at::Tensor& g_o, const at::Tensor& g_ci,
                        const at::Tensor& g_co, bool use_peephole, bool ifco, const at::Tensor& dgates,
                        const at::Tensor& dcs_carry);
};

}  // namespace brnn
}  // namespace torchops
