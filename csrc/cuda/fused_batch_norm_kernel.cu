// CUDA kernels of FusedBatchNormV3 / FusedBatchNormGradV3.
//
// Per-channel reductions run in two steps: a partial kernel reduces a slice of every channel into
// a [splits, C] workspace (Welford states for the statistics, plain sums for the gradient), and a
// per-channel finalize kernel merges the slices and derives the per-channel coefficients. Both
// layouts read coalesced: channels-first blocks walk one channel's contiguous runs; channels-last
// blocks are 32 channels wide (a warp reads 32 consecutive channels of a row) and 8 rows tall.
// The element-wise passes then apply the shared scalar math of common/fused_batch_norm_math.h. Where cuDNN
// runs the case and its route is on, the Kernels table's library routes (cuda/fused_batch_norm_cudnn.cpp) take it
// instead.
#include "common/fused_batch_norm_math.h"
#include "cuda/fused_batch_norm_cudnn.h"
#include "fused_batch_norm/fused_batch_norm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>

namespace torchops {
namespace fbn {
namespace {

constexpr int kThreads = 256;      // channels-first reduction and element-wise blocks
constexpr int kTileC = 32;         // channels-last reduction block: 32 channels x 8 rows
constexpr int kTileRows = 8;

// ---------------------------------------------------------------- reduction policies

template <typename U>
struct MomentsOp {
  using State = Welford<U>;
  template <typename T>
  __device__ static void update(State& s, const T* x, const T* /*dy*/, int64_t idx, U /*mu*/) {
    s.update(static_cast<U>(x[idx]));
  }
  __device__ static void merge(State& a, const State& b) { a.merge(b); }
};

template <typename U>
struct GradSums {
  U dy = U(0);
  U dyxc = U(0);
};

template <typename U>
struct GradSumsOp {
  using State = GradSums<U>;
  template <typename T>
  __device__ static void update(State& s, const T* x, const T* dy, int64_t idx, U mu) {
    const U g = static_cast<U>(dy[idx]);
    s.dy += g;
    s.dyxc += g * (static_cast<U>(x[idx]) - mu);
  }
  __device__ static void merge(State& a, const State& b) {
    a.dy += b.dy;
    a.dyxc += b.dyxc;
  }
};

// ---------------------------------------------------------------- partial reductions

// Channels-first [outer, C, inner]: block (c, split) reduces elements m in [split*per, (split+1)*per)
// of channel c, m = o * inner + i.
template <typename Op, typename T, typename U>
__global__ void partial_channels_first(const T* x, const T* dy, const U* mu, int64_t C, int64_t inner, int64_t n,
                                       int64_t per_split, typename Op::State* out) {
  using State = typename Op::State;
  extern __shared__ unsigned char smem_raw[];
  State* smem = reinterpret_cast<State*>(smem_raw);
  const int64_t c = blockIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t m1 = std::min(n, m0 + per_split);
  const U m = mu ? mu[c] : U(0);
  State s;
  for (int64_t k = m0 + threadIdx.x; k < m1; k += blockDim.x) {
    const int64_t o = k / inner, i = k - o * inner;
    Op::update(s, x, dy, (o * C + c) * inner + i, m);
  }
  smem[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) Op::merge(smem[threadIdx.x], smem[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[static_cast<int64_t>(blockIdx.y) * C + c] = smem[0];
}

// Channels-last [rows, C]: block (tile, split) reduces rows [split*per, (split+1)*per) of channels
// tile*32 .. tile*32+31; thread (tx, ty) takes channel tile*32+tx and every 8th row.
template <typename Op, typename T, typename U>
__global__ void partial_channels_last(const T* x, const T* dy, const U* mu, int64_t C, int64_t rows,
                                      int64_t per_split, typename Op::State* out) {
  using State = typename Op::State;
  extern __shared__ unsigned char smem_raw[];
  State* smem = reinterpret_cast<State*>(smem_raw);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileC + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * per_split;
  const int64_t r1 = std::min(rows, r0 + per_split);
  State s;
  if (c < C) {
    const U m = mu ? mu[c] : U(0);
    for (int64_t r = r0 + ty; r < r1; r += kTileRows) Op::update(s, x, dy, r * C + c, m);
  }
  smem[ty * kTileC + tx] = s;
  __syncthreads();
  for (int stride = kTileRows / 2; stride > 0; stride >>= 1) {
    if (ty < stride) Op::merge(smem[ty * kTileC + tx], smem[(ty + stride) * kTileC + tx]);
    __syncthreads();
  }
  if (ty == 0 && c < C) out[static_cast<int64_t>(blockIdx.y) * C + c] = smem[tx];
}

// Runs the partial reduction for either layout; returns the [splits, C] workspace and splits.
template <typename Op, typename T, typename U>
std::pair<at::Tensor, int64_t> reduce_partials(const Layout& L, const T* x, const T* dy, const U* mu,
                                               const at::TensorOptions& opts) {
  using State = typename Op::State;
  const int64_t C = L.channels;
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const auto stream = at::cuda::getCurrentCUDAStream();
  const int64_t target_blocks = 4 * static_cast<int64_t>(sms);
  if (L.inner > 1) {
    const int64_t n = L.n();
    const int64_t splits = std::max<int64_t>(
        1, std::min<int64_t>({(n + kThreads * 8 - 1) / (kThreads * 8), (target_blocks + C - 1) / C, 65535}));
    const int64_t per = (n + splits - 1) / splits;
    at::Tensor ws = at::empty({splits * C * static_cast<int64_t>(sizeof(State))}, opts.dtype(at::kByte));
    const dim3 grid(static_cast<unsigned>(C), static_cast<unsigned>(splits));
    partial_channels_first<Op, T, U><<<grid, kThreads, kThreads * sizeof(State), stream>>>(
        x, dy, mu, C, L.inner, n, per, reinterpret_cast<State*>(ws.mutable_data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return {ws, splits};
  }
  const int64_t tiles = (C + kTileC - 1) / kTileC;
  const int64_t rows = L.outer;
  const int64_t splits = std::max<int64_t>(
      1, std::min<int64_t>({(rows + kTileRows * 16 - 1) / (kTileRows * 16), (target_blocks + tiles - 1) / tiles, 65535}));
  const int64_t per = (rows + splits - 1) / splits;
  at::Tensor ws = at::empty({splits * C * static_cast<int64_t>(sizeof(State))}, opts.dtype(at::kByte));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  const dim3 block(kTileC, kTileRows);
  partial_channels_last<Op, T, U><<<grid, block, kTileC * kTileRows * sizeof(State), stream>>>(
      x, dy, mu, C, rows, per, reinterpret_cast<State*>(ws.mutable_data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {ws, splits};
}

// ---------------------------------------------------------------- per-channel finalize

template <typename U>
__global__ void finalize_moments(const Welford<U>* partial, int64_t splits, int64_t C, const U* scale, U eps,
                                 U* mean_out, U* var_out, U* alpha) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  Welford<U> w;
  for (int64_t s = 0; s < splits; ++s) w.merge(partial[s * C + c]);
  const U var = w.m2 / static_cast<U>(w.n);  // biased
  mean_out[c] = w.mean;
  var_out[c] = var;
  alpha[c] = inv_std(var, eps) * scale[c];
}

template <typename U>
__global__ void inference_alpha(const U* scale, const U* var, U eps, int64_t C, U* alpha) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < C) alpha[c] = inv_std(var[c], eps) * scale[c];
}

template <typename U>
__global__ void finalize_grad(const GradSums<U>* partial, int64_t splits, int64_t C, const U* scale, const U* var,
                              U eps, int64_t n, bool training, U* dscale, U* doffset, GradCoefs<U>* coefs) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  GradSums<U> s;
  for (int64_t k = 0; k < splits; ++k) GradSumsOp<U>::merge(s, partial[k * C + c]);
  doffset[c] = s.dy;
  dscale[c] = s.dyxc * inv_std(var[c], eps);
  coefs[c] = grad_coefs<U>(scale[c], var[c], eps, s.dy, s.dyxc, n, training);
}

// ---------------------------------------------------------------- element-wise passes

template <typename T, typename U>
__global__ void normalize_kernel(const T* x, const U* mean, const U* alpha, const U* offset, int64_t numel,
                                 int64_t C, int64_t inner, T* y) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t c = (i / inner) % C;
    y[i] = static_cast<T>(normalize(static_cast<U>(x[i]), mean[c], alpha[c], offset[c]));
  }
}

template <typename T, typename U>
__global__ void grad_input_kernel(const T* dy, const T* x, const U* mu, const GradCoefs<U>* coefs, int64_t numel,
                                  int64_t C, int64_t inner, T* dx) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const int64_t c = (i / inner) % C;
    dx[i] = static_cast<T>(grad_input(static_cast<U>(dy[i]), static_cast<U>(x[i]), mu[c], coefs[c]));
  }
}

// The normalisation written for bandwidth: 16-byte loads and stores, the channel found once per vector by
// multiply-shift division (no per-element 64-bit division), a few vectors in flight per thread.
// Channels-first planes (inner % VEC == 0): a vector lies in one plane, one channel. Channels-last rows
// (inner == 1, C % VEC == 0): a vector holds VEC consecutive channels.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

constexpr int kUnroll = 4;

template <typename T, typename U, int VEC, bool kChannelsLast>
__global__ void normalize_vec_kernel(const T* __restrict__ x, const U* __restrict__ mean,
                                     const U* __restrict__ alpha, const U* __restrict__ offset, uint32_t nvec,
                                     at::cuda::detail::IntDivider<uint32_t> inner, at::cuda::detail::IntDivider<uint32_t> channels,
                                     T* __restrict__ y) {
  using P = Pack<T, VEC>;
  const P* xv = reinterpret_cast<const P*>(x);
  P* yv = reinterpret_cast<P*>(y);
  const uint32_t nthreads = gridDim.x * blockDim.x;
  for (uint32_t base = blockIdx.x * blockDim.x + threadIdx.x; base < nvec; base += nthreads * kUnroll) {
    P in[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t v = base + k * nthreads;
      if (v < nvec) in[k] = xv[v];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t v = base + k * nthreads;
      if (v >= nvec) continue;
      P out;
      if constexpr (kChannelsLast) {
        const uint32_t c0 = channels.divmod(v * VEC).mod;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          out.v[j] = static_cast<T>(normalize(static_cast<U>(in[k].v[j]), mean[c0 + j], alpha[c0 + j], offset[c0 + j]));
        }
      } else {
        const uint32_t c = channels.divmod(inner.div(v * VEC)).mod;
        const U m = mean[c], a = alpha[c], o = offset[c];
#pragma unroll
        for (int j = 0; j < VEC; ++j) out.v[j] = static_cast<T>(normalize(static_cast<U>(in[k].v[j]), m, a, o));
      }
      yv[v] = out;
    }
  }
}

unsigned elementwise_blocks(int64_t numel) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((numel + kThreads - 1) / kThreads, sms * 32)));
}

unsigned channel_blocks(int64_t C) { return static_cast<unsigned>((C + kThreads - 1) / kThreads); }

// y = normalize(x) with per-channel mean, alpha, offset: the vectorized kernel where its route is on and the
// layout and the pointers allow it, the plain one otherwise.
template <typename T, typename U>
void launch_normalize(const Layout& L, const T* x, const U* mean, const U* alpha, const U* offset, int64_t numel,
                      T* y, cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0;
  const bool fits = numel <= static_cast<int64_t>(UINT32_MAX) && L.channels <= static_cast<int64_t>(UINT32_MAX) &&
                    L.inner <= static_cast<int64_t>(UINT32_MAX);
  const bool last = L.inner == 1;
  if (route::cuda_vectorized.enabled() && aligned && fits && (last ? L.channels % VEC == 0 : L.inner % VEC == 0)) {
    route::cuda_vectorized.ran();
    const auto nvec = static_cast<uint32_t>(numel / VEC);
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    const int64_t per_sm = at::cuda::getCurrentDeviceProperties()->maxThreadsPerMultiProcessor / kThreads;
    const auto blocks = static_cast<unsigned>(std::max<int64_t>(
        1, std::min<int64_t>((nvec + kThreads * kUnroll - 1) / (kThreads * kUnroll), sms * per_sm)));
    const at::cuda::detail::IntDivider<uint32_t> inner(static_cast<uint32_t>(L.inner));
    const at::cuda::detail::IntDivider<uint32_t> channels(static_cast<uint32_t>(L.channels));
    if (last) {
      normalize_vec_kernel<T, U, VEC, true><<<blocks, kThreads, 0, stream>>>(x, mean, alpha, offset, nvec, inner,
                                                                             channels, y);
    } else {
      normalize_vec_kernel<T, U, VEC, false><<<blocks, kThreads, 0, stream>>>(x, mean, alpha, offset, nvec, inner,
                                                                              channels, y);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  route::cuda_plain.ran();
  normalize_kernel<T, U><<<elementwise_blocks(numel), kThreads, 0, stream>>>(x, mean, alpha, offset, numel,
                                                                            L.channels, L.inner, y);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------- Kernels entry points

void train_forward_cuda(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        double eps, at::Tensor& y, at::Tensor& mean_out, at::Tensor& var_out) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cuda", [&] {
    using U = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    auto [ws, splits] = reduce_partials<MomentsOp<U>, scalar_t, U>(L, xp, nullptr, nullptr, x.options());
    at::Tensor alpha = at::empty({L.channels}, mean_out.options());
    finalize_moments<U><<<channel_blocks(L.channels), kThreads, 0, stream>>>(
        reinterpret_cast<const Welford<U>*>(ws.const_data_ptr()), splits, L.channels, scale.const_data_ptr<U>(),
        static_cast<U>(eps), mean_out.mutable_data_ptr<U>(), var_out.mutable_data_ptr<U>(),
        alpha.mutable_data_ptr<U>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_normalize<scalar_t, U>(L, xp, mean_out.const_data_ptr<U>(), alpha.const_data_ptr<U>(),
                                  offset.const_data_ptr<U>(), x.numel(), y.mutable_data_ptr<scalar_t>(), stream);
  });
}

void infer_forward_cuda(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        const at::Tensor& mean, const at::Tensor& var, double eps, at::Tensor& y) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cuda", [&] {
    using U = at::opmath_type<scalar_t>;
    at::Tensor alpha = at::empty({L.channels}, mean.options());
    inference_alpha<U><<<channel_blocks(L.channels), kThreads, 0, stream>>>(
        scale.const_data_ptr<U>(), var.const_data_ptr<U>(), static_cast<U>(eps), L.channels,
        alpha.mutable_data_ptr<U>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_normalize<scalar_t, U>(L, x.const_data_ptr<scalar_t>(), mean.const_data_ptr<U>(), alpha.const_data_ptr<U>(),
                                  offset.const_data_ptr<U>(), x.numel(), y.mutable_data_ptr<scalar_t>(), stream);
  });
}

void backward_cuda(const Layout& L, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                   const at::Tensor& mu, const at::Tensor& var, double eps, bool training, at::Tensor& dx,
                   at::Tensor& dscale, at::Tensor& doffset) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_grad_v3_cuda", [&] {
    using U = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    const U* mup = mu.const_data_ptr<U>();
    auto [ws, splits] = reduce_partials<GradSumsOp<U>, scalar_t, U>(L, xp, gp, mup, x.options());
    at::Tensor coefs = at::empty({L.channels * static_cast<int64_t>(sizeof(GradCoefs<U>))}, x.options().dtype(at::kByte));
    finalize_grad<U><<<channel_blocks(L.channels), kThreads, 0, stream>>>(
        reinterpret_cast<const GradSums<U>*>(ws.const_data_ptr()), splits, L.channels, scale.const_data_ptr<U>(),
        var.const_data_ptr<U>(), static_cast<U>(eps), L.n(), training, dscale.mutable_data_ptr<U>(),
        doffset.mutable_data_ptr<U>(), reinterpret_cast<GradCoefs<U>*>(coefs.mutable_data_ptr()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    grad_input_kernel<scalar_t, U><<<elementwise_blocks(x.numel()), kThreads, 0, stream>>>(
        gp, xp, mup, reinterpret_cast<const GradCoefs<U>*>(coefs.const_data_ptr()), x.numel(), L.channels, L.inner,
        dx.mutable_data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

const Kernels kCudaKernels{train_forward_cuda, infer_forward_cuda, backward_cuda, &route::cuda_kernels,
                           {{&route::cuda_cudnn, cudnn_forward, cudnn_backward},
                            {&route::cuda_cudnn_inference, cudnn_inference_forward, nullptr}}};

}  // namespace
}  // namespace fbn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CUDA, m) {
  using namespace torchops::fbn;
  m.impl("fused_batch_norm_v3", &Impls<kCudaKernels>::fused_batch_norm_v3);
  m.impl("fused_batch_norm_grad_v3", &Impls<kCudaKernels>::fused_batch_norm_grad_v3);
}
