// Scalar math of the CudnnRNN ops, shared by the CPU and CUDA kernels. U is the compute
// type: float (also for float16 / bfloat16 data, which the ops compute in float32) or double. The
// transcendentals are the block RNN family's (common/block_rnn_math.h): branch-free on the CPU so the
// gate loops vectorize, the CUDA math library on the device.
#pragma once

#include "common/block_rnn_math.h"

namespace torchops {
namespace crnn {

using brnn::sigmoid;
using brnn::tanh_f;

// rnn_relu / rnn_tanh: h' = act(pre).
template <typename U>
C10_HOST_DEVICE inline U rnn_act(U pre, bool relu) {
  return relu ? (pre > U(0) ? pre : U(0)) : tanh_f(pre);
}
// d act / d pre expressed through the activation a = act(pre).
template <typename U>
C10_HOST_DEVICE inline U rnn_act_grad(U a, bool relu) {
  return relu ? (a > U(0) ? U(1) : U(0)) : U(1) - a * a;
}

// lstm (cuDNN gate order i, f, g(c), o): c' = f c + i g, m = o tanh(c') (h' = m, or Pm m).
template <typename U>
struct LstmFwd {
  U i, f, g, o, c, m;
};
template <typename U>
C10_HOST_DEVICE inline LstmFwd<U> lstm_fwd(U pi, U pf, U pg, U po, U c_prev) {
  LstmFwd<U> r;
  r.i = sigmoid(pi);
  r.f = sigmoid(pf);
  r.g = tanh_f(pg);
  r.o = sigmoid(po);
  r.c = r.f * c_prev + r.i * r.g;
  r.m = r.o * tanh_f(r.c);
  return r;
}

// Backward of one lstm step from the saved activations. dm = dL/dm, dc = dL/dc' arriving from later
// steps. Returns the pre-activation gradients and dL/dc_prev.
template <typename U>
struct LstmBwd {
  U di, df, dg, do_, dc_prev;
};
template <typename U>
C10_HOST_DEVICE inline LstmBwd<U> lstm_bwd(U i, U f, U g, U o, U c, U c_prev, U dm, U dc) {
  LstmBwd<U> r;
  const U tc = tanh_f(c);
  const U dct = dc + dm * o * (U(1) - tc * tc);
  r.do_ = dm * tc * o * (U(1) - o);
  r.di = dct * g * i * (U(1) - i);
  r.dg = dct * i * (U(1) - g * g);
  r.df = dct * c_prev * f * (U(1) - f);
  r.dc_prev = dct * f;
  return r;
}

// gru (linear before reset, gates r, z, n): gx = W x + b_W, gh = R h + b_R (per gate);
// r = σ(gx_r + gh_r), z = σ(gx_z + gh_z), n = tanh(gx_n + r gh_n), h' = (1 - z) n + z h.
template <typename U>
struct GruFwd {
  U r, z, n, h;
};
template <typename U>
C10_HOST_DEVICE inline GruFwd<U> gru_fwd(U xr, U xz, U xn, U hr, U hz, U hn, U h_prev) {
  GruFwd<U> o;
  o.r = sigmoid(xr + hr);
  o.z = sigmoid(xz + hz);
  o.n = tanh_f(xn + o.r * hn);
  o.h = (U(1) - o.z) * o.n + o.z * h_prev;
  return o;
}

// Backward of one gru step: pre-activation gradients of the input part (dr, dz, dn) and of the recurrent
// part (dr, dz, dn * r), and the direct term dL/dh_prev += z dh.
template <typename U>
struct GruBwd {
  U dr, dz, dn, dhn, dh_prev;
};
template <typename U>
C10_HOST_DEVICE inline GruBwd<U> gru_bwd(U r, U z, U n, U hn, U h_prev, U dh) {
  GruBwd<U> o;
  const U dn_pre = dh * (U(1) - z) * (U(1) - n * n);
  o.dn = dn_pre;
  o.dhn = dn_pre * r;
  o.dr = dn_pre * hn * r * (U(1) - r);
  o.dz = dh * (h_prev - n) * z * (U(1) - z);
  o.dh_prev = dh * z;
  return o;
}

}  // namespace crnn
}  // namespace torchops
