// Argument checks shared by the op families: tensors passed as None, sizes in checked 64-bit arithmetic.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace torchops {

// A non-optional Tensor argument passed as None arrives as an undefined tensor.
inline void check_defined(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.defined(), name, " must be a tensor, got None");
}

// a * b and a + b of non-negative sizes; `what` names the size in the error.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  TORCH_CHECK_VALUE(!__builtin_mul_overflow(a, b, &r), what, " overflows int64 (", a, " * ", b, ")");
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  TORCH_CHECK_VALUE(!__builtin_add_overflow(a, b, &r), what, " overflows int64 (", a, " + ", b, ")");
  return r;
}

}  // namespace torchops
