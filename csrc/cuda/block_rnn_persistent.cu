// Whole-sequence CUDA recurrences of BlockLSTM(V2), BlockGRU and their gradients (Kernels::*_sequence in
// block_rnn/block_rnn.h): one cooperative launch runs all L steps, with a grid-wide barrier wherever a
// step needs values that other blocks wrote. Block k owns cells [k * nc, k * nc + ncb) and every gate
// column of them, so the gate math of a (row, cell) stays in one thread; the block's slice of the
// recurrent weight is copied to shared memory once when it fits, else read through L2 on every step.
// The input projections (x rows of the weights) and every weight gradient stay big GEMMs in
// block_rnn/ops.cpp. Scalar math: common/block_rnn_math.h, as the per-step kernels.
#include "block_rnn/block_rnn.h"
#include "common/block_rnn_math.h"

#include <ATen/OpMathType.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

namespace torchops {
namespace brnn {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kRows = 4;             // batch rows per thread
constexpr int kMaxSplit = 8;         // threads that share one (rows, cell) dot product
constexpr int kTileElems = 4096;     // staged source elements per tile
constexpr int kPrefetch = kTileElems / kThreads;  // of them per thread, held in registers

// Launch geometry, the same numbers on the host (shared memory size) and in every block.
struct Geo {
  int B, C;      // batch rows, cells
  int nc;        // cells per block; the last block owns C - (grid - 1) * nc of them
  int kt;        // source columns per staged tile
  int rows_cap;  // most source rows one pass of a block stages
};

// A block's slice of a recurrent weight: element (k, g, j) (source column k, gate g, owned cell j) is
// p[k * sk + g * sg + j * sj] in global memory, or p[(k * NG + g) * ncb + j] in its shared memory copy.
template <typename T>
struct GView {
  const T* p;
  int64_t sk, sg, sj;
};

template <typename T, bool kSmem>
struct WSlice {
  const T* p;
  int64_t sk, sg, sj;  // global
  int rs, gs;          // shared: row stride NG * ncb, gate stride ncb
  __device__ __forceinline__ T get(int64_t k, int g, int j) const {
    if constexpr (kSmem) {
      return p[k * rs + g * gs + j];
    } else {
      return __ldg(p + k * sk + g * sg + j * sj);
    }
  }
};

// The slice of `v` (K source columns, NG gates, ncb cells), copied into `smem` when kSmem. The copy is
// complete after the block's next __syncthreads (block_matmul starts with one).
template <typename T, bool kSmem>
__device__ WSlice<T, kSmem> weight_slice(T* smem, GView<T> v, int64_t K, int NG, int ncb) {
  WSlice<T, kSmem> w{v.p, v.sk, v.sg, v.sj, NG * ncb, ncb};
  if constexpr (kSmem) {
    const int64_t n = K * NG * ncb;
    for (int64_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
      const int j = static_cast<int>(idx % ncb);
      const int64_t r = idx / ncb;
      const int g = static_cast<int>(r % NG);
      const int64_t k = r / NG;
      smem[idx] = v.p[k * v.sk + g * v.sg + j * v.sj];
    }
    w.p = smem;
  }
  return w;
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <typename T>
__device__ __forceinline__ at::opmath_type<T> ld(const T* p, int64_t k) {
  return p ? static_cast<at::opmath_type<T>>(p[k]) : at::opmath_type<T>(0);
}

// Values other blocks of this launch wrote (ordered by grid.sync()): read from L2, never from a stale L1 line.
template <typename T>
__device__ __forceinline__ at::opmath_type<T> ldl2(const T* p) {
  return static_cast<at::opmath_type<T>>(__ldcg(p));
}

// acc[g] = sum_k S[b, k] * W(k, g, j) for every (row b, owned cell j) of the block, then epi(b, j, acc).
// S is [B, K] with row stride lds, read through L2 (other blocks may have written it). A thread computes
// kRows rows of one cell (the weights it loads serve kRows rows); groups (rows b0 .. b0 + kRows - 1, cell
// j) = (group / ncb * kRows, group % ncb) go to threads in passes of kThreads / split; with few groups,
// `split` threads share one group's k range and their partial sums are added in shared memory. The source
// rows of a pass are staged in tiles of kt columns, the next tile prefetched into registers during the
// current one. Every thread of the block must call it.
template <int NG, typename T, bool kSmem, typename Epi>
__device__ void block_matmul(const Geo& geo, int ncb, const T* S, int64_t lds, int64_t K,
                             const WSlice<T, kSmem>& w, at::opmath_type<T>* tile, at::opmath_type<T>* red,
                             const Epi& epi) {
  using U = at::opmath_type<T>;
  const int groups = (geo.B + kRows - 1) / kRows * ncb;
  int split = 1;
  while (split < kMaxSplit && groups * split * 2 <= kThreads) split *= 2;
  const int per_pass = kThreads / split;
  const int slot = threadIdx.x % per_pass, part = threadIdx.x / per_pass;
  const int ts = geo.kt + 1;  // odd row stride: the rows of one tile column fall in different banks
  for (int i0 = 0; i0 < groups; i0 += per_pass) {
    const int i1 = min(groups, i0 + per_pass);
    const int b_lo = i0 / ncb * kRows, rows = min(geo.B, ((i1 - 1) / ncb + 1) * kRows) - b_lo;
    const int grp = i0 + slot;
    const bool active = grp < i1;
    const int b0 = (active ? grp / ncb : i0 / ncb) * kRows, j = active ? grp % ncb : 0;
    int roff[kRows];  // tile offsets of the thread's rows; rows past B repeat row B - 1 (never written out)
#pragma unroll
    for (int r = 0; r < kRows; ++r) roff[r] = (min(b0 + r, geo.B - 1) - b_lo) * ts;
    U acc[kRows][NG];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int g = 0; g < NG; ++g) acc[r][g] = U(0);
    }
    U pf[kPrefetch];
    auto fetch = [&](int64_t k0, int kt) {
#pragma unroll
      for (int q = 0; q < kPrefetch; ++q) {
        const int idx = threadIdx.x + q * kThreads;
        if (idx < rows * kt) pf[q] = ldl2(S + static_cast<int64_t>(b_lo + idx / kt) * lds + k0 + idx % kt);
      }
    };
    int kt = static_cast<int>(min64(geo.kt, K));
    fetch(0, kt);
    for (int64_t k0 = 0; k0 < K; k0 += geo.kt) {
      kt = static_cast<int>(min64(geo.kt, K - k0));
      __syncthreads();  // the previous tile is consumed (and a weight slice copy complete)
#pragma unroll
      for (int q = 0; q < kPrefetch; ++q) {
        const int idx = threadIdx.x + q * kThreads;
        if (idx < rows * kt) tile[(idx / kt) * ts + idx % kt] = pf[q];
      }
      __syncthreads();
      const int64_t k1 = k0 + geo.kt;
      if (k1 < K) fetch(k1, static_cast<int>(min64(geo.kt, K - k1)));
      if (active) {
        for (int kk = part; kk < kt; kk += split) {
          U wv[NG];
#pragma unroll
          for (int g = 0; g < NG; ++g) wv[g] = static_cast<U>(w.get(k0 + kk, g, j));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const U s = tile[roff[r] + kk];
#pragma unroll
            for (int g = 0; g < NG; ++g) acc[r][g] += s * wv[g];
          }
        }
      }
    }
    if (split > 1) {
      U* mine = red + (part * per_pass + slot) * kRows * NG;
      if (active) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
#pragma unroll
          for (int g = 0; g < NG; ++g) mine[r * NG + g] = acc[r][g];
        }
      }
      __syncthreads();
      if (active && part == 0) {
        for (int p = 1; p < split; ++p) {
          const U* other = red + (p * per_pass + slot) * kRows * NG;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
#pragma unroll
            for (int g = 0; g < NG; ++g) acc[r][g] += other[r * NG + g];
          }
        }
      }
    }
    if (active && part == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (b0 + r < geo.B) epi(b0 + r, j, acc[r]);
      }
    }
    if (split > 1) __syncthreads();  // `red` is reused by the next pass
  }
}

// Shared memory: [red: kThreads * kRows * NG][tile: rows_cap * (kt + 1)] in U, then the weight slices in T.
template <typename T>
struct Smem {
  at::opmath_type<T>* red;
  at::opmath_type<T>* tile;
  T* w;
};

template <typename T>
__device__ Smem<T> carve(const Geo& geo, int ng_max) {
  using U = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem<T> s;
  s.red = reinterpret_cast<U*>(smem_raw);
  s.tile = s.red + kThreads * kRows * ng_max;
  s.w = reinterpret_cast<T*>(s.tile + geo.rows_cap * (geo.kt + 1));
  return s;
}

// ------------------------------------------------------------------------------------------------
// LSTM
// ------------------------------------------------------------------------------------------------
template <typename T>
struct LstmFwdParams {
  const T *pre, *w_h, *cs0, *h0, *wci, *wcf, *wco;
  T *i, *cs, *f, *o, *ci, *co, *h;
  int64_t ldw;  // row stride of w_h
  at::opmath_type<T> forget_bias, cell_clip;
  bool peep, ifco;
  int L;
  Geo geo;
};

template <typename T, bool kSmem>
__global__ void __launch_bounds__(kThreads, 1) lstm_forward_sequence_kernel(LstmFwdParams<T> p) {
  using U = at::opmath_type<T>;
  cg::grid_group grid = cg::this_grid();
  const Geo& geo = p.geo;
  const int C = geo.C, c0 = blockIdx.x * geo.nc, ncb = min(geo.nc, C - c0);
  const int64_t BC = static_cast<int64_t>(geo.B) * C;
  const Smem<T> sm = carve<T>(geo, 4);
  const auto w = weight_slice<T, kSmem>(sm.w, GView<T>{p.w_h + c0, p.ldw, C, 1}, C, 4, ncb);
  for (int t = 0; t < p.L; ++t) {
    const T* hp = t == 0 ? p.h0 : p.h + (t - 1) * BC;
    const T* pre = p.pre + t * BC * 4;
    block_matmul<4>(geo, ncb, hp, C, C, w, sm.tile, sm.red, [&](int b, int j, const U* acc) {
      const int c = c0 + j;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const T* g = pre + static_cast<int64_t>(b) * 4 * C + c;
      const U csp = t == 0 ? static_cast<U>(p.cs0[e]) : ldl2(p.cs + s - BC);
      // Column blocks i, ci, f, o: 0, 1, 2, 3 (ICFO) or 0, 2, 1, 3 (IFCO); constant acc indices keep acc in
      // registers.
      const U a_ci = p.ifco ? acc[2] : acc[1], a_f = p.ifco ? acc[1] : acc[2];
      const LstmForward<U> r = lstm_forward<U>(
          static_cast<U>(g[0]) + acc[0], static_cast<U>(g[p.ifco ? 2 * C : C]) + a_ci,
          static_cast<U>(g[p.ifco ? C : 2 * C]) + a_f, static_cast<U>(g[3 * C]) + acc[3], csp,
          static_cast<U>(p.wci[c]), static_cast<U>(p.wcf[c]), static_cast<U>(p.wco[c]), p.forget_bias, p.cell_clip,
          p.peep);
      p.i[s] = static_cast<T>(r.i);
      p.cs[s] = static_cast<T>(r.cs);
      p.f[s] = static_cast<T>(r.f);
      p.o[s] = static_cast<T>(r.o);
      p.ci[s] = static_cast<T>(r.ci);
      p.co[s] = static_cast<T>(r.co);
      p.h[s] = static_cast<T>(r.h);
    });
    if (t + 1 < p.L) grid.sync();  // h_t of every cell before step t + 1
  }
}

template <typename T>
struct LstmBwdParams {
  const T *i, *cs, *f, *o, *ci, *co, *cs0, *wci, *wcf, *wco, *w_h;
  const T *h_grad, *cs_grad, *g_i, *g_f, *g_o, *g_ci, *g_co;  // null: zeros
  T *dgates, *dh, *dcs;
  int64_t ldw;
  int qi, qci, qf, qo;
  bool peep, gates;
  int L;
  Geo geo;
};

// Step t: the cell backward of the owned cells (dh, dcs carries -> dgates_t, dcs), then
// dh = dgates_t @ w_h^T for the owned cells (w_h's rows of them: the transposed slice).
template <typename T, bool kSmem>
__global__ void __launch_bounds__(kThreads, 1) lstm_backward_sequence_kernel(LstmBwdParams<T> p) {
  using U = at::opmath_type<T>;
  cg::grid_group grid = cg::this_grid();
  const Geo& geo = p.geo;
  const int C = geo.C, c0 = blockIdx.x * geo.nc, ncb = min(geo.nc, C - c0);
  const int64_t BC = static_cast<int64_t>(geo.B) * C;
  const Smem<T> sm = carve<T>(geo, 1);
  const auto w = weight_slice<T, kSmem>(sm.w, GView<T>{p.w_h + c0 * p.ldw, 1, 0, p.ldw}, 4 * C, 1, ncb);
  for (int t = p.L - 1; t >= 0; --t) {
    __syncthreads();  // dh of the owned cells, written by other threads of this block
    for (int it = threadIdx.x; it < geo.B * ncb; it += kThreads) {
      const int b = it / ncb, c = c0 + it % ncb;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const U dh = ld(p.h_grad, s) + ldl2(p.dh + e);
      const U dcs_in = ld(p.cs_grad, s) + ldl2(p.dcs + e);
      const U csp = t == 0 ? static_cast<U>(p.cs0[e]) : static_cast<U>(p.cs[s - BC]);
      const LstmBackward<U> r = lstm_backward<U>(
          static_cast<U>(p.i[s]), static_cast<U>(p.cs[s]), static_cast<U>(p.f[s]), static_cast<U>(p.o[s]),
          static_cast<U>(p.ci[s]), static_cast<U>(p.co[s]), csp, static_cast<U>(p.wci[c]), static_cast<U>(p.wcf[c]),
          static_cast<U>(p.wco[c]), dh, dcs_in, ld(p.g_i, s), ld(p.g_f, s), ld(p.g_o, s), ld(p.g_ci, s),
          ld(p.g_co, s), p.peep, p.gates);
      T* dg = p.dgates + (t * static_cast<int64_t>(geo.B) + b) * 4 * C + c;
      dg[p.qi * C] = static_cast<T>(r.di);
      dg[p.qci * C] = static_cast<T>(r.dci);
      dg[p.qf * C] = static_cast<T>(r.df);
      dg[p.qo * C] = static_cast<T>(r.do_);
      p.dcs[e] = static_cast<T>(r.cs_prev_grad);
    }
    grid.sync();  // dgates_t of every cell
    block_matmul<1>(geo, ncb, p.dgates + t * BC * 4, 4 * C, 4 * C, w, sm.tile, sm.red,
                    [&](int b, int j, const U* acc) {
                      p.dh[static_cast<int64_t>(b) * C + c0 + j] = static_cast<T>(acc[0]);
                    });
    // No grid barrier: step t - 1 reads only its own cells' dh before the next one.
  }
}

// ------------------------------------------------------------------------------------------------
// GRU
// ------------------------------------------------------------------------------------------------
template <typename T>
struct GruFwdParams {
  const T *pre_ru, *pre_c, *w_ru_h, *w_c_h, *h0;
  T *r, *u, *c, *h, *hr;  // hr: [B,C] workspace
  int64_t ld_ru, ld_c;
  int L;
  Geo geo;
};

template <typename T, bool kSmem>
__global__ void __launch_bounds__(kThreads, 1) gru_forward_sequence_kernel(GruFwdParams<T> p) {
  using U = at::opmath_type<T>;
  cg::grid_group grid = cg::this_grid();
  const Geo& geo = p.geo;
  const int C = geo.C, c0 = blockIdx.x * geo.nc, ncb = min(geo.nc, C - c0);
  const int64_t BC = static_cast<int64_t>(geo.B) * C;
  const Smem<T> sm = carve<T>(geo, 2);
  const auto w_ru = weight_slice<T, kSmem>(sm.w, GView<T>{p.w_ru_h + c0, p.ld_ru, C, 1}, C, 2, ncb);
  const auto w_c =
      weight_slice<T, kSmem>(sm.w + static_cast<int64_t>(C) * 2 * ncb, GView<T>{p.w_c_h + c0, p.ld_c, 0, 1}, C, 1, ncb);
  for (int t = 0; t < p.L; ++t) {
    const T* hp = t == 0 ? p.h0 : p.h + (t - 1) * BC;
    block_matmul<2>(geo, ncb, hp, C, C, w_ru, sm.tile, sm.red, [&](int b, int j, const U* acc) {
      const int c = c0 + j;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const T* g = p.pre_ru + (t * static_cast<int64_t>(geo.B) + b) * 2 * C + c;
      const GruGates<U> o = gru_gates<U>(static_cast<U>(g[0]) + acc[0], static_cast<U>(g[C]) + acc[1], ldl2(hp + e));
      p.r[s] = static_cast<T>(o.r);
      p.u[s] = static_cast<T>(o.u);
      p.hr[e] = static_cast<T>(o.hr);
    });
    grid.sync();  // h_{t-1} * r_t of every cell
    block_matmul<1>(geo, ncb, p.hr, C, C, w_c, sm.tile, sm.red, [&](int b, int j, const U* acc) {
      const int c = c0 + j;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const GruOutput<U> o = gru_output<U>(static_cast<U>(p.pre_c[s]) + acc[0], ldl2(p.u + s), ldl2(hp + e));
      p.c[s] = static_cast<T>(o.c);
      p.h[s] = static_cast<T>(o.h);
    });
    if (t + 1 < p.L) grid.sync();  // h_t of every cell (and hr consumed) before step t + 1
  }
}

template <typename T>
struct GruBwdParams {
  const T *r, *u, *c, *h, *h0, *w_ru_h, *w_c_h;
  const T *h_grad, *g_r, *g_u, *g_c;  // null: zeros
  T *d_c_bar, *d_rbu, *hr, *dh, *dh_step;  // hr optional; dh: carry; dh_step: [B,C] workspace
  int64_t ld_ru, ld_c;
  int L;
  Geo geo;
};

// Step t: (a) d_c_bar, d_u_bar of the owned cells; (b) d_hr = d_c_bar @ w_c_h^T -> d_r_bar and the
// part of dh_{t-1} not through w_ru; (c) dh_{t-1} += d_rbu @ w_ru_h^T.
template <typename T, bool kSmem>
__global__ void __launch_bounds__(kThreads, 1) gru_backward_sequence_kernel(GruBwdParams<T> p) {
  using U = at::opmath_type<T>;
  cg::grid_group grid = cg::this_grid();
  const Geo& geo = p.geo;
  const int C = geo.C, c0 = blockIdx.x * geo.nc, ncb = min(geo.nc, C - c0);
  const int64_t B = geo.B, BC = B * C;
  const Smem<T> sm = carve<T>(geo, 1);
  const auto w_c = weight_slice<T, kSmem>(sm.w, GView<T>{p.w_c_h + c0 * p.ld_c, 1, 0, p.ld_c}, C, 1, ncb);
  const auto w_ru = weight_slice<T, kSmem>(sm.w + static_cast<int64_t>(C) * ncb,
                                           GView<T>{p.w_ru_h + c0 * p.ld_ru, 1, 0, p.ld_ru}, 2 * C, 1, ncb);
  for (int t = p.L - 1; t >= 0; --t) {
    const T* hp = t == 0 ? p.h0 : p.h + (t - 1) * BC;
    __syncthreads();  // dh of the owned cells, written by other threads of this block
    for (int it = threadIdx.x; it < geo.B * ncb; it += kThreads) {
      const int b = it / ncb, c = c0 + it % ncb;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const U d = ld(p.h_grad, s) + ldl2(p.dh + e);
      const GruBwdA<U> o = gru_backward_a<U>(d, ld(p.g_u, s), ld(p.g_c, s), static_cast<U>(p.u[s]),
                                             static_cast<U>(p.c[s]), static_cast<U>(hp[e]));
      p.dh_step[e] = static_cast<T>(d);
      p.d_c_bar[s] = static_cast<T>(o.d_c_bar);
      p.d_rbu[(t * B + b) * 2 * C + C + c] = static_cast<T>(o.d_u_bar);
    }
    grid.sync();  // d_c_bar_t of every cell
    block_matmul<1>(geo, ncb, p.d_c_bar + t * BC, C, C, w_c, sm.tile, sm.red, [&](int b, int j, const U* acc) {
      const int c = c0 + j;
      const int64_t e = static_cast<int64_t>(b) * C + c, s = t * BC + e;
      const GruBwdB<U> o = gru_backward_b<U>(acc[0], ld(p.g_r, s), ldl2(p.dh_step + e), static_cast<U>(p.r[s]),
                                             static_cast<U>(p.u[s]), static_cast<U>(hp[e]));
      p.d_rbu[(t * B + b) * 2 * C + c] = static_cast<T>(o.d_r_bar);
      p.dh[e] = static_cast<T>(o.d_h_prev_part);
      if (p.hr) p.hr[s] = static_cast<T>(o.hr);
    });
    grid.sync();  // d_r_bar_t of every cell
    block_matmul<1>(geo, ncb, p.d_rbu + t * BC * 2, 2 * C, 2 * C, w_ru, sm.tile, sm.red,
                    [&](int b, int j, const U* acc) {
                      T* dh = p.dh + static_cast<int64_t>(b) * C + c0 + j;
                      *dh = static_cast<T>(ldl2(dh) + acc[0]);
                    });
    // No grid barrier: step t - 1 starts with its own cells' dh; its first barrier orders the rest.
  }
}

// ------------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------------
struct Plan {
  Geo geo;
  int grid;
  size_t smem;
  bool in_smem;  // weight slices in shared memory
};

// Lets `fn` use the device's whole opt-in shared memory, once per kernel and device. The attribute is
// per-function state shared by every host thread: setting it to each call's own size would let a thread that
// plans a smaller size shrink it between another thread's plan and launch (the launch then fails). The maximum
// serves every plan, and the occupancy query takes each plan's size.
void allow_max_dynamic_smem(const void* fn, const cudaDeviceProp& prop) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (!done.insert({fn, dev}).second) return;
  const cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(prop.sharedMemPerBlockOptin));
  if (err != cudaSuccess) done.erase({fn, dev});
  C10_CUDA_CHECK(err);
}

// The launch of a kernel pair (weights in shared memory / read through L2) for B rows and C cells:
// ng_max gates per matmul at most, w_per_cell weight elements per owned cell. False where the device
// cannot run it (no cooperative launch, sizes beyond the int indexing, too few co-resident blocks).
template <typename T, typename KS, typename KG>
bool plan_launch(KS* k_smem, KG* k_glob, int64_t B, int64_t C, int ng_max, int64_t w_per_cell, Plan& out) {
  using U = at::opmath_type<T>;
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  if (!prop->cooperativeLaunch || B <= 0 || C <= 0 || B > INT_MAX / 8 || C > (1 << 24)) return false;
  const int64_t sms = prop->multiProcessorCount;
  const int64_t nc = (C + sms - 1) / sms;  // one block per SM at most: few blocks at each barrier
  if (B * nc > INT_MAX / 8) return false;
  const int64_t grid = (C + nc - 1) / nc;
  const int64_t ncb_min = C - (grid - 1) * nc;
  // Rows one pass stages: the groups of a pass span at most ceil(kThreads / ncb) + 1 row groups.
  const int64_t rows_cap = std::min<int64_t>(B, ((kThreads + ncb_min - 1) / ncb_min + 1) * kRows);
  // Tile columns: even (odd row stride), a multiple of 8 where the budget allows (k split evenly).
  const int64_t fit = std::min<int64_t>(128, kTileElems / rows_cap);
  const int64_t kt = fit >= 8 ? fit / 8 * 8 : std::max<int64_t>(2, fit / 2 * 2);
  TORCH_INTERNAL_ASSERT(rows_cap * kt <= kTileElems);
  const size_t base = static_cast<size_t>(kThreads * kRows * ng_max + rows_cap * (kt + 1)) * sizeof(U);
  out.geo = Geo{static_cast<int>(B), static_cast<int>(C), static_cast<int>(nc), static_cast<int>(kt),
                static_cast<int>(rows_cap)};
  out.grid = static_cast<int>(grid);
  auto fits = [&](const void* fn, size_t smem) {
    if (smem > prop->sharedMemPerBlockOptin) return false;
    allow_max_dynamic_smem(fn, *prop);
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kThreads, smem));
    return per_sm > 0 && per_sm * sms >= grid;
  };
  const size_t with_w = base + static_cast<size_t>(nc * w_per_cell) * sizeof(T);
  if (fits(reinterpret_cast<const void*>(k_smem), with_w)) {
    out.smem = with_w;
    out.in_smem = true;
    return true;
  }
  if (fits(reinterpret_cast<const void*>(k_glob), base)) {
    out.smem = base;
    out.in_smem = false;
    return true;
  }
  return false;
}

// Cooperative launch; false (error cleared) where the device refuses it as unsupported.
template <typename P>
bool launch(const void* fn, const Plan& plan, P& params) {
  void* args[] = {&params};
  const cudaError_t err = cudaLaunchCooperativeKernel(fn, dim3(plan.grid), dim3(kThreads), args, plan.smem,
                                                      at::cuda::getCurrentCUDAStream());
  if (err == cudaErrorCooperativeLaunchTooLarge || err == cudaErrorNotSupported) {
    (void)cudaGetLastError();
    return false;
  }
  C10_CUDA_CHECK(err);
  return true;
}

template <typename T>
const T* cp(const at::Tensor& t) {
  return cptr<T>(t);
}
template <typename T>
T* mp(const at::Tensor& t) {
  return mptr<T>(t);
}

bool supported(at::ScalarType st, std::initializer_list<const at::Tensor*> ts) {
  if (st != at::kFloat && st != at::kDouble) return false;
  for (const at::Tensor* t : ts) {
    if (t->defined() && (!t->is_contiguous() || t->scalar_type() != st)) return false;
  }
  return true;
}

bool steps_fit(int64_t L) { return L > 0 && L <= INT_MAX; }

template <typename T>
bool lstm_forward_sequence_t(const LstmSeqForward& a) {
  using U = at::opmath_type<T>;
  const int64_t B = a.h_prev.size(0), C = a.h_prev.size(1);
  Plan plan;
  if (!plan_launch<T>(lstm_forward_sequence_kernel<T, true>, lstm_forward_sequence_kernel<T, false>, B, C, 4,
                      4 * C, plan))
    return false;
  LstmFwdParams<T> p{cp<T>(a.pre), cp<T>(a.w_h), cp<T>(a.cs_prev), cp<T>(a.h_prev), cp<T>(a.wci), cp<T>(a.wcf),
                     cp<T>(a.wco), mp<T>(a.i), mp<T>(a.cs), mp<T>(a.f), mp<T>(a.o), mp<T>(a.ci), mp<T>(a.co),
                     mp<T>(a.h), a.w_h.stride(0), static_cast<U>(a.forget_bias), static_cast<U>(a.cell_clip),
                     a.use_peephole, a.ifco, static_cast<int>(a.L), plan.geo};
  return launch(plan.in_smem ? reinterpret_cast<const void*>(lstm_forward_sequence_kernel<T, true>)
                             : reinterpret_cast<const void*>(lstm_forward_sequence_kernel<T, false>),
                plan, p);
}

template <typename T>
bool lstm_backward_sequence_t(const LstmSeqBackward& a) {
  const int64_t B = a.cs_prev.size(0), C = a.cs_prev.size(1);
  Plan plan;
  if (!plan_launch<T>(lstm_backward_sequence_kernel<T, true>, lstm_backward_sequence_kernel<T, false>, B, C, 1,
                      4 * C, plan))
    return false;
  const GateOffsets off = gate_offsets(a.ifco, C);
  const bool gates = a.g_i.defined() || a.g_f.defined() || a.g_o.defined() || a.g_ci.defined() || a.g_co.defined();
  LstmBwdParams<T> p{cp<T>(a.i),      cp<T>(a.cs),      cp<T>(a.f),    cp<T>(a.o),      cp<T>(a.ci),
                     cp<T>(a.co),     cp<T>(a.cs_prev), cp<T>(a.wci),  cp<T>(a.wcf),    cp<T>(a.wco),
                     cp<T>(a.w_h),    cp<T>(a.h_grad),  cp<T>(a.cs_grad), cp<T>(a.g_i), cp<T>(a.g_f),
                     cp<T>(a.g_o),    cp<T>(a.g_ci),    cp<T>(a.g_co), mp<T>(a.dgates), mp<T>(a.dh),
                     mp<T>(a.dcs),    a.w_h.stride(0),  static_cast<int>(off.i / C), static_cast<int>(off.ci / C),
                     static_cast<int>(off.f / C), static_cast<int>(off.o / C), a.use_peephole, gates,
                     static_cast<int>(a.L), plan.geo};
  return launch(plan.in_smem ? reinterpret_cast<const void*>(lstm_backward_sequence_kernel<T, true>)
                             : reinterpret_cast<const void*>(lstm_backward_sequence_kernel<T, false>),
                plan, p);
}

template <typename T>
bool gru_forward_sequence_t(const GruSeqForward& a) {
  const int64_t B = a.h_prev.size(0), C = a.h_prev.size(1);
  Plan plan;
  if (!plan_launch<T>(gru_forward_sequence_kernel<T, true>, gru_forward_sequence_kernel<T, false>, B, C, 2, 3 * C,
                      plan))
    return false;
  const at::Tensor hr = at::empty({B, C}, a.h_prev.options());
  GruFwdParams<T> p{cp<T>(a.pre_ru), cp<T>(a.pre_c), cp<T>(a.w_ru_h), cp<T>(a.w_c_h), cp<T>(a.h_prev),
                    mp<T>(a.r),      mp<T>(a.u),     mp<T>(a.c),      mp<T>(a.h),     mp<T>(hr),
                    a.w_ru_h.stride(0), a.w_c_h.stride(0), static_cast<int>(a.L), plan.geo};
  return launch(plan.in_smem ? reinterpret_cast<const void*>(gru_forward_sequence_kernel<T, true>)
                             : reinterpret_cast<const void*>(gru_forward_sequence_kernel<T, false>),
                plan, p);
}

template <typename T>
bool gru_backward_sequence_t(const GruSeqBackward& a) {
  const int64_t B = a.h_prev.size(0), C = a.h_prev.size(1);
  Plan plan;
  if (!plan_launch<T>(gru_backward_sequence_kernel<T, true>, gru_backward_sequence_kernel<T, false>, B, C, 1, 3 * C,
                      plan))
    return false;
  const at::Tensor dh_step = at::empty({B, C}, a.h_prev.options());
  GruBwdParams<T> p{cp<T>(a.r),       cp<T>(a.u),       cp<T>(a.c),       cp<T>(a.h),       cp<T>(a.h_prev),
                    cp<T>(a.w_ru_h),  cp<T>(a.w_c_h),   cp<T>(a.h_grad),  cp<T>(a.g_r),     cp<T>(a.g_u),
                    cp<T>(a.g_c),     mp<T>(a.d_c_bar), mp<T>(a.d_rbu),   mp<T>(a.hr),      mp<T>(a.dh),
                    mp<T>(dh_step),   a.w_ru_h.stride(0), a.w_c_h.stride(0), static_cast<int>(a.L), plan.geo};
  return launch(plan.in_smem ? reinterpret_cast<const void*>(gru_backward_sequence_kernel<T, true>)
                             : reinterpret_cast<const void*>(gru_backward_sequence_kernel<T, false>),
                plan, p);
}

}  // namespace

// The weight views (w_h etc.) must have unit column stride; their row stride is passed to the kernels.
bool lstm_forward_sequence_cuda(const LstmSeqForward& a) {
  const auto st = a.h_prev.scalar_type();
  if (!steps_fit(a.L) || a.w_h.stride(1) != 1 ||
      !supported(st, {&a.pre, &a.cs_prev, &a.h_prev, &a.wci, &a.wcf, &a.wco, &a.i, &a.cs, &a.f, &a.o, &a.ci, &a.co,
                      &a.h}))
    return false;
  const c10::cuda::CUDAGuard guard(a.h_prev.device());
  return st == at::kFloat ? lstm_forward_sequence_t<float>(a) : lstm_forward_sequence_t<double>(a);
}

bool lstm_backward_sequence_cuda(const LstmSeqBackward& a) {
  const auto st = a.cs_prev.scalar_type();
  if (!steps_fit(a.L) || a.w_h.stride(1) != 1 ||
      !supported(st, {&a.cs_prev, &a.wci, &a.wcf, &a.wco, &a.i, &a.cs, &a.f, &a.o, &a.ci, &a.co, &a.h_grad,
                      &a.cs_grad, &a.g_i, &a.g_f, &a.g_o, &a.g_ci, &a.g_co, &a.dgates, &a.dh, &a.dcs}))
    return false;
  const c10::cuda::CUDAGuard guard(a.cs_prev.device());
  return st == at::kFloat ? lstm_backward_sequence_t<float>(a) : lstm_backward_sequence_t<double>(a);
}

bool gru_forward_sequence_cuda(const GruSeqForward& a) {
  const auto st = a.h_prev.scalar_type();
  if (!steps_fit(a.L) || a.w_ru_h.stride(1) != 1 || a.w_c_h.stride(1) != 1 ||
      !supported(st, {&a.pre_ru, &a.pre_c, &a.h_prev, &a.r, &a.u, &a.c, &a.h}))
    return false;
  const c10::cuda::CUDAGuard guard(a.h_prev.device());
  return st == at::kFloat ? gru_forward_sequence_t<float>(a) : gru_forward_sequence_t<double>(a);
}

bool gru_backward_sequence_cuda(const GruSeqBackward& a) {
  const auto st = a.h_prev.scalar_type();
  if (!steps_fit(a.L) || a.w_ru_h.stride(1) != 1 || a.w_c_h.stride(1) != 1 || (a.L > 1 && !a.h.defined()) ||
      !supported(st, {&a.h_prev, &a.r, &a.u, &a.c, &a.h, &a.h_grad, &a.g_r, &a.g_u, &a.g_c, &a.d_c_bar, &a.d_rbu,
                      &a.hr, &a.dh}))
    return false;
  const c10::cuda::CUDAGuard guard(a.h_prev.device());
  return st == at::kFloat ? gru_backward_sequence_t<float>(a) : gru_backward_sequence_t<double>(a);
}

}  // namespace brnn
}  // namespace torchops
