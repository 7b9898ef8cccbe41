// The accumulator state machines: counter, global step, FIFO takes, staleness, close.
#include "accumulator/accumulator.h"

#include <ATen/ops/_unique2.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace torchops {
namespace accumulator {

std::string PartialShape::str() const {
  if (!known_rank) return "<unknown>";
  std::ostringstream ss;
  ss << "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    ss << (i ? ", " : "");
    if (dims[i] < 0)
      ss << "?";
    else
      ss << dims[i];
  }
  ss << "]";
  return ss.str();
}

PartialShape make_shape(const c10::optional<std::vector<int64_t>>& shape, const char* what) {
  PartialShape s;
  if (!shape.has_value()) return s;
  s.known_rank = true;
  s.dims = *shape;
  for (size_t i = 0; i < s.dims.size(); ++i) {
    TORCH_CHECK_VALUE(s.dims[i] >= -1, what, ": shape[", i, "] must be a non-negative size or -1 (unknown), got ",
                      s.dims[i]);
  }
  return s;
}

bool parse_reduction(const std::string& r, const char* what) {
  TORCH_CHECK_VALUE(r == "MEAN" || r == "SUM", what, ": reduction_type must be 'MEAN' or 'SUM', got '", r, "'");
  return r == "MEAN";
}

void check_dtype(c10::ScalarType dtype, const char* what) {
  TORCH_CHECK_TYPE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble, what,
                   ": dtype must be float16, bfloat16, float32 or float64, got ", dtype);
}

c10::ScalarType opmath(c10::ScalarType dtype) {
  return (dtype == at::kHalf || dtype == at::kBFloat16) ? at::kFloat : dtype;
}

namespace {
// Timeouts are clamped to 100 years so huge values mean "practically never" without overflow.
Clock::time_point deadline_after(double seconds) {
  constexpr double kMax = 100.0 * 365 * 24 * 3600;
  if (!(seconds > 0)) seconds = 0;  // (NaN too)
  if (seconds > kMax) seconds = kMax;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

constexpr const char* kCancelled = "TakeGrad operation was cancelled";
}  // namespace

CoreBase::CoreBase(bool sparse_, c10::ScalarType dtype_, PartialShape shape_, bool mean_)
    : sparse(sparse_), dtype(dtype_), shape(std::move(shape_)), mean(mean_) {}

int64_t CoreBase::num_accumulated() {
  std::lock_guard<std::mutex> lk(mu_);
  return counter_;
}

int64_t CoreBase::global_step() {
  std::lock_guard<std::mutex> lk(mu_);
  return global_step_;
}

void CoreBase::set_global_step(int64_t step) {
  std::lock_guard<std::mutex> lk(mu_);
  if (step < global_step_) {
    TORCH_WARN("Attempt to set current_global_step_ to smaller value: current_global_step_ = ", global_step_,
               " >= ", step, " = new_global_step.");
  }
  global_step_ = step;  // always (TF), even backwards; does not flush takes
}

bool CoreBase::closed() {
  std::lock_guard<std::mutex> lk(mu_);
  return closed_;
}

Stats CoreBase::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void CoreBase::close() {
  std::lock_guard<std::mutex> lk(mu_);
  closed_ = true;
  for (auto& t : takers_) {
    t->done = true;
    t->error = std::string(kCancelled) + " (the accumulator was closed while the take was waiting)";
    ++stats_.cancelled;
  }
  takers_.clear();
  cv_.notify_all();
}

void CoreBase::flush_locked() {
  bool completed = false;
  while (!takers_.empty()) {
    auto& front = takers_.front();
    if (counter_ < front->num_required) break;  // head-of-line blocking (TF)
    complete_locked(*front);
    front->done = true;
    ++global_step_;
    ++stats_.takes;
    takers_.pop_front();
    completed = true;
  }
  if (completed) cv_.notify_all();
}

bool CoreBase::begin_apply_locked(int64_t local_step, const char* what) {
  TORCH_CHECK(!closed_, what, ": the accumulator is closed; no gradient can be applied");
  if (local_step < global_step_) {
    ++stats_.dropped_stale;  // silently dropped (TF), but counted
    return false;
  }
  return true;
}

std::shared_ptr<TakeAttempt> CoreBase::take(int64_t num_required, double timeout_s, const char* what) {
  TORCH_CHECK_VALUE(num_required > 0, "Argument num_required must be positive, but was ", num_required);
  InFlight in_flight;
  auto t = std::make_shared<TakeAttempt>();
  t->num_required = num_required;
  std::unique_lock<std::mutex> lk(mu_);
  TORCH_CHECK(!closed_, kCancelled, ": ", what, ": the accumulator is closed");
  takers_.push_back(t);
  flush_locked();
  const bool timed = timeout_s >= 0;
  const Clock::time_point deadline = timed ? deadline_after(timeout_s) : Clock::time_point::max();
  while (!t->done) {
    if (!timed) {
      cv_.wait(lk);
    } else if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && !t->done) {
      auto it = std::find(takers_.begin(), takers_.end(), t);
      if (it != takers_.end()) takers_.erase(it);
      ++stats_.timeouts;
      flush_locked();  // the next attempt may now be at the front
      TORCH_CHECK(false, what, ": TakeGrad timed out after ", timeout_s, " s waiting for ", num_required,
                  " gradient(s) (", counter_, " accumulated); the accumulator state is unchanged");
    }
  }
  TORCH_CHECK(t->error.empty(), t->error);
  return t;
}

// ---------------------------------------------------------------------------------------------- dense

void DenseCore::apply(int64_t local_step, const at::Tensor& grad) {
  constexpr const char* what = "accumulator_apply_gradient";
  TORCH_CHECK(grad.defined(), what, ": gradient is an undefined tensor");
  TORCH_CHECK_TYPE(grad.scalar_type() == dtype, what, ": gradient dtype mismatch: the accumulator holds ", dtype,
                   " but the gradient is ", grad.scalar_type());
  TORCH_CHECK(grad.layout() == at::kStrided, what, ": gradient must be a dense (strided) tensor, got layout ",
              grad.layout(), "; use a SparseConditionalAccumulator for sparse gradients");
  std::lock_guard<std::mutex> lk(mu_);
  if (!begin_apply_locked(local_step, what)) {
    flush_locked();
    return;
  }
  if (counter_ > 0) {
    TORCH_CHECK_VALUE(grad.sizes() == accum_.sizes(), "Shape mismatch: expected ", accum_.sizes(), ", got ",
                      grad.sizes());
    TORCH_CHECK(grad.device() == accum_.device(), what, ": all gradients of one accumulation round must be on one "
                "device: the accumulated value is on ", accum_.device(), " but the gradient is on ", grad.device());
  }
  if (shape.known_rank) {
    bool ok = static_cast<size_t>(grad.dim()) == shape.dims.size();
    for (size_t i = 0; ok && i < shape.dims.size(); ++i) ok = shape.dims[i] < 0 || shape.dims[i] == grad.size(i);
    TORCH_CHECK_VALUE(ok, "Shape mismatch: expected ", shape.str(), ", got ", grad.sizes());
  }
  if (counter_ == 0) {
    // (the previous buffer went to the last take; this round's buffer is allocated once, here)
    if (!accum_.defined() || accum_.sizes() != grad.sizes() || accum_.device() != grad.device())
      accum_ = at::empty(grad.sizes(), grad.options().dtype(opmath(dtype)).memory_format(at::MemoryFormat::Contiguous));
    accumulate(accum_, grad, /*copy=*/true);
  } else {
    accumulate(accum_, grad, /*copy=*/false);
  }
  ++counter_;
  ++stats_.applied;
  flush_locked();
}

void DenseCore::complete_locked(TakeAttempt& t) {
  t.value = std::move(accum_);
  accum_ = at::Tensor();
  t.counter = counter_;
  counter_ = 0;
}

at::Tensor DenseCore::take_grad(int64_t num_required, double timeout_s) {
  auto t = take(num_required, timeout_s, "accumulator_take_gradient");
  at::Tensor v = std::move(t->value);
  // The buffer is ours alone now: finish the mean in place (opmath), round once to the dtype.
  if (mean && t->counter > 1) v.div_(t->counter);
  if (v.scalar_type() != dtype) v = v.to(dtype);
  return v;
}

// --------------------------------------------------------------------------------------------- sparse

void SparseCore::apply(int64_t local_step, const at::Tensor& indices_in, const at::Tensor& values,
                       const c10::optional<std::vector<int64_t>>& dense_shape) {
  constexpr const char* what = "sparse_accumulator_apply_gradient";
  TORCH_CHECK(indices_in.defined() && values.defined(), what, ": gradient indices/values are undefined tensors");
  TORCH_CHECK_TYPE(values.scalar_type() == dtype, what, ": gradient values dtype mismatch: the accumulator holds ",
                   dtype, " but the values are ", values.scalar_type());
  TORCH_CHECK_TYPE(indices_in.scalar_type() == at::kLong, what, ": gradient indices must be int64, got ",
                   indices_in.scalar_type());
  std::lock_guard<std::mutex> lk(mu_);
  if (!begin_apply_locked(local_step, what)) {
    flush_locked();
    return;
  }
  // Validation in TF's order and with TF's messages.
  TORCH_CHECK_VALUE(indices_in.dim() == 1, "Input indices should be vector but received shape: ", indices_in.sizes());
  TORCH_CHECK_VALUE(values.dim() > 0, "Values cannot be 0-dimensional.");
  const int64_t nnz = indices_in.size(0);
  TORCH_CHECK_VALUE(values.size(0) == nnz, "Expected ", nnz, " non-empty input values, got ", values.size(0));
  const int64_t drank = shape.known_rank ? static_cast<int64_t>(shape.dims.size()) : -1;
  if (dense_shape.has_value() && drank >= 0) {
    const auto& gs = *dense_shape;
    TORCH_CHECK_VALUE(drank <= static_cast<int64_t>(gs.size()), "Shape mismatch: expected shape rank at least ", drank,
                      ", got ", gs.size());
    for (int64_t i = 0; i < drank; ++i) {
      TORCH_CHECK_VALUE(shape.dims[i] < 0 || shape.dims[i] == gs[i], "Shape mismatch: expected shape dim ", i,
                        " to be ", shape.dims[i], ", got ", gs[i]);
    }
  }
  const at::Tensor idx_cpu = indices_in.to(at::kCPU).contiguous();
  {
    const int64_t* p = idx_cpu.const_data_ptr<int64_t>();
    const int64_t limit = drank > 0 && shape.dims[0] >= 0 ? shape.dims[0] : -1;
    for (int64_t j = 0; j < nnz; ++j) {
      TORCH_CHECK_VALUE(p[j] >= 0, what, ": index of slice ", j, " is negative (", p[j], ")");
      TORCH_CHECK_VALUE(limit < 0 || p[j] < limit, "Shape mismatch: index of slice ", j,
                        " exceeded limits of shape; index is ", p[j], " exceeded ", limit);
    }
  }
  if (counter_ > 0) {
    TORCH_CHECK_VALUE(values.dim() == values_.dim(), "Shape mismatch: expected values rank ", values_.dim(), ", got ",
                      values.dim());
    for (int64_t i = 1; i < values.dim(); ++i) {
      TORCH_CHECK_VALUE(values.size(i) == values_.size(i), "Shape mismatch: expected values dim ", i, " to be ",
                        values_.size(i), ", got ", values.size(i));
    }
    TORCH_CHECK(values.device() == values_.device(), what, ": all gradients of one accumulation round must be on one "
                "device: the accumulated values are on ", values_.device(), " but the gradient is on ", values.device());
  } else if (drank >= 0) {
    TORCH_CHECK_VALUE(drank <= values.dim(), "Shape mismatch: expected values rank at least ", drank, ", got ",
                      values.dim());
    for (int64_t i = 1; i < drank; ++i) {
      TORCH_CHECK_VALUE(shape.dims[i] < 0 || shape.dims[i] == values.size(i), "Shape mismatch: expected values dim ",
                        i, " to be ", shape.dims[i], ", got ", values.size(i));
    }
  }
  // Accumulate: duplicates within the gradient are summed and count once; index order is free.
  const at::Tensor idx = indices_in.device() == values.device() ? indices_in : indices_in.to(values.device());
  const at::Tensor vals = values.to(opmath(dtype));
  std::vector<int64_t> row_shape(values.sizes().begin(), values.sizes().end());
  const auto long_opts = idx.options().dtype(at::kLong);
  if (counter_ == 0) {
    auto [u, inv, unused] = at::_unique2(idx, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
    row_shape[0] = u.size(0);
    values_ = at::zeros(row_shape, vals.options()).index_add_(0, inv, vals);
    counts_ = at::ones({u.size(0)}, long_opts);
    indices_ = u;
  } else {
    const int64_t n_old = indices_.size(0);
    auto [u, inv, unused] =
        at::_unique2(at::cat({indices_, idx}), /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
    row_shape[0] = u.size(0);
    const at::Tensor inv_old = inv.narrow(0, 0, n_old), inv_new = inv.narrow(0, n_old, nnz);
    at::Tensor v = at::zeros(row_shape, vals.options());
    v.index_add_(0, inv_old, values_).index_add_(0, inv_new, vals);
    at::Tensor c = at::zeros({u.size(0)}, long_opts);
    c.index_add_(0, inv_old, counts_);
    at::Tensor mark = at::zeros({u.size(0)}, long_opts);
    mark.index_fill_(0, inv_new, 1);
    values_ = v;
    counts_ = c.add_(mark);
    indices_ = u;
  }
  ++counter_;
  ++stats_.applied;
  flush_locked();
}

void SparseCore::complete_locked(TakeAttempt& t) {
  t.indices = std::move(indices_);
  t.value = std::move(values_);
  t.counts = std::move(counts_);
  indices_ = values_ = counts_ = at::Tensor();
  t.counter = counter_;
  counter_ = 0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> SparseCore::take_grad(int64_t num_required, double timeout_s) {
  auto t = take(num_required, timeout_s, "sparse_accumulator_take_gradient");
  at::Tensor v = std::move(t->value);
  if (mean) {
    std::vector<int64_t> view(v.dim(), 1);
    view[0] = v.size(0);
    v.div_(t->counts.to(v.scalar_type()).view(view));  // each row by its own count (TF)
  }
  if (v.scalar_type() != dtype) v = v.to(dtype);
  at::Tensor shp = at::empty({v.dim()}, at::TensorOptions().dtype(at::kLong));
  int64_t* s = shp.mutable_data_ptr<int64_t>();
  s[0] = shape.known_rank && !shape.dims.empty() ? shape.dims[0] : -1;
  for (int64_t i = 1; i < v.dim(); ++i) s[i] = v.size(i);
  return {std::move(t->indices), std::move(v), std::move(shp)};
}

}  // namespace accumulator
}  // namespace torchops
