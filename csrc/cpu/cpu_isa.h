// Per-instruction-set builds of CPU kernels, one mechanism for every family.
//
// A family's hot loops live in cpu/<family>_kernel_isa.h; its kernel file cpu/<family>_kernel.cpp includes
// them (through cpu_isa_sections.h) inside namespaces `isa_base`, `isa_avx2` (under
// `#pragma GCC target("avx2,fma")`) and, where wider vectors pay, `isa_avx512`, after every header it needs
// has been included at the baseline ISA, so only torchops' own functions get wider code and no inline
// library function is emitted twice. `isa_level()` picks the
// build at run time, so one binary runs on any x86-64 (and elsewhere uses the baseline build only).
#pragma once

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

}  // namespace cpu
}  // namespace torchops
