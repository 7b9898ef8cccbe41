// CPU kernel of the accumulators' in-place accumulation: accum (+)= gradient, where accum is the
// accumulator's own contiguous buffer in the opmath dtype (float for half/bfloat16 gradients) and
// gradient is contiguous (csrc/accumulator/ops.cpp makes it so). Memory-bound: one pass, vectorized (by the compiler),
// split over threads in chunks large enough to amortise the fork.
#include "accumulator/add_checks.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstring>
#include <type_traits>

namespace torchops {
namespace accumulator {
namespace {

// 64K elements per task: below that one thread is faster than waking the others.
constexpr int64_t kGrain = 1 << 16;

// A plain restrict-qualified loop: GCC -O3 vectorizes it for the baseline ISA (SSE2), which is already
// enough to saturate memory bandwidth for an add (measured faster here than at::vec::Vectorized's generic
// build, which this baseline translation unit would get).
template <typename T>
void add_same(T* __restrict acc, const T* __restrict g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += g[i];
}

template <typename T, typename U>
void add_chunk(U* __restrict acc, const T* __restrict g, int64_t n, bool copy) {
  if constexpr (std::is_same_v<T, U>) {
    if (copy)
      std::memcpy(acc, g, n * sizeof(U));
    else
      add_same<U>(acc, g, n);
  } else if (copy) {
    for (int64_t i = 0; i < n; ++i) acc[i] = static_cast<U>(g[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<U>(g[i]);
  }
}

void accumulator_add_cpu(const at::Tensor& accum, const at::Tensor& gradient, bool copy) {
  check_accumulator_add(accum, gradient);
  TORCH_CHECK(accum.is_cpu() && gradient.is_cpu(), "_accumulator_add_ (CPU): expected CPU tensors, got accum on ",
              accum.device(), " and gradient on ", gradient.device());
  const int64_t n = gradient.numel();
  if (n == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, gradient.scalar_type(), "_accumulator_add_", [&] {
    using U = at::opmath_type<scalar_t>;
    U* acc = accum.mutable_data_ptr<U>();
    const scalar_t* g = gradient.const_data_ptr<scalar_t>();
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      add_chunk<scalar_t, U>(acc + begin, g + begin, end - begin, copy);
    });
  });
}

}  // namespace
}  // namespace accumulator
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  m.impl("_accumulator_add_", &torchops::accumulator::accumulator_add_cpu);
}
