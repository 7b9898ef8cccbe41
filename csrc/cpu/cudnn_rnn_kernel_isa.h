// The CPU step kernels of the CudnnRNN ops, one table per CPU capability build of
// cpu/cudnn_rnn_kernel_isa.cpp (see cpu/cpu_isa.h).
#pragma once

#include "cudnn_rnn/step_kernels.h"

namespace torchops {
namespace crnn {

template <int Capability>
const StepKernels& cpu_step_kernels();
template <>
const StepKernels& cpu_step_kernels<0>();
template <>
const StepKernels& cpu_step_kernels<1>();
template <>
const StepKernels& cpu_step_kernels<2>();

}  // namespace crnn
}  // namespace torchops
