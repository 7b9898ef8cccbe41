// CPU kernels of the CudnnRNN ops: the per-step elementwise kernels of the CPU capability in use
// (cpu/cudnn_rnn_kernel_isa.cpp, picked by the family's capability routes, cudnn_rnn/routes.cpp), beside the
// whole-op library routes; the GEMMs and the time loops are in csrc/cudnn_rnn/ops.cpp.
#include "cpu/cpu_isa.h"
#include "cpu/cudnn_rnn_kernel_isa.h"
#include "cpu/cudnn_rnn_onednn.h"
#include "cudnn_rnn/cudnn_route.h"
#include "cudnn_rnn/cudnn_rnn.h"

#include <torch/library.h>

namespace torchops {
namespace crnn {
namespace {

const StepKernels& step_kernels() {
  return TORCHOPS_ISA_PICK(route::cpu_gate_kernels.slot, cpu_step_kernels);
}

#define TORCHOPS_STEP(name) TORCHOPS_PICKED(StepKernels, step_kernels, name)
const Kernels kCpuKernels{TORCHOPS_STEP(lstm_fwd), TORCHOPS_STEP(gru_fwd),  TORCHOPS_STEP(rnn_fwd),
                          TORCHOPS_STEP(mask_state), TORCHOPS_STEP(bwd_prep), TORCHOPS_STEP(lstm_bwd),
                          TORCHOPS_STEP(gru_bwd), TORCHOPS_STEP(rnn_bwd), c10::DeviceType::CPU, &route::cpu_loops,
                          {{&route::cpu_onednn, onednn_forward, onednn_backward},
                           {&route::cpu_onednn_bf16, onednn_forward, onednn_backward, at::kBFloat16},
                           {&route::cpu_cudnn_standin, standin_forward, standin_backward}}};

#undef TORCHOPS_STEP

}  // namespace
}  // namespace crnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::crnn;
  m.impl("cudnn_rnn", &Impls<kCpuKernels>::v1);
  m.impl("cudnn_rnn_v2", &Impls<kCpuKernels>::v2);
  m.impl("cudnn_rnn_v3", &Impls<kCpuKernels>::v3);
  m.impl("cudnn_rnn_backprop", &Impls<kCpuKernels>::bwd_v1);
  m.impl("cudnn_rnn_backprop_v2", &Impls<kCpuKernels>::bwd_v2);
  m.impl("cudnn_rnn_backprop_v3", &Impls<kCpuKernels>::bwd_v3);
}

