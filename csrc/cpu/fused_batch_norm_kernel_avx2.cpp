// The FusedBatchNorm CPU kernels built for AVX2+FMA (see csrc/cpu/cpu_isa.h).
#include "cpu/cpu_isa.h"

#if TORCHOPS_HAVE_AVX2_BUILD
// Every header the implementation includes, first, at the baseline ISA.
#include "common/fused_batch_norm_math.h"
#include "fused_batch_norm.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC target("avx2,fma")
#define TORCHOPS_CPU_ISA avx2
#include "cpu/fused_batch_norm_kernel_impl.h"
#endif
