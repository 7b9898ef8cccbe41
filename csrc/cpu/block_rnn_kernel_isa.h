// The CPU step kernels of the GRU / LSTM block ops, one table per CPU capability build of
// cpu/block_rnn_kernel_isa.cpp (see cpu/cpu_isa.h).
#pragma once

#include "cpu/cpu_isa.h"
#include "block_rnn/step_kernels.h"

namespace torchops {
namespace brnn {

// The CPU table: the per-step kernels of every device and the CPU's own.
struct CpuStepKernels : StepKernels {
  void (*lstm_forward_bf16_rows)(const LstmBf16Rows& a);
};

TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE(CpuStepKernels, cpu_step_kernels);

}  // namespace brnn
}  // namespace torchops
