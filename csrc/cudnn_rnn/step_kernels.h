// The per-step fused elementwise kernels of the CudnnRNN ops, the part of a backend's table (Kernels,
// cudnn_rnn.h) that every device implements; its own header, so that the CPU capability builds
// (cpu/cudnn_rnn_kernel_isa.cpp) need no more than ATen's tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace torchops {
namespace crnn {

// Per-step kernels. Every matrix argument is an [nb, n] view with unit column stride and any row
// stride (stride(0)); all data is in the compute dtype (float32 or float64). `lens` is an int32 [nb]
// tensor on the kernels' device or undefined (every row active); row b is active at step t iff
// t < lens[b]. Inactive rows keep their state and write 0 outputs / 0 gate gradients.
struct StepKernels {
  // g [nb,4H] pre-activations in, activations (i,f,g,o) out; c_out = c', hm_out = m (= h' when the
  // layer has no projection). y [nb,O] (may be undefined) = h' for active rows, 0 otherwise.
  void (*lstm_fwd)(const at::Tensor& g, const at::Tensor& c_prev, const at::Tensor& h_prev, const at::Tensor& c_out,
                   const at::Tensor& hm_out, const at::Tensor& y, bool proj, const at::Tensor& lens, int64_t t);
  // g [nb,3H] = W x + b_W in, (r,z,n) out; gh [nb,3H] = R h (no bias); b_r [3H]; ghn_out = R_n h + b_Rn.
  void (*gru_fwd)(const at::Tensor& g, const at::Tensor& gh, const at::Tensor& b_r, const at::Tensor& h_prev,
                  const at::Tensor& ghn_out, const at::Tensor& h_out, const at::Tensor& y, const at::Tensor& lens,
                  int64_t t);
  // g [nb,H] pre-activation in, activation out; h_out, y as above.
  void (*rnn_fwd)(const at::Tensor& g, const at::Tensor& h_prev, const at::Tensor& h_out, const at::Tensor& y,
                  bool relu, const at::Tensor& lens, int64_t t);
  // Projected lstm: h_new (= Pm m) of inactive rows <- h_prev; y <- h_new (active) or 0.
  void (*mask_state)(const at::Tensor& h_new, const at::Tensor& h_prev, const at::Tensor& y, const at::Tensor& lens,
                     int64_t t);
  // Backward step prologue: active rows: dh = dh_carry + dy, dh_next = 0; inactive: dh = 0,
  // dh_next = dh_carry. dy may be undefined (= 0).
  void (*bwd_prep)(const at::Tensor& dh_carry, const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& dh_next,
                   const at::Tensor& lens, int64_t t);
  // g: activations; dm [nb,H]; dc [nb,H] in (dL/dc') / out (dL/dc_prev, unchanged for inactive rows);
  // dg [nb,4H] pre-activation gradients out.
  void (*lstm_bwd)(const at::Tensor& g, const at::Tensor& c, const at::Tensor& c_prev, const at::Tensor& dm,
                   const at::Tensor& dc, const at::Tensor& dg, const at::Tensor& lens, int64_t t);
  // dgx [nb,3H], dgh [nb,3H] out; dh_next += z dh.
  void (*gru_bwd)(const at::Tensor& g, const at::Tensor& ghn, const at::Tensor& h_prev, const at::Tensor& dh,
                  const at::Tensor& dh_next, const at::Tensor& dgx, const at::Tensor& dgh, const at::Tensor& lens,
                  int64_t t);
  void (*rnn_bwd)(const at::Tensor& g, const at::Tensor& dh, const at::Tensor& dg, bool relu, const at::Tensor& lens,
                  int64_t t);
};

}  // namespace crnn
}  // namespace torchops
