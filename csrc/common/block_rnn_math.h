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
// Transcendentals. On the device: the CUDA math library. On the CPU, float: TensorFlow's own algorithms,
// so that the gate math gives TF's numbers bit for bit. TF's CPU kernels evaluate sigmoid and tanh with
// Eigen's packet functions (scalar_logistic_op<float>::packetOp, ptanh_float of the Eigen that TF 2.21
// ships; x86 builds without FMA, so every a * b + c below is two roundings: the kernel files compile
// this math with fp-contract off). Checked against tf.math.sigmoid / tf.math.tanh on 2M random floats:
// bitwise equal, except that TF flushes subnormal results to zero and torchops keeps them. Error vs the
// exact value (TF's, so): tanh <= 5.8 ulp, sigmoid <= 6.6 ulp (tools/tf_compare/ulp_check.cpp). Written without
// branches or library calls (floor aside) so that compilers vectorize the gate loops. double: libm.
// ---------------------------------------------------------------------------------------------------
// Eigen's coefficients, shared by the float functions below and the AVX-512 bfloat16 LSTM step
// (cpu/block_rnn_kernel_isa.cpp), which evaluates the same algorithms on vectors.
namespace eigen_tanh {
// the clamp c, and the numerator's (p) and denominator's (q) coefficients in x^2, highest first
constexpr float kClamp = 7.90738964080810547f;
constexpr float kP[4] = {1.394553628e-8f, 2.102733560e-5f, 3.520756727e-3f, 1.340216100e-1f};
constexpr float kQ[5] = {8.015776984e-7f, 3.326951409e-4f, 2.597254514e-2f, 4.673548340e-1f, 1.0f};
}  // namespace eigen_tanh
namespace eigen_logistic {
// the upper clamp, log2(e), ln(2) in two parts, the even and odd polynomial coefficients in r^2 (highest
// first), and the argument below which S = 0
constexpr float kHi = 16.6355324f, kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kEven[2] = {4.1898667812347412109375e-2f, 0.49999141693115234375f};
constexpr float kOdd[2] = {8.33471305668354034423828125e-3f, 0.16666877269744873046875f};
constexpr float kZeroBelow = -104.0f;
}  // namespace eigen_logistic

C10_HOST_DEVICE inline float tanh_f(float a) {
#ifdef __CUDA_ARCH__
  return ::tanhf(a);
#else
  // Eigen's 9/8 rational interpolant on [-c, c], c the smallest argument where it is exactly +-1.
  // The selects keep NaN (as Eigen's pmin/pmax).
  using namespace eigen_tanh;
  const float c = kClamp;
  float x = c < a ? c : a;
  x = -c > x ? -c : x;
  const float x2 = x * x;
  const float x3 = x2 * x;
  float p = kP[0];
  p = p * x2 + kP[1];
  p = p * x2 + kP[2];
  p = p * x2 + kP[3];
  float q = kQ[0];
  q = q * x2 + kQ[1];
  q = q * x2 + kQ[2];
  q = q * x2 + kQ[3];
  q = q * x2 + kQ[4];
  p = x3 * p + x;
  return p / q;
#endif
}
C10_HOST_DEVICE inline double tanh_f(double x) { return ::tanh(x); }

// Eigen's float logistic: S(x) = e / (1 + e) with e = exp(x / 2)^2 (the halving keeps 2^m normal), x
// clamped above where S is exactly 1; S = 0 below -104.
C10_HOST_DEVICE inline float sigmoid_f(float a) {
#ifdef __CUDA_ARCH__
  const float e = ::expf(a < 0.f ? a : -a);
  return (a < 0.f ? e : 1.0f) / (1.0f + e);
#else
  using namespace eigen_logistic;
  float x = kHi < a ? kHi : a;
  x = x * 0.5f;
#if defined(__GNUC__)
  // The builtin, not std::floor: an inline from <cmath> compiled without this file's fp-contract /
  // trapping-math settings would not be inlined into the kernels, which then would not vectorize.
  const float m = __builtin_floorf(x * kLog2e + 0.5f);
#else
  const float m = std::floor(x * kLog2e + 0.5f);
#endif
  float r = m * -kLn2Hi + x;
  r = m * -kLn2Lo + r;
  const float r2 = r * r;
  const float p_even = r2 * kEven[0] + kEven[1];
  const float p_odd = r2 * kOdd[0] + kOdd[1];
  float p = r * p_odd + p_even;
  p = r2 * p + (r + 1.0f);
  // 2^m through the exponent bits, the biased exponent clamped to [0, 255] (NaN -> 0: p is NaN then).
  float be = m + 127.0f;
  be = be > 0.0f ? be : 0.0f;
  be = be < 255.0f ? be : 255.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(be)) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float e = p * scale;
  e = e * e;
  const float s = e / (1.0f + e);
  return a < kZeroBelow ? 0.0f : s;
#endif
}

// double: 1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) for x < 0, so that the exponential never
// overflows and tiny results keep full relative accuracy.
C10_HOST_DEVICE inline double sigmoid_f(double x) {
  const double e = ::exp(x < 0.0 ? x : -x);
  return (x < 0.0 ? e : 1.0) / (1.0 + e);
}

template <typename U>
C10_HOST_DEVICE inline U sigmoid(U x) {
  return sigmoid_f(x);
}

template <typename U>
C10_HOST_DEVICE inline U clip_value(U v, U cell_clip) {
  // cell_clip <= 0 disables clipping (TF: 0 or -1).
  const U lo = v < -cell_clip ? -cell_clip : v;
  const U c = lo > cell_clip ? cell_clip : lo;
  return cell_clip > U(0) ? c : v;
}

// ---------------------------------------------------------------------------------------------------
// GRU. ru_bar = [x, h_prev] @ w_ru + b_ru; r = first half, u = second half.
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

// First half of the cell backward: gradients of the pre-activations c_bar and u_bar.
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
// LSTM. Gate column blocks of w / b / gate gradients: ICFO (V1) or IFCO (V2).
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

// One element of LSTMBlockCell, in TF's order of operations.
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

// One element of the LSTM cell backward (extended with the gradients g_* arriving
// at the gate outputs; gates = false: all g_* = 0, TF's LSTMBlockCellGrad). dh / dcs_in: total gradient
// arriving at h and cs. Straight-through cell clip; peephole terms added once.
// Every term is formed in TF's order of operations (BlockLSTMBprop in TF's lstm_ops.h) and the g_*
// terms are added after TF's, so that without them the results are TF's bit for bit.
template <typename U>
C10_HOST_DEVICE inline LstmBackward<U> lstm_backward(U i, U cs, U f, U o, U ci, U co, U cs_prev, U wci, U wcf,
                                                     U wco, U dh, U dcs_in, U g_i, U g_f, U g_o, U g_ci, U g_co,
                                                     bool use_peephole, bool gates) {
  LstmBackward<U> r;
  const U so = o * (U(1) - o), tco = U(1) - co * co, tci = U(1) - ci * ci;
  const U sf = f * (U(1) - f), si = i * (U(1) - i);
  const U do0 = so * dh * co;
  r.do_ = gates ? do0 + so * g_o : do0;
  const U dcs0 = tco * dh * o;
  U dcs = (gates ? dcs0 + tco * g_co : dcs0) + dcs_in;
  dcs = use_peephole ? dcs + r.do_ * wco : dcs;
  const U dci0 = tci * dcs * i, df0 = sf * dcs * cs_prev, di0 = si * dcs * ci;
  r.dci = gates ? dci0 + tci * g_ci : dci0;
  r.df = gates ? df0 + sf * g_f : df0;
  r.di = gates ? di0 + si * g_i : di0;
  const U csg = dcs * f;
  r.cs_prev_grad = use_peephole ? csg + r.di * wci + r.df * wcf : csg;
  (void)cs;
  return r;
}

}  // namespace brnn
}  // namespace torchops
