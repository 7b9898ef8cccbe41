// A CPU stand-in for cuDNN's batch norm behind the cuDNN route's glue (cudnn_route.h's vendor table), so that the
// glue runs in CPU CI (route cpu_cudnn_standin, a test-only route, off by default). It keeps the contract of
// ATen's cudnn_batch_norm / cudnn_batch_norm_backward and what the glue relies on:
//   - channels at dim 1, data in contiguous or channels-last memory; y in x's memory format and dtype, the
//     statistics float32;
//   - training returns the batch mean and the INVERSE standard deviation as the saved statistics, and updates the
//     running buffers in place with the factor and the unbiased batch variance;
//   - a training forward keeps a reserve (here the saved statistics' bytes) that its backward must get back: a
//     reserve of another size or from another forward is refused;
//   - it takes only what cuDNN takes: float32/float16, epsilon at least cuDNN's minimum (1e-5), and not while
//     torch.backends.cudnn is disabled.
#include "fused_batch_norm/cudnn_route.h"

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/var.h>

#include <vector>

namespace torchops {
namespace fbn {
namespace {

constexpr double kCudnnMinEpsilon = 1e-5;  // CUDNN_BN_MIN_EPSILON

std::vector<int64_t> reduce_dims(const at::Tensor& x) {
  std::vector<int64_t> d{0};
  for (int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
  return d;
}

// A [C] vector shaped to broadcast against x's channels (dim 1).
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[1] = v.numel();
  return v.view(shape);
}

at::Tensor like_x(const at::Tensor& t, const at::Tensor& x) {
  return t.to(x.scalar_type()).contiguous(x.suggest_memory_format());
}

bool standin_runs(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& rm,
                  const at::Tensor& rv, bool training, double epsilon) {
  return x.is_cpu() && w.defined() && b.defined() && epsilon >= kCudnnMinEpsilon &&
         at::globalContext().userEnabledCuDNN();
}

int64_t standin_reserve_bytes(const at::Tensor& x, bool training) { return training ? x.size(1) * 2 * 4 : 0; }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> standin_batch_norm(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
    const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv, bool training, double factor,
    double epsilon) {
  TORCH_CHECK(x.is_contiguous(x.suggest_memory_format()), "cuDNN stand-in: x must be dense in its memory format");
  const at::Tensor xf = x.to(at::kFloat), wf = w.to(at::kFloat), bf = b->to(at::kFloat);
  const auto bytes = x.options().dtype(at::kByte);
  if (!training) {
    TORCH_CHECK(rm.has_value() && rv.has_value(), "cuDNN stand-in: inference needs the running statistics");
    const at::Tensor invstd = at::rsqrt(rv->add(epsilon));
    const at::Tensor y = (xf - per_channel(*rm, x)) * per_channel(invstd * wf, x) + per_channel(bf, x);
    return {like_x(y, x), at::empty({0}, wf.options()), at::empty({0}, wf.options()), at::empty({0}, bytes)};
  }
  const auto dims = reduce_dims(x);
  const int64_t n = x.numel() / x.size(1);
  const at::Tensor mean = xf.mean(dims);
  const at::Tensor var = xf.var(dims, /*unbiased=*/false);
  const at::Tensor invstd = at::rsqrt(var.add(epsilon));
  const at::Tensor y = (xf - per_channel(mean, x)) * per_channel(invstd * wf, x) + per_channel(bf, x);
  if (rm.has_value() && rm->defined()) rm->mul_(1.0 - factor).add_(mean, factor);
  if (rv.has_value() && rv->defined()) rv->mul_(1.0 - factor).add_(var * (static_cast<double>(n) / (n - 1)), factor);
  // The reserve holds the saved statistics' bytes, so that the backward can tell its own forward's reserve.
  const at::Tensor reserve = at::cat({mean, invstd}).view(at::kByte).clone();
  TORCH_INTERNAL_ASSERT(reserve.numel() == standin_reserve_bytes(x, true));
  return {like_x(y, x), mean, invstd, reserve};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> standin_batch_norm_backward(
    const at::Tensor& x, const at::Tensor& dy, const at::Tensor& w, const std::optional<at::Tensor>& rm,
    const std::optional<at::Tensor>& rv, const std::optional<at::Tensor>& save_mean,
    const std::optional<at::Tensor>& save_var, double epsilon, const at::Tensor& reserve) {
  const int64_t C = x.size(1);
  TORCH_CHECK(reserve.numel() == standin_reserve_bytes(x, true), "cuDNN stand-in: the reserve has ", reserve.numel(),
              " bytes, expected ", standin_reserve_bytes(x, true), ": pass the reserve its training forward returned");
  TORCH_CHECK(save_mean.has_value() && save_var.has_value(), "cuDNN stand-in: the backward needs the saved statistics");
  const at::Tensor kept = reserve.view(at::kFloat);
  TORCH_CHECK(at::equal(kept.narrow(0, 0, C), save_mean->to(at::kFloat)),
              "cuDNN stand-in: the reserve is not the one of the forward that saved this mean");
  const at::Tensor xf = x.to(at::kFloat), gf = dy.to(at::kFloat), wf = w.to(at::kFloat);
  const auto dims = reduce_dims(x);
  const int64_t n = x.numel() / C;
  const at::Tensor invstd = save_var->to(at::kFloat);  // (cuDNN's save_var is the inverse std)
  const at::Tensor xhat = (xf - per_channel(*save_mean, x)) * per_channel(invstd, x);
  const at::Tensor dbias = at::sum(gf, dims);
  const at::Tensor dweight = at::sum(gf * xhat, dims);
  const at::Tensor dx = per_channel(wf * invstd, x) *
                        (gf - per_channel(dbias / n, x) - xhat * per_channel(dweight / n, x));
  return {like_x(dx, x), dweight, dbias};
}

}  // namespace

const CudnnBnVendor kCudnnBnStandin{standin_runs, standin_batch_norm, standin_batch_norm_backward,
                                    standin_reserve_bytes};

std::optional<ForwardResult> standin_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                             const at::Tensor& offset, const at::Tensor& mean,
                                             const at::Tensor& variance, double epsilon,
                                             double exponential_avg_factor, bool is_training) {
  return route_forward(kCudnnBnStandin, x, cdim, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                       is_training);
}

std::optional<ForwardResult> standin_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                       const at::Tensor& offset, const at::Tensor& mean,
                                                       const at::Tensor& variance, double epsilon,
                                                       double exponential_avg_factor, bool is_training) {
  return route_inference_forward(kCudnnBnStandin, x, cdim, scale, offset, mean, variance, epsilon, is_training);
}

std::optional<GradResult> standin_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                           const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                           const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                           double epsilon, bool is_training) {
  return route_backward(kCudnnBnStandin, dy, x, cdim, scale, reserve_space_1, reserve_space_2, reserve_space_3,
                        epsilon, is_training);
}

}  // namespace fbn
}  // namespace torchops
