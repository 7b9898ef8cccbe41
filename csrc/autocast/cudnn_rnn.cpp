// Autocast kernels of the CudnnRNN forward and backprop ops: every floating argument (input, states,
// params, and for the backprop ops the forward's outputs and the incoming gradients; not the opaque
// reserve_space) is cast to the autocast dtype, as ATen's RNNs are under autocast. The params layout
// converters and ParamsSize keep their dtypes (no autocast kernel).
#include "autocast/autocast.h"

namespace {
// One list for both device keys: `kernel` makes the device's casting kernel.
void impl_ops(torch::Library& m, torch::CppFunction (*kernel)()) {
  m.impl("cudnn_rnn", kernel());
  m.impl("cudnn_rnn_v2", kernel());
  m.impl("cudnn_rnn_v3", kernel());
  m.impl("cudnn_rnn_backprop", kernel());
  m.impl("cudnn_rnn_backprop_v2", kernel());
  m.impl("cudnn_rnn_backprop_v3", kernel());
}
}  // namespace

TORCH_LIBRARY_IMPL(torchops, AutocastCPU, m) {
  impl_ops(m, &torchops::autocast::cpu_kernel<torchops::autocast::Policy::lower_precision_fp>);
}

TORCH_LIBRARY_IMPL(torchops, AutocastCUDA, m) {
  impl_ops(m, &torchops::autocast::cuda_kernel<torchops::autocast::Policy::lower_precision_fp>);
}
