// FusedBatchNorm's cuDNN route: the glue around the vendor calls (the channels-first view of channels-last data,
// the cases the route takes, the statistics the op's contract asks for, cuDNN's reserve carried in
// reserve_space_3), compiled in every build. The vendor calls sit behind a table with ATen's signatures
// (at::cudnn_batch_norm / cudnn_batch_norm_backward, the reserve size): ATen's cuDNN ops on CUDA
// (cuda/fused_batch_norm_cudnn.cpp; routes cuda_cudnn and cuda_cudnn_inference), and a CPU stand-in that keeps
// their contract (cudnn_standin.cpp; route cpu_cudnn_standin, a test-only route), so the glue runs in CPU CI.
#pragma once

#include "fused_batch_norm/fused_batch_norm.h"

namespace torchops {
namespace fbn {

struct CudnnBnVendor {
  // Whether the library takes this case (channels at dim 1): where torch's own batch_norm would pick it.
  bool (*runs)(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
               const at::Tensor& running_var, bool training, double epsilon);
  // (y, save_mean, save_invstd, reserve): training updates running_mean/var in place with the factor and the
  // UNBIASED batch variance; y has x's memory format.
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*batch_norm)(
      const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
      const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
      double exponential_average_factor, double epsilon);
  // (dx, dweight, dbias) of a training forward, from its saved mean, inverse std and reserve.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> (*batch_norm_backward)(
      const at::Tensor& x, const at::Tensor& grad_output, const at::Tensor& weight,
      const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
      const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_var, double epsilon,
      const at::Tensor& reserve);
  // The reserve bytes a forward of x keeps for its backward.
  int64_t (*reserve_bytes)(const at::Tensor& x, bool training);
};

extern const CudnnBnVendor kCudnnBnStandin;  // the CPU stand-in (cudnn_standin.cpp)

// The glue over a vendor: the Kernels::LibraryRoute entry points call these.
std::optional<ForwardResult> route_forward(const CudnnBnVendor& v, const at::Tensor& x, int64_t cdim,
                                           const at::Tensor& scale, const at::Tensor& offset, const at::Tensor& mean,
                                           const at::Tensor& variance, double epsilon, double exponential_avg_factor,
                                           bool is_training);
std::optional<ForwardResult> route_inference_forward(const CudnnBnVendor& v, const at::Tensor& x, int64_t cdim,
                                                     const at::Tensor& scale, const at::Tensor& offset,
                                                     const at::Tensor& mean, const at::Tensor& variance,
                                                     double epsilon, bool is_training);
std::optional<GradResult> route_backward(const CudnnBnVendor& v, const at::Tensor& dy, const at::Tensor& x,
                                         int64_t cdim, const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                         const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                         double epsilon, bool is_training);

// Kernels::LibraryRoute entry points: the CPU stand-in (every build) and ATen's cuDNN (CUDA builds only).
// *_inference_forward returns nullopt in training, *_forward and *_backward in inference.
std::optional<ForwardResult> standin_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                             const at::Tensor& offset, const at::Tensor& mean,
                                             const at::Tensor& variance, double epsilon,
                                             double exponential_avg_factor, bool is_training);
std::optional<ForwardResult> standin_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                       const at::Tensor& offset, const at::Tensor& mean,
                                                       const at::Tensor& variance, double epsilon,
                                                       double exponential_avg_factor, bool is_training);
std::optional<GradResult> standin_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                           const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                           const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                           double epsilon, bool is_training);
std::optional<ForwardResult> cudnn_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                           const at::Tensor& offset, const at::Tensor& mean,
                                           const at::Tensor& variance, double epsilon,
                                           double exponential_avg_factor, bool is_training);
std::optional<ForwardResult> cudnn_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                     const at::Tensor& offset, const at::Tensor& mean,
                                                     const at::Tensor& variance, double epsilon,
                                                     double exponential_avg_factor, bool is_training);
std::optional<GradResult> cudnn_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                         const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                         const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                         double epsilon, bool is_training);

}  // namespace fbn
}  // namespace torchops
