// Autograd of Batch (backward = Unbatch of the incoming gradient, with grad_timeout_micros) and of
// Unbatch (backward = UnbatchGrad). Registered at the Autograd key so that every invocation
// runs its own backward on its own thread, in eager, TorchScript and libtorch alike. UnbatchGrad is
// not differentiable (double backward through the batching ops is a clear error).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

namespace torchops {
namespace batching {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using BatchResult = std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor>;

BatchResult call_batch(at::TensorList in, int64_t nbt, int64_t mbs, int64_t btm, int64_t gtm, int64_t meb,
                       at::IntArrayRef allowed, c10::string_view container, c10::string_view shared_name,
                       c10::string_view queue) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchops::batch", "")
                       .typed<BatchResult(at::TensorList, int64_t, int64_t, int64_t, int64_t, int64_t, at::IntArrayRef,
                                          c10::string_view, c10::string_view, c10::string_view)>();
  return op.call(in, nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue);
}

at::Tensor call_unbatch(const at::Tensor& batched, const at::Tensor& index, const at::Tensor& id, int64_t timeout,
                        c10::string_view container, c10::string_view shared_name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchops::unbatch", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t,
                                         c10::string_view, c10::string_view)>();
  return op.call(batched, index, id, timeout, container, shared_name);
}

at::Tensor call_unbatch_grad(const at::Tensor& original, const at::Tensor& index, const at::Tensor& grad,
                             const at::Tensor& id, c10::string_view container, c10::string_view shared_name,
                             int64_t timeout) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchops::unbatch_grad", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         c10::string_view, c10::string_view, int64_t)>();
  return op.call(original, index, grad, id, container, shared_name, timeout);
}

void check_cpu_for_grad(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && t.requires_grad() && !t.is_cpu()), op, ": ", arg,
              " requires grad and is on ", t.device(),
              "; the gradients of the batching ops are CPU-only (PyTorch runs the backward of non-CPU tensors on "
              "one shared worker thread per device, where the blocking gradient exchange between invocations "
              "would deadlock). Use CPU tensors, or detach the input / run under torch.no_grad()");
}

// Sizes as an IValue that also holds symbolic sizes (fake tensors under torch.compile).
c10::IValue shape_of(const at::Tensor& t) { return c10::IValue(t.sym_sizes()); }

std::string batch_gradient_name(const std::string& shared_name, const std::string& queue, size_t i) {
  return shared_name + "/" + queue + "/batch_gradient_" + std::to_string(i);
}

class BatchFunction : public torch::autograd::Function<BatchFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList in, int64_t nbt, int64_t mbs, int64_t btm,
                               int64_t gtm, int64_t meb, at::IntArrayRef allowed, c10::string_view container,
                               c10::string_view shared_name, c10::string_view queue) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [batched, index, id] = call_batch(in, nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue);
    const bool empty = !in.empty() && in[0].dim() > 0 && in[0].size(0) == 0;
    ctx->saved_data["empty"] = empty;
    ctx->saved_data["k"] = static_cast<int64_t>(batched.size());
    ctx->saved_data["gtm"] = gtm;
    ctx->saved_data["container"] = std::string(container);
    ctx->saved_data["shared_name"] = std::string(shared_name);
    ctx->saved_data["queue"] = std::string(queue);
    for (size_t i = 0; i < batched.size(); ++i) {
      // Shape of the zeros an undefined incoming gradient stands for; for the empty path the input's.
      const at::Tensor& like = empty ? in[i] : batched[i];
      ctx->saved_data["shape" + std::to_string(i)] = shape_of(like);
      ctx->saved_data["dtype" + std::to_string(i)] = static_cast<int64_t>(like.scalar_type());
    }
    ctx->save_for_backward({index, id});
    ctx->mark_non_differentiable({index, id});
    variable_list outs(batched.begin(), batched.end());
    outs.push_back(index);
    outs.push_back(id);
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t k = ctx->saved_data["k"].toInt();
    variable_list result(k + 9);
    const bool empty = ctx->saved_data["empty"].toBool();
    const auto zeros = [&](int64_t i) {
      const auto shape = ctx->saved_data["shape" + std::to_string(i)].toSymIntVector();
      const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype" + std::to_string(i)].toInt());
      return at::zeros_symint(shape, at::TensorOptions().dtype(dtype));
    };
    if (empty) {  // the empty-input path touches no resource
      for (int64_t i = 0; i < k; ++i) result[i] = zeros(i);
      return result;
    }
    const std::string container = ctx->saved_data["container"].toStringRef();
    const std::string shared_name = ctx->saved_data["shared_name"].toStringRef();
    const std::string queue = ctx->saved_data["queue"].toStringRef();
    const int64_t gtm = ctx->saved_data["gtm"].toInt();
    // Every input's gradient is exchanged (even where this invocation needs none), so that the holder's
    // scatter and the other invocations' waits always pair up.
    for (int64_t i = 0; i < k; ++i) {
      const at::Tensor g = grads[i].defined() ? grads[i] : zeros(i);
      result[i] = call_unbatch(g, saved[0], saved[1], gtm, container, batch_gradient_name(shared_name, queue, i));
    }
    return result;
  }
};

class UnbatchFunction : public torch::autograd::Function<UnbatchFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& batched, const at::Tensor& index,
                               const at::Tensor& id, int64_t timeout, c10::string_view container,
                               c10::string_view shared_name) {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor out = call_unbatch(batched, index, id, timeout, container, shared_name);
    ctx->saved_data["timeout"] = timeout;
    ctx->saved_data["container"] = std::string(container);
    ctx->saved_data["shared_name"] = std::string(shared_name);
    ctx->saved_data["out_shape"] = shape_of(out);
    ctx->save_for_backward({batched, index, id});
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& batched = saved[0];
    const at::Tensor g =
        grads[0].defined() ? grads[0]
                            : at::zeros_symint(ctx->saved_data["out_shape"].toSymIntVector(), batched.options());
    at::Tensor r = call_unbatch_grad(batched, saved[1], g, saved[2], ctx->saved_data["container"].toStringRef(),
                                     ctx->saved_data["shared_name"].toStringRef() + "/unbatch_gradient",
                                     ctx->saved_data["timeout"].toInt());
    // A data-dependent (traced) row count is treated as a holder: the padding formula below is also
    // right for a non-holder whose output keeps the batched tensor's trailing shape.
    if (TORCH_GUARD_OR_FALSE(batched.sym_numel().sym_eq(0))) {
      r = at::zeros_symint(batched.sym_sizes(), batched.options());
    } else {
      // UnbatchGrad returns the N unpadded rows; padding rows get zero gradient. Written with
      // SymInts and no comparison so that tracing (fake tensors, data-dependent N) needs no guard.
      std::vector<c10::SymInt> pad_shape(batched.sym_sizes().begin(), batched.sym_sizes().end());
      pad_shape[0] = batched.sym_size(0) - r.sym_size(0);
      r = at::cat({r, at::zeros_symint(pad_shape, r.options())}, 0);
    }
    return {r, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

BatchResult batch_autograd(at::TensorList in, int64_t nbt, int64_t mbs, int64_t btm, int64_t gtm, int64_t meb,
                           at::IntArrayRef allowed, c10::string_view container, c10::string_view shared_name,
                           c10::string_view queue) {
  bool need_grad = false;
  for (size_t i = 0; i < in.size(); ++i) {
    check_cpu_for_grad(in[i], "batch", "in_tensors");
    need_grad = need_grad || in[i].requires_grad();
  }
  if (!need_grad || !at::GradMode::is_enabled()) {  // inference: no graph, no bookkeeping
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_batch(in, nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue);
  }
  auto r = BatchFunction::apply(in, nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue);
  const size_t k = r.size() - 2;
  std::vector<at::Tensor> batched(r.begin(), r.begin() + k);
  return {batched, r[k], r[k + 1]};
}

at::Tensor unbatch_autograd(const at::Tensor& batched, const at::Tensor& index, const at::Tensor& id,
                            int64_t timeout, c10::string_view container, c10::string_view shared_name) {
  check_cpu_for_grad(batched, "unbatch", "batched_tensor");
  if (!batched.requires_grad() || !at::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_unbatch(batched, index, id, timeout, container, shared_name);
  }
  return UnbatchFunction::apply(batched, index, id, timeout, container, shared_name)[0];
}

at::Tensor unbatch_grad_autograd(const at::Tensor& original, const at::Tensor& index, const at::Tensor& grad,
                                 const at::Tensor& id, c10::string_view container, c10::string_view shared_name,
                                 int64_t timeout) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && (grad.requires_grad() || original.requires_grad())),
              "unbatch_grad is not differentiable: double backward through Batch/Unbatch is not supported "
              "(the gradient of one invocation depends on other invocations' backward calls)");
  at::AutoDispatchBelowADInplaceOrView guard;
  return call_unbatch_grad(original, index, grad, id, container, shared_name, timeout);
}

// No graph: the caller (nn.Batched / batch_function) uses it only with grad mode off.
std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor, std::vector<at::Tensor>> batch_then_unbatch_autograd(
    at::TensorList in, int64_t nbt, int64_t mbs, int64_t btm, int64_t gtm, int64_t meb, at::IntArrayRef allowed,
    c10::string_view container, c10::string_view shared_name, c10::string_view queue,
    const std::vector<std::string>& unbatch_names, int64_t unbatch_timeout) {
  for (const auto& t : in) {
    TORCH_CHECK(!(at::GradMode::is_enabled() && t.requires_grad()),
                "_batch_then_unbatch is the no-grad path of nn.Batched / batch_function and records no gradient; "
                "with inputs that require grad use batch and unbatch");
  }
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("torchops::_batch_then_unbatch", "")
          .typed<std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor, std::vector<at::Tensor>>(
              at::TensorList, int64_t, int64_t, int64_t, int64_t, int64_t, at::IntArrayRef, c10::string_view,
              c10::string_view, c10::string_view, const std::vector<std::string>&, int64_t)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(in, nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue, unbatch_names, unbatch_timeout);
}

}  // namespace
}  // namespace batching
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, Autograd, m) {
  m.impl("batch", &torchops::batching::batch_autograd);
  m.impl("unbatch", &torchops::batching::unbatch_autograd);
  m.impl("unbatch_grad", &torchops::batching::unbatch_grad_autograd);
  m.impl("_batch_then_unbatch", &torchops::batching::batch_then_unbatch_autograd);
}
