// FusedBatchNormV3 / FusedBatchNormGradV3: the orchestration entry points (ops.cpp: validation and the
// device-independent algorithm), the per-device kernel table each backend provides
// (csrc/cpu/fused_batch_norm_kernel.cpp, csrc/cuda/fused_batch_norm_kernel.cu) and the op entry points
// bound to one table (Impls<K>), which each backend registers.
#pragma once

#include "common/routes.h"

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace torchops {
namespace fbn {

// The physical view every kernel works on: x is dense as [outer, C, inner], channel stride = inner.
// Channels-first data is [N, C, spatial]; channels-last data (NHWC, or NCHW in channels_last memory)
// is [N*spatial, C, 1]. Kernels read memory in this order, so neither layout needs a transpose.
struct Layout {
  int64_t outer = 0;
  int64_t channels = 0;
  int64_t inner = 0;
  int64_t n() const { return outer * inner; }  // elements per channel
};

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using GradResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// Per-device kernels. All tensors are dense in the Layout's order; per-channel vectors are
// contiguous [C] of the statistics dtype U. n() > 0 and channels > 0 whenever they are called.
struct Kernels {
  // y = normalized x; mean_out/var_out = batch mean and BIASED batch variance.
  void (*train_forward)(const Layout&, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        double epsilon, at::Tensor& y, at::Tensor& mean_out, at::Tensor& var_out);
  // y = normalized x with the given statistics.
  void (*infer_forward)(const Layout&, const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                        const at::Tensor& mean, const at::Tensor& var, double epsilon, at::Tensor& y);
  // x_backprop, scale_backprop, offset_backprop (training or freeze form).
  void (*backward)(const Layout&, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                   const at::Tensor& mu, const at::Tensor& var, double epsilon, bool is_training,
                   at::Tensor& dx, at::Tensor& dscale, at::Tensor& doffset);
  // The route counted when these kernels ran (nullptr: their CPU capability routes count themselves).
  const routes::Route* kernels_route = nullptr;
  // Whole-op routes through a vendor library (CUDA: cuDNN), tried in order after validation when x has data and
  // the route is enabled; nullopt leaves the case to the next route and finally to the kernels above.
  struct LibraryRoute {
    const routes::Route* route = nullptr;
    // x and dy are dense in the kernels' order (see Layout), cdim is x's channel axis.
    std::optional<ForwardResult> (*forward)(const at::Tensor& x, int64_t cdim, const at::Tensor& scale,
                                            const at::Tensor& offset, const at::Tensor& mean,
                                            const at::Tensor& variance, double epsilon,
                                            double exponential_avg_factor, bool is_training) = nullptr;
    std::optional<GradResult> (*backward)(const at::Tensor& dy, const at::Tensor& x, int64_t cdim,
                                          const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                          const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                          double epsilon, bool is_training) = nullptr;
  };
  LibraryRoute library[2] = {};
};

ForwardResult forward(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                      const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                      double exponential_avg_factor, c10::string_view data_format, bool is_training,
                      const Kernels& kernels);

GradResult backward(const at::Tensor& y_backprop, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& reserve_space_1, const at::Tensor& reserve_space_2,
                    const at::Tensor& reserve_space_3, double epsilon, c10::string_view data_format,
                    bool is_training, const Kernels& kernels);

// The family's routes (fused_batch_norm/routes.cpp).
namespace route {
extern routes::Route cpu_avx2, cpu_default;
extern routes::Route cuda_cudnn, cuda_cudnn_inference, cuda_kernels;
extern routes::Route cuda_vectorized, cuda_plain;
}  // namespace route

// Index of the channel axis for a data_format ("NHWC" -> last, "NCHW" -> 1); validates the string
// and that x's rank matches it.
int64_t channel_dim(c10::string_view data_format, int64_t rank, const char* arg);

// The op entry points of one backend (its Kernels table K); each backend file registers them.
template <const Kernels& K>
struct Impls {
  static ForwardResult fused_batch_norm_v3(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset,
                                           const at::Tensor& mean, const at::Tensor& variance, double epsilon,
                                           double exponential_avg_factor, c10::string_view data_format,
                                           bool is_training) {
    return forward(x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training, K);
  }
  static GradResult fused_batch_norm_grad_v3(const at::Tensor& y_backprop, const at::Tensor& x,
                                             const at::Tensor& scale, const at::Tensor& reserve_space_1,
                                             const at::Tensor& reserve_space_2, const at::Tensor& reserve_space_3,
                                             double epsilon, c10::string_view data_format, bool is_training) {
    return backward(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3, epsilon, data_format,
                    is_training, K);
  }
};

}  // namespace fbn
}  // namespace torchops
