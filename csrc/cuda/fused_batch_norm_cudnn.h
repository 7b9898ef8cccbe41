// FusedBatchNormV3 / GradV3 through cuDNN (ATen's cudnn_batch_norm ops): the CUDA Kernels table's library
// routes (route::cuda_cudnn and route::cuda_cudnn_inference; see Kernels::LibraryRoute).
#pragma once

#include "fused_batch_norm/fused_batch_norm.h"

namespace torchops {
namespace fbn {

std::optional<ForwardResult> cudnn_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                           const at::Tensor& offset, const at::Tensor& mean,
                                           const at::Tensor& variance, double epsilon,
                                           double exponential_avg_factor, bool is_training);

// Inference only (nullopt in training).
std::optional<ForwardResult> cudnn_inference_forward(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                                     const at::Tensor& offset, const at::Tensor& mean,
                                                     const at::Tensor& variance, double epsilon,
                                                     double exponential_avg_factor, bool is_training);

// Training only (cudnn_forward returns nullopt in inference).
std::optional<GradResult> cudnn_backward(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                         const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                         const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                         double epsilon, bool is_training);

}  // namespace fbn
}  // namespace torchops
