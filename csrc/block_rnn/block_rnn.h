// GRU / LSTM block ops: GRUBlockCell(Grad), LSTMBlockCell(Grad), BlockLSTM(V2) and their grads, and
// BlockGRU (torchops). Validation and the device-independent orchestration (GEMMs through ATen, the
// time loop, workspaces) live in ops.cpp; each backend provides the per-step fused elementwise kernels
// below (csrc/cpu/block_rnn_kernel.cpp, csrc/cuda/block_rnn_kernel.cu), all of which share the scalar
// math of csrc/common/block_rnn_math.h, and registers the op entry points bound to its table (Impls<K>).
#pragma once

#include "block_rnn/step_kernels.h"
#include "common/routes.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <tuple>

namespace torchops {
namespace brnn {

// Arguments of the whole-sequence recurrences (Kernels::*_sequence). Every tensor is contiguous; the
// [T,B,C] ones have T >= L, and only their steps [0, L) are read or written. B, C, L > 0.
struct LstmSeqForward {
  at::Tensor pre;                              // [L,B,4C]: x_t @ w[:I] + b of every step
  at::Tensor w_h;                              // [C,4C]: the recurrent rows w[I:]
  at::Tensor cs_prev, h_prev, wci, wcf, wco;   // [B,C], [B,C], [C] x 3
  double forget_bias, cell_clip;
  bool use_peephole, ifco;
  int64_t L;
  at::Tensor i, cs, f, o, ci, co, h;           // [T,B,C] outputs
};
struct LstmSeqBackward {
  at::Tensor w_h, cs_prev, wci, wcf, wco;
  at::Tensor i, cs, f, o, ci, co;              // [T,B,C] forward outputs
  at::Tensor h_grad, cs_grad, g_i, g_f, g_o, g_ci, g_co;  // [T,B,C], each optional
  bool use_peephole, ifco;
  int64_t L;
  at::Tensor dgates;                           // [L,B,4C] output (layout per ifco)
  at::Tensor dh, dcs;                          // [B,C] carries: zeros on entry, h_prev's / cs_prev's gradient on return
};
struct GruSeqForward {
  at::Tensor pre_ru, pre_c;                    // [L,B,2C], [L,B,C]: input projections plus biases
  at::Tensor w_ru_h, w_c_h;                    // [C,2C], [C,C]: the recurrent rows of w_ru, w_c
  at::Tensor h_prev;
  int64_t L;
  at::Tensor r, u, c, h;                       // [T,B,C] outputs
};
struct GruSeqBackward {
  at::Tensor w_ru_h, w_c_h, h_prev;
  at::Tensor r, u, c, h;                       // [T,B,C] forward outputs (h read for t >= 1 only)
  at::Tensor h_grad, g_r, g_u, g_c;            // [T,B,C], each optional
  int64_t L;
  at::Tensor d_c_bar, d_rbu;                   // [L,B,C], [L,B,2C] outputs
  at::Tensor hr;                               // [L,B,C] output h_{t-1} * r_t, optional
  at::Tensor dh;                               // [B,C] carry: zeros on entry, h_prev's gradient on return
};

// One backend's table: its per-step kernels (StepKernels) and what else the orchestration asks of it.
struct Kernels : StepKernels {
  // The device type these kernels run on: an op dispatched here (by any tensor argument, e.g. a CUDA
  // seq_len_max beside CPU data) checks that x is on it.
  c10::DeviceType device;
  // Whole-sequence recurrences (one launch for all L steps), or nullptr. Each returns false, having
  // written nothing, where it does not support the configuration (dtype, sizes, device limits); the
  // caller then runs the per-step loop.
  bool (*lstm_forward_sequence)(const LstmSeqForward& a);
  bool (*lstm_backward_sequence)(const LstmSeqBackward& a);
  bool (*gru_forward_sequence)(const GruSeqForward& a);
  bool (*gru_backward_sequence)(const GruSeqBackward& a);
  // The CPU bfloat16 LSTM forward's fused step (LstmBf16Rows), nullptr on other devices.
  void (*lstm_forward_bf16_rows)(const LstmBf16Rows& a);
};

// The family's routes (block_rnn/routes.cpp).
namespace route {
extern routes::CapabilityRoutes cpu_step_kernels;
extern routes::Route cuda_persistent, cuda_steps, cpu_float32_cell, cpu_dtype_cell;
}  // namespace route

// The CUDA whole-sequence recurrences (csrc/cuda/block_rnn_persistent.cu; CUDA builds only).
bool lstm_forward_sequence_cuda(const LstmSeqForward& a);
bool lstm_backward_sequence_cuda(const LstmSeqBackward& a);
bool gru_forward_sequence_cuda(const GruSeqForward& a);
bool gru_backward_sequence_cuda(const GruSeqBackward& a);

using T4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using T5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using T6 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using T7 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using T8 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using OptT = c10::optional<at::Tensor>;

// ---- GRU ----
T4 gru_block_cell(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                  const at::Tensor& b_ru, const at::Tensor& b_c, const Kernels& k);
T4 gru_block_cell_grad(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                       const at::Tensor& b_ru, const at::Tensor& b_c, const at::Tensor& r, const at::Tensor& u,
                       const at::Tensor& c, const at::Tensor& d_h, const Kernels& k);
T6 gru_block_cell_backward(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                           const at::Tensor& w_c, const at::Tensor& r, const at::Tensor& u, const at::Tensor& c,
                           const OptT& d_r, const OptT& d_u, const OptT& d_c, const OptT& d_h, const Kernels& k);
T4 block_gru(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
             const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c, const Kernels& k);
T6 block_gru_grad(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& h_prev,
                  const at::Tensor& w_ru, const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c,
                  const at::Tensor& r, const at::Tensor& u, const at::Tensor& c, const at::Tensor& h,
                  const at::Tensor& h_grad, const OptT& r_grad, const OptT& u_grad, const OptT& c_grad,
                  const Kernels& k);

// ---- LSTM ----
T7 lstm_block_cell(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev, const at::Tensor& w,
                   const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b,
                   double forget_bias, double cell_clip, bool use_peephole, const Kernels& k);
T5 lstm_block_cell_grad(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                        const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                        const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                        const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const at::Tensor& cs_grad,
                        const at::Tensor& h_grad, bool use_peephole, const Kernels& k);
T8 lstm_block_cell_backward(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                            const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                            const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                            const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const OptT& cs_grad,
                            const OptT& h_grad, const OptT& i_grad, const OptT& f_grad, const OptT& o_grad,
                            const OptT& ci_grad, const OptT& co_grad, bool use_peephole, const Kernels& k);
T7 block_lstm(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
              const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
              const at::Tensor& wco, const at::Tensor& b, double forget_bias, double cell_clip, bool use_peephole,
              bool ifco, const Kernels& k);
// The sequence backward (BlockLSTMGrad(V2) when the gate gradients are absent).
T8 block_lstm_backward(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
                       const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                       const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs,
                       const at::Tensor& f, const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co,
                       const at::Tensor& h, const OptT& cs_grad, const OptT& h_grad, const OptT& i_grad,
                       const OptT& f_grad, const OptT& o_grad, const OptT& ci_grad, const OptT& co_grad,
                       bool use_peephole, bool ifco, bool tf_grad_op, const Kernels& k);

// The op entry points of one backend (its Kernels table K); each backend file registers them.
template <const Kernels& K>
struct Impls {
  static T4 gru_block_cell(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                           const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c) {
    return ::torchops::brnn::gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c, K);
  }
  static T4 gru_block_cell_grad(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                                const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c,
                                const at::Tensor& r, const at::Tensor& u, const at::Tensor& c,
                                const at::Tensor& d_h) {
    return ::torchops::brnn::gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h, K);
  }
  static T6 gru_block_cell_backward(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                                    const at::Tensor& w_c, const at::Tensor& r, const at::Tensor& u,
                                    const at::Tensor& c, const OptT& d_r, const OptT& d_u, const OptT& d_c,
                                    const OptT& d_h) {
    return ::torchops::brnn::gru_block_cell_backward(x, h_prev, w_ru, w_c, r, u, c, d_r, d_u, d_c, d_h, K);
  }
  static T4 block_gru(const at::Tensor& s, const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                      const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c) {
    return ::torchops::brnn::block_gru(s, x, h_prev, w_ru, w_c, b_ru, b_c, K);
  }
  static T6 block_gru_grad(const at::Tensor& s, const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                           const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c, const at::Tensor& r,
                           const at::Tensor& u, const at::Tensor& c, const at::Tensor& h, const at::Tensor& h_grad,
                           const OptT& r_grad, const OptT& u_grad, const OptT& c_grad) {
    return ::torchops::brnn::block_gru_grad(s, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad, r_grad, u_grad,
                                            c_grad, K);
  }
  static T7 lstm_block_cell(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                            const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                            const at::Tensor& b, double forget_bias, double cell_clip, bool use_peephole) {
    return ::torchops::brnn::lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
                                             use_peephole, K);
  }
  static T5 lstm_block_cell_grad(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                                 const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                                 const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i,
                                 const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o, const at::Tensor& ci,
                                 const at::Tensor& co, const at::Tensor& cs_grad, const at::Tensor& h_grad,
                                 bool use_peephole) {
    return ::torchops::brnn::lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                                                  cs_grad, h_grad, use_peephole, K);
  }
  static T8 lstm_block_cell_backward(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                                     const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                                     const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i,
                                     const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                                     const at::Tensor& ci, const at::Tensor& co, const OptT& cs_grad,
                                     const OptT& h_grad, const OptT& i_grad, const OptT& f_grad, const OptT& o_grad,
                                     const OptT& ci_grad, const OptT& co_grad, bool use_peephole) {
    return ::torchops::brnn::lstm_block_cell_backward(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co,
                                                      cs_grad, h_grad, i_grad, f_grad, o_grad, ci_grad, co_grad,
                                                      use_peephole, K);
  }
  static T7 block_lstm(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                       const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                       const at::Tensor& b, double forget_bias, double cell_clip, bool use_peephole) {
    return ::torchops::brnn::block_lstm(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
                                        use_peephole, false, K);
  }
  static T7 block_lstm_v2(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev,
                          const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                          const at::Tensor& wco, const at::Tensor& b, double cell_clip, bool use_peephole) {
    return ::torchops::brnn::block_lstm(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, 0.0, cell_clip, use_peephole,
                                        true, K);
  }
  template <bool IFCO>
  static T8 block_lstm_grad_ifco(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev,
                            const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci,
                            const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i,
                            const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o, const at::Tensor& ci,
                            const at::Tensor& co, const at::Tensor& h, const at::Tensor& cs_grad,
                            const at::Tensor& h_grad, bool use_peephole) {
    TORCH_CHECK_VALUE(cs_grad.defined(), "cs_grad must be a tensor, got None");
    TORCH_CHECK_VALUE(h_grad.defined(), "h_grad must be a tensor, got None");
    return ::torchops::brnn::block_lstm_backward(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h,
                                                 cs_grad, h_grad, OptT(), OptT(), OptT(), OptT(), OptT(),
                                                 use_peephole, IFCO, /*tf_grad_op=*/true, K);
  }
  static T8 block_lstm_grad(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev,
                            const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci,
                            const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i,
                            const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o, const at::Tensor& ci,
                            const at::Tensor& co, const at::Tensor& h, const at::Tensor& cs_grad,
                            const at::Tensor& h_grad, bool use_peephole) {
    return block_lstm_grad_ifco<false>(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad,
                                       h_grad, use_peephole);
  }
  static T8 block_lstm_grad_v2(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev,
                               const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci,
                               const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b,
                               const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                               const at::Tensor& ci, const at::Tensor& co, const at::Tensor& h,
                               const at::Tensor& cs_grad, const at::Tensor& h_grad, bool use_peephole) {
    return block_lstm_grad_ifco<true>(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad,
                                      h_grad, use_peephole);
  }
  static T8 block_lstm_backward(const at::Tensor& s, const at::Tensor& x, const at::Tensor& cs_prev,
                                   const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci,
                                   const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b,
                                   const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                                   const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co,
                                   const at::Tensor& h, const OptT& cs_grad, const OptT& h_grad, const OptT& i_grad,
                                   const OptT& f_grad, const OptT& o_grad, const OptT& ci_grad, const OptT& co_grad,
                                   bool use_peephole, bool ifco) {
    return ::torchops::brnn::block_lstm_backward(s, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h,
                                                 cs_grad, h_grad, i_grad, f_grad, o_grad, ci_grad, co_grad,
                                                 use_peephole, ifco, /*tf_grad_op=*/false, K);
  }
};

}  // namespace brnn
}  // namespace torchops
