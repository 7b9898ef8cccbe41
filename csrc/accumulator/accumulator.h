// ConditionalAccumulator / SparseConditionalAccumulator.
//
// A resource ("core") holds the state of one accumulator under one mutex + condition variable: the
// counter of gradients accepted since the last take, the global step, the accumulated value, the FIFO
// of pending take attempts, the closed flag and the statistics. Handles (the TorchScript custom
// classes registered in schemas.cpp) point at a core; shared cores are found by
// (container, shared_name) in one process-wide registry (registry.cpp). Takes wait with wait_until
// loops (deadline + closed flag); close() fails every pending take; destructors never block.
//
// Dense accumulation is in place into a buffer the core owns (float32 for half/bfloat16 gradients,
// rounded once at take), by the per-device kernel `torchops::_accumulator_add_` (CPU:
// csrc/cpu/accumulator_kernel.cpp, CUDA: csrc/cuda/accumulator_kernel.cu). A take moves the buffer
// out to its caller, which finishes the result (mean, cast) after the lock is released.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>
#include <torch/custom_class.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace torchops {
namespace accumulator {

using Clock = std::chrono::steady_clock;

struct Stats {
  int64_t applied = 0;        // accepted (fresh) gradients
  int64_t dropped_stale = 0;  // local_step < global_step
  int64_t takes = 0;          // completed takes
  int64_t timeouts = 0;       // takes that timed out
  int64_t cancelled = 0;      // takes failed by close()
};

// The declared partial shape: unknown rank (known_rank=false) or a rank with -1 for unknown dims.
struct PartialShape {
  bool known_rank = false;
  std::vector<int64_t> dims;
  bool operator==(const PartialShape& o) const { return known_rank == o.known_rank && dims == o.dims; }
  std::string str() const;
};

// One pending take (FIFO entry). Completed (or failed) under the core's mutex.
struct TakeAttempt {
  int64_t num_required = 0;
  bool done = false;
  std::string error;
  // Result hand-off: the accumulated value(s) moved out of the core and the number of gradients.
  at::Tensor value;    // dense: the buffer; sparse: the row sums
  at::Tensor indices;  // sparse: sorted unique indices
  at::Tensor counts;   // sparse: per-index counts
  int64_t counter = 0;
};

class CoreBase {
 public:
  CoreBase(bool sparse, c10::ScalarType dtype, PartialShape shape, bool mean);
  virtual ~CoreBase() = default;
  CoreBase(const CoreBase&) = delete;
  CoreBase& operator=(const CoreBase&) = delete;

  const bool sparse;
  const c10::ScalarType dtype;
  const PartialShape shape;
  const bool mean;

  int64_t num_accumulated();
  void set_global_step(int64_t step);
  int64_t global_step();
  void close();
  bool closed();
  Stats stats();

 protected:
  // Registers a take, flushes, and waits (GIL already released by the caller's dispatcher call).
  // Returns the completed attempt. timeout_s < 0: no timeout.
  std::shared_ptr<TakeAttempt> take(int64_t num_required, double timeout_s, const char* what);
  // Under mu_: completes pending takes from the front of the FIFO while enough gradients are there.
  void flush_locked();
  // Under mu_: hands the accumulated state to `t` and resets it (counter = 0).
  virtual void complete_locked(TakeAttempt& t) = 0;
  // Under mu_: the checks and bookkeeping shared by dense and sparse applies. Returns false if the
  // gradient is stale (dropped and counted).
  bool begin_apply_locked(int64_t local_step, const char* what);

  std::mutex mu_;
  std::condition_variable cv_;
  int64_t counter_ = 0;
  int64_t global_step_ = 0;
  bool closed_ = false;
  std::deque<std::shared_ptr<TakeAttempt>> takers_;
  Stats stats_;
};

class DenseCore : public CoreBase {
 public:
  DenseCore(c10::ScalarType dtype, PartialShape shape, bool mean) : CoreBase(false, dtype, std::move(shape), mean) {}
  void apply(int64_t local_step, const at::Tensor& grad);
  at::Tensor take_grad(int64_t num_required, double timeout_s);

 private:
  void complete_locked(TakeAttempt& t) override;
  at::Tensor accum_;  // owned buffer (opmath dtype); undefined after a take until the next apply
};

class SparseCore : public CoreBase {
 public:
  SparseCore(c10::ScalarType dtype, PartialShape shape, bool mean) : CoreBase(true, dtype, std::move(shape), mean) {}
  // shape: the gradient's dense shape (TF has_known_shape) or nullopt.
  void apply(int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
             const c10::optional<std::vector<int64_t>>& dense_shape);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> take_grad(int64_t num_required, double timeout_s);

 private:
  void complete_locked(TakeAttempt& t) override;
  at::Tensor indices_;  // sorted unique int64 indices; undefined when counter_ == 0
  at::Tensor values_;   // [nnz, ...] row sums (opmath dtype)
  at::Tensor counts_;   // [nnz] int64 per-index counts
};

// Registry (registry.cpp). Empty shared_name: a private core. Mismatched kind/dtype/shape/reduction on
// sharing: c10::Error naming both.
std::shared_ptr<DenseCore> get_or_create_dense(const std::string& container, const std::string& shared_name,
                                               c10::ScalarType dtype, const PartialShape& shape, bool mean);
std::shared_ptr<SparseCore> get_or_create_sparse(const std::string& container, const std::string& shared_name,
                                                 c10::ScalarType dtype, const PartialShape& shape, bool mean);
// Closes every live accumulator (shared and private) and forgets the shared ones. shutdown: later
// creations fail (interpreter exit).
void close_all(bool shutdown);
int64_t in_flight();
struct InFlight {
  InFlight();
  ~InFlight();
};

// The TorchScript-visible handles.
struct ConditionalAccumulator : torch::CustomClassHolder {
  ConditionalAccumulator(c10::ScalarType dtype, c10::optional<std::vector<int64_t>> shape, std::string container,
                         std::string shared_name, std::string reduction_type);
  std::shared_ptr<DenseCore> core;
  std::string container, shared_name, reduction_type;
};

struct SparseConditionalAccumulator : torch::CustomClassHolder {
  SparseConditionalAccumulator(c10::ScalarType dtype, c10::optional<std::vector<int64_t>> shape,
                               std::string container, std::string shared_name, std::string reduction_type);
  std::shared_ptr<SparseCore> core;
  std::string container, shared_name, reduction_type;
};

// Helpers shared by the classes.
PartialShape make_shape(const c10::optional<std::vector<int64_t>>& shape, const char* what);
bool parse_reduction(const std::string& reduction_type, const char* what);
void check_dtype(c10::ScalarType dtype, const char* what);
c10::ScalarType opmath(c10::ScalarType dtype);
// accum (+)= grad, in place, on grad's device (copy=true: accum = grad). Calls torchops::_accumulator_add_.
void accumulate(const at::Tensor& accum, const at::Tensor& grad, bool copy);

// The ops and the handles' methods (ops.cpp), bound in schemas.cpp.
using Dense = c10::intrusive_ptr<ConditionalAccumulator>;
using Sparse = c10::intrusive_ptr<SparseConditionalAccumulator>;
// A handle's pickled state: dtype, declared shape, container, shared_name, reduction_type.
using HandleState = std::tuple<int64_t, c10::optional<std::vector<int64_t>>, std::string, std::string, std::string>;

void apply_gradient(const Dense& h, int64_t local_step, const at::Tensor& gradient);
at::Tensor take_gradient(const Dense& h, int64_t num_required, c10::optional<double> timeout);
int64_t num_accumulated(const Dense& h);
int64_t num_accumulated_sparse(const Sparse& h);
void set_global_step(const Dense& h, int64_t step);
void set_global_step_sparse(const Sparse& h, int64_t step);
void sparse_apply_gradient(const Sparse& h, int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
                           const at::Tensor& gradient_shape, bool has_known_shape);
void sparse_apply_gradient_coo(const Sparse& h, int64_t local_step, const at::Tensor& gradient);
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_take_gradient(const Sparse& h, int64_t num_required,
                                                                     c10::optional<double> timeout);
void close_all_op(bool shutdown);
int64_t in_flight_op();

// SparseConditionalAccumulator.apply_grad: shape None = unknown dense shape.
void sparse_apply_grad(const Sparse& h, int64_t local_step, const at::Tensor& indices, const at::Tensor& values,
                       const c10::optional<at::Tensor>& shape);
// Methods of both handle classes (H = Dense or Sparse; C = the class).
template <typename H>
int64_t handle_global_step(const H& h);
template <typename H>
void handle_close(const H& h);
template <typename H>
bool handle_closed(const H& h);
template <typename H>
c10::Dict<std::string, int64_t> handle_stats(const H& h);
template <typename H>
c10::ScalarType handle_dtype(const H& h);
template <typename H>
c10::optional<std::vector<int64_t>> handle_shape(const H& h);
template <typename H>
std::string handle_container(const H& h);
template <typename H>
std::string handle_shared_name(const H& h);
template <typename H>
std::string handle_reduction_type(const H& h);
template <typename H>
HandleState handle_get_state(const H& h);
template <typename C>
c10::intrusive_ptr<C> handle_set_state(HandleState s);

}  // namespace accumulator
}  // namespace torchops
