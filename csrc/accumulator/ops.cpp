// ConditionalAccumulator family: the handles (TorchScript custom classes), their methods and the
// device-independent kernels of the TF-style ops taking them. The state machines are in core.cpp, the
// shared-resource registry in registry.cpp; schemas.cpp binds everything here.
#include "accumulator/accumulator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/custom_class.h>

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

double timeout_or_none(c10::optional<double> timeout) {
  if (!timeout.has_value()) return -1;
  TORCH_CHECK_VALUE(*timeout >= 0, "take_grad: timeout must be None or a non-negative number of seconds, got ",
                    *timeout);
  return *timeout;
}

// TF reads gradient_shape's elements in order, whatever its rank.
std::vector<int64_t> shape_vector(const at::Tensor& shape) {
  const at::Tensor s = shape.to(at::kCPU).contiguous();
  const int64_t* p = s.const_data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + s.numel());
}

}  // namespace

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
  TORCH_CHECK(gradient_shape.defined(), "sparse_accumulator_apply_gradient: gradient_shape is an undefined tensor");
  TORCH_CHECK_TYPE(gradient_shape.scalar_type() == at::kLong,
                   "sparse_accumulator_apply_gradient: gradient_shape must be int64, got ", gradient_shape.scalar_type());
  c10::optional<std::vector<int64_t>> shape;
  if (has_known_shape) shape = shape_vector(gradient_shape);
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

// ----------------------------------------------------------------------------------- handle methods

void sparse_apply_grad(const Sparse& h, int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
                       const c10::optional<at::Tensor>& shape) {
  sparse_apply_gradient(h, local_step, indices, values,
                        shape.has_value() ? *shape : at::empty({0}, at::TensorOptions().dtype(at::kLong)),
                        shape.has_value());
}

template <typename H>
int64_t handle_global_step(const H& h) {
  return h->core->global_step();
}

template <typename H>
void handle_close(const H& h) {
  h->core->close();
}

template <typename H>
bool handle_closed(const H& h) {
  return h->core->closed();
}

template <typename H>
c10::Dict<std::string, int64_t> handle_stats(const H& h) {
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
c10::ScalarType handle_dtype(const H& h) {
  return h->core->dtype;
}

template <typename H>
c10::optional<std::vector<int64_t>> handle_shape(const H& h) {
  const auto& s = h->core->shape;
  if (!s.known_rank) return c10::nullopt;
  return s.dims;
}

template <typename H>
std::string handle_container(const H& h) {
  return h->container;
}

template <typename H>
std::string handle_shared_name(const H& h) {
  return h->shared_name;
}

template <typename H>
std::string handle_reduction_type(const H& h) {
  return h->reduction_type;
}

// Serialization (torch.jit.save of a module holding one): the creation arguments, not the state; loading
// creates the accumulator again (a shared one is found by its name if it exists in the process).
template <typename H>
HandleState handle_get_state(const H& h) {
  return std::make_tuple(static_cast<int64_t>(h->core->dtype), handle_shape(h), h->container, h->shared_name,
                         h->reduction_type);
}

template <typename C>
c10::intrusive_ptr<C> handle_set_state(HandleState s) {
  return c10::make_intrusive<C>(static_cast<c10::ScalarType>(std::get<0>(s)), std::get<1>(s), std::get<2>(s),
                                std::get<3>(s), std::get<4>(s));
}

#define TORCHOPS_INSTANTIATE_HANDLE_METHODS(H, C)                              \
  template int64_t handle_global_step(const H&);                              \
  template void handle_close(const H&);                                       \
  template bool handle_closed(const H&);                                      \
  template c10::Dict<std::string, int64_t> handle_stats(const H&);            \
  template c10::ScalarType handle_dtype(const H&);                            \
  template c10::optional<std::vector<int64_t>> handle_shape(const H&);        \
  template std::string handle_container(const H&);                            \
  template std::string handle_shared_name(const H&);                          \
  template std::string handle_reduction_type(const H&);                       \
  template HandleState handle_get_state(const H&);                            \
  template c10::intrusive_ptr<C> handle_set_state<C>(HandleState);
TORCHOPS_INSTANTIATE_HANDLE_METHODS(Dense, ConditionalAccumulator)
TORCHOPS_INSTANTIATE_HANDLE_METHODS(Sparse, SparseConditionalAccumulator)
#undef TORCHOPS_INSTANTIATE_HANDLE_METHODS

}  // namespace accumulator
}  // namespace torchops

