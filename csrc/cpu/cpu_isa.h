// Per-capability builds of the CPU loops, as ATen's native/DispatchStub.h does them.
//
// A family's loops live in cpu/<family>_kernel_isa.cpp, which setup.py compiles once per CPU capability with
// that capability's compiler flags and -DTORCHOPS_CPU_CAPABILITY=0|1|2 (Default; AVX2 + FMA; AVX-512 F, VL,
// BW, DQ): every compiler gets the wide builds, and each build's definitions sit in their own namespace
// (TORCHOPS_CPU_CAPABILITY_NAMESPACE), so no symbol of one build can stand in for another's. Each build
// defines the family's table of loops for its capability, declared in cpu/<family>_kernel_isa.h as
// `template <int Capability> const Table& <name>();` with one declared specialization per build
// (TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE);
// the family's CPU capability routes (common/routes.h) pick the table at run time, within isa_level() and
// the capability in use. TORCHOPS_CPU_DISPATCH (set by setup.py on x86-64) says the AVX2 and AVX-512
// builds exist; elsewhere there is the Default build only.
#pragma once

#include "common/routes.h"

#ifndef TORCHOPS_CPU_DISPATCH
#define TORCHOPS_CPU_DISPATCH 0
#endif

namespace torchops {
namespace cpu {

// 0: Default, 1: AVX2 + FMA, 2: AVX-512 (F, VL, BW, DQ): the best build this CPU runs.
inline int isa_level() {
#if TORCHOPS_CPU_DISPATCH
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
#if TORCHOPS_CPU_DISPATCH
  __builtin_cpu_init();  // (may run in a static initializer, before the library's own constructors)
  return __builtin_cpu_is("intel");
#else
  return false;
#endif
}

// A function that runs entry `Entry` (a function pointer member of Table) of the table Pick() returns: the
// entries of a family's backend table (Kernels) that run the build of the capability in use.
template <typename Table, const Table& (*Pick)(), typename F>
struct PickedEntry;
template <typename Table, const Table& (*Pick)(), typename R, typename... A>
struct PickedEntry<Table, Pick, R (*)(A...)> {
  template <R (*Table::*Entry)(A...)>
  static R run(A... a) {
    return (Pick().*Entry)(a...);
  }
};

}  // namespace cpu
}  // namespace torchops

#define TORCHOPS_PICKED(Table, pick, name) \
  (&::torchops::cpu::PickedEntry<Table, pick, decltype(Table::name)>::template run<&Table::name>)

// The table of loops `table<N>()` (see above) picked by a slot's CPU capability routes `slot`: a
// `const routes::Route* const[3]` of the AVX-512, AVX2 and Default routes.
#if TORCHOPS_CPU_DISPATCH
#define TORCHOPS_ISA_PICK(slot, table)                                                        \
  ([](int i) -> decltype(table<0>()) { return i == 0 ? table<2>() : i == 1 ? table<1>() : table<0>(); }( \
      ::torchops::routes::pick(slot, 3)))
#else
#define TORCHOPS_ISA_PICK(slot, table) (::torchops::routes::pick(slot, 3), table<0>())
#endif

// Declares `template <int Capability> const Table& name();` and its specialization for each build (0, 1, 2);
// a family's capability builds each define theirs (a family built for fewer capabilities never calls the others).
#define TORCHOPS_DECLARE_CPU_CAPABILITY_TABLE(Table, name) \
  template <int Capability>                                 \
  const Table& name();                                      \
  template <>                                               \
  const Table& name<0>();                                   \
  template <>                                               \
  const Table& name<1>();                                   \
  template <>                                               \
  const Table& name<2>()

// In a per-capability build (cpu/*_isa.cpp): the namespace of its definitions.
#if defined(TORCHOPS_CPU_CAPABILITY)
#if TORCHOPS_CPU_CAPABILITY == 2
#define TORCHOPS_CPU_CAPABILITY_NAMESPACE capability_avx512
#elif TORCHOPS_CPU_CAPABILITY == 1
#define TORCHOPS_CPU_CAPABILITY_NAMESPACE capability_avx2
#else
#define TORCHOPS_CPU_CAPABILITY_NAMESPACE capability_default
#endif
#endif
