// Autocast kernels of FusedBatchNormV3 and its gradient: TensorFlow's contract under mixed precision.
// `x` (and `y_backprop`) keep their dtype, so `y` has the dtype of `x` as with torch.nn.BatchNorm2d under
// autocast; scale, offset, the statistics and the reserve spaces are promoted to float32 when given in
// float16/bfloat16 and never cast down.
#include "autocast/autocast.h"

namespace {
// One list for both device keys: `kernel` makes the device's casting kernel.
void impl_ops(torch::Library& m, torch::CppFunction (*kernel)()) {
  m.impl("fused_batch_norm_v3", kernel());
  m.impl("fused_batch_norm_grad_v3", kernel());
}
}  // namespace

TORCH_LIBRARY_IMPL(torchops, AutocastCPU, m) {
  impl_ops(m, &torchops::autocast::cpu_kernel<torchops::autocast::Policy::batch_norm>);
}

TORCH_LIBRARY_IMPL(torchops, AutocastCUDA, m) {
  impl_ops(m, &torchops::autocast::cuda_kernel<torchops::autocast::Policy::batch_norm>);
}
