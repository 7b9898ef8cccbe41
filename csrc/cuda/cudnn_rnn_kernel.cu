// CUDA kernels of the CudnnRNN ops (the generic path): the fused per-step elementwise kernels over the
// scalar math of common/cudnn_rnn_math.h; the GEMMs (ATen -> cuBLAS) and the time loops are the
// device-independent orchestration of csrc/cudnn_rnn/ops.cpp. One thread per (row, unit), grid-stride loops
// with int64 indices; `lens` (int32, device) masks finished rows.
#include "common/cudnn_rnn_math.h"
#include "cuda/cudnn_rnn_cudnn.h"
#include "cudnn_rnn/cudnn_rnn.h"
#include "cuda/grid_loop.cuh"

#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

namespace torchops {
namespace crnn {
namespace {

using cuda_grid::kThreads;
using cuda_grid::num_blocks;

// A row-strided matrix: element (b, k) at p[b * s + k].
template <typename U>
struct M {
  U* p;
  int64_t s;
  __device__ __forceinline__ U& operator()(int64_t b, int64_t k) const { return p[b * s + k]; }
};
template <typename U>
M<U> mat(const at::Tensor& t) {
  return t.defined() ? M<U>{t.data_ptr<U>(), t.stride(0)} : M<U>{nullptr, 0};
}

__device__ __forceinline__ bool active(const int32_t* lens, int64_t b, int64_t t) {
  return lens == nullptr || t < lens[b];
}

const int32_t* lens_ptr(const at::Tensor& lens) { return lens.defined() ? lens.const_data_ptr<int32_t>() : nullptr; }

// ---- forward ----
template <typename U>
__global__ void lstm_fwd_kernel(int64_t nb, int64_t H, int64_t O, M<U> g, M<U> cp, M<U> hp, M<U> co, M<U> hm, M<U> y,
                                bool proj, const int32_t* lens, int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    if (active(lens, b, t)) {
      const LstmFwd<U> r = lstm_fwd<U>(g(b, k), g(b, H + k), g(b, 2 * H + k), g(b, 3 * H + k), cp(b, k));
      g(b, k) = r.i;
      g(b, H + k) = r.f;
      g(b, 2 * H + k) = r.g;
      g(b, 3 * H + k) = r.o;
      co(b, k) = r.c;
      hm(b, k) = r.m;
      if (y.p && !proj) y(b, k) = r.m;
    } else {
      co(b, k) = cp(b, k);
      if (proj) {
        hm(b, k) = U(0);
      } else {
        hm(b, k) = hp(b, k);
        if (y.p) y(b, k) = U(0);
      }
    }
  }
}

template <typename U>
__global__ void gru_fwd_kernel(int64_t nb, int64_t H, M<U> g, M<U> gh, const U* br, M<U> hp, M<U> ghn, M<U> ho,
                               M<U> y, const int32_t* lens, int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    if (active(lens, b, t)) {
      const U hn = gh(b, 2 * H + k) + br[2 * H + k];
      const GruFwd<U> o = gru_fwd<U>(g(b, k), g(b, H + k), g(b, 2 * H + k), gh(b, k) + br[k],
                                     gh(b, H + k) + br[H + k], hn, hp(b, k));
      g(b, k) = o.r;
      g(b, H + k) = o.z;
      g(b, 2 * H + k) = o.n;
      ghn(b, k) = hn;
      ho(b, k) = o.h;
      y(b, k) = o.h;
    } else {
      ho(b, k) = hp(b, k);
      y(b, k) = U(0);
    }
  }
}

template <typename U>
__global__ void rnn_fwd_kernel(int64_t nb, int64_t H, M<U> g, M<U> hp, M<U> ho, M<U> y, bool relu, const int32_t* lens,
                               int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    if (active(lens, b, t)) {
      const U a = rnn_act<U>(g(b, k), relu);
      g(b, k) = a;
      ho(b, k) = a;
      y(b, k) = a;
    } else {
      ho(b, k) = hp(b, k);
      y(b, k) = U(0);
    }
  }
}

template <typename U>
__global__ void mask_state_kernel(int64_t nb, int64_t O, M<U> hn, M<U> hp, M<U> y, const int32_t* lens, int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * O) {
    const int64_t b = idx / O, k = idx % O;
    if (active(lens, b, t)) {
      y(b, k) = hn(b, k);
    } else {
      hn(b, k) = hp(b, k);
      y(b, k) = U(0);
    }
  }
}

// ---- backward ----
template <typename U>
__global__ void bwd_prep_kernel(int64_t nb, int64_t O, M<U> dhc, M<U> dy, M<U> dh, M<U> dhn, const int32_t* lens,
                                int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * O) {
    const int64_t b = idx / O, k = idx % O;
    if (active(lens, b, t)) {
      dh(b, k) = dhc(b, k) + (dy.p ? dy(b, k) : U(0));
      dhn(b, k) = U(0);
    } else {
      dh(b, k) = U(0);
      dhn(b, k) = dhc(b, k);
    }
  }
}

template <typename U>
__global__ void lstm_bwd_kernel(int64_t nb, int64_t H, M<U> g, M<U> c, M<U> cp, M<U> dm, M<U> dc, M<U> dg,
                                const int32_t* lens, int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    if (active(lens, b, t)) {
      const LstmBwd<U> r =
          lstm_bwd<U>(g(b, k), g(b, H + k), g(b, 2 * H + k), g(b, 3 * H + k), c(b, k), cp(b, k), dm(b, k), dc(b, k));
      dg(b, k) = r.di;
      dg(b, H + k) = r.df;
      dg(b, 2 * H + k) = r.dg;
      dg(b, 3 * H + k) = r.do_;
      dc(b, k) = r.dc_prev;
    } else {
      dg(b, k) = U(0);
      dg(b, H + k) = U(0);
      dg(b, 2 * H + k) = U(0);
      dg(b, 3 * H + k) = U(0);
    }
  }
}

template <typename U>
__global__ void gru_bwd_kernel(int64_t nb, int64_t H, M<U> g, M<U> ghn, M<U> hp, M<U> dh, M<U> dhn, M<U> dgx, M<U> dgh,
                               const int32_t* lens, int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    if (active(lens, b, t)) {
      const GruBwd<U> o = gru_bwd<U>(g(b, k), g(b, H + k), g(b, 2 * H + k), ghn(b, k), hp(b, k), dh(b, k));
      dgx(b, k) = o.dr;
      dgx(b, H + k) = o.dz;
      dgx(b, 2 * H + k) = o.dn;
      dgh(b, k) = o.dr;
      dgh(b, H + k) = o.dz;
      dgh(b, 2 * H + k) = o.dhn;
      dhn(b, k) += o.dh_prev;
    } else {
      for (int j = 0; j < 3; ++j) {
        dgx(b, j * H + k) = U(0);
        dgh(b, j * H + k) = U(0);
      }
    }
  }
}

template <typename U>
__global__ void rnn_bwd_kernel(int64_t nb, int64_t H, M<U> g, M<U> dh, M<U> dg, bool relu, const int32_t* lens,
                               int64_t t) {
  TORCHOPS_GRID_LOOP(idx, nb * H) {
    const int64_t b = idx / H, k = idx % H;
    dg(b, k) = active(lens, b, t) ? dh(b, k) * rnn_act_grad<U>(g(b, k), relu) : U(0);
  }
}

#define TORCHOPS_CRNN_LAUNCH(ref, n, kernel, ...)                                                           \
  do {                                                                                                      \
    const c10::cuda::CUDAGuard guard(ref.device());                                                         \
    if ((n) > 0) {                                                                                          \
      AT_DISPATCH_FLOATING_TYPES(ref.scalar_type(), "cudnn_rnn_cuda", [&] {                                 \
        using U = scalar_t;                                                                                 \
        kernel<U><<<num_blocks(n), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(__VA_ARGS__);           \
        C10_CUDA_KERNEL_LAUNCH_CHECK();                                                                     \
      });                                                                                                   \
    }                                                                                                       \
  } while (0)

void lstm_fwd_cuda(const at::Tensor& g, const at::Tensor& c_prev, const at::Tensor& h_prev, const at::Tensor& c_out,
                   const at::Tensor& hm_out, const at::Tensor& y, bool proj, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = c_prev.size(1), O = h_prev.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, lstm_fwd_kernel, nb, H, O, mat<U>(g), mat<U>(c_prev), mat<U>(h_prev), mat<U>(c_out),
                       mat<U>(hm_out), mat<U>(y), proj, lens_ptr(lens), t);
}

void gru_fwd_cuda(const at::Tensor& g, const at::Tensor& gh, const at::Tensor& b_r, const at::Tensor& h_prev,
                  const at::Tensor& ghn_out, const at::Tensor& h_out, const at::Tensor& y, const at::Tensor& lens,
                  int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, gru_fwd_kernel, nb, H, mat<U>(g), mat<U>(gh), b_r.const_data_ptr<U>(),
                       mat<U>(h_prev), mat<U>(ghn_out), mat<U>(h_out), mat<U>(y), lens_ptr(lens), t);
}

void rnn_fwd_cuda(const at::Tensor& g, const at::Tensor& h_prev, const at::Tensor& h_out, const at::Tensor& y,
                  bool relu, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, rnn_fwd_kernel, nb, H, mat<U>(g), mat<U>(h_prev), mat<U>(h_out), mat<U>(y), relu,
                       lens_ptr(lens), t);
}

void mask_state_cuda(const at::Tensor& h_new, const at::Tensor& h_prev, const at::Tensor& y, const at::Tensor& lens,
                     int64_t t) {
  const int64_t nb = h_new.size(0), O = h_new.size(1);
  TORCHOPS_CRNN_LAUNCH(h_new, nb * O, mask_state_kernel, nb, O, mat<U>(h_new), mat<U>(h_prev), mat<U>(y),
                       lens_ptr(lens), t);
}

void bwd_prep_cuda(const at::Tensor& dh_carry, const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& dh_next,
                   const at::Tensor& lens, int64_t t) {
  const int64_t nb = dh.size(0), O = dh.size(1);
  TORCHOPS_CRNN_LAUNCH(dh, nb * O, bwd_prep_kernel, nb, O, mat<U>(dh_carry), mat<U>(dy), mat<U>(dh), mat<U>(dh_next),
                       lens_ptr(lens), t);
}

void lstm_bwd_cuda(const at::Tensor& g, const at::Tensor& c, const at::Tensor& c_prev, const at::Tensor& dm,
                   const at::Tensor& dc, const at::Tensor& dg, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = c.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, lstm_bwd_kernel, nb, H, mat<U>(g), mat<U>(c), mat<U>(c_prev), mat<U>(dm), mat<U>(dc),
                       mat<U>(dg), lens_ptr(lens), t);
}

void gru_bwd_cuda(const at::Tensor& g, const at::Tensor& ghn, const at::Tensor& h_prev, const at::Tensor& dh,
                  const at::Tensor& dh_next, const at::Tensor& dgx, const at::Tensor& dgh, const at::Tensor& lens,
                  int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, gru_bwd_kernel, nb, H, mat<U>(g), mat<U>(ghn), mat<U>(h_prev), mat<U>(dh),
                       mat<U>(dh_next), mat<U>(dgx), mat<U>(dgh), lens_ptr(lens), t);
}

void rnn_bwd_cuda(const at::Tensor& g, const at::Tensor& dh, const at::Tensor& dg, bool relu, const at::Tensor& lens,
                  int64_t t) {
  const int64_t nb = g.size(0), H = g.size(1);
  TORCHOPS_CRNN_LAUNCH(g, nb * H, rnn_bwd_kernel, nb, H, mat<U>(g), mat<U>(dh), mat<U>(dg), relu, lens_ptr(lens), t);
}

#undef TORCHOPS_CRNN_LAUNCH

const Kernels kCudaKernels{lstm_fwd_cuda, gru_fwd_cuda, rnn_fwd_cuda, mask_state_cuda, bwd_prep_cuda,
                           lstm_bwd_cuda, gru_bwd_cuda, rnn_bwd_cuda, c10::DeviceType::CUDA, &route::cuda_loops,
                           {&route::cuda_cudnn, cudnn_forward, cudnn_backward}};

}  // namespace
}  // namespace crnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CUDA, m) {
  using namespace torchops::crnn;
  m.impl("cudnn_rnn", &Impls<kCudaKernels>::v1);
  m.impl("cudnn_rnn_v2", &Impls<kCudaKernels>::v2);
  m.impl("cudnn_rnn_v3", &Impls<kCudaKernels>::v3);
  m.impl("cudnn_rnn_backprop", &Impls<kCudaKernels>::bwd_v1);
  m.impl("cudnn_rnn_backprop_v2", &Impls<kCudaKernels>::bwd_v2);
  m.impl("cudnn_rnn_backprop_v3", &Impls<kCudaKernels>::bwd_v3);
}
