// FusedBatchNormV3 / FusedBatchNormGradV3 schemas. Kernels: cpu/ and cuda/fused_batch_norm_kernel.*;
// autograd: autograd/fused_batch_norm.cpp.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  m.def(
      "fused_batch_norm_v3(Tensor x, Tensor scale, Tensor offset, Tensor mean, Tensor variance, "
      "float epsilon=0.0001, float exponential_avg_factor=1.0, str data_format=\"NHWC\", bool is_training=True) "
      "-> (Tensor y, Tensor batch_mean, Tensor batch_variance, Tensor reserve_space_1, Tensor reserve_space_2, "
      "Tensor reserve_space_3)");
  m.def(
      "fused_batch_norm_grad_v3(Tensor y_backprop, Tensor x, Tensor scale, Tensor reserve_space_1, "
      "Tensor reserve_space_2, Tensor reserve_space_3, float epsilon=0.0001, str data_format=\"NHWC\", "
      "bool is_training=True) "
      "-> (Tensor x_backprop, Tensor scale_backprop, Tensor offset_backprop, Tensor reserve_space_4, "
      "Tensor reserve_space_5)");
}
