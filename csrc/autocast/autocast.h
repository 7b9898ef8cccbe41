// The Autocast kernels of the torchops ops (csrc/autocast/<family>.cpp register them). They follow ATen's
// autocast_mode.cpp: exclude the device's autocast key, cast the eligible floating arguments with
// at::autocast::cached_cast (CPU/CUDA tensors only, float64 never, float32 weights cast once per autocast
// region) and call the op again through the dispatcher, so the casts are recorded by autograd and the
// gradients of float32 parameters arrive in float32. One boxed kernel serves every op of a policy.
#pragma once

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <string>

namespace torchops {
namespace autocast {

enum class Policy {
  // Every floating argument to the autocast dtype (ATen's lower_precision_fp, as its RNN ops).
  lower_precision_fp,
  // The data arguments (`x`, `y_backprop`) keep their dtype; every other floating argument (scale,
  // offset, statistics, reserve spaces) is promoted from float16/bfloat16 to float32, never cast down:
  // TensorFlow's FusedBatchNormV3 contract, and what torch.nn.BatchNorm2d gives under autocast.
  batch_norm,
};

inline bool is_data_argument(const std::string& name) { return name == "x" || name == "y_backprop"; }

// CudnnRNN's reserve_space is an opaque workspace of the forward's dtype: casting it would scramble it, so it is
// passed on as it is (the op then says which dtype it expects).
inline bool is_opaque_argument(const std::string& name) { return name == "reserve_space"; }

template <c10::DeviceType device, Policy policy>
void cast_and_call(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(device));
  const auto& args = op.schema().arguments();
  const at::ScalarType to =
      policy == Policy::lower_precision_fp ? at::autocast::get_autocast_dtype(device) : at::kFloat;
  auto first = stack->end() - static_cast<std::ptrdiff_t>(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = first[static_cast<std::ptrdiff_t>(i)];
    const std::string& name = args[i].name();
    if (!v.isTensor() || is_opaque_argument(name) || (policy == Policy::batch_norm && is_data_argument(name))) continue;
    v = at::autocast::cached_cast(to, v.toTensor(), device);
  }
  op.callBoxed(stack);
}

// The kernel of `policy` for each autocast dispatch key this library registers. (`Autocast` is the
// alias of `AutocastCUDA` in the torch versions torchops supports, so AutocastCUDA covers it.)
template <Policy policy>
torch::CppFunction cpu_kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&cast_and_call<c10::DeviceType::CPU, policy>>();
}
template <Policy policy>
torch::CppFunction cuda_kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&cast_and_call<c10::DeviceType::CUDA, policy>>();
}

}  // namespace autocast
}  // namespace torchops
