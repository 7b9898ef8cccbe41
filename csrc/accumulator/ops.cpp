// ConditionalAccumulator family: the TorchScript custom classes (the accumulator handles), the TF-style
// ops taking them (schemas + device-independent kernels) and the internal per-device accumulation op.
// The state machines live in csrc/accumulator/.
//
// Every op is registered at CompositeExplicitAutograd (the resource does the work and calls the
// per-device kernel `_accumulator_add_` itself) and at Autograd with the same function: nothing here is
// differentiable (the outputs are fresh tensors without history), and the ops that take no tensor
// (take_gradient) dispatch to the composite kernel anyway.
#include "accumulator/accumulator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

namespace torchops {
namespace accumulator {

ConditionalAccumulator::ConditionalAccumulator(c10::ScalarType dtype, c10::optional<std::vector<int64_t>> shape,
                                               std::string container_, std::string shared_name_,
                                               std::string reduction_type_)
    : container(std::move(container_)), shared_name(std::move(shared_name_)), reduction_type(std::move(reduction_type_)) {
  const char* what = "ConditionalAccumulator";
  check_dtype(dtype, what);
  const bool mean = parse_reduction(reduction_type, what);
  core = get_or_create_dense(container, shared_name, dtype, make_shape(shape, what), mean);
}

SparseConditionalAccumulator::SparseConditionalAccumulator(c10::ScalarType dtype,
                                                           c10::optional<std::vector<int64_t>> shape,
                                                           std::string container_, std::string shared_name_,
                                                           std::string reduction_type_)
    : container(std::move(container_)), shared_name(std::move(shared_name_)), reduction_type(std::move(reduction_type_)) {
  const char* what = "SparseConditionalAccumulator";
  check_dtype(dtype, what);
  const bool mean = parse_reduction(reduction_type, what);
  core = get_or_create_sparse(container, shared_name, dtype, make_shape(shape, what), mean);
}

void accumulate(const at::Tensor& accum, const at::Tensor& grad, bool copy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchops::_accumulator_add_", "")
                       .typed<void(const at::Tensor&, const at::Tensor&, bool)>();
  at::AutoDispatchBelowADInplaceOrView guard;  // an internal in-place op on our own buffer
  op.call(accum, grad.is_contiguous() ? grad : grad.contiguous(), copy);
}

namespace {

using Dense = c10::intrusive_ptr<ConditionalAccumulator>;
using Sparse = c10::intrusive_ptr<SparseConditionalAccumulator>;

double timeout_or_none(c10::optional<double> timeout) {
  if (!timeout.has_value()) return -1;
  TORCH_CHECK_VALUE(*timeout >= 0, "take_grad: timeout must be None or a non-negative number of seconds, got ",
                    *timeout);
  return *timeout;
}

std::vector<int64_t> shape_vector(const at::Tensor& shape, const char* what) {
  TORCH_CHECK_VALUE(shape.dim() == 1, what, ": gradient_shape must be an int64 vector, got shape ", shape.sizes());
  TORCH_CHECK_TYPE(shape.scalar_type() == at::kLong, what, ": gradient_shape must be int64, got ", shape.scalar_type());
  const at::Tensor s = shape.to(at::kCPU).contiguous();
  const int64_t* p = s.const_data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + s.numel());
}

// ------------------------------------------------------------------------------------------------ ops

void apply_gradient(const Dense& h, int64_t local_step, const at::Tensor& gradient) {
  h->core->apply(local_step, gradient);
}

at::Tensor take_gradient(const Dense& h, int64_t num_required, c10::optional<double> timeout) {
  return h->core->take_grad(num_required, timeout_or_none(timeout));
}

int64_t num_accumulated(const Dense& h) { return h->core->num_accumulated(); }
int64_t num_accumulated_sparse(const Sparse& h) { return h->core->num_accumulated(); }
void set_global_step(const Dense& h, int64_t step) { h->core->set_global_step(step); }
void set_global_step_sparse(const Sparse& h, int64_t step) { h->core->set_global_step(step); }

void sparse_apply_gradient(const Sparse& h, int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
                           const at::Tensor& gradient_shape, bool has_known_shape) {
  c10::optional<std::vector<int64_t>> shape;
  if (has_known_shape) shape = shape_vector(gradient_shape, "sparse_accumulator_apply_gradient");
  h->core->apply(local_step, indices, values, shape);
}

// A torch sparse COO tensor: dim 0 is sparse (the indexed rows), the others dense.
void sparse_apply_gradient_coo(const Sparse& h, int64_t local_step, const at::Tensor& gradient) {
  const char* what = "sparse_accumulator_apply_gradient";
  TORCH_CHECK_VALUE(gradient.layout() == at::kSparse, what, ": expected a sparse COO gradient, got layout ",
                    gradient.layout());
  TORCH_CHECK_VALUE(gradient.sparse_dim() == 1, what, ": the sparse COO gradient must have sparse_dim 1 (indexed rows, "
                    "dense rows), got sparse_dim ", gradient.sparse_dim(), "; convert it with "
                    "t.to_dense().to_sparse(1)");
  const at::Tensor indices = gradient._indices().select(0, 0);
  const at::Tensor values = gradient._values();
  h->core->apply(local_step, indices, values, std::vector<int64_t>(gradient.sizes().begin(), gradient.sizes().end()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_take_gradient(const Sparse& h, int64_t num_required,
                                                                     c10::optional<double> timeout) {
  return h->core->take_grad(num_required, timeout_or_none(timeout));
}

void close_all_op(bool shutdown) { close_all(shutdown); }
int64_t in_flight_op() { return in_flight(); }

// --------------------------------------------------------------------------------- class helpers

template <typename H>
c10::Dict<std::string, int64_t> stats_dict(const H& h) {
  const Stats s = h->core->stats();
  c10::Dict<std::string, int64_t> d;
  d.insert("applied", s.applied);
  d.insert("dropped_stale", s.dropped_stale);
  d.insert("takes", s.takes);
  d.insert("timeouts", s.timeouts);
  d.insert("cancelled", s.cancelled);
  return d;
}

template <typename H>
c10::optional<std::vector<int64_t>> declared_shape(const H& h) {
  const auto& s = h->core->shape;
  if (!s.known_rank) return c10::nullopt;
  return s.dims;
}

}  // namespace
}  // namespace accumulator
}  // namespace torchops

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  using namespace torchops::accumulator;
  m.class_<ConditionalAccumulator>("ConditionalAccumulator")
      .def(torch::init<c10::ScalarType, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string>(),
           "", {torch::arg("dtype"), torch::arg("shape") = c10::nullopt, torch::arg("container") = std::string(),
                torch::arg("shared_name") = std::string(), torch::arg("reduction_type") = std::string("MEAN")})
      .def("apply_grad", [](const Dense& self, int64_t local_step, const at::Tensor& grad) {
        self->core->apply(local_step, grad);
      })
      .def("take_grad",
           [](const Dense& self, int64_t num_required, c10::optional<double> timeout) {
             return self->core->take_grad(num_required, timeout_or_none(timeout));
           },
           "", {torch::arg("num_required"), torch::arg("timeout") = c10::nullopt})
      .def("num_accumulated", [](const Dense& self) { return self->core->num_accumulated(); })
      .def("set_global_step", [](const Dense& self, int64_t step) { self->core->set_global_step(step); })
      .def("global_step", [](const Dense& self) { return self->core->global_step(); })
      .def("close", [](const Dense& self) { self->core->close(); })
      .def("closed", [](const Dense& self) { return self->core->closed(); })
      .def("stats", [](const Dense& self) { return stats_dict(self); })
      .def("dtype", [](const Dense& self) { return self->core->dtype; })
      .def("shape", [](const Dense& self) { return declared_shape(self); })
      .def("container", [](const Dense& self) { return self->container; })
      .def("shared_name", [](const Dense& self) { return self->shared_name; })
      .def("reduction_type", [](const Dense& self) { return self->reduction_type; })
      // Serialization (torch.jit.save of a module holding one): the creation arguments, not the state; loading
      // creates the accumulator again (a shared one is found by its name if it exists in the process).
      .def_pickle(
          [](const Dense& self) {
            return std::make_tuple(static_cast<int64_t>(self->core->dtype), declared_shape(self), self->container,
                                   self->shared_name, self->reduction_type);
          },
          [](std::tuple<int64_t, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string> s) {
            return c10::make_intrusive<ConditionalAccumulator>(static_cast<c10::ScalarType>(std::get<0>(s)), std::get<1>(s),
                                                    std::get<2>(s), std::get<3>(s), std::get<4>(s));
          });

  m.class_<SparseConditionalAccumulator>("SparseConditionalAccumulator")
      .def(torch::init<c10::ScalarType, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string>(),
           "", {torch::arg("dtype"), torch::arg("shape") = c10::nullopt, torch::arg("container") = std::string(),
                torch::arg("shared_name") = std::string(), torch::arg("reduction_type") = std::string("MEAN")})
      .def("apply_grad",
           [](const Sparse& self, int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
              const c10::optional<at::Tensor>& shape) {
             sparse_apply_gradient(self, local_step, indices, values,
                                   shape.has_value() ? *shape : at::empty({0}, at::TensorOptions().dtype(at::kLong)),
                                   shape.has_value());
           },
           "", {torch::arg("local_step"), torch::arg("indices"), torch::arg("values"), torch::arg("shape") = c10::nullopt})
      .def("apply_sparse_grad", [](const Sparse& self, int64_t local_step, const at::Tensor& grad) {
        sparse_apply_gradient_coo(self, local_step, grad);
      })
      .def("take_grad",
           [](const Sparse& self, int64_t num_required, c10::optional<double> timeout) {
             return self->core->take_grad(num_required, timeout_or_none(timeout));
           },
           "", {torch::arg("num_required"), torch::arg("timeout") = c10::nullopt})
      .def("num_accumulated", [](const Sparse& self) { return self->core->num_accumulated(); })
      .def("set_global_step", [](const Sparse& self, int64_t step) { self->core->set_global_step(step); })
      .def("global_step", [](const Sparse& self) { return self->core->global_step(); })
      .def("close", [](const Sparse& self) { self->core->close(); })
      .def("closed", [](const Sparse& self) { return self->core->closed(); })
      .def("stats", [](const Sparse& self) { return stats_dict(self); })
      .def("dtype", [](const Sparse& self) { return self->core->dtype; })
      .def("shape", [](const Sparse& self) { return declared_shape(self); })
      .def("container", [](const Sparse& self) { return self->container; })
      .def("shared_name", [](const Sparse& self) { return self->shared_name; })
      .def("reduction_type", [](const Sparse& self) { return self->reduction_type; })
      // Serialization (torch.jit.save of a module holding one): the creation arguments, not the state; loading
      // creates the accumulator again (a shared one is found by its name if it exists in the process).
      .def_pickle(
          [](const Sparse& self) {
            return std::make_tuple(static_cast<int64_t>(self->core->dtype), declared_shape(self), self->container,
                                   self->shared_name, self->reduction_type);
          },
          [](std::tuple<int64_t, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string> s) {
            return c10::make_intrusive<SparseConditionalAccumulator>(static_cast<c10::ScalarType>(std::get<0>(s)), std::get<1>(s),
                                                    std::get<2>(s), std::get<3>(s), std::get<4>(s));
          });

  // CONSERVATIVE: ops without outputs (or whose result depends on hidden state) must not be dropped or
  // reordered by TorchScript.
  const auto conservative = c10::AliasAnalysisKind::CONSERVATIVE;
  m.def(torch::schema("accumulator_apply_gradient(__torch__.torch.classes.torchops.ConditionalAccumulator handle, "
                      "int local_step, Tensor gradient) -> ()",
                      conservative));
  m.def(torch::schema("accumulator_take_gradient(__torch__.torch.classes.torchops.ConditionalAccumulator handle, "
                      "int num_required, float? timeout=None) -> Tensor average",
                      conservative));
  m.def(torch::schema("accumulator_num_accumulated(__torch__.torch.classes.torchops.ConditionalAccumulator handle) "
                      "-> int",
                      conservative));
  m.def(torch::schema("accumulator_num_accumulated.sparse(__torch__.torch.classes.torchops."
                      "SparseConditionalAccumulator handle) -> int",
                      conservative));
  m.def(torch::schema("accumulator_set_global_step(__torch__.torch.classes.torchops.ConditionalAccumulator handle, "
                      "int new_global_step) -> ()",
                      conservative));
  m.def(torch::schema("accumulator_set_global_step.sparse(__torch__.torch.classes.torchops."
                      "SparseConditionalAccumulator handle, int new_global_step) -> ()",
                      conservative));
  m.def(torch::schema("sparse_accumulator_apply_gradient(__torch__.torch.classes.torchops."
                      "SparseConditionalAccumulator handle, int local_step, Tensor gradient_indices, "
                      "Tensor gradient_values, Tensor gradient_shape, bool has_known_shape) -> ()",
                      conservative));
  m.def(torch::schema("sparse_accumulator_apply_gradient.sparse_tensor(__torch__.torch.classes.torchops."
                      "SparseConditionalAccumulator handle, int local_step, Tensor gradient) -> ()",
                      conservative));
  m.def(torch::schema("sparse_accumulator_take_gradient(__torch__.torch.classes.torchops."
                      "SparseConditionalAccumulator handle, int num_required, float? timeout=None) -> "
                      "(Tensor indices, Tensor values, Tensor shape)",
                      conservative));
  // Internal: accum (+)= gradient in place on the gradient's device (per-backend kernels).
  m.def("_accumulator_add_(Tensor(a!) accum, Tensor gradient, bool copy) -> ()");
  // Python-front plumbing.
  m.def("_accumulator_close_all(bool shutdown=False) -> ()", &torchops::accumulator::close_all_op);
  m.def("_accumulator_in_flight() -> int", &torchops::accumulator::in_flight_op);
}

#define TORCHOPS_ACCUMULATOR_IMPLS(m)                                                                        \
  m.impl("accumulator_apply_gradient", &torchops::accumulator::apply_gradient);                             \
  m.impl("accumulator_take_gradient", &torchops::accumulator::take_gradient);                               \
  m.impl("accumulator_num_accumulated", &torchops::accumulator::num_accumulated);                           \
  m.impl("accumulator_num_accumulated.sparse", &torchops::accumulator::num_accumulated_sparse);             \
  m.impl("accumulator_set_global_step", &torchops::accumulator::set_global_step);                           \
  m.impl("accumulator_set_global_step.sparse", &torchops::accumulator::set_global_step_sparse);             \
  m.impl("sparse_accumulator_apply_gradient", &torchops::accumulator::sparse_apply_gradient);               \
  m.impl("sparse_accumulator_apply_gradient.sparse_tensor", &torchops::accumulator::sparse_apply_gradient_coo); \
  m.impl("sparse_accumulator_take_gradient", &torchops::accumulator::sparse_take_gradient)

TORCH_LIBRARY_IMPL(torchops, CompositeExplicitAutograd, m) { TORCHOPS_ACCUMULATOR_IMPLS(m); }

// Not differentiable: the same kernels, producing tensors without history.
TORCH_LIBRARY_IMPL(torchops, Autograd, m) { TORCHOPS_ACCUMULATOR_IMPLS(m); }
