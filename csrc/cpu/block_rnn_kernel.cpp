// CPU kernels of the GRU / LSTM block ops: the per-step elementwise kernels of the CPU capability in use
// (cpu/block_rnn_kernel_isa.cpp, picked by the family's capability routes, block_rnn/routes.cpp); the GEMMs and
// the time loop are in csrc/block_rnn/ops.cpp.
#include "block_rnn/block_rnn.h"
#include "cpu/block_rnn_kernel_isa.h"
#include "cpu/cpu_isa.h"

#include <torch/library.h>

namespace torchops {
namespace brnn {
namespace {

const CpuStepKernels& cpu_kernels() { return TORCHOPS_ISA_PICK(route::cpu_step_kernels.slot, cpu_step_kernels); }
const StepKernels& step_kernels() { return cpu_kernels(); }

#define TORCHOPS_STEP(name) TORCHOPS_PICKED(StepKernels, step_kernels, name)
const Kernels kCpuKernels{TORCHOPS_STEP(gru_gates),      TORCHOPS_STEP(gru_output),   TORCHOPS_STEP(gru_backward_a),
                          TORCHOPS_STEP(gru_backward_b), TORCHOPS_STEP(lstm_forward), TORCHOPS_STEP(lstm_backward),
                          c10::DeviceType::CPU,          nullptr,                     nullptr,
                          nullptr,                       nullptr,                     TORCHOPS_PICKED(CpuStepKernels, cpu_kernels, lstm_forward_bf16_rows)};
#undef TORCHOPS_STEP

}  // namespace
}  // namespace brnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::brnn;
  m.impl("gru_block_cell", &Impls<kCpuKernels>::gru_block_cell);
  m.impl("gru_block_cell_grad", &Impls<kCpuKernels>::gru_block_cell_grad);
  m.impl("_gru_block_cell_backward", &Impls<kCpuKernels>::gru_block_cell_backward);
  m.impl("block_gru", &Impls<kCpuKernels>::block_gru);
  m.impl("block_gru_grad", &Impls<kCpuKernels>::block_gru_grad);
  m.impl("lstm_block_cell", &Impls<kCpuKernels>::lstm_block_cell);
  m.impl("lstm_block_cell_grad", &Impls<kCpuKernels>::lstm_block_cell_grad);
  m.impl("_lstm_block_cell_backward", &Impls<kCpuKernels>::lstm_block_cell_backward);
  m.impl("block_lstm", &Impls<kCpuKernels>::block_lstm);
  m.impl("block_lstm_v2", &Impls<kCpuKernels>::block_lstm_v2);
  m.impl("block_lstm_grad", &Impls<kCpuKernels>::block_lstm_grad);
  m.impl("block_lstm_grad_v2", &Impls<kCpuKernels>::block_lstm_grad_v2);
  m.impl("_block_lstm_backward", &Impls<kCpuKernels>::block_lstm_backward);
}

