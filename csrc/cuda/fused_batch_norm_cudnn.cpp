// ATen's cuDNN batch norm ops as the cuDNN route's vendor (fused_batch_norm/cudnn_route.h), and the CUDA Kernels
// table's entry points over them. Host code only: compiled by the C++ compiler in CUDA builds.
#include "fused_batch_norm/cudnn_route.h"

#include <ATen/native/Normalization.h>
#include <ATen/ops/cudnn_batch_norm.h>
#include <ATen/ops/cudnn_batch_norm_backward.h>

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

// Where ATen's own batch_norm would use cuDNN (torch.backends.cudnn enabled, epsilon and size limits).
bool aten_runs(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const at::Tensor& rm,
               const at::Tensor& rv, bool training, double epsilon) {
  return at::native::_select_batch_norm_backend(x, w, b, rm, rv, training, epsilon) ==
         at::native::BatchNormBackend::Cudnn;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> aten_batch_norm(
    const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& b,
    const std::optional<at::Tensor>& rm, const std::optional<at::Tensor>& rv, bool training, double factor,
    double epsilon) {
  return at::cudnn_batch_norm(x, w, b, rm, rv, training, factor, epsilon);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> aten_batch_norm_backward(
    const at::Tensor& x, const at::Tensor& dy, const at::Tensor& w, const std::optional<at::Tensor>& rm,
    const std::optional<at::Tensor>& rv, const std::optional<at::Tensor>& save_mean,
    const std::optional<at::Tensor>& save_var, double epsilon, const at::Tensor& reserve) {
  return at::cudnn_batch_norm_backward(x, dy, w, rm, rv, save_mean, save_var, epsilon, reserve);
}

int64_t aten_reserve_bytes(const at::Tensor& x, bool training) {
  return static_cast<int64_t>(at::native::_get_cudnn_batch_norm_reserve_space_size(x, training));
}

const CudnnBnVendor kAtenCudnnBn{aten_runs, aten_batch_norm, aten_batch_norm_backward, aten_reserve_bytes};

}  // namespace

std::optional<ForwardResult> cudnn_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                           const at::Tensor& offset, const at::Tensor& mean,
                                           const at::Tensor& variance, double epsilon,
                                           double exponential_avg_factor, bool is_training) {
  return route_forward(kAtenCudnnBn, x, cdim, scale, offset, mean, variance, epsilon, exponential_avg_factor,
                       is_training);
}

std::optional<ForwardResult> cudnn_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                     const at::Tensor& offset, const at::Tensor& mean,
                                                     const at::Tensor& variance, double epsilon,
                                                     double exponential_avg_factor, bool is_training) {
  return route_inference_forward(kAtenCudnnBn, x, cdim, scale, offset, mean, variance, epsilon, is_training);
}

std::optional<GradResult> cudnn_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                         const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                         const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                         double epsilon, bool is_training) {
  return route_backward(kAtenCudnnBn, dy, x, cdim, scale, reserve_space_1, reserve_space_2, reserve_space_3,
                        epsilon, is_training);
}

}  // namespace fbn
}  // namespace torchops
