// FusedBatchNormV3 / GradV3 through cuDNN, as TensorFlow's GPU kernels run them, via ATen's cudnn_batch_norm
// ops (ATen's cuDNN handle, stream and descriptors). Host code only: compiled by the C++ compiler in CUDA builds.
//
// The op's contract holds on this route too: reserve_space_1/2 are the batch mean and the biased batch
// variance; reserve_space_3 carries cuDNN's reserve bytes as a float32 vector ([0] when cuDNN keeps none),
// which the grad op hands back to cuDNN. The routes (fused_batch_norm/routes.cpp) switch training and
// inference separately; channels-first training with planes of kOwnPlaneMin elements or more stays on
// torchops' kernels. cuDNN is used only where ATen itself would pick it (torch.backends.cudnn.enabled, epsilon >= cuDNN's minimum,
// batch size and element-count limits), for float32 and float16 data: float64 and bfloat16 stay on torchops'
// kernels, as do the inference gradient and batches with fewer than two elements per channel.
#include "cuda/fused_batch_norm_cudnn.h"

#include <ATen/native/Normalization.h>
#include <ATen/ops/cudnn_batch_norm.h>
#include <ATen/ops/cudnn_batch_norm_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>

#include <vector>

namespace at {
namespace native {
// Defined and exported by libtorch_cuda (torch._C._get_cudnn_batch_norm_reserve_space_size binds it); its
// header is not installed.
size_t _get_cudnn_batch_norm_reserve_space_size(const Tensor& input_t, bool training);
}  // namespace native
}  // namespace at

namespace torchops {
namespace fbn {
namespace {

// Channels-first planes at least this large keep torchops' own training kernels under `auto` (they measured
// faster than ATen there; smaller planes and channels-last data did not).
constexpr int64_t kOwnPlaneMin = 1024;

// x with the channels at dim 1, as cuDNN's ops take it: channels-last data becomes an NCHW view with
// channels_last strides (no copy).
at::Tensor channels_first_view(const at::Tensor& x, int64_t cdim) {
  if (cdim == 1) return x;
  std::vector<int64_t> perm{0, cdim};
  for (const auto d : c10::irange(int64_t{1}, cdim)) perm.push_back(d);
  return x.permute(perm);
}

// The inverse of channels_first_view for an output of cuDNN (in x's memory format, so dense again).
at::Tensor from_channels_first(const at::Tensor& t, int64_t cdim) {
  if (cdim == 1) return t;
  std::vector<int64_t> perm{0};
  for (const auto d : c10::irange(int64_t{2}, t.dim())) perm.push_back(d);
  perm.push_back(1);
  at::Tensor r = t.permute(perm);
  return r.is_contiguous() ? r : r.contiguous();
}

bool channels_first_data(const at::Tensor& xv) {
  return xv.suggest_memory_format() == at::MemoryFormat::Contiguous;
}

// Whether cuDNN takes this case: where ATen's own batch_norm would use it, in a layout its descriptors
// describe densely, with at least two elements per channel (its unbiased variance divides by n - 1).
bool cudnn_runs(const at::Tensor& xv, const at::Tensor& scale, const at::Tensor& offset, const at::Tensor& mean,
                const at::Tensor& variance, bool training, double epsilon) {
  const auto t = xv.scalar_type();
  if (t != at::kFloat && t != at::kHalf) return false;
  if (!xv.is_contiguous(xv.suggest_memory_format())) return false;
  if (training && xv.numel() / xv.size(1) < 2) return false;
  return at::native::_select_batch_norm_backend(xv, scale, offset, mean, variance, training, epsilon) ==
         at::native::BatchNormBackend::Cudnn;
}

// The training cases the route leaves to torchops' kernels: channels-first data with large planes.
bool training_route_allows(const at::Tensor& xv) {
  return !channels_first_data(xv) || xv.numel() / (xv.size(0) * xv.size(1)) < kOwnPlaneMin;
}

// Attributes are float32 in TF; round them as the own kernels' orchestration does.
double as_float(double v) { return static_cast<double>(static_cast<float>(v)); }

// cuDNN's reserve bytes as a float32 vector (the contract's statistics dtype for reserve_space_3).
at::Tensor reserve_as_stats(const at::Tensor& reserve, const at::TensorOptions& uopts) {
  const int64_t bytes = reserve.numel();
  if (bytes == 0) return at::empty({0}, uopts);
  if (bytes % 4 == 0 && reserve.storage_offset() == 0) return reserve.view(at::kFloat);
  at::Tensor r = at::empty({(bytes + 3) / 4}, uopts);
  r.view(at::kByte).narrow(0, 0, bytes).copy_(reserve);
  return r;
}

}  // namespace

std::optional<ForwardResult> cudnn_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                           const at::Tensor& offset, const at::Tensor& mean,
                                           const at::Tensor& variance, double epsilon,
                                           double exponential_avg_factor, bool is_training) {
  if (!is_training) return std::nullopt;
  const at::Tensor xv = channels_first_view(x, cdim);
  const at::Tensor w = scale.contiguous(), b = offset.contiguous();
  if (!training_route_allows(xv)) return std::nullopt;
  const int64_t channels = xv.size(1);
  const auto uopts = scale.options();
  // Fresh running buffers and factor 1 make cuDNN write the batch mean and the unbiased batch variance.
  at::Tensor run_mean = at::zeros({channels}, uopts), run_var = at::zeros({channels}, uopts);
  if (!cudnn_runs(xv, w, b, run_mean, run_var, true, epsilon)) return std::nullopt;
  auto [y, save_mean, save_invstd, reserve] = at::cudnn_batch_norm(xv, w, b, run_mean, run_var, true, 1.0, epsilon);
  const int64_t n = xv.numel() / channels;
  at::Tensor var_biased = run_var.mul(static_cast<double>(static_cast<float>(n - 1) / static_cast<float>(n)));
  at::Tensor batch_mean = run_mean, batch_var = run_var;
  if (exponential_avg_factor != 1.0) {
    const double eaf = as_float(exponential_avg_factor), keep = as_float(1.0 - eaf);
    batch_mean = mean.mul(keep).add_(save_mean.mul(eaf));
    batch_var = variance.mul(keep).add_(run_var.mul(eaf));
  }
  return ForwardResult{from_channels_first(y, cdim), batch_mean, batch_var, save_mean, var_biased,
                       reserve_as_stats(reserve, uopts)};
}

std::optional<ForwardResult> cudnn_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                     const at::Tensor& offset, const at::Tensor& mean,
                                                     const at::Tensor& variance, double epsilon,
                                                     double exponential_avg_factor, bool is_training) {
  if (is_training) return std::nullopt;
  const at::Tensor xv = channels_first_view(x, cdim);
  const at::Tensor w = scale.contiguous(), b = offset.contiguous();
  const at::Tensor m = mean.contiguous(), v = variance.contiguous();
  if (!cudnn_runs(xv, w, b, m, v, false, epsilon)) return std::nullopt;
  at::Tensor y = std::get<0>(at::cudnn_batch_norm(xv, w, b, m, v, false, 0.0, epsilon));
  return ForwardResult{from_channels_first(y, cdim), mean.clone(), variance.clone(), mean.clone(), variance.clone(),
                       at::empty({0}, mean.options())};
}

std::optional<GradResult> cudnn_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                         const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                         const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                         double epsilon, bool is_training) {
  if (!is_training) return std::nullopt;  // cuDNN has no frozen-statistics backward
  const at::Tensor xv = channels_first_view(x, cdim);
  if (!training_route_allows(xv)) return std::nullopt;
  const at::Tensor w = scale.contiguous(), mu = reserve_space_1.contiguous(), var = reserve_space_2.contiguous();
  if (!cudnn_runs(xv, w, w, mu, var, true, epsilon)) return std::nullopt;
  // cuDNN reads the reserve its forward wrote; a reserve_space_3 too small to be one (e.g. the [0] of the own
  // kernels' forward) leaves the case to the own kernels, which need only reserve_space_1/2.
  const auto needed = static_cast<int64_t>(at::native::_get_cudnn_batch_norm_reserve_space_size(xv, true));
  at::Tensor reserve = at::empty({0}, x.options().dtype(at::kByte));
  if (needed > 0) {
    if (!reserve_space_3.is_cuda() || reserve_space_3.device() != x.device() || !reserve_space_3.is_contiguous() ||
        static_cast<int64_t>(reserve_space_3.nbytes()) < needed) {
      return std::nullopt;
    }
    reserve = reserve_space_3.reshape({-1}).view(at::kByte).narrow(0, 0, needed);
  }
  const at::Tensor invstd = var.add(epsilon).rsqrt_();
  auto [dx, dscale, doffset] =
      at::cudnn_batch_norm_backward(xv, channels_first_view(dy, cdim), w, mu, var, mu, invstd, epsilon, reserve);
  const auto uopts = scale.options();
  return GradResult{from_channels_first(dx, cdim), dscale, doffset, at::empty({0}, uopts), at::empty({0}, uopts)};
}

}  // namespace fbn
}  // namespace torchops
