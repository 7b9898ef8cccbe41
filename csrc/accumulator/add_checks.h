// The operand checks of the internal op _accumulator_add_ (accum (+)= gradient), made by both per-device
// kernels (csrc/cpu/accumulator_kernel.cpp, csrc/cuda/accumulator_kernel.cu) before they touch memory:
// csrc/accumulator/ops.cpp hands them contiguous operands with accum in the gradient's opmath dtype.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace torchops {
namespace accumulator {

inline void check_accumulator_add(const at::Tensor& accum, const at::Tensor& gradient) {
  TORCH_CHECK_VALUE(accum.defined() && gradient.defined(), "_accumulator_add_: accum and gradient must be tensors, got ",
                    accum.defined() ? "gradient" : "accum", " None");
  TORCH_CHECK(!accum.requires_grad(), "_accumulator_add_: accum requires grad; the op writes into it in place and "
              "records no gradient");
  TORCH_CHECK(accum.is_contiguous() && gradient.is_contiguous(),
              "_accumulator_add_: accum and gradient must be contiguous");
  TORCH_CHECK_VALUE(accum.sizes() == gradient.sizes(), "_accumulator_add_: accum has shape ", accum.sizes(),
                    " but gradient has shape ", gradient.sizes());
  const auto want = at::toOpMathType(gradient.scalar_type());
  TORCH_CHECK(accum.scalar_type() == want, "_accumulator_add_: accum must be ", want, " for ",
              gradient.scalar_type(), " gradients, got ", accum.scalar_type());
}

}  // namespace accumulator
}  // namespace torchops
