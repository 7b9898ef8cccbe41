// Batch / Unbatch / UnbatchGrad: validation (TF's order and messages) and the device-independent
// kernels (registered at CompositeExplicitAutograd: the work is ATen concatenation and slicing, so
// every device works; the autograd at the Autograd key is CPU-only). The stateful resources live in
// batch_resource.cpp, unbatch_resource.cpp and registry.cpp.
#include "batching/batching.h"
#include "common/arg_checks.h"

#include <ATen/core/Tensor.h>
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <tuple>

namespace torchops {
namespace batching {
namespace {

std::string describe(at::TensorList ts) {
  std::ostringstream ss;
  for (size_t i = 0; i < ts.size(); ++i) ss << (i ? ", " : " ") << "in_tensors[" << i << "]: " << ts[i].sizes();
  return ss.str();
}

std::string debug_string(const at::Tensor& t) {
  std::ostringstream ss;
  ss << "Tensor<type: " << t.scalar_type() << " shape: " << t.sizes() << ">";
  return ss.str();
}

// Every invocation appears once in a batch_index (Batch makes the ids unique); a repeated id would
// make Unbatch hand out rows twice and UnbatchGrad wait for a gradient that is already counted.
void check_unique_ids(const int64_t* p, int64_t k, const char* op) {
  std::vector<std::pair<int64_t, int64_t>> seen(k);  // (id, row), sorted: no hashing per call
  for (int64_t j = 0; j < k; ++j) seen[j] = {p[3 * j], j};
  std::sort(seen.begin(), seen.end());
  for (int64_t j = 1; j < k; ++j) {
    TORCH_CHECK_VALUE(seen[j].first != seen[j - 1].first, op, ": batch_index lists id ", seen[j].first,
                      " twice (rows ", seen[j - 1].second, " and ", seen[j].second,
                      "); each invocation of a batch appears once");
  }
}

int64_t scalar_id(const at::Tensor& id) {
  TORCH_CHECK(id.scalar_type() == at::kLong, "id must be an int64 tensor, got ", id.scalar_type());
  if (id.is_cpu()) return *id.const_data_ptr<int64_t>();  // (0-dim, checked by the callers)
  return id.item<int64_t>();
}

// batch_index (or another small index tensor) as contiguous CPU int64 data, without dispatcher calls
// when it already is.
at::Tensor cpu_contiguous(const at::Tensor& t) {
  return t.is_cpu() && t.is_contiguous() ? t : t.to(at::kCPU).contiguous();
}

// The rows [offset, offset + size) of `t` as a fresh tensor (what TF's Unbatch hands out): a plain
// allocation + memcpy for contiguous CPU tensors (the common case, and on the batch holder's critical
// path once per invocation), else clone().
at::Tensor copy_rows(const at::Tensor& t, int64_t offset, int64_t size) {
  if (t.is_cpu() && t.layout() == at::kStrided && !t.is_quantized() && t.is_contiguous() && !t.is_neg() &&
      !t.is_conj()) {
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[0] = size;
    at::Tensor out = at::Tensor(at::detail::empty_cpu(shape, t.scalar_type(), false));
    const int64_t row = size > 0 ? out.nbytes() / size : 0;
    if (out.nbytes() > 0)
      std::memcpy(out.mutable_data_ptr(), static_cast<const char*>(t.const_data_ptr()) + offset * row, out.nbytes());
    return out;
  }
  return t.narrow(0, offset, size).clone();
}

// A batch this thread holds and has promised to unbatch (`_arm_unbatch_fail`, used by a scripted
// nn.Batched, where TorchScript cannot catch the module's exception and hand it to the other calls).
// If the thread makes any other batching call, or exits, before the holder's unbatch, the batch's calls
// are failed with `message` instead of waiting for their unbatch timeout.
struct AbandonedBatch {
  std::shared_ptr<UnbatchResource> res;
  std::vector<int64_t> keys;
  std::string message;
  void fire() {
    if (!res) return;
    auto r = std::move(res);
    res.reset();
    r->fail(keys, message);
  }
  ~AbandonedBatch() {
    try {
      fire();
    } catch (...) {
    }
  }
};
thread_local AbandonedBatch t_abandoned;

std::vector<int64_t> index_keys(const at::Tensor& batch_index) {
  TORCH_CHECK_VALUE(batch_index.dim() == 2 && batch_index.size(1) == 3,
                    "batch_index must have shape [K, 3], got ", batch_index.sizes());
  const at::Tensor idx = batch_index.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* p = idx.const_data_ptr<int64_t>();
  std::vector<int64_t> keys;
  keys.reserve(idx.size(0));
  for (int64_t j = 0; j < idx.size(0); ++j) keys.push_back(p[3 * j]);
  return keys;
}

}  // namespace

std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> batch_kernel(
    at::TensorList in_tensors, int64_t num_batch_threads, int64_t max_batch_size, int64_t batch_timeout_micros,
    int64_t grad_timeout_micros, int64_t max_enqueued_batches, at::IntArrayRef allowed_batch_sizes,
    c10::string_view container, c10::string_view shared_name, c10::string_view batching_queue) {
  InFlight in_flight;
  t_abandoned.fire();
  BatchOptions o;
  o.num_batch_threads = num_batch_threads;
  o.max_batch_size = max_batch_size;
  o.batch_timeout_micros = batch_timeout_micros;
  o.grad_timeout_micros = grad_timeout_micros;
  o.max_enqueued_batches = max_enqueued_batches;
  o.allowed_batch_sizes.assign(allowed_batch_sizes.begin(), allowed_batch_sizes.end());
  validate_options(o);
  TORCH_CHECK_VALUE(!in_tensors.empty(), "Batch: in_tensors must contain at least one tensor, got an empty list");
  const std::string queue(batching_queue);
  auto res = get_or_create_batch(container, shared_name, o);
  for (const auto& t : in_tensors) {
    if (t.dim() == 0) {
      res->record_rejection(queue, "invalid_input");
      TORCH_CHECK_VALUE(false, "Batching input tensors must have at least one dimension.", describe(in_tensors));
    }
  }
  for (const auto& t : in_tensors) {
    if (t.size(0) != in_tensors[0].size(0)) {
      res->record_rejection(queue, "invalid_input");
      TORCH_CHECK_VALUE(false,
                        "Batching input tensors supplied in a given op invocation must have equal 0th-dimension size.",
                        describe(in_tensors));
    }
  }
  if (in_tensors[0].size(0) == 0) {
    // Degenerate empty input: every output is a 1-D [0] tensor, nothing is enqueued.
    std::vector<at::Tensor> outs;
    for (const auto& t : in_tensors) outs.push_back(at::empty({0}, t.options()));
    return {outs, at::empty({0}, at::kLong), at::empty({0}, at::kLong)};
  }
  std::vector<at::Tensor> inputs(in_tensors.begin(), in_tensors.end());
  BatchOutput out = res->run(std::move(inputs), queue);
  // batch_index and id stay host tensors whatever the inputs' device (TF keeps them in host memory): reading
  // them (Unbatch, the caller's branch on batch_index.size(0)) then never waits for the device.
  at::Tensor id = at::Tensor(at::detail::empty_cpu({}, at::kLong, false));
  *id.mutable_data_ptr<int64_t>() = out.id;
  return {std::move(out.batched), std::move(out.batch_index), std::move(id)};
}

// Validation in TF's order, then the sequential split.
at::Tensor unbatch_kernel(const at::Tensor& batched_tensor, const at::Tensor& batch_index, const at::Tensor& id,
                          int64_t timeout_micros, c10::string_view container, c10::string_view shared_name) {
  InFlight in_flight;
  TORCH_CHECK_VALUE(batched_tensor.dim() >= 1, "Unbatch: batched_tensor must have at least one dimension, got shape ",
                    batched_tensor.sizes());
  const int64_t d0 = batched_tensor.size(0);
  TORCH_CHECK_VALUE(batch_index.dim() == 0 || batch_index.size(0) <= d0,
                    "Wrong shape for index tensor. Expected 0th dimension size to be no greater than ", d0,
                    "; Got: ", batch_index.dim() >= 1 ? batch_index.size(0) : 0, ".");
  TORCH_CHECK_VALUE(batch_index.dim() >= 2 && batch_index.size(1) == 3,
                    "Wrong shape for index tensor. Expected 1st dimension size to be 3 ; Got: ",
                    batch_index.dim() >= 2 ? std::to_string(batch_index.size(1))
                                           : "a rank-" + std::to_string(batch_index.dim()) + " batch_index of shape " +
                                                 c10::str(batch_index.sizes()),
                    ".");
  TORCH_CHECK_VALUE(id.dim() == 0, "Input id should be scalar; Got: ", debug_string(id), ".");
  TORCH_CHECK_VALUE(batch_index.dim() == 2, "Unbatch: batch_index must be 2-dimensional [K, 3], got shape ",
                    batch_index.sizes());
  TORCH_CHECK_VALUE(batch_index.scalar_type() == at::kLong, "Unbatch: batch_index must be int64, got ",
                    batch_index.scalar_type());
  TORCH_CHECK_VALUE(timeout_micros >= 0, "Unbatch: timeout_micros must be non-negative; was ", timeout_micros);
  const int64_t my = scalar_id(id);
  std::vector<std::pair<int64_t, at::Tensor>> pieces;
  const int64_t k = batch_index.size(0);
  if (k > 0) {
    const at::Tensor idx = cpu_contiguous(batch_index);
    const int64_t* p = idx.const_data_ptr<int64_t>();
    check_unique_ids(p, k, "Unbatch");
    int64_t total = 0;  // (overflow-checked: the values are arbitrary user input)
    for (int64_t j = 0; j < k; ++j) {
      int64_t size = 0;
      TORCH_CHECK_VALUE(!__builtin_sub_overflow(p[3 * j + 2], p[3 * j + 1], &size), "Unbatch: batch_index row ", j,
                        " has start ", p[3 * j + 1], " and end ", p[3 * j + 2], ", whose difference overflows int64");
      TORCH_CHECK_VALUE(size >= 0, "Unbatch: batch_index row ", j, " has end ", p[3 * j + 2], " before start ",
                        p[3 * j + 1], " (negative split size)");
      TORCH_CHECK_VALUE(size <= d0 - total, "Sum of split sizes must not exceed dim0-size of input tensor; rows 0..",
                        j, " of batch_index need more than the ", d0, " rows of batched_tensor");
      total += size;
    }
    int64_t offset = 0;
    pieces.reserve(k);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t size = p[3 * j + 2] - p[3 * j + 1];
      pieces.emplace_back(p[3 * j], copy_rows(batched_tensor, offset, size));
      offset += size;
    }
  }
  auto res = get_or_create_unbatch(container, shared_name, timeout_micros);
  if (t_abandoned.res == res && !pieces.empty())
    t_abandoned.res.reset();  // the holder delivers its batch: nothing to fail
  else
    t_abandoned.fire();
  if (pieces.empty()) {
    on_batching_call(nullptr);  // release before blocking
    return res->run(my, std::move(pieces), timeout_micros);
  }
  const int64_t last_row_id = pieces.back().first;
  struct Release {
    int64_t id;
    ~Release() { on_batching_call(&id); }  // after the rows are stored (or on error)
  } release{last_row_id};
  return res->run(my, std::move(pieces), timeout_micros, current_stream(batched_tensor));
}

// The inference fast path of nn.Batched / batch_function: Batch, and for a call that does not hold its
// batch, its Unbatch from each of `unbatch_names` as well, in one op call instead of two (from Python
// threads every op call is a GIL round trip, the main cost of a request there). `unbatched` is empty
// for the holder (it runs the model and calls unbatch itself) and for 0-row inputs.
std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor, std::vector<at::Tensor>> batch_then_unbatch_kernel(
    at::TensorList in_tensors, int64_t num_batch_threads, int64_t max_batch_size, int64_t batch_timeout_micros,
    int64_t grad_timeout_micros, int64_t max_enqueued_batches, at::IntArrayRef allowed_batch_sizes,
    c10::string_view container, c10::string_view shared_name, c10::string_view batching_queue,
    const std::vector<std::string>& unbatch_names, int64_t unbatch_timeout_micros) {
  TORCH_CHECK_VALUE(unbatch_timeout_micros >= 0, "unbatch_timeout_micros must be non-negative; was ",
                    unbatch_timeout_micros);
  auto [batched, index, id] = batch_kernel(in_tensors, num_batch_threads, max_batch_size, batch_timeout_micros,
                                           grad_timeout_micros, max_enqueued_batches, allowed_batch_sizes, container,
                                           shared_name, batching_queue);
  std::vector<at::Tensor> unbatched;
  if (index.dim() == 2 && index.size(0) == 0) {  // (a 0-row input gets a 1-D index: nothing to wait for)
    unbatched.reserve(unbatch_names.size());
    for (const auto& name : unbatch_names)
      unbatched.push_back(unbatch_kernel(batched[0], index, id, unbatch_timeout_micros, container, name));
  }
  return {std::move(batched), std::move(index), std::move(id), std::move(unbatched)};
}

at::Tensor unbatch_grad_kernel(const at::Tensor& original_input, const at::Tensor& batch_index, const at::Tensor& grad,
                               const at::Tensor& id, c10::string_view container, c10::string_view shared_name,
                               int64_t timeout_micros) {
  InFlight in_flight;
  check_defined(original_input, "original_input");
  check_defined(batch_index, "batch_index");
  check_defined(grad, "grad");
  check_defined(id, "id");
  TORCH_CHECK_VALUE(id.dim() == 0, "Expected `id` to be scalar. Received ", debug_string(id));
  TORCH_CHECK_VALUE(grad.dim() >= 1, "UnbatchGrad: grad must have at least one dimension, got shape ", grad.sizes());
  TORCH_CHECK_VALUE(batch_index.scalar_type() == at::kLong, "UnbatchGrad: batch_index must be int64, got ",
                    batch_index.scalar_type());
  TORCH_CHECK_VALUE(timeout_micros >= -1, "UnbatchGrad: timeout_micros must be -1 (wait forever) or non-negative; was ",
                    timeout_micros);
  // (the CPU copy is the one the resource reads too)
  const at::Tensor idx = cpu_contiguous(batch_index);
  if (idx.dim() == 2 && idx.size(1) == 3) check_unique_ids(idx.const_data_ptr<int64_t>(), idx.size(0), "UnbatchGrad");
  const int64_t my = scalar_id(id);
  // The holder (the invocation whose original_input is the batch): validate the index against the batch
  // and its own gradient against its row (O(K)).
  int64_t rows_total = -1;
  if (original_input.numel() > 0) {
    TORCH_CHECK_VALUE(original_input.dim() >= 1, "UnbatchGrad: original_input must have at least one dimension, got "
                      "shape ", original_input.sizes());
    TORCH_CHECK_VALUE(idx.numel() > 0, "batch_index is empty while the tensor isn't.");
    const int64_t rows = idx.dim() > 0 ? idx.size(0) : 1;
    TORCH_CHECK_VALUE(idx.numel() == rows * 3, "batch_index should contain ", rows * 3, " elements. Received ",
                      idx.numel());
    TORCH_CHECK_VALUE(idx.dim() == 2 && idx.size(1) == 3, "UnbatchGrad: batch_index must have shape [K, 3], got ",
                      idx.sizes());
    const int64_t d0 = original_input.size(0), k = idx.size(0);
    const int64_t* p = idx.const_data_ptr<int64_t>();
    int64_t total = 0, own = -1;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t start = p[3 * j + 1], end = p[3 * j + 2];
      TORCH_CHECK_VALUE(start >= 0 && start <= end && end <= d0, "UnbatchGrad: batch_index row ", j, " = [", p[3 * j],
                        ", ", start, ", ", end, "] must have 0 <= start <= end <= original_input.size(0) = ", d0);
      total += end - start;  // (each term <= d0: no overflow before the check below)
      TORCH_CHECK_VALUE(total <= d0, "UnbatchGrad: the rows of batch_index (", total, " after row ", j,
                        ") exceed original_input.size(0) = ", d0);
      if (p[3 * j] == my) own = end - start;
    }
    TORCH_CHECK_VALUE(own >= 0, "UnbatchGrad: batch_index has no row for id ", my);
    std::vector<int64_t> want(original_input.sizes().begin(), original_input.sizes().end());
    want[0] = own;
    TORCH_CHECK_VALUE(grad.sizes() == at::IntArrayRef(want), "UnbatchGrad: grad of id ", my, " must have shape ",
                      at::IntArrayRef(want), " (its batch_index row and original_input's trailing dimensions), got ",
                      grad.sizes());
    rows_total = total;
  }
  t_abandoned.fire();
  on_batching_call(nullptr);
  auto res = get_or_create_unbatch_grad(container, shared_name);
  at::Tensor out = res->run(original_input, idx, grad, my, timeout_micros);
  // The other invocations' gradients, concatenated: as many rows as batch_index says, original_input's trailing shape.
  TORCH_CHECK_VALUE(rows_total < 0 || (out.dim() == original_input.dim() && out.size(0) == rows_total &&
                                       out.sizes().slice(1) == original_input.sizes().slice(1)),
                    "UnbatchGrad: the gradients of the batch's invocations concatenate to shape ", out.sizes(),
                    ", but batch_index and original_input (shape ", original_input.sizes(), ") say ", rows_total,
                    " rows of shape ", original_input.sizes().slice(1));
  return out;
}

// Python-side helpers (no tensors; not traced by torch.compile).
std::string batching_stats(c10::string_view container, c10::string_view shared_name,
                           c10::string_view batching_queue) {
  return stats_json(std::string(container), std::string(shared_name), std::string(batching_queue));
}

std::string batching_list_queues() { return list_queues_json(); }

void batching_close_all(bool shutdown) { close_all(shutdown); }

int64_t batching_in_flight() { return in_flight(); }

// Fails the calls of a batch whose holder could not produce the batched output. timeout_micros: the
// Unbatch resource's (it is created if no call has reached Unbatch yet, so that the failure waits for
// them); -1: only an existing resource is told.
void unbatch_fail(const at::Tensor& batch_index, c10::string_view message, c10::string_view container,
                  c10::string_view shared_name, int64_t timeout_micros) {
  struct Release {  // then release the calls this thread holds back (deferred release): they see the failure
    ~Release() { on_batching_call(nullptr); }
  } release;
  t_abandoned.res.reset();  // this failure replaces an armed one
  if (batch_index.numel() == 0) return;
  const auto keys = index_keys(batch_index);
  auto res = timeout_micros >= 0 ? get_or_create_unbatch(container, shared_name, timeout_micros)
                                 : find_unbatch(container, shared_name);
  if (res) res->fail(keys, std::string(message));
}

void arm_unbatch_fail(const at::Tensor& batch_index, c10::string_view message, c10::string_view container,
                      c10::string_view shared_name, int64_t timeout_micros) {
  t_abandoned.fire();  // (an earlier armed batch that was never unbatched)
  if (batch_index.numel() == 0) return;
  t_abandoned.keys = index_keys(batch_index);
  t_abandoned.message = std::string(message);
  t_abandoned.res = get_or_create_unbatch(container, shared_name, timeout_micros);
}

}  // namespace batching
}  // namespace torchops
