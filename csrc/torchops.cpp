// The torchops operator library. This file owns TORCH_LIBRARY(torchops); every op family adds to it.
//
// Every family (fused_batch_norm, block_rnn, cudnn_rnn, batching, accumulator) has the same files:
//   <family>/<family>.h       the family's internal interface: its orchestration entry points and, where it
//                             has device kernels, the per-device Kernels table type and Impls<K>, the op
//                             entry points bound to one table
//   <family>/schemas.cpp      TORCH_LIBRARY_FRAGMENT with every schema (and custom class) of the family, and
//                             its device-independent registrations (CompositeExplicitAutograd, Autograd)
//   <family>/ops.cpp          validation, output allocation and the device-independent algorithm
//   <family>/<unit>.cpp       further units (batching's resources and registry, accumulator's core and registry)
//   cpu/<family>_kernel.cpp   CPU kernels and the CPU Kernels table; cpu/<family>_kernel_isa.cpp holds the loops,
//                             compiled once per CPU capability by setup.py (cpu/cpu_isa.h);
//                             cpu/<family>_onednn.cpp a oneDNN route (a Kernels table's library route)
//   <family>/routes.cpp       the family's route table (common/routes.h): which implementation runs
//   cuda/<family>_kernel.cu   CUDA kernels; cuda/*.cpp host code (cuDNN through ATen); CUDA builds only
//   autograd/<family>.cpp     autograd::Functions at the Autograd key
//   autocast/<family>.cpp     the differentiable ops at AutocastCPU and AutocastCUDA (autocast/autocast.h)
//   common/<family>_math.h    scalar math shared by the CPU and CUDA kernels
// Shared helpers: common/arg_checks.h (every family); rnn_util.h and cpu/packed_gemm* (the two RNN families).
// Registration: every TORCH_LIBRARY_IMPL block is (or calls) a plain list of m.impl("op", function) lines; a
// device file registers &Impls<its Kernels table>::op for each of its family's device ops.
#include <torch/library.h>

TORCH_LIBRARY(torchops, m) {
  // Schemas live with their families: csrc/<family>/schemas.cpp.
}
