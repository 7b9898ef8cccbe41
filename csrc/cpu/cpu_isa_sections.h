// Emits a family's per-ISA loops (cpu/<family>_kernel_isa.h) once per instruction set (see cpu_isa.h).
// Deliberately without include guard: a family's kernel file defines TORCHOPS_ISA_SELF (the include path
// of its _isa.h) and TORCHOPS_ISA_AVX512 (0 or 1), then includes this header inside its namespace.
#ifndef TORCHOPS_ISA_SELF
#error "define TORCHOPS_ISA_SELF (the path of the _isa.h to emit) before including cpu/cpu_isa_sections.h"
#endif

// TORCHOPS_ISA_LEVEL (0, 1, 2: as isa_level()) tells a section which build it is: in C++ GCC does not
// define __AVX2__ / __AVX512F__ under `#pragma GCC target`.
#define TORCHOPS_ISA_LEVEL 0
namespace isa_base {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_base
#undef TORCHOPS_ISA_LEVEL
#if TORCHOPS_MULTI_ISA
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define TORCHOPS_ISA_LEVEL 1
namespace isa_avx2 {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_avx2
#undef TORCHOPS_ISA_LEVEL
#pragma GCC pop_options
#if TORCHOPS_ISA_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
#define TORCHOPS_ISA_LEVEL 2
namespace isa_avx512 {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_avx512
#undef TORCHOPS_ISA_LEVEL
#pragma GCC pop_options
#endif
#endif
