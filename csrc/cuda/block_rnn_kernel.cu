// CUDA kernels of the GRU / LSTM block ops: the fused per-step elementwise kernels (the GEMMs, through
// ATen -> cuBLAS, and the time loop are in csrc/block_rnn/ops.cpp; the sequence ops first try the
// whole-sequence kernels of block_rnn_persistent.cu). One thread per (batch row, cell) element, grid-stride
// loops with int64 indices, the scalar math of common/block_rnn_math.h.
#include "block_rnn/block_rnn.h"
#include "common/block_rnn_math.h"
#include "cuda/grid_loop.cuh"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace torchops {
namespace brnn {
namespace {

using cuda_grid::kThreads;
using cuda_grid::num_blocks;

template <typename T>
__device__ __forceinline__ at::opmath_type<T> ld(const T* p, int64_t k) {
  return p ? static_cast<at::opmath_type<T>>(p[k]) : at::opmath_type<T>(0);
}

// ------------------------------------------------------------------------------------------------
// GRU
// ------------------------------------------------------------------------------------------------
template <typename T>
__global__ void gru_gates_kernel(int64_t n, int64_t C, const T* ru, const T* hp, T* r, T* u, T* hr) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const int64_t b = k / C, c = k % C;
    const GruGates<U> g = gru_gates<U>(static_cast<U>(ru[b * 2 * C + c]), static_cast<U>(ru[b * 2 * C + C + c]),
                                       static_cast<U>(hp[k]));
    r[k] = static_cast<T>(g.r);
    u[k] = static_cast<T>(g.u);
    hr[k] = static_cast<T>(g.hr);
  }
}

template <typename T>
__global__ void gru_output_kernel(int64_t n, const T* cb, const T* u, const T* hp, T* c, T* h) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const GruOutput<U> o = gru_output<U>(static_cast<U>(cb[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    c[k] = static_cast<T>(o.c);
    h[k] = static_cast<T>(o.h);
  }
}

template <typename T>
__global__ void gru_backward_a_kernel(int64_t n, int64_t C, const T* hg, const T* carry, const T* gu, const T* gc,
                                      const T* u, const T* c, const T* hp, T* dh, T* dcb, T* drbu) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const int64_t b = k / C, j = k % C;
    const U d = ld(hg, k) + ld(carry, k);
    const GruBwdA<U> o = gru_backward_a<U>(d, ld(gu, k), ld(gc, k), static_cast<U>(u[k]), static_cast<U>(c[k]),
                                           static_cast<U>(hp[k]));
    dh[k] = static_cast<T>(d);
    dcb[k] = static_cast<T>(o.d_c_bar);
    drbu[b * 2 * C + C + j] = static_cast<T>(o.d_u_bar);
  }
}

template <typename T>
__global__ void gru_backward_b_kernel(int64_t n, int64_t C, const T* dhr, const T* gr, const T* dh, const T* r,
                                      const T* u, const T* hp, T* drbu, T* part, T* hr) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const int64_t b = k / C, j = k % C;
    const GruBwdB<U> o = gru_backward_b<U>(static_cast<U>(dhr[k]), ld(gr, k), static_cast<U>(dh[k]),
                                           static_cast<U>(r[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    drbu[b * 2 * C + j] = static_cast<T>(o.d_r_bar);
    part[k] = static_cast<T>(o.d_h_prev_part);
    if (hr) hr[k] = static_cast<T>(o.hr);
  }
}

void gru_gates_cuda(const at::Tensor& ru_bar, const at::Tensor& h_prev, const at::Tensor& r, const at::Tensor& u,
                    const at::Tensor& hr) {
  const c10::cuda::CUDAGuard guard(h_prev.device());
  const int64_t n = h_prev.numel(), C = h_prev.size(1);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_cuda", [&] {
    gru_gates_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(
        n, C, cptr<scalar_t>(ru_bar), cptr<scalar_t>(h_prev), mptr<scalar_t>(r), mptr<scalar_t>(u),
        mptr<scalar_t>(hr));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void gru_output_cuda(const at::Tensor& c_bar, const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& c,
                     const at::Tensor& h) {
  const c10::cuda::CUDAGuard guard(h_prev.device());
  const int64_t n = h_prev.numel();
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_cuda", [&] {
    gru_output_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(
        n, cptr<scalar_t>(c_bar), cptr<scalar_t>(u), cptr<scalar_t>(h_prev), mptr<scalar_t>(c), mptr<scalar_t>(h));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void gru_backward_a_cuda(const at::Tensor& h_grad, const at::Tensor& dh_carry, const at::Tensor& g_u,
                         const at::Tensor& g_c, const at::Tensor& u, const at::Tensor& c, const at::Tensor& h_prev,
                         const at::Tensor& dh_out, const at::Tensor& d_c_bar, const at::Tensor& d_rbu) {
  const c10::cuda::CUDAGuard guard(h_prev.device());
  const int64_t n = h_prev.numel(), C = h_prev.size(1);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_grad_cuda", [&] {
    gru_backward_a_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(
        n, C, cptr<scalar_t>(h_grad), cptr<scalar_t>(dh_carry), cptr<scalar_t>(g_u), cptr<scalar_t>(g_c),
        cptr<scalar_t>(u), cptr<scalar_t>(c), cptr<scalar_t>(h_prev), mptr<scalar_t>(dh_out),
        mptr<scalar_t>(d_c_bar), mptr<scalar_t>(d_rbu));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void gru_backward_b_cuda(const at::Tensor& d_hr, const at::Tensor& g_r, const at::Tensor& dh, const at::Tensor& r,
                         const at::Tensor& u, const at::Tensor& h_prev, const at::Tensor& d_rbu,
                         const at::Tensor& dh_part, const at::Tensor& hr) {
  const c10::cuda::CUDAGuard guard(h_prev.device());
  const int64_t n = h_prev.numel(), C = h_prev.size(1);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_prev.scalar_type(), "gru_block_cell_grad_cuda", [&] {
    gru_backward_b_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(
        n, C, cptr<scalar_t>(d_hr), cptr<scalar_t>(g_r), cptr<scalar_t>(dh), cptr<scalar_t>(r), cptr<scalar_t>(u),
        cptr<scalar_t>(h_prev), mptr<scalar_t>(d_rbu), mptr<scalar_t>(dh_part), mptr<scalar_t>(hr));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// ------------------------------------------------------------------------------------------------
// LSTM
// ------------------------------------------------------------------------------------------------
template <typename T>
struct LstmFwdArgs {
  const T *gates, *cs_prev, *wci, *wcf, *wco;
  T *i, *cs, *f, *o, *ci, *co, *h;
};

template <typename T>
__global__ void lstm_forward_kernel(int64_t n, int64_t C, GateOffsets off, LstmFwdArgs<T> a,
                                    at::opmath_type<T> forget_bias, at::opmath_type<T> cell_clip, bool peep) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const int64_t b = k / C, j = k % C;
    const T* g = a.gates + b * 4 * C + j;
    const LstmForward<U> r =
        lstm_forward<U>(static_cast<U>(g[off.i]), static_cast<U>(g[off.ci]), static_cast<U>(g[off.f]),
                        static_cast<U>(g[off.o]), static_cast<U>(a.cs_prev[k]), static_cast<U>(a.wci[j]),
                        static_cast<U>(a.wcf[j]), static_cast<U>(a.wco[j]), forget_bias, cell_clip, peep);
    a.i[k] = static_cast<T>(r.i);
    a.cs[k] = static_cast<T>(r.cs);
    a.f[k] = static_cast<T>(r.f);
    a.o[k] = static_cast<T>(r.o);
    a.ci[k] = static_cast<T>(r.ci);
    a.co[k] = static_cast<T>(r.co);
    a.h[k] = static_cast<T>(r.h);
  }
}

template <typename T>
struct LstmBwdArgs {
  const T *i, *cs, *f, *o, *ci, *co, *cs_prev, *wci, *wcf, *wco, *h_grad, *dh_carry, *cs_grad;
  const T *g_i, *g_f, *g_o, *g_ci, *g_co;  // null = no gradient
  T *dgates, *dcs_carry;
};

template <typename T>
__global__ void lstm_backward_kernel(int64_t n, int64_t C, GateOffsets off, LstmBwdArgs<T> a, bool peep) {
  using U = at::opmath_type<T>;
  TORCHOPS_GRID_LOOP(k, n) {
    const int64_t b = k / C, j = k % C;
    const U dh = ld(a.h_grad, k) + ld(a.dh_carry, k);
    const U dcs_in = ld(a.cs_grad, k) + static_cast<U>(a.dcs_carry[k]);
    const LstmBackward<U> r = lstm_backward<U>(
        static_cast<U>(a.i[k]), static_cast<U>(a.cs[k]), static_cast<U>(a.f[k]), static_cast<U>(a.o[k]),
        static_cast<U>(a.ci[k]), static_cast<U>(a.co[k]), static_cast<U>(a.cs_prev[k]), static_cast<U>(a.wci[j]),
        static_cast<U>(a.wcf[j]), static_cast<U>(a.wco[j]), dh, dcs_in, ld(a.g_i, k), ld(a.g_f, k), ld(a.g_o, k),
        ld(a.g_ci, k), ld(a.g_co, k), peep, /*gates=*/a.g_i != nullptr);
    T* dg = a.dgates + b * 4 * C + j;
    dg[off.i] = static_cast<T>(r.di);
    dg[off.ci] = static_cast<T>(r.dci);
    dg[off.f] = static_cast<T>(r.df);
    dg[off.o] = static_cast<T>(r.do_);
    a.dcs_carry[k] = static_cast<T>(r.cs_prev_grad);
  }
}

void lstm_forward_cuda(const at::Tensor& gates, const at::Tensor& cs_prev, const at::Tensor& wci,
                       const at::Tensor& wcf, const at::Tensor& wco, double forget_bias, double cell_clip,
                       bool use_peephole, bool ifco, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                       const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const at::Tensor& h) {
  const c10::cuda::CUDAGuard guard(cs_prev.device());
  const int64_t n = cs_prev.numel(), C = cs_prev.size(1);
  const GateOffsets off = gate_offsets(ifco, C);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cs_prev.scalar_type(), "lstm_block_cell_cuda", [&] {
    using U = at::opmath_type<scalar_t>;
    LstmFwdArgs<scalar_t> a{cptr<scalar_t>(gates), cptr<scalar_t>(cs_prev), cptr<scalar_t>(wci),
                            cptr<scalar_t>(wcf),   cptr<scalar_t>(wco),     mptr<scalar_t>(i),
                            mptr<scalar_t>(cs),    mptr<scalar_t>(f),       mptr<scalar_t>(o),
                            mptr<scalar_t>(ci),    mptr<scalar_t>(co),      mptr<scalar_t>(h)};
    lstm_forward_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(
        n, C, off, a, static_cast<U>(forget_bias), static_cast<U>(cell_clip), use_peephole);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

void lstm_backward_cuda(const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                        const at::Tensor& ci, const at::Tensor& co, const at::Tensor& cs_prev, const at::Tensor& wci,
                        const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& h_grad,
                        const at::Tensor& dh_carry, const at::Tensor& cs_grad, const at::Tensor& g_i,
                        const at::Tensor& g_f, const at::Tensor& g_o, const at::Tensor& g_ci, const at::Tensor& g_co,
                        bool use_peephole, bool ifco, const at::Tensor& dgates, const at::Tensor& dcs_carry) {
  const c10::cuda::CUDAGuard guard(cs_prev.device());
  const int64_t n = cs_prev.numel(), C = cs_prev.size(1);
  const GateOffsets off = gate_offsets(ifco, C);
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cs_prev.scalar_type(), "lstm_block_cell_grad_cuda", [&] {
    LstmBwdArgs<scalar_t> a{cptr<scalar_t>(i),      cptr<scalar_t>(cs),       cptr<scalar_t>(f),
                            cptr<scalar_t>(o),      cptr<scalar_t>(ci),       cptr<scalar_t>(co),
                            cptr<scalar_t>(cs_prev), cptr<scalar_t>(wci),     cptr<scalar_t>(wcf),
                            cptr<scalar_t>(wco),    cptr<scalar_t>(h_grad),   cptr<scalar_t>(dh_carry),
                            cptr<scalar_t>(cs_grad), cptr<scalar_t>(g_i),     cptr<scalar_t>(g_f),
                            cptr<scalar_t>(g_o),    cptr<scalar_t>(g_ci),     cptr<scalar_t>(g_co),
                            mptr<scalar_t>(dgates), mptr<scalar_t>(dcs_carry)};
    lstm_backward_kernel<scalar_t><<<num_blocks(n), kThreads, 0, stream>>>(n, C, off, a, use_peephole);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

const Kernels kCudaKernels{gru_gates_cuda, gru_output_cuda, gru_backward_a_cuda, gru_backward_b_cuda,
                           lstm_forward_cuda, lstm_backward_cuda, c10::DeviceType::CUDA,
                           lstm_forward_sequence_cuda, lstm_backward_sequence_cuda, gru_forward_sequence_cuda,
                           gru_backward_sequence_cuda, nullptr};

}  // namespace brnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CUDA, m) {
  using namespace torchops::brnn;
  m.impl("gru_block_cell", &Impls<kCudaKernels>::gru_block_cell);
  m.impl("gru_block_cell_grad", &Impls<kCudaKernels>::gru_block_cell_grad);
  m.impl("_gru_block_cell_backward", &Impls<kCudaKernels>::gru_block_cell_backward);
  m.impl("block_gru", &Impls<kCudaKernels>::block_gru);
  m.impl("block_gru_grad", &Impls<kCudaKernels>::block_gru_grad);
  m.impl("lstm_block_cell", &Impls<kCudaKernels>::lstm_block_cell);
  m.impl("lstm_block_cell_grad", &Impls<kCudaKernels>::lstm_block_cell_grad);
  m.impl("_lstm_block_cell_backward", &Impls<kCudaKernels>::lstm_block_cell_backward);
  m.impl("block_lstm", &Impls<kCudaKernels>::block_lstm);
  m.impl("block_lstm_v2", &Impls<kCudaKernels>::block_lstm_v2);
  m.impl("block_lstm_grad", &Impls<kCudaKernels>::block_lstm_grad);
  m.impl("block_lstm_grad_v2", &Impls<kCudaKernels>::block_lstm_grad_v2);
  m.impl("_block_lstm_backward", &Impls<kCudaKernels>::block_lstm_backward);
}
