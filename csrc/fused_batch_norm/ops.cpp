// FusedBatchNormV3 / FusedBatchNormGradV3: validation (TF's order and key phrases) and the
// device-independent orchestration around the per-device kernels.
#include "fused_batch_norm/fused_batch_norm.h"
#include "common/arg_checks.h"

#include <ATen/DeviceGuard.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/irange.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace torchops {
namespace fbn {
namespace {

c10::ScalarType stats_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_dtype_and_device(const at::Tensor& x, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == stats_dtype(x), name, " must have dtype ", stats_dtype(x), " for x of dtype ",
              x.scalar_type(), " (statistics are float32, or float64 for float64 x), got ", t.scalar_type());
  TORCH_CHECK(t.device() == x.device(), name, " must be on x's device ", x.device(), ", got ", t.device());
}

void check_x(const at::Tensor& x, const char* name) {
  check_defined(x, name);
  TORCH_CHECK(x.dim() == 4 || x.dim() == 5, name, ": input must be 4 or 5-dimensional, got shape ", x.sizes());
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, name,
              " must be float32, float64, float16 or bfloat16, got ", t);
}

void check_rank1(const at::Tensor& t, const char* what) {
  check_defined(t, what);
  TORCH_CHECK(t.dim() == 1, what, " must be 1-dimensional, got shape ", t.sizes());
}

void check_channels(const at::Tensor& t, int64_t channels, const char* what) {
  TORCH_CHECK(t.numel() == channels, what, " must have the same number of elements as the channels of x, got ",
              t.numel(), " and ", channels);
}

// x in the physical order the kernels read, the Layout that describes it, and whether it is
// channels-first data stored channels-last.
struct Prepared {
  at::Tensor x;
  Layout layout;
  c10::optional<at::MemoryFormat> channels_last;
};

c10::MemoryFormat channels_last_format(int64_t rank) {
  return rank == 4 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
}

Prepared prepare(const at::Tensor& x, int64_t cdim) {
  Prepared p;
  const int64_t rank = x.dim();
  p.layout.channels = x.size(cdim);
  if (cdim == rank - 1) {
    p.x = x.contiguous();
    p.layout.outer = 1;
    for (const auto d : c10::irange(rank - 1)) p.layout.outer *= x.size(d);
    p.layout.inner = 1;
    return p;
  }
  const auto cl = channels_last_format(rank);
  if (!x.is_contiguous() && x.is_contiguous(cl)) {
    // NCHW data in channels_last memory: it is NHWC in memory, read it as such.
    p.x = x;
    p.channels_last = cl;
    p.layout.outer = 1;
    for (const auto d : c10::irange(rank)) if (d != 1) p.layout.outer *= x.size(d);
    p.layout.inner = 1;
    return p;
  }
  p.x = x.contiguous();
  p.layout.outer = x.size(0);
  p.layout.inner = 1;
  for (const auto d : c10::irange(2, rank)) p.layout.inner *= x.size(d);
  return p;
}

at::Tensor like_layout(const at::Tensor& t, const Prepared& p) {
  return p.channels_last ? t.contiguous(*p.channels_last) : t.contiguous();
}

// An uninitialized [c] statistics vector.
at::Tensor stats_empty(int64_t c, const at::TensorOptions& opts) { return at::empty({c}, opts); }

// An uninitialized tensor of x's shape and strides (x is dense: contiguous in its memory format), for y or dx.
at::Tensor output_empty(const at::Tensor& x) { return at::empty_like(x); }

// A fresh copy of a [C] statistics vector. On the CPU a plain memcpy: clone() goes through TensorIterator,
// ~1 us per call, and inference returns four of these (4 us of its ~20 us fixed cost, measured).
at::Tensor copy_vector(const at::Tensor& v) {
  if (!v.is_cpu() || !v.is_contiguous() || v.dim() != 1) return v.clone();
  at::Tensor r = stats_empty(v.numel(), v.options());
  if (v.nbytes() > 0) std::memcpy(r.data_ptr(), v.const_data_ptr(), v.nbytes());
  return r;
}

at::Tensor nan_vector(int64_t c, const at::TensorOptions& opts) {
  return stats_empty(c, opts).fill_(std::numeric_limits<double>::quiet_NaN());
}

// Attributes are float32 in TF; round them as TF does when the statistics are float32.
double as_stats_scalar(double v, c10::ScalarType u) {
  return u == at::kFloat ? static_cast<double>(static_cast<float>(v)) : v;
}

}  // namespace

// NaN, infinite or negative epsilon would make every output NaN (or divide by a negative variance).
void check_epsilon(double epsilon) {
  TORCH_CHECK_VALUE(std::isfinite(epsilon) && epsilon >= 0.0, "epsilon must be a finite number >= 0, got ", epsilon);
}

int64_t channel_dim(c10::string_view data_format, int64_t rank, const char* arg) {
  int64_t want_rank = 0;
  bool last = false;
  if (data_format == "NHWC") {
    want_rank = 4, last = true;
  } else if (data_format == "NCHW") {
    want_rank = 4, last = false;
  } else if (data_format == "NDHWC") {
    want_rank = 5, last = true;
  } else if (data_format == "NCDHW") {
    want_rank = 5, last = false;
  } else {
    TORCH_CHECK_VALUE(false, "data_format must be one of NHWC, NCHW, NDHWC, NCDHW, got '", data_format, "'");
  }
  TORCH_CHECK(rank == want_rank, arg, " must be ", want_rank, "-dimensional for data_format '", data_format,
              "', got rank ", rank);
  return last ? rank - 1 : 1;
}

ForwardResult forward(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                      const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                      double exponential_avg_factor, c10::string_view data_format, bool is_training,
                      const Kernels& kernels) {
  // The kernels and the library routes (cuDNN's handle is per device) run on x's device.
  const c10::OptionalDeviceGuard device_guard(at::device_of(x));
  check_epsilon(epsilon);
  TORCH_CHECK_VALUE(std::isfinite(exponential_avg_factor), "exponential_avg_factor must be finite, got ",
                    exponential_avg_factor);
  check_x(x, "x");
  check_rank1(scale, "scale");
  check_rank1(offset, "offset");
  check_rank1(mean, "estimated_mean");
  check_rank1(variance, "estimated_variance");
  const int64_t cdim = channel_dim(data_format, x.dim(), "x");
  const int64_t channels = x.size(cdim);
  check_channels(scale, channels, "scale");
  check_channels(offset, channels, "offset");
  const bool use_stats = !is_training || exponential_avg_factor != 1.0;
  if (use_stats) {
    const char* prefix = is_training ? "When exponential_avg_factor != 1, " : "When is_training=false, ";
    TORCH_CHECK(mean.numel() == channels, prefix,
                "mean must have the same number of elements as the channels of x, got ", mean.numel(), " and ",
                channels);
    TORCH_CHECK(variance.numel() == channels, prefix,
                "variance must have the same number of elements as the channels of x, got ", variance.numel(),
                " and ", channels);
  }
  check_dtype_and_device(x, scale, "scale");
  check_dtype_and_device(x, offset, "offset");
  check_dtype_and_device(x, mean, "mean");
  check_dtype_and_device(x, variance, "variance");

  const auto u = stats_dtype(x);
  const auto uopts = x.options().dtype(u);
  Prepared p = prepare(x, cdim);
  const bool has_data = p.layout.n() > 0 && channels > 0;
  if (has_data) {
    for (const auto& lib : kernels.library) {
      if (lib.forward == nullptr || !lib.route->enabled()) continue;
      if (auto r = lib.forward(p.x, cdim, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                               is_training)) {
        lib.route->ran();
        return std::move(*r);
      }
    }
    if (kernels.kernels_route) kernels.kernels_route->ran();
  }
  at::Tensor reserve_3 = stats_empty(0, uopts);

  if (!is_training) {
    at::Tensor bm = copy_vector(mean), bv = copy_vector(variance);
    at::Tensor r1 = copy_vector(mean), r2 = copy_vector(variance);
    at::Tensor y = output_empty(p.x);
    ForwardResult out{y, bm, bv, r1, r2, reserve_3};
    if (has_data) {
      kernels.infer_forward(p.layout, p.x, scale.contiguous(), offset.contiguous(), mean.contiguous(),
                            variance.contiguous(), epsilon, y);
    }
    return out;
  }
  if (!has_data) {
    at::Tensor y = output_empty(p.x);
    // Batch statistics of an empty set are undefined; running statistics pass through.
    at::Tensor batch_mean = use_stats ? copy_vector(mean) : nan_vector(channels, uopts);
    at::Tensor batch_var = use_stats ? copy_vector(variance) : nan_vector(channels, uopts);
    return {y, batch_mean, batch_var, nan_vector(channels, uopts), nan_vector(channels, uopts), reserve_3};
  }

  at::Tensor mean_b = stats_empty(channels, uopts);
  at::Tensor var_b = stats_empty(channels, uopts);
  at::Tensor batch_mean = stats_empty(channels, uopts);
  at::Tensor batch_var = stats_empty(channels, uopts);
  at::Tensor y = output_empty(p.x);
  kernels.train_forward(p.layout, p.x, scale.contiguous(), offset.contiguous(), epsilon, y, mean_b, var_b);

  const int64_t n = p.layout.n();
  const double adj = u == at::kFloat ? static_cast<double>(static_cast<float>(n) / static_cast<float>(std::max<int64_t>(n - 1, 1)))
                                     : static_cast<double>(n) / static_cast<double>(std::max<int64_t>(n - 1, 1));
  // Same operation order as TF's kernel, so float32 results round alike.
  if (exponential_avg_factor == 1.0) {
    batch_mean.copy_(mean_b);
    batch_var.copy_(var_b).mul_(adj);
  } else {
    const double eaf = as_stats_scalar(exponential_avg_factor, u);
    const double keep = as_stats_scalar(1.0 - eaf, u);
    batch_mean.copy_(mean).mul_(keep).add_(mean_b.mul(eaf));
    batch_var.copy_(variance).mul_(keep).add_(var_b.mul(eaf).mul_(adj));
  }
  return {y, batch_mean, batch_var, mean_b, var_b, reserve_3};
}

GradResult backward(const at::Tensor& y_backprop, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& reserve_space_1, const at::Tensor& reserve_space_2,
                    const at::Tensor& reserve_space_3, double epsilon, c10::string_view data_format,
                    bool is_training, const Kernels& kernels) {
  // The kernels and the library routes (cuDNN's handle is per device) run on x's device.
  const c10::OptionalDeviceGuard device_guard(at::device_of(x));
  check_epsilon(epsilon);
  check_defined(reserve_space_3, "reserve_space_3");
  check_x(y_backprop, "y_backprop");
  check_x(x, "x");
  check_rank1(scale, "scale");
  check_rank1(reserve_space_1, "saved mean (reserve_space_1)");
  check_rank1(reserve_space_2, "saved variance (reserve_space_2)");
  TORCH_CHECK(x.sizes() == y_backprop.sizes(), "x and y_backprop must have same shape, but x has shape ", x.sizes(),
              " and y_backprop has shape ", y_backprop.sizes());
  TORCH_CHECK(y_backprop.scalar_type() == x.scalar_type(), "y_backprop must have x's dtype ", x.scalar_type(),
              ", got ", y_backprop.scalar_type());
  TORCH_CHECK(y_backprop.device() == x.device(), "y_backprop must be on x's device ", x.device(), ", got ",
              y_backprop.device());
  const int64_t cdim = channel_dim(data_format, x.dim(), "x");
  const int64_t channels = x.size(cdim);
  check_channels(scale, channels, "scale");
  check_channels(reserve_space_1, channels, "reserve_space_1");
  check_channels(reserve_space_2, channels, "reserve_space_2");
  check_dtype_and_device(x, scale, "scale");
  check_dtype_and_device(x, reserve_space_1, "reserve_space_1");
  check_dtype_and_device(x, reserve_space_2, "reserve_space_2");
  // An unused placeholder of any shape and dtype, but its device takes part in dispatch:
  // a CUDA reserve_space_3 beside CPU data would run the CUDA kernels on host memory.
  TORCH_CHECK(reserve_space_3.device() == x.device() || reserve_space_3.is_cpu(),
              "reserve_space_3 must be on x's device ", x.device(), " or the CPU, got ", reserve_space_3.device());

  const auto uopts = x.options().dtype(stats_dtype(x));
  Prepared p = prepare(x, cdim);
  const bool has_data = p.layout.n() > 0 && channels > 0;
  const at::Tensor dy = has_data ? like_layout(y_backprop, p) : y_backprop;
  if (has_data) {
    for (const auto& lib : kernels.library) {
      if (lib.backward == nullptr || !lib.route->enabled()) continue;
      if (auto r = lib.backward(dy, p.x, cdim, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon,
                                is_training)) {
        lib.route->ran();
        return std::move(*r);
      }
    }
    if (kernels.kernels_route) kernels.kernels_route->ran();
  }
  at::Tensor dscale = stats_empty(channels, uopts).zero_();
  at::Tensor doffset = stats_empty(channels, uopts).zero_();
  at::Tensor dx = output_empty(p.x);  // after the small outputs, as in the forward
  if (has_data) {
    kernels.backward(p.layout, dy, p.x, scale.contiguous(), reserve_space_1.contiguous(),
                     reserve_space_2.contiguous(), epsilon, is_training, dx, dscale, doffset);
  }
  return {dx, dscale, doffset, stats_empty(0, uopts), stats_empty(0, uopts)};
}

}  // namespace fbn
}  // namespace torchops
