// Per-instruction-set builds of CPU kernels, one mechanism for every family.
//
// A family's hot loops live in cpu/<family>_kernel_isa.h; its kernel file cpu/<family>_kernel.cpp includes
// them (through cpu_isa_sections.h) inside namespaces `isa_base`, `isa_avx2` (under
// `#pragma GCC target("avx2,fma")`) and, where wider vectors pay, `isa_avx512`, after every header it needs
// has been included at the baseline ISA, so only torchops' own functions get wider code and no inline
// library function is emitted twice. A family's CPU capability routes (common/routes.h) pick the build at
// run time, within `isa_level()` and the capability in use, so one binary runs on any x86-64 (and elsewhere
// uses the baseline build only).
#pragma once

#include "common/routes.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TORCHOPS_MULTI_ISA 1
#else
#define TORCHOPS_MULTI_ISA 0
#endif

namespace torchops {
namespace cpu {

// 0: baseline, 1: AVX2 + FMA, 2: AVX-512 (F, VL, BW, DQ).
inline int isa_level() {
#if TORCHOPS_MULTI_ISA
  static const int level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")
                               ? 2
                               : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0);
  return level;
#else
  return 0;
#endif
}

// Whether the CPU is Intel's: MKL runs its tuned kernels only there (elsewhere its generic path).
inline bool cpu_is_intel() {
#if TORCHOPS_MULTI_ISA
  __builtin_cpu_init();  // (may run in a static initializer, before the library's own constructors)
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

}  // namespace cpu
}  // namespace torchops

// The build of `fn` (a function in the isa_* namespaces of cpu_isa_sections.h) picked by a slot's CPU
// capability routes `slot`: a `const routes::Route* const[3]` of the AVX-512, AVX2 and Default routes.
#if TORCHOPS_MULTI_ISA
#define TORCHOPS_ISA_PICK(slot, ...)                                                          \
  ([&](int i) { return i == 0 ? &isa_avx512::__VA_ARGS__ : i == 1 ? &isa_avx2::__VA_ARGS__ \
                                                                  : &isa_base::__VA_ARGS__; }( \
      ::torchops::routes::pick(slot, 3)))
#else
#define TORCHOPS_ISA_PICK(slot, ...) (::torchops::routes::pick(slot, 3), &isa_base::__VA_ARGS__)
#endif
