// ConditionalAccumulator family: the handle classes, the schemas of the ops taking them and of the internal
// per-device accumulation op (kernels: cpu/ and cuda/accumulator_kernel.*).
//
// Every handle op is registered at CompositeExplicitAutograd (the resource does the work and calls the
// per-device kernel `_accumulator_add_` itself) and at Autograd with the same function: nothing here is
// differentiable (the outputs are fresh tensors without history), and the ops that take no tensor
// (take_gradient) dispatch to the composite kernel anyway.
#include "accumulator/accumulator.h"

#include <torch/custom_class.h>
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  using namespace torchops::accumulator;
  m.class_<ConditionalAccumulator>("ConditionalAccumulator")
      .def(torch::init<c10::ScalarType, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string>(),
           "", {torch::arg("dtype"), torch::arg("shape") = c10::nullopt, torch::arg("container") = std::string(),
                torch::arg("shared_name") = std::string(), torch::arg("reduction_type") = std::string("MEAN")})
      .def("apply_grad", &apply_gradient)
      .def("take_grad", &take_gradient, "", {torch::arg("num_required"), torch::arg("timeout") = c10::nullopt})
      .def("num_accumulated", &num_accumulated)
      .def("set_global_step", &set_global_step)
      .def("global_step", &handle_global_step<Dense>)
      .def("close", &handle_close<Dense>)
      .def("closed", &handle_closed<Dense>)
      .def("stats", &handle_stats<Dense>)
      .def("dtype", &handle_dtype<Dense>)
      .def("shape", &handle_shape<Dense>)
      .def("container", &handle_container<Dense>)
      .def("shared_name", &handle_shared_name<Dense>)
      .def("reduction_type", &handle_reduction_type<Dense>)
      // torch accepts only lambdas here.
      .def_pickle([](const Dense& self) { return handle_get_state(self); },
                  [](HandleState s) { return handle_set_state<ConditionalAccumulator>(std::move(s)); });

  m.class_<SparseConditionalAccumulator>("SparseConditionalAccumulator")
      .def(torch::init<c10::ScalarType, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string>(),
           "", {torch::arg("dtype"), torch::arg("shape") = c10::nullopt, torch::arg("container") = std::string(),
                torch::arg("shared_name") = std::string(), torch::arg("reduction_type") = std::string("MEAN")})
      .def("apply_grad", &sparse_apply_grad, "",
           {torch::arg("local_step"), torch::arg("indices"), torch::arg("values"), torch::arg("shape") = c10::nullopt})
      .def("apply_sparse_grad", &sparse_apply_gradient_coo)
      .def("take_grad", &sparse_take_gradient, "",
           {torch::arg("num_required"), torch::arg("timeout") = c10::nullopt})
      .def("num_accumulated", &num_accumulated_sparse)
      .def("set_global_step", &set_global_step_sparse)
      .def("global_step", &handle_global_step<Sparse>)
      .def("close", &handle_close<Sparse>)
      .def("closed", &handle_closed<Sparse>)
      .def("stats", &handle_stats<Sparse>)
      .def("dtype", &handle_dtype<Sparse>)
      .def("shape", &handle_shape<Sparse>)
      .def("container", &handle_container<Sparse>)
      .def("shared_name", &handle_shared_name<Sparse>)
      .def("reduction_type", &handle_reduction_type<Sparse>)
      .def_pickle([](const Sparse& self) { return handle_get_state(self); },
                  [](HandleState s) { return handle_set_state<SparseConditionalAccumulator>(std::move(s)); });

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
  m.def("_accumulator_close_all(bool shutdown=False) -> ()", &close_all_op);
  m.def("_accumulator_in_flight() -> int", &in_flight_op);
}

namespace {
// The accumulator ops, registered at two keys below.
void impl_accumulator_ops(torch::Library& m) {
  using namespace torchops::accumulator;
  m.impl("accumulator_apply_gradient", &apply_gradient);
  m.impl("accumulator_take_gradient", &take_gradient);
  m.impl("accumulator_num_accumulated", &num_accumulated);
  m.impl("accumulator_num_accumulated.sparse", &num_accumulated_sparse);
  m.impl("accumulator_set_global_step", &set_global_step);
  m.impl("accumulator_set_global_step.sparse", &set_global_step_sparse);
  m.impl("sparse_accumulator_apply_gradient", &sparse_apply_gradient);
  m.impl("sparse_accumulator_apply_gradient.sparse_tensor", &sparse_apply_gradient_coo);
  m.impl("sparse_accumulator_take_gradient", &sparse_take_gradient);
}
}  // namespace

TORCH_LIBRARY_IMPL(torchops, CompositeExplicitAutograd, m) { impl_accumulator_ops(m); }

// Not differentiable: the same kernels, producing tensors without history.
TORCH_LIBRARY_IMPL(torchops, Autograd, m) { impl_accumulator_ops(m); }
