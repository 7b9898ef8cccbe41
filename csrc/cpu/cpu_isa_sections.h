// Emits the including file's kernel section once per instruction set (see cpu_isa.h). Deliberately
// without include guard: a family's kernel file defines its section macro, TORCHOPS_ISA_SELF (its own
// include path) and TORCHOPS_ISA_AVX512 (0 or 1), then includes this header inside its namespace.
#ifndef TORCHOPS_ISA_SELF
#error "define TORCHOPS_ISA_SELF (the including file's path) before including cpu/cpu_isa_sections.h"
#endif

namespace isa_base {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_base
#if TORCHOPS_MULTI_ISA
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace isa_avx2 {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_avx2
#pragma GCC pop_options
#if TORCHOPS_ISA_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")
namespace isa_avx512 {
#include TORCHOPS_ISA_SELF  // NOLINT(build/include)
}  // namespace isa_avx512
#pragma GCC pop_options
#endif
#endif
