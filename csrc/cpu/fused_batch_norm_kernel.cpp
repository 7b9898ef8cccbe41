// CPU kernels of FusedBatchNormV3 / FusedBatchNormGradV3.
//
// Two loop orders, both reading memory front to back:
//  * channels-first ([N, C, spatial], inner > 1): one task per channel; the channel's runs are summed,
//    then normalised while still in cache (one trip to memory for statistics + output).
//  * channels-last ([rows, C], inner == 1): each thread accumulates per-channel partial sums over a
//    block of rows (inner loop over contiguous channels), partials are combined, then a row pass.
// Sums run in lane-parallel accumulators of U (so the compiler vectorizes them without reassociating)
// and are flushed into double totals per run/row block, which keeps float32 statistics accurate.
#include "common/fused_batch_norm_math.h"
#include "fused_batch_norm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

namespace torchops {
namespace fbn {
namespace {

constexpr int kLanes = 16;
constexpr int64_t kRowBlock = 256;  // rows accumulated in U before flushing to double

template <typename T, typename U>
inline U sum_run(const T* p, int64_t len) {
  U lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += static_cast<U>(p[i + j]);
  U s = 0;
  for (; i < len; ++i) s += static_cast<U>(p[i]);
  for (int j = 0; j < kLanes; ++j) s += lanes[j];
  return s;
}

template <typename T, typename U>
inline U sum_sq_dev_run(const T* p, int64_t len, U mean) {
  U lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const U d = static_cast<U>(p[i + j]) - mean;
      lanes[j] += d * d;
    }
  U s = 0;
  for (; i < len; ++i) {
    const U d = static_cast<U>(p[i]) - mean;
    s += d * d;
  }
  for (int j = 0; j < kLanes; ++j) s += lanes[j];
  return s;
}

// sum(dy) and sum(dy * (x - mu)) over a run.
template <typename T, typename U>
inline void grad_sums_run(const T* dy, const T* x, int64_t len, U mu, U& s_dy, U& s_dyxc) {
  U a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const U g = static_cast<U>(dy[i + j]);
      a[j] += g;
      b[j] += g * (static_cast<U>(x[i + j]) - mu);
    }
  U sa = 0, sb = 0;
  for (; i < len; ++i) {
    const U g = static_cast<U>(dy[i]);
    sa += g;
    sb += g * (static_cast<U>(x[i]) - mu);
  }
  for (int j = 0; j < kLanes; ++j) sa += a[j], sb += b[j];
  s_dy = sa;
  s_dyxc = sb;
}

// Channels-last reductions: out[k][c] (k = 0..nk-1) = sum over rows of f(row, c), computed by
// `accumulate(row_ptr_index, block_buffers...)`. Splits rows into one chunk per thread; the caller
// adds the per-chunk double partials in chunk order (deterministic for a given thread count).
template <typename F>
std::vector<double> row_partials(int64_t rows, int64_t channels, int nk, int64_t& nchunks, const F& block_sum) {
  nchunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (rows + kRowBlock - 1) / kRowBlock));
  std::vector<double> partial(static_cast<size_t>(nchunks * nk * channels), 0.0);
  const int64_t per = (rows + nchunks - 1) / nchunks;
  at::parallel_for(0, nchunks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r0 = k * per, r1 = std::min(rows, r0 + per);
      double* out = partial.data() + k * nk * channels;
      for (int64_t r = r0; r < r1; r += kRowBlock) block_sum(r, std::min(r1, r + kRowBlock), out);
    }
  });
  return partial;
}

template <typename T, typename U>
void train_forward_typed(const Layout& L, const T* x, const U* scale, const U* offset, U eps, T* y, U* mean_out,
                         U* var_out) {
  const int64_t C = L.channels, inner = L.inner, outer = L.outer, n = L.n();
  if (inner > 1) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s = 0;
        for (int64_t o = 0; o < outer; ++o) s += sum_run<T, U>(x + (o * C + c) * inner, inner);
        const U mean = static_cast<U>(s / n);
        double q = 0;
        for (int64_t o = 0; o < outer; ++o) q += sum_sq_dev_run<T, U>(x + (o * C + c) * inner, inner, mean);
        const U var = static_cast<U>(q / n);
        mean_out[c] = mean;
        var_out[c] = var;
        const U alpha = inv_std(var, eps) * scale[c], off = offset[c];
        for (int64_t o = 0; o < outer; ++o) {
          const T* xp = x + (o * C + c) * inner;
          T* yp = y + (o * C + c) * inner;
          for (int64_t i = 0; i < inner; ++i) yp[i] = static_cast<T>(normalize(static_cast<U>(xp[i]), mean, alpha, off));
        }
      }
    });
    return;
  }
  // Channels-last: two reduction passes (mean, then squared deviations), then the row pass.
  int64_t nchunks = 0;
  std::vector<U> mean(C), alpha(C);
  auto sums = row_partials(outer, C, 1, nchunks, [&](int64_t r0, int64_t r1, double* out) {
    std::vector<U> blk(C, U(0));
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * C;
      for (int64_t c = 0; c < C; ++c) blk[c] += static_cast<U>(row[c]);
    }
    for (int64_t c = 0; c < C; ++c) out[c] += blk[c];
  });
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t k = 0; k < nchunks; ++k) s += sums[k * C + c];
    mean[c] = static_cast<U>(s / n);
  }
  auto sq = row_partials(outer, C, 1, nchunks, [&](int64_t r0, int64_t r1, double* out) {
    std::vector<U> blk(C, U(0));
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * C;
      for (int64_t c = 0; c < C; ++c) {
        const U d = static_cast<U>(row[c]) - mean[c];
        blk[c] += d * d;
      }
    }
    for (int64_t c = 0; c < C; ++c) out[c] += blk[c];
  });
  for (int64_t c = 0; c < C; ++c) {
    double q = 0;
    for (int64_t k = 0; k < nchunks; ++k) q += sq[k * C + c];
    const U var = static_cast<U>(q / n);
    mean_out[c] = mean[c];
    var_out[c] = var;
    alpha[c] = inv_std(var, eps) * scale[c];
  }
  at::parallel_for(0, outer, std::max<int64_t>(1, 16384 / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * C;
      T* out = y + r * C;
      for (int64_t c = 0; c < C; ++c) out[c] = static_cast<T>(normalize(static_cast<U>(row[c]), mean[c], alpha[c], offset[c]));
    }
  });
}

// y = normalize(x) with per-channel (mean, alpha, offset); elementwise over the whole tensor.
template <typename T, typename U>
void normalize_all(const Layout& L, const T* x, const U* mean, const U* alpha, const U* offset, T* y) {
  const int64_t C = L.channels, inner = L.inner;
  if (inner > 1) {
    at::parallel_for(0, L.outer * C, std::max<int64_t>(1, 16384 / inner), [&](int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t c = k % C;
        const T* xp = x + k * inner;
        T* yp = y + k * inner;
        const U m = mean[c], a = alpha[c], o = offset[c];
        for (int64_t i = 0; i < inner; ++i) yp[i] = static_cast<T>(normalize(static_cast<U>(xp[i]), m, a, o));
      }
    });
    return;
  }
  at::parallel_for(0, L.outer, std::max<int64_t>(1, 16384 / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * C;
      T* out = y + r * C;
      for (int64_t c = 0; c < C; ++c) out[c] = static_cast<T>(normalize(static_cast<U>(row[c]), mean[c], alpha[c], offset[c]));
    }
  });
}

template <typename T, typename U>
void backward_typed(const Layout& L, const T* dy, const T* x, const U* scale, const U* mu, const U* var, U eps,
                    bool training, T* dx, U* dscale, U* doffset) {
  const int64_t C = L.channels, inner = L.inner, outer = L.outer, n = L.n();
  if (inner > 1) {
    at::parallel_for(0, C, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double s_dy = 0, s_dyxc = 0;
        for (int64_t o = 0; o < outer; ++o) {
          U a, b;
          const int64_t off = (o * C + c) * inner;
          grad_sums_run<T, U>(dy + off, x + off, inner, mu[c], a, b);
          s_dy += a, s_dyxc += b;
        }
        const GradCoefs<U> g = grad_coefs<U>(scale[c], var[c], eps, static_cast<U>(s_dy), static_cast<U>(s_dyxc), n, training);
        doffset[c] = static_cast<U>(s_dy);
        dscale[c] = static_cast<U>(s_dyxc) * inv_std(var[c], eps);
        const U m = mu[c];
        for (int64_t o = 0; o < outer; ++o) {
          const int64_t off = (o * C + c) * inner;
          for (int64_t i = 0; i < inner; ++i)
            dx[off + i] = static_cast<T>(grad_input(static_cast<U>(dy[off + i]), static_cast<U>(x[off + i]), m, g));
        }
      }
    });
    return;
  }
  int64_t nchunks = 0;
  auto sums = row_partials(outer, C, 2, nchunks, [&](int64_t r0, int64_t r1, double* out) {
    std::vector<U> a(C, U(0)), b(C, U(0));
    for (int64_t r = r0; r < r1; ++r) {
      const T* g = dy + r * C;
      const T* xr = x + r * C;
      for (int64_t c = 0; c < C; ++c) {
        const U gv = static_cast<U>(g[c]);
        a[c] += gv;
        b[c] += gv * (static_cast<U>(xr[c]) - mu[c]);
      }
    }
    for (int64_t c = 0; c < C; ++c) out[c] += a[c], out[C + c] += b[c];
  });
  std::vector<GradCoefs<U>> coefs(C);
  for (int64_t c = 0; c < C; ++c) {
    double s_dy = 0, s_dyxc = 0;
    for (int64_t k = 0; k < nchunks; ++k) s_dy += sums[2 * k * C + c], s_dyxc += sums[2 * k * C + C + c];
    coefs[c] = grad_coefs<U>(scale[c], var[c], eps, static_cast<U>(s_dy), static_cast<U>(s_dyxc), n, training);
    doffset[c] = static_cast<U>(s_dy);
    dscale[c] = static_cast<U>(s_dyxc) * inv_std(var[c], eps);
  }
  at::parallel_for(0, outer, std::max<int64_t>(1, 16384 / C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* g = dy + r * C;
      const T* xr = x + r * C;
      T* out = dx + r * C;
      for (int64_t c = 0; c < C; ++c)
        out[c] = static_cast<T>(grad_input(static_cast<U>(g[c]), static_cast<U>(xr[c]), mu[c], coefs[c]));
    }
  });
}

void train_forward_cpu(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       double eps, at::Tensor& y, at::Tensor& mean_out, at::Tensor& var_out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    train_forward_typed<scalar_t, U>(L, x.const_data_ptr<scalar_t>(), scale.const_data_ptr<U>(),
                                     offset.const_data_ptr<U>(), static_cast<U>(eps), y.mutable_data_ptr<scalar_t>(),
                                     mean_out.mutable_data_ptr<U>(), var_out.mutable_data_ptr<U>());
  });
}

void infer_forward_cpu(const Layout& L, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                       const at::Tensor& mean, const at::Tensor& var, double eps, at::Tensor& y) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    const U* s = scale.const_data_ptr<U>();
    const U* v = var.const_data_ptr<U>();
    std::vector<U> alpha(L.channels);
    for (int64_t c = 0; c < L.channels; ++c) alpha[c] = inv_std(v[c], static_cast<U>(eps)) * s[c];
    normalize_all<scalar_t, U>(L, x.const_data_ptr<scalar_t>(), mean.const_data_ptr<U>(), alpha.data(),
                               offset.const_data_ptr<U>(), y.mutable_data_ptr<scalar_t>());
  });
}

void backward_cpu(const Layout& L, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                  const at::Tensor& mu, const at::Tensor& var, double eps, bool training, at::Tensor& dx,
                  at::Tensor& dscale, at::Tensor& doffset) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_batch_norm_grad_v3_cpu", [&] {
    using U = at::opmath_type<scalar_t>;
    backward_typed<scalar_t, U>(L, dy.const_data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                scale.const_data_ptr<U>(), mu.const_data_ptr<U>(), var.const_data_ptr<U>(),
                                static_cast<U>(eps), training, dx.mutable_data_ptr<scalar_t>(),
                                dscale.mutable_data_ptr<U>(), doffset.mutable_data_ptr<U>());
  });
}

const Kernels kCpuKernels{train_forward_cpu, infer_forward_cpu, backward_cpu};

ForwardResult fused_batch_norm_v3_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                                      const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                                      double exponential_avg_factor, c10::string_view data_format, bool is_training) {
  return forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training,
                 kCpuKernels);
}

GradResult fused_batch_norm_grad_v3_cpu(const at::Tensor& y_backprop, const at::Tensor& x, const at::Tensor& scale,
                                        const at::Tensor& reserve_space_1, const at::Tensor& reserve_space_2,
                                        const at::Tensor& reserve_space_3, double epsilon,
                                        c10::string_view data_format, bool is_training) {
  return backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon, data_format,
                  is_training, kCpuKernels);
}

}  // namespace
}  // namespace fbn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  m.impl("fused_batch_norm_v3", &torchops::fbn::fused_batch_norm_v3_cpu);
  m.impl("fused_batch_norm_grad_v3", &torchops::fbn::fused_batch_norm_grad_v3_cpu);
}
