// The CPU step kernels of the CudnnRNN ops, one table per CPU capability build of
// cpu/cudnn_rnn_kernel_isa.cpp (see cpu/cpu_isa.h).
#pragma once

#include "cpu/cpu_isa.h"
#include "cudnn_rnn/step_kernels.h"

namespace torchops {
namespace crnn {

TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE(StepKernels, cpu_step_kernels);

}  // namespace crnn
}  // namespace torchops
