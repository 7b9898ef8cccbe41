// Stateful resources behind Batch / Unbatch / UnbatchGrad.
//
//  * BatchResource: a shared batch scheduler. `num_batch_threads` worker threads serve one queue per
//    `batching_queue` name (round-robin). A queue is a deque of batches whose back is the open one;
//    a batch ships when full, when its timeout passes, or when the resource is closed (flush).
//  * UnbatchResource: hands each invocation its own rows of a batched tensor (waiters + stored pieces,
//    both with deadlines).
//  * UnbatchGradResource: gathers the invocations' gradients into the batch holder's gradient.
//
// Every resource has one mutex + one condition variable; waits are wait_until loops with a deadline
// and a closed flag; close() wakes every waiter with an error; destructors never block; worker
// threads never call into Python. Resources live in process-wide registries keyed by
// (container, shared_name), one registry per kind.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/util/string_view.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace torchops {
namespace batching {

using Clock = std::chrono::steady_clock;

// Timeouts are clamped to 100 years where they become deadlines, so that huge values (up to
// INT64_MAX microseconds) mean "practically never" instead of overflowing the clock.
inline std::chrono::microseconds clamp_timeout(int64_t micros) {
  constexpr int64_t kMax = int64_t(100) * 365 * 24 * 3600 * 1000000;
  return std::chrono::microseconds(micros < 0 ? 0 : (micros > kMax ? kMax : micros));
}

constexpr int64_t kMaxBatchThreads = 1024;  // num_batch_threads above this is a clear error

struct BatchOptions {
  int64_t num_batch_threads = 1;
  int64_t max_batch_size = 1;
  int64_t batch_timeout_micros = 0;
  int64_t grad_timeout_micros = 0;
  int64_t max_enqueued_batches = 10;
  std::vector<int64_t> allowed_batch_sizes;
};

// Device work of a call runs on its thread's current stream. Tensors handed between the calls of a batch
// (inputs to the concatenation, rows to their callers) may come from another thread's stream: the
// receiving stream then waits for the producing one (an event, no host wait), and the caching allocator
// learns that the receiver uses the tensor. Nothing happens for CPU tensors or on the same stream (the
// default stream of every thread, unless the caller chose one).
std::optional<c10::Stream> current_stream(const at::Tensor& t);  // nullopt for non-CUDA tensors
void order_after(const at::Tensor& t, const std::optional<c10::Stream>& producer);

// Validates the attributes (TF's messages). Throws c10::Error / c10::ValueError.
void validate_options(const BatchOptions& o);

// The result one Batch invocation receives.
struct BatchOutput {
  std::vector<at::Tensor> batched;  // holder: concatenated + padded; others: [0] + own trailing shape
  at::Tensor batch_index;           // holder: [K, 3]; others: [0, 3]
  int64_t id = 0;
};

// Per-queue statistics. Guarded by the owning resource's mutex.
struct QueueStats {
  int64_t tasks = 0;
  int64_t batches_formed = 0;
  int64_t batches_failed = 0;
  int64_t padding_rows = 0;
  int64_t rows = 0;  // unpadded rows processed
  int64_t deferred_batches = 0;    // batches whose other calls were released by the holder's Unbatch
  int64_t deferred_fallbacks = 0;  // ... of which released by the fallback deadline instead
  std::map<int64_t, int64_t> batch_size_histogram;  // padded size -> count
  std::map<std::string, int64_t> rejections;        // reason -> count
  int64_t wait_count = 0;
  double wait_total_us = 0;
  double wait_max_us = 0;
  std::vector<float> wait_samples_us;  // ring buffer of the latest waits (for percentiles)
  size_t wait_next = 0;
  void add_wait(double us);
  std::string to_json() const;
};

struct Task;
struct Batch;
struct BatchState;

class BatchResource {
 public:
  BatchResource(const BatchOptions& o);
  ~BatchResource();  // never blocks: closes, detaches the workers (they hold the shared state)
  BatchResource(const BatchResource&) = delete;
  BatchResource& operator=(const BatchResource&) = delete;

  const BatchOptions& options() const { return options_; }
  // Enqueues one invocation and blocks until its batch is processed (or fails / is closed).
  BatchOutput run(std::vector<at::Tensor> inputs, const std::string& queue_name);
  // Stops accepting tasks, flushes every queued batch, and waits (bounded) for the workers.
  void close(bool wait);
  // JSON of one queue's statistics; empty string if the queue does not exist.
  std::string stats_json(const std::string& queue_name);
  std::vector<std::string> queue_names();
  // Counts a task rejected before enqueueing (invalid input) in the queue's statistics.
  void record_rejection(const std::string& queue_name, const std::string& reason);

 private:
  BatchOptions options_;
  std::shared_ptr<BatchState> state_;
  std::vector<std::thread> workers_;
};

class UnbatchResource {
 public:
  explicit UnbatchResource(int64_t timeout_micros) : timeout_micros_(timeout_micros) {}
  int64_t timeout_micros() const { return timeout_micros_; }
  // pieces: (key, tensor) of a non-empty batch (may be empty), made on `producer` (current_stream of the
  // batched tensor). Blocks until `id`'s piece arrives.
  at::Tensor run(int64_t id, std::vector<std::pair<int64_t, at::Tensor>> pieces, int64_t timeout_micros,
                 const std::optional<c10::Stream>& producer = std::nullopt);
  // Fails the waiters of these keys (and any later call for them, until it expires) with `message`.
  void fail(const std::vector<int64_t>& keys, const std::string& message);
  void close();

 private:
  // A blocked call. Completed by whoever brings its piece: removed from waiters_ under mu_, then
  // filled and notified under its own mutex (so a scatter wakes exactly its receivers, with no
  // convoy on mu_).
  struct Waiter {
    Clock::time_point deadline;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    at::Tensor value;
    std::optional<c10::Stream> stream;  // where value was made
    std::string error;
  };
  static void complete(Waiter& w, at::Tensor value, const std::string& error,
                       const std::optional<c10::Stream>& stream = std::nullopt);
  struct Piece {
    at::Tensor value;
    std::string error;
    Clock::time_point deadline;
    std::optional<c10::Stream> stream;  // where value was made
  };
  void sweep_locked(Clock::time_point now);  // drops expired pieces
  void store_locked(int64_t key, Piece piece);
  const int64_t timeout_micros_;
  std::mutex mu_;
  bool closed_ = false;
  std::atomic<bool> closed_flag_{false};
  std::unordered_map<int64_t, std::shared_ptr<Waiter>> waiters_;
  std::unordered_map<int64_t, Piece> pieces_;
  Clock::time_point next_expiry_ = Clock::time_point::max();  // no piece expires before this
};

class UnbatchGradResource {
 public:
  // original_input / batch_index as given; grad stored under id. Returns the holder's N-row gradient,
  // or an empty tensor for a non-holder. timeout_micros < 0: wait forever (woken by close()).
  at::Tensor run(const at::Tensor& original_input, const at::Tensor& batch_index, const at::Tensor& grad,
                 int64_t id, int64_t timeout_micros);
  void close();

 private:
  struct Holder {
    std::vector<int64_t> keys;  // batch_index row order
    size_t missing = 0;
    bool failed = false;
    std::string error;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::unordered_map<int64_t, at::Tensor> grads_;
  std::unordered_map<int64_t, std::shared_ptr<Holder>> holders_;  // holder id -> holder
  std::unordered_map<int64_t, int64_t> missing_to_holder_;
};

// Process-wide registries. get_or_create_* check that the attributes match the creator's.
std::shared_ptr<BatchResource> get_or_create_batch(c10::string_view container, c10::string_view shared_name,
                                                   const BatchOptions& o);
std::shared_ptr<UnbatchResource> get_or_create_unbatch(c10::string_view container, c10::string_view shared_name,
                                                       int64_t timeout_micros);
std::shared_ptr<UnbatchGradResource> get_or_create_unbatch_grad(c10::string_view container,
                                                               c10::string_view shared_name);
std::shared_ptr<UnbatchResource> find_unbatch(c10::string_view container, c10::string_view shared_name);
// Closes and forgets every resource (all kinds). Blocked calls get an error or their flushed batch.
// With shutdown=true (interpreter exit), later calls fail at once instead of creating new resources.
void close_all(bool shutdown = false);
// Number of calls currently inside batch / unbatch / unbatch_grad (to let released callers drain at exit).
int64_t in_flight();
// RAII counter of in_flight().
struct InFlight {
  InFlight();
  ~InFlight();
};
// Statistics of one queue as JSON ("" if unknown).
std::string stats_json(const std::string& container, const std::string& shared_name, const std::string& queue);
// JSON list of [container, shared_name, queue] of every live queue.
std::string list_queues_json();

int64_t new_id();

// Deferred release (batch_resource.cpp): every batching op calls this on entry (Unbatch: after storing
// a non-empty batch's rows, with the id of its batch_index's last row) so that the calls held back by
// this thread's last batch are released before the thread blocks or once it has unbatched.
void on_batching_call(const int64_t* last_row_id);

// The ops (ops.cpp), registered in schemas.cpp.
std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor> batch_kernel(
    at::TensorList in_tensors, int64_t num_batch_threads, int64_t max_batch_size, int64_t batch_timeout_micros,
    int64_t grad_timeout_micros, int64_t max_enqueued_batches, at::IntArrayRef allowed_batch_sizes,
    c10::string_view container, c10::string_view shared_name, c10::string_view batching_queue);
at::Tensor unbatch_kernel(const at::Tensor& batched_tensor, const at::Tensor& batch_index, const at::Tensor& id,
                          int64_t timeout_micros, c10::string_view container, c10::string_view shared_name);
std::tuple<std::vector<at::Tensor>, at::Tensor, at::Tensor, std::vector<at::Tensor>> batch_then_unbatch_kernel(
    at::TensorList in_tensors, int64_t num_batch_threads, int64_t max_batch_size, int64_t batch_timeout_micros,
    int64_t grad_timeout_micros, int64_t max_enqueued_batches, at::IntArrayRef allowed_batch_sizes,
    c10::string_view container, c10::string_view shared_name, c10::string_view batching_queue,
    const std::vector<std::string>& unbatch_names, int64_t unbatch_timeout_micros);
at::Tensor unbatch_grad_kernel(const at::Tensor& original_input, const at::Tensor& batch_index, const at::Tensor& grad,
                               const at::Tensor& id, c10::string_view container, c10::string_view shared_name,
                               int64_t timeout_micros);
std::string batching_stats(c10::string_view container, c10::string_view shared_name,
                           c10::string_view batching_queue);
std::string batching_list_queues();
void batching_close_all(bool shutdown);
int64_t batching_in_flight();
void unbatch_fail(const at::Tensor& batch_index, c10::string_view message, c10::string_view container,
                  c10::string_view shared_name, int64_t timeout_micros);
void arm_unbatch_fail(const at::Tensor& batch_index, c10::string_view message, c10::string_view container,
                      c10::string_view shared_name, int64_t timeout_micros);

}  // namespace batching
}  // namespace torchops
