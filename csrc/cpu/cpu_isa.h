// Per-instruction-set builds of CPU kernels.
//
// A family's kernel implementation header (csrc/cpu/<family>_kernel_impl.h) is compiled twice:
// by <family>_kernel.cpp for the baseline ISA (namespace `base`), and by <family>_kernel_avx2.cpp under
// `#pragma GCC target("avx2,fma")` (namespace `avx2`) after every library header it needs has already
// been included, so that only torchops' own functions get AVX2 code and no inline library function is
// emitted in two ISAs. `has_avx2()` picks the build at run time, so one binary runs on any x86-64.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TORCHOPS_HAVE_AVX2_BUILD 1
#else
#define TORCHOPS_HAVE_AVX2_BUILD 0
#endif

namespace torchops {
namespace cpu {

inline bool has_avx2() {
#if TORCHOPS_HAVE_AVX2_BUILD
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

}  // namespace cpu
}  // namespace torchops
