// Autocast kernels of the GRU / LSTM block ops and their gradient ops: every floating argument (x, the
// states, the weights, peepholes and biases; for the gradient ops also the forward's activations and the
// incoming gradients) is cast to the autocast dtype, as ATen's RNNs are under autocast.
#include "autocast/autocast.h"

namespace {
// One list for both device keys: `kernel` makes the device's casting kernel.
void impl_ops(torch::Library& m, torch::CppFunction (*kernel)()) {
  m.impl("gru_block_cell", kernel());
  m.impl("gru_block_cell_grad", kernel());
  m.impl("_gru_block_cell_backward", kernel());
  m.impl("block_gru", kernel());
  m.impl("block_gru_grad", kernel());
  m.impl("lstm_block_cell", kernel());
  m.impl("lstm_block_cell_grad", kernel());
  m.impl("_lstm_block_cell_backward", kernel());
  m.impl("block_lstm", kernel());
  m.impl("block_lstm_v2", kernel());
  m.impl("block_lstm_grad", kernel());
  m.impl("block_lstm_grad_v2", kernel());
  m.impl("_block_lstm_backward", kernel());
}
}  // namespace

TORCH_LIBRARY_IMPL(torchops, AutocastCPU, m) {
  impl_ops(m, &torchops::autocast::cpu_kernel<torchops::autocast::Policy::lower_precision_fp>);
}

TORCH_LIBRARY_IMPL(torchops, AutocastCUDA, m) {
  impl_ops(m, &torchops::autocast::cuda_kernel<torchops::autocast::Policy::lower_precision_fp>);
}
