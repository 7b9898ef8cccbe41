// Scalar math of the GRU / LSTM block ops (GRUBlockCell, LSTMBlockCell, BlockLSTM(V2), BlockGRU and
// their gradients), shared by the CPU and CUDA kernels. U is the compute type: float (also for
// float16 / bfloat16 storage) or double. Every function is branch-free per element so that the CPU
// loops that call it vectorize.
#pragma once

#include <c10/macros/Macros.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace torchops {
namespace brnn {

// ---------------------------------------------------------------------------------------------------
// Transcendentals. On the device: the CUDA math library. On the CPU, float: Cephes' expf / tanhf
// (<= 1.5 ulp from the exact value over all floats; tools/tf_compare/ulp_check.cpp), written without
// branches or library calls so that compilers vectorize the gate loops (glibc's scalar expf/tanhf would
// not vectorize and would dominate the elementwise time). double: the C library.
// ---------------------------------------------------------------------------------------------------
C10_HOST_DEVICE inline float exp_f(float x) {
#ifdef __CUDA_ARCH__
  return ::expf(x);
#else
  // Clamp so that 2^n below stays representable: x > 89 overflows to inf and x < -105 underflows to 0
  // through the two-factor scaling (which also gives correct subnormal results). NaN passes the clamp
  // and propagates through r and p (an explicit isnan select would stop GCC vectorizing the loops).
  const float xc = x < -105.0f ? -105.0f : (x > 89.0f ? 89.0f : x);
  const float t = xc * 1.44269504088896341f;
  const int32_t n = static_cast<int32_t>(t + (t >= 0.f ? 0.5f : -0.5f));
  const float fn = static_cast<float>(n);
  float r = xc - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * (r * r) + r + 1.0f;
  // 2^n = 2^n1 * 2^n2 with n1, n2 in [-76, 64] (normal floats), so n in [-152, 128] needs no branch.
  const int32_t n1 = n >> 1, n2 = n - n1;
  const uint32_t b1 = static_cast<uint32_t>(n1 + 127) << 23, b2 = static_cast<uint32_t>(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof(s1));
  std::memcpy(&s2, &b2, sizeof(s2));
  const float e = (p * s1) * s2;
  return e;
#endif
}

C10_HOST_DEVICE inline double exp_f(double x) { return ::exp(x); }

// sigmoid(x) = 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) for x < 0: the exponential never
// overflows, so tiny results for large negative x keep full relative accuracy.
template <typename U>
C10_HOST_DEVICE inline U sigmoid(U x) {
  const U e = exp_f(x < U(0) ? x : -x);
  return (x < U(0) ? e : U(1)) / (U(1) + e);
}

C10_HOST_DEVICE inline float tanh_f(float x) {
#ifdef __CUDA_ARCH__
  return ::tanhf(x);
#else
  const float ax = x < 0.f ? -x : x;
  // |x| >= 0.625: 1 - 2 / (exp(2|x|) + 1), sign restored.
  const float e = exp_f(2.0f * ax);
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0.f ? -big : big;
  // |x| < 0.625: odd polynomial.
  const float z = x * x;
  float p = -5.70498872745E-3f;
  p = p * z + 2.06390887954E-2f;
  p = p * z - 5.37397155531E-2f;
  p = p * z + 1.33314422036E-1f;
  p = p * z - 3.33332819422E-1f;
  const float small = p * z * x + x;
  return ax < 0.625f ? small : big;
#endif
}
C10_HOST_DEVICE inline double tanh_f(double x) { return ::tanh(x); }

template <typename U>
C10_HOST_DEVICE inline U clip_value(U v, U cell_clip) {
  // cell_clip <= 0 disables clipping (TF: 0 or -1).
  const U lo = v < -cell_clip ? -cell_clip : v;
  const U c = lo > cell_clip ? cell_clip : lo;
  return cell_clip > U(0) ? c : v;
}

// ---------------------------------------------------------------------------------------------------
// GRU (spec §3). ru_bar = [x, h_prev] @ w_ru + b_ru; r = first half, u = second half.
// ---------------------------------------------------------------------------------------------------
template <typename U>
struct GruGates {
  U r, u, hr;  // hr = h_prev * r, the reset state that multiplies the h-rows of w_c
};

template <typename U>
C10_HOST_DEVICE inline GruGates<U> gru_gates(U r_bar, U u_bar, U h_prev) {
  GruGates<U> g;
  g.r = sigmoid(r_bar);
  g.u = sigmoid(u_bar);
  g.hr = h_prev * g.r;
  return g;
}

template <typename U>
struct GruOutput {
  U c, h;
};

template <typename U>
C10_HOST_DEVICE inline GruOutput<U> gru_output(U c_bar, U u, U h_prev) {
  GruOutput<U> o;
  o.c = tanh_f(c_bar);
  o.h = u * (h_prev - o.c) + o.c;
  return o;
}

// First half of the cell backward (spec §3.6): gradients of the pre-activations c_bar and u_bar.
// dh = gradient arriving at h; g_u / g_c = gradients arriving at the u / c outputs (0 if none).
template <typename U>
struct GruBwdA {
  U d_c_bar, d_u_bar;
};

template <typename U>
C10_HOST_DEVICE inline GruBwdA<U> gru_backward_a(U dh, U g_u, U g_c, U u, U c, U h_prev) {
  GruBwdA<U> o;
  o.d_c_bar = (g_c + dh * (U(1) - u)) * (U(1) - c * c);
  o.d_u_bar = (g_u + dh * (h_prev - c)) * u * (U(1) - u);
  return o;
}

// Second half: d_hr = d_c_bar @ w_c[I:]^T (the reset-state columns). Gives d_r_bar, the part of
// d_h_prev that does not go through w_ru (d_hr * r + dh * u), and hr = h_prev * r (for d_w_c).
template <typename U>
struct GruBwdB {
  U d_r_bar, d_h_prev_part, hr;
};

template <typename U>
C10_HOST_DEVICE inline GruBwdB<U> gru_backward_b(U d_hr, U g_r, U dh, U r, U u, U h_prev) {
  GruBwdB<U> o;
  o.d_r_bar = (g_r + d_hr * h_prev) * r * (U(1) - r);
  o.d_h_prev_part = d_hr * r + dh * u;
  o.hr = h_prev * r;
  return o;
}

// ---------------------------------------------------------------------------------------------------
// LSTM (spec §4). Gate column blocks of w / b / gate gradients: ICFO (V1) or IFCO (V2).
// ---------------------------------------------------------------------------------------------------
struct GateOffsets {
  int64_t i, ci, f, o;
};

C10_HOST_DEVICE inline GateOffsets gate_offsets(bool ifco, int64_t cell_size) {
  GateOffsets g;
  g.i = 0;
  g.ci = (ifco ? 2 : 1) * cell_size;
  g.f = (ifco ? 1 : 2) * cell_size;
  g.o = 3 * cell_size;
  return g;
}

template <typename U>
struct LstmForward {
  U i, cs, f, o, ci, co, h;
};

// One element of LSTMBlockCell (spec §4.2), in TF's order of operations.
template <typename U>
C10_HOST_DEVICE inline LstmForward<U> lstm_forward(U g_i, U g_ci, U g_f, U g_o, U cs_prev, U wci, U wcf, U wco,
                                                   U forget_bias, U cell_clip, bool use_peephole) {
  LstmForward<U> r;
  const U i_peep = use_peephole ? cs_prev * wci : U(0);
  const U f_peep = use_peephole ? cs_prev * wcf : U(0);
  r.i = sigmoid(g_i + i_peep);
  r.ci = tanh_f(g_ci);
  r.f = sigmoid(g_f + forget_bias + f_peep);
  r.cs = clip_value(r.i * r.ci + r.f * cs_prev, cell_clip);
  r.co = tanh_f(r.cs);
  const U o_peep = use_peephole ? r.cs * wco : U(0);
  r.o = sigmoid(g_o + o_peep);
  r.h = r.o * r.co;
  return r;
}

template <typename U>
struct LstmBackward {
  U di, dci, df, do_, cs_prev_grad;
};

// One element of the LSTM cell backward (spec §4.4, extended by §4.7 with the gradients g_* arriving
// at the gate outputs; all g_* = 0 gives TF's LSTMBlockCellGrad). dh / dcs: total gradient arriving
// at h and cs. Straight-through cell clip (rule 10d); peephole terms added once (rule 10f).
template <typename U>
C10_HOST_DEVICE inline LstmBackward<U> lstm_backward(U i, U cs, U f, U o, U ci, U co, U cs_prev, U wci, U wcf,
                                                     U wco, U dh, U dcs_in, U g_i, U g_f, U g_o, U g_ci, U g_co,
                                                     bool use_peephole) {
  LstmBackward<U> r;
  r.do_ = o * (U(1) - o) * (dh * co + g_o);
  const U dco = dh * o + g_co;
  const U dcs = (U(1) - co * co) * dco + dcs_in + (use_peephole ? r.do_ * wco : U(0));
  r.dci = (U(1) - ci * ci) * (dcs * i + g_ci);
  r.df = f * (U(1) - f) * (dcs * cs_prev + g_f);
  r.di = i * (U(1) - i) * (dcs * ci + g_i);
  r.cs_prev_grad = dcs * f + (use_peephole ? r.di * wci + r.df * wcf : U(0));
  (void)cs;
  return r;
}

}  // namespace brnn
}  // namespace torchops
