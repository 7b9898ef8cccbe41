// The shared batch scheduler behind torchops::batch.
#include "batching/batching.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <sstream>

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace torchops {
namespace batching {

namespace {
constexpr size_t kWaitSamples = 8192;
constexpr int64_t kSpinMicros = 100;
// Calls of full batches yield-spin for up to this long before they sleep (see BatchResource::run).
constexpr float kMaxReleaseSpinMicros = 1000;

std::string error_text(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

// Timed waits for a batch's timeout use a 1 ns timer slack (Linux's default is 50 us) so that a batch
// ships when its timeout passes, not up to 50 us later; the thread's own slack is restored afterwards.
class PreciseTimers {
 public:
  PreciseTimers() {
#ifdef __linux__
    const int prev = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (prev > 1 && prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0) prev_ = prev;
#endif
  }
  ~PreciseTimers() {
#ifdef __linux__
    if (prev_ > 0) prctl(PR_SET_TIMERSLACK, static_cast<unsigned long>(prev_), 0, 0, 0);
#endif
  }
  PreciseTimers(const PreciseTimers&) = delete;
  PreciseTimers& operator=(const PreciseTimers&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

std::optional<c10::Stream> current_stream(const at::Tensor& t) {
  if (!t.defined() || !t.is_cuda()) return std::nullopt;
  return c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
}

void order_after(const at::Tensor& t, const std::optional<c10::Stream>& producer) {
  if (!producer || !t.defined() || t.device() != producer->device()) return;
  const c10::Stream consumer = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
  if (consumer == *producer) return;
  c10::Event ready(t.device().type());
  ready.record(*producer);
  ready.block(consumer);
  t.record_stream(consumer);
}

namespace {

std::string sizes_str(const at::Tensor& t) {
  std::ostringstream ss;
  ss << t.sizes();
  return ss.str();
}
}  // namespace

int64_t new_id() {
  thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    seed ^= static_cast<uint64_t>(std::hash<std::thread::id>()(std::this_thread::get_id()));
    seed ^= static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    return seed;
  }());
  return static_cast<int64_t>(gen());
}

void validate_options(const BatchOptions& o) {
  const auto& a = o.allowed_batch_sizes;
  if (!a.empty()) {
    TORCH_CHECK_VALUE(a[0] >= 1, "allowed_batch_sizes entries must be positive; got ", c10::IntArrayRef(a));
    for (size_t i = 1; i < a.size(); ++i) {
      TORCH_CHECK_VALUE(a[i] > a[i - 1], "allowed_batch_sizes entries must be monotonically increasing; got ", c10::IntArrayRef(a));
    }
    TORCH_CHECK_VALUE(a.back() == o.max_batch_size,
                      "final entry in allowed_batch_sizes must equal max_batch_size; got allowed_batch_sizes ", c10::IntArrayRef(a),
                      " and max_batch_size ", o.max_batch_size);
  }
  TORCH_CHECK_VALUE(o.num_batch_threads >= 1, "num_batch_threads must be positive; was ", o.num_batch_threads);
  // (each is an OS thread, started when the queue is created)
  TORCH_CHECK_VALUE(o.num_batch_threads <= kMaxBatchThreads, "num_batch_threads must be at most ", kMaxBatchThreads,
                    "; was ", o.num_batch_threads);
  TORCH_CHECK_VALUE(o.max_batch_size >= 1, "input_batch_size_limit must be positive; was ", o.max_batch_size,
                    " (max_batch_size)");
  TORCH_CHECK_VALUE(o.batch_timeout_micros >= 0, "batch_timeout_micros must be non-negative; was ",
                    o.batch_timeout_micros);
  TORCH_CHECK_VALUE(o.max_enqueued_batches >= 0, "max_enqueued_batches must be non-negative; was ",
                    o.max_enqueued_batches);
  TORCH_CHECK_VALUE(o.grad_timeout_micros >= 0, "grad_timeout_micros must be non-negative; was ",
                    o.grad_timeout_micros);
}

// ---------------------------------------------------------------------------------------------
// Statistics

void QueueStats::add_wait(double us) {
  ++wait_count;
  wait_total_us += us;
  wait_max_us = std::max(wait_max_us, us);
  if (wait_samples_us.size() < kWaitSamples) {
    wait_samples_us.push_back(static_cast<float>(us));
  } else {
    wait_samples_us[wait_next] = static_cast<float>(us);
    wait_next = (wait_next + 1) % kWaitSamples;
  }
}

std::string QueueStats::to_json() const {
  std::ostringstream ss;
  ss.precision(10);
  auto pct = [&](double p) -> double {
    if (wait_samples_us.empty()) return 0.0;
    std::vector<float> v(wait_samples_us);
    const size_t k = std::min(v.size() - 1, static_cast<size_t>(std::floor(p * (v.size() - 1) + 0.5)));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
  };
  ss << "{\"tasks\": " << tasks << ", \"batches_formed\": " << batches_formed
     << ", \"batches_failed\": " << batches_failed << ", \"rows\": " << rows << ", \"padding_rows\": " << padding_rows
     << ", \"deferred_release\": {\"batches\": " << deferred_batches << ", \"fallbacks\": " << deferred_fallbacks
     << "}"
     << ", \"batch_size_histogram\": {";
  bool first = true;
  for (const auto& [size, count] : batch_size_histogram) {
    ss << (first ? "" : ", ") << "\"" << size << "\": " << count;
    first = false;
  }
  ss << "}, \"rejections\": {";
  first = true;
  for (const auto& [reason, count] : rejections) {
    ss << (first ? "" : ", ") << "\"" << reason << "\": " << count;
    first = false;
  }
  ss << "}, \"queue_wait_us\": {\"count\": " << wait_count << ", \"total\": " << wait_total_us
     << ", \"max\": " << wait_max_us << ", \"mean\": " << (wait_count ? wait_total_us / wait_count : 0.0)
     << ", \"p50\": " << pct(0.5) << ", \"p99\": " << pct(0.99) << "}}";
  return ss.str();
}

// ---------------------------------------------------------------------------------------------
// Scheduler state

struct Batch;
struct Queue;
struct DeferredGroup;

// Where the tasks of one batch sleep: one mutex and condition variable per batch, so that releasing a
// batch's calls is one broadcast (one futex wake for all of them) rather than one wake per call, each
// of which lets the woken thread preempt the releasing one.
struct Signal {
  std::mutex mu;
  std::condition_variable cv;
};

struct Task {
  std::vector<at::Tensor> inputs;
  std::vector<std::optional<c10::Stream>> streams;  // the caller's stream of each input (CUDA inputs)
  int64_t size = 0;
  int64_t id = 0;
  Clock::time_point enqueued;
  // Where the task waits (set at enqueue, guarded by the state's mutex when dereferenced).
  std::weak_ptr<Batch> batch;
  Queue* queue = nullptr;
  Clock::time_point due;  // its batch's timeout
  bool first = false;     // the batch's first task: the one that ships it at its timeout
  std::shared_ptr<DeferredGroup> group;  // holder only: the calls it releases (deferred release)
  std::atomic<bool> done_flag{false};  // done, readable without the signal's mutex (spin)
  std::shared_ptr<Signal> sig;         // its batch's (set at enqueue)
  // completion (guarded by sig->mu)
  bool done = false;
  bool holder = false;
  std::vector<at::Tensor> batched;
  std::vector<std::optional<c10::Stream>> batched_streams;  // where each of `batched` was made (CUDA)
  at::Tensor index;
  std::string error;
};

// Deferred release (an optimization of the Batch -> model -> Unbatch pattern). A call that does not
// hold its batch has nothing to do but call Unbatch and wait there for its rows; waking it when the
// batch is formed and again when the rows arrive costs two thread hand-offs per request. Once a
// resource has seen its holders call Unbatch right after Batch, the other calls of a batch are
// released when the holder's thread makes its next batching call (its Unbatch, after it has stored
// everyone's rows), so they find their rows at once: one hand-off per request. Their outputs are
// complete when the batch is formed (empty tensors and their id), so only the moment of release
// changes. A fallback deadline (a few times the observed Batch -> Unbatch gap, 1-20 ms) releases
// them if the holder does not call back in time (and turns the optimization off until seen again).
struct DeferredGroup {
  std::vector<std::shared_ptr<Task>> tasks;
  QueueStats* stats = nullptr;  // guarded by the state's mutex
  Clock::time_point deadline;
  std::atomic<bool> released{false};
};

struct Batch {
  std::shared_ptr<Signal> sig = std::make_shared<Signal>();
  std::vector<std::shared_ptr<Task>> tasks;
  int64_t size = 0;
  Clock::time_point start;
};

struct Queue {
  std::string name;
  std::deque<std::shared_ptr<Batch>> batches;  // back() is the open batch
  QueueStats stats;
};

struct BatchState {
  BatchOptions opts;
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  std::map<std::string, std::unique_ptr<Queue>> queues;
  std::vector<Queue*> order;  // round-robin order (creation order)
  size_t cursor = 0;
  int live_workers = 0;
  std::atomic<bool> workers_gone{false};
  // Spin-then-sleep: whether the last batch formed was full, and the typical time from enqueue to
  // completion of a call that did not hold its batch (us, moving average; updated without a lock).
  std::atomic<bool> last_full{false};
  std::atomic<float> release_wait_us{0};
  // deferred release (see DeferredGroup)
  bool defer = false;
  double gap_ewma_us = 0;
  std::vector<std::shared_ptr<DeferredGroup>> deferred;

  Queue& queue_locked(const std::string& name) {
    auto it = queues.find(name);
    if (it != queues.end()) return *it->second;
    auto q = std::make_unique<Queue>();
    q->name = name;
    q->batches.push_back(std::make_shared<Batch>());
    Queue* raw = q.get();
    queues.emplace(name, std::move(q));
    order.push_back(raw);
    return *raw;
  }
};

namespace {

constexpr int64_t kDeferMinMicros = 1000, kDeferMaxMicros = 20000;

// Marks t done (caller holds t.sig->mu); the caller then broadcasts on t.sig->cv.
void set_done_locked(Task& t, bool holder, std::vector<at::Tensor> batched, at::Tensor index,
                     const std::string& error) {
  t.done = true;
  t.holder = holder;
  t.batched = std::move(batched);
  t.index = std::move(index);
  t.error = error;
  t.done_flag.store(true, std::memory_order_release);
}

// Completes the non-holders of one batch (they share its signal) with one broadcast.
void complete_others(const std::vector<std::shared_ptr<Task>>& tasks, size_t count, const std::string& error) {
  if (count == 0) return;
  Signal& sig = *tasks[0]->sig;
  {
    std::lock_guard<std::mutex> lk(sig.mu);
    for (size_t j = 0; j < count; ++j) set_done_locked(*tasks[j], false, {}, at::Tensor(), error);
  }
  sig.cv.notify_all();
}

void release_group(DeferredGroup& g) {
  if (g.released.exchange(true)) return;
  complete_others(g.tasks, g.tasks.size(), "");
}

// This thread's last held batch, while its deferred calls wait for the thread's next batching call.
struct ThreadHolder {
  std::weak_ptr<BatchState> state;
  std::shared_ptr<DeferredGroup> group;
  int64_t holder_id = 0;
  Clock::time_point processed;
  bool active = false;
  ~ThreadHolder() {
    if (group) release_group(*group);  // the thread exits: release at once
  }
};
thread_local ThreadHolder t_holder;

// Concatenates (and pads) one batch and releases its tasks. No lock held; `caller` is the task whose
// thread runs it (nullptr on a worker thread).
void process_batch(BatchState& s, Queue& q, Batch& b, const Task* caller) {
  const auto started = Clock::now();
  const auto& tasks = b.tasks;
  const int64_t k = static_cast<int64_t>(tasks.size());
  const int64_t n = b.size;
  s.last_full.store(n >= s.opts.max_batch_size, std::memory_order_relaxed);
  int64_t padded = n;
  for (int64_t a : s.opts.allowed_batch_sizes) {
    if (a >= n) {
      padded = a;
      break;
    }
  }
  std::vector<at::Tensor> outs;
  at::Tensor index;
  std::string error;
  try {
    // Never record autograd history here: the autograd of batch lives at the Autograd key.
    at::AutoDispatchBelowADInplaceOrView guard;
    const auto& first = tasks[0]->inputs;
    const size_t arity = first.size();
    for (int64_t j = 1; j < k; ++j) {
      const auto& in = tasks[j]->inputs;
      TORCH_CHECK(in.size() == arity,
                  "Batching invocations of one batch must pass the same number of in_tensors; invocation 0 passed ",
                  arity, " and invocation ", j, " passed ", in.size());
    }
    for (size_t i = 0; i < arity; ++i) {
      const at::Tensor& ref = first[i];
      std::vector<at::Tensor> parts;
      parts.reserve(k + 1);
      for (int64_t j = 0; j < k; ++j) {
        const at::Tensor& t = tasks[j]->inputs[i];
        TORCH_CHECK(t.scalar_type() == ref.scalar_type(),
                    "Dtypes of inputs should match: in_tensors[", i, "] of invocation 0 has dtype ", ref.scalar_type(),
                    " but invocation ", j, " has dtype ", t.scalar_type());
        TORCH_CHECK(t.device() == ref.device(), "Devices of inputs should match: in_tensors[", i,
                    "] of invocation 0 is on ", ref.device(), " but invocation ", j, " is on ", t.device());
        TORCH_CHECK(t.dim() == ref.dim(), "Ranks of all input tensors should match: in_tensors[", i,
                    "] of invocation 0 has shape ", sizes_str(ref), " but invocation ", j, " has shape ",
                    sizes_str(t));
        TORCH_CHECK(t.sizes().slice(1) == ref.sizes().slice(1),
                    "Dimensions of inputs should match: in_tensors[", i, "] of invocation 0 has shape ",
                    sizes_str(ref), " but invocation ", j, " has shape ", sizes_str(t),
                    " (all dimensions but the 0th must be equal)");
        order_after(t, tasks[j]->streams[i]);  // (another thread's stream: wait for it)
        parts.push_back(t);
      }
      if (padded > n) {
        std::vector<int64_t> shape(ref.sizes().begin(), ref.sizes().end());
        shape[0] = padded - n;
        parts.push_back(ref.narrow(0, 0, 1).expand(shape));
      }
      try {
        outs.push_back(k == 1 && padded == n ? ref.contiguous().clone() : at::cat(parts, 0));
      } catch (const std::exception& e) {
        // Name the attribute when padding is what made the batch too large to allocate.
        TORCH_CHECK(padded == n, "Batch: could not form a batch padded from ", n, " to ", padded,
                    " rows (the next entry of allowed_batch_sizes): ", error_text(e));
        throw;
      }
    }
    index = at::empty({k, 3}, at::TensorOptions().dtype(at::kLong));
    auto* p = index.data_ptr<int64_t>();
    int64_t offset = 0;
    for (int64_t j = 0; j < k; ++j) {
      p[3 * j] = tasks[j]->id;
      p[3 * j + 1] = offset;
      offset += tasks[j]->size;
      p[3 * j + 2] = offset;
    }
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  std::shared_ptr<DeferredGroup> group;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (s.defer && !s.closed && error.empty() && k > 1) {
      group = std::make_shared<DeferredGroup>();
      group->tasks.assign(tasks.begin(), tasks.end() - 1);
      const double fallback = std::clamp(4.0 * s.gap_ewma_us, double(kDeferMinMicros), double(kDeferMaxMicros));
      group->deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(fallback));
      group->stats = &q.stats;
      ++q.stats.deferred_batches;
      s.deferred.push_back(group);
    }
    auto& st = q.stats;
    ++st.batches_formed;
    if (!error.empty()) {
      ++st.batches_failed;
    } else {
      ++st.batch_size_histogram[padded];
      st.padding_rows += padded - n;
      st.rows += n;
    }
    for (const auto& t : tasks)
      st.add_wait(std::chrono::duration<double, std::micro>(started - t->enqueued).count());
  }
  Task& holder = *tasks[k - 1];
  {
    std::lock_guard<std::mutex> lk(b.sig->mu);
    for (int64_t j = 0; j < k - 1; ++j)
      if (!error.empty() || !group) set_done_locked(*tasks[j], false, {}, at::Tensor(), error);
    if (error.empty()) {
      holder.group = group;  // published to the holder's thread by the signal's mutex
      // The batch was made on this thread's stream, which may not be the holder's (a timeout or worker thread).
      holder.batched_streams.clear();
      for (const auto& t : outs) holder.batched_streams.push_back(current_stream(t));
      set_done_locked(holder, true, std::move(outs), index, "");
    } else {
      set_done_locked(holder, false, {}, at::Tensor(), error);
    }
  }
  // Nobody to wake when only the holder was completed, on its own thread.
  if (!(group && caller == &holder)) b.sig->cv.notify_all();
}

void worker_loop(std::shared_ptr<BatchState> s) {
#ifdef __linux__
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // our own thread: precise batch timeouts
#endif
  std::unique_lock<std::mutex> lk(s->mu);
  const auto timeout = clamp_timeout(s->opts.batch_timeout_micros);
  while (true) {
    const auto now = Clock::now();
    auto next_wake = now + std::chrono::milliseconds(100);
    // Deferred releases whose holder did not call back in time (or everything, when closing).
    std::vector<std::shared_ptr<DeferredGroup>> overdue;
    for (auto it = s->deferred.begin(); it != s->deferred.end();) {
      if ((*it)->released.load()) {
        it = s->deferred.erase(it);
      } else if (s->closed || now >= (*it)->deadline) {
        if (!s->closed) ++(*it)->stats->deferred_fallbacks;
        overdue.push_back(*it);
        it = s->deferred.erase(it);
      } else {
        next_wake = std::min(next_wake, (*it)->deadline);
        ++it;
      }
    }
    if (!overdue.empty()) {
      s->defer = false;  // the holders do not call Unbatch promptly: stop deferring until seen again
      lk.unlock();
      for (auto& g : overdue) release_group(*g);
      lk.lock();
      continue;
    }
    if (s->defer) next_wake = std::min(next_wake, now + std::chrono::milliseconds(2));  // watch new groups
    std::shared_ptr<Batch> batch;
    Queue* from = nullptr;
    const size_t nq = s->order.size();
    for (size_t i = 0; i < nq && !batch; ++i) {
      Queue* q = s->order[(s->cursor + i) % nq];
      auto& d = q->batches;
      if (d.size() >= 2) {
        batch = d.front();
        d.pop_front();
      } else if (d.size() == 1 && d.front()->size > 0) {
        const auto& open = d.front();
        const auto due = open->start + timeout;
        if (s->closed || open->size >= s->opts.max_batch_size || now >= due) {
          batch = open;
          d.pop_front();
          d.push_back(std::make_shared<Batch>());
        } else {
          next_wake = std::min(next_wake, due);
        }
      }
      if (batch) {
        from = q;
        s->cursor = (s->cursor + i + 1) % nq;
      }
    }
    if (batch) {
      lk.unlock();
      process_batch(*s, *from, *batch, nullptr);
      batch.reset();
      lk.lock();
      continue;
    }
    if (s->closed && s->deferred.empty()) break;  // closed and nothing left: everything was flushed
    s->cv.wait_until(lk, next_wake);
  }
  if (--s->live_workers == 0) s->workers_gone = true;
  lk.unlock();
  s->cv.notify_all();
}

}  // namespace

void on_batching_call(const int64_t* last_row_id) {
  auto& t = t_holder;
  if (!t.active) return;
  t.active = false;
  auto group = std::move(t.group);
  auto state = t.state.lock();
  t.state.reset();
  if (state && last_row_id && *last_row_id == t.holder_id) {
    // The holder unbatches its own batch: the pattern deferred release is made for.
    const double gap = std::chrono::duration<double, std::micro>(Clock::now() - t.processed).count();
    std::lock_guard<std::mutex> lk(state->mu);
    state->gap_ewma_us = state->gap_ewma_us == 0 ? gap : 0.8 * state->gap_ewma_us + 0.2 * gap;
    if (!state->closed && gap < kDeferMaxMicros / 4 && !state->defer) {
      state->defer = true;
      // A worker asleep for up to 100 ms must start watching the deferred groups' fallback deadlines.
      state->cv.notify_all();
    }
  }
  if (group) release_group(*group);
}

// ---------------------------------------------------------------------------------------------
// BatchResource

BatchResource::BatchResource(const BatchOptions& o) : options_(o), state_(std::make_shared<BatchState>()) {
  state_->opts = o;
  state_->live_workers = static_cast<int>(o.num_batch_threads);
  workers_.reserve(o.num_batch_threads);
  try {
    for (int64_t i = 0; i < o.num_batch_threads; ++i) workers_.emplace_back(worker_loop, state_);
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lk(state_->mu);
      state_->closed = true;
      state_->live_workers = static_cast<int>(workers_.size());
    }
    state_->cv.notify_all();
    for (auto& w : workers_) w.detach();
    TORCH_CHECK(false, "Batch: could not start num_batch_threads=", o.num_batch_threads, " worker threads: ",
                e.what());
  }
}

BatchResource::~BatchResource() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->closed = true;
  }
  state_->cv.notify_all();
  // Never block in a destructor: the workers own a reference to the state, flush and exit alone.
  for (auto& w : workers_)
    if (w.joinable()) w.detach();
}

void BatchResource::close(bool wait) {
  std::unique_lock<std::mutex> lk(state_->mu);
  state_->closed = true;
  std::vector<std::shared_ptr<DeferredGroup>> deferred;
  deferred.swap(state_->deferred);
  lk.unlock();
  for (auto& g : deferred) release_group(*g);
  lk.lock();
  state_->cv.notify_all();
  if (wait) {
    // Flushing is bounded work (concatenations); give up waiting after a generous deadline.
    state_->cv.wait_for(lk, std::chrono::seconds(10), [&] { return state_->live_workers == 0; });
  }
  const bool all_gone = state_->live_workers == 0;
  lk.unlock();
  for (auto& w : workers_) {
    if (!w.joinable()) continue;
    if (all_gone)
      w.join();  // returns at once: the loop has exited
    else
      w.detach();
  }
}

BatchOutput BatchResource::run(std::vector<at::Tensor> inputs, const std::string& queue_name) {
  on_batching_call(nullptr);  // never block while holding back the calls of an earlier batch
  auto task = std::make_shared<Task>();
  task->size = inputs[0].size(0);
  task->id = new_id();
  task->streams.reserve(inputs.size());
  for (const auto& t : inputs) task->streams.push_back(current_stream(t));
  task->inputs = std::move(inputs);
  const int64_t max_size = options_.max_batch_size;
  std::shared_ptr<Batch> inline_batch;
  Queue* inline_queue = nullptr;
  bool notify = false;
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    TORCH_CHECK(!state_->closed, "Batch: the batching resource is closed (torchops.batching.close_all() was called "
                "or the process is exiting); no new tasks are accepted");
    Queue& q = state_->queue_locked(queue_name);
    if (task->size > max_size) {
      ++q.stats.rejections["task_too_large"];
      TORCH_CHECK_VALUE(false, "Task size ", task->size, " is larger than maximum input batch size ", max_size);
    }
    auto open = q.batches.back();
    if (open->size + task->size > max_size) {
      const int64_t limit = std::max<int64_t>(1, options_.max_enqueued_batches);
      if (static_cast<int64_t>(q.batches.size()) >= limit) {
        ++q.stats.rejections["queue_full"];
        TORCH_CHECK(false, "Batch scheduling queue is full; currently ", q.batches.size(),
                    " batches enqueued and max_enqueued_batches is ", options_.max_enqueued_batches,
                    options_.max_enqueued_batches < 1 ? " (treated as 1)" : "");
      }
      q.batches.push_back(std::make_shared<Batch>());
      open = q.batches.back();
      notify = true;  // the previous batch is closed: runnable
    }
    task->enqueued = Clock::now();
    if (open->tasks.empty()) {
      // The batch's first task ships it at its timeout itself (see the wait below), so the workers
      // need not be woken for the new deadline (they still look at least every 100 ms).
      open->start = task->enqueued;
      task->first = true;
    }
    open->tasks.push_back(task);
    task->sig = open->sig;
    open->size += task->size;
    task->batch = open;
    task->queue = &q;
    task->due = open->start + clamp_timeout(options_.batch_timeout_micros);
    ++q.stats.tasks;
    if (open->size >= max_size && q.batches.size() == 1) {
      // The batch is full and first in line: this task (its last, the holder) concatenates it on its
      // own thread, saving the hand-off to a worker and back. Same result and order as a worker.
      inline_batch = open;
      q.batches.pop_front();
      q.batches.push_back(std::make_shared<Batch>());
      inline_queue = &q;
    } else if (open->size >= max_size) {
      notify = true;
    }
  }
  if (inline_batch) {
    process_batch(*state_, *inline_queue, *inline_batch, task.get());
    inline_batch.reset();
  } else if (notify) {
    state_->cv.notify_one();
  }

  Signal& sig = *task->sig;
  std::unique_lock<std::mutex> tl(sig.mu);
  // Only the batch's first task ships it at its timeout (the others just wait to be completed).
  bool tried_own = !task->first;
  // Under load (full batches) a call is released soon after it enqueues: yield-spinning until then keeps
  // the thread runnable, which saves a sleep and wake-up per call, and keeps an otherwise idle core in use
  // (a woken thread may wait long for a core, or be placed on the waker's). Not when batches ship at
  // their timeout or take long (a slow model): then the wait is long and spinning would only burn CPU.
  auto spin_until = task->enqueued;
  if (state_->last_full.load(std::memory_order_relaxed)) {
    const float expected = state_->release_wait_us.load(std::memory_order_relaxed);
    if (expected > 0 && expected < kMaxReleaseSpinMicros)
      spin_until += std::chrono::microseconds(static_cast<int64_t>(std::min(kMaxReleaseSpinMicros, 1.5f * expected)));
  }
  while (!task->done) {
    if (state_->workers_gone.load() && !task->done) {
      // Cannot happen in normal operation (workers flush before exiting); never hang regardless.
      TORCH_CHECK(false, "Batch: the batching resource was closed before this task was processed");
    }
    if (!tried_own && Clock::now() >= task->due) {
      // The batch's timeout has passed: rather than wait for a worker to wake up and then wake us,
      // concatenate the batch here if it is still first in line (same result as a worker).
      tried_own = true;
      tl.unlock();
      std::shared_ptr<Batch> mine;
      {
        std::lock_guard<std::mutex> lk(state_->mu);
        auto& d = task->queue->batches;
        auto b = task->batch.lock();
        if (b && !d.empty() && d.front() == b) {
          mine = b;
          d.pop_front();
          if (d.empty()) d.push_back(std::make_shared<Batch>());
        }
      }
      if (mine) process_batch(*state_, *task->queue, *mine, task.get());
      tl.lock();
      continue;
    }
    if (Clock::now() < spin_until) {
      tl.unlock();
      const auto until = tried_own ? spin_until : std::min(spin_until, task->due);
      while (Clock::now() < until && !task->done_flag.load(std::memory_order_acquire)) std::this_thread::yield();
      tl.lock();
      continue;
    }
    if (!tried_own) {
      // Sleep until shortly before the timeout, then yield-spin to it: a thread woken from a sleep
      // can take long to get a CPU back on a busy machine, and that delay would add to the latency.
      const auto spin_from = task->due - std::chrono::microseconds(kSpinMicros);
      if (Clock::now() < spin_from) {
        PreciseTimers precise;
        sig.cv.wait_until(tl, spin_from);
      } else {
        tl.unlock();
        while (Clock::now() < task->due && !task->done_flag.load(std::memory_order_acquire))
          std::this_thread::yield();
        tl.lock();
      }
    } else
      sig.cv.wait_for(tl, std::chrono::milliseconds(100));
  }
  // Done: no other thread touches the task now. Build the outputs without the batch's mutex, which
  // the batch's other calls need to wake up.
  tl.unlock();
  if (!task->holder) {
    const float waited = std::chrono::duration<float, std::micro>(Clock::now() - task->enqueued).count();
    const float prev = state_->release_wait_us.load(std::memory_order_relaxed);
    state_->release_wait_us.store(prev == 0 ? waited : 0.9f * prev + 0.1f * waited, std::memory_order_relaxed);
  }
  TORCH_CHECK(task->error.empty(), task->error);
  BatchOutput out;
  out.id = task->id;
  if (task->holder) {
    out.batched = std::move(task->batched);
    for (size_t i = 0; i < out.batched.size(); ++i) order_after(out.batched[i], task->batched_streams[i]);
    out.batch_index = std::move(task->index);
    t_holder.state = state_;
    t_holder.group = std::move(task->group);
    t_holder.holder_id = task->id;
    t_holder.processed = Clock::now();
    t_holder.active = true;
  } else {
    out.batched.reserve(task->inputs.size());
    for (const auto& t : task->inputs) {
      std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
      shape[0] = 0;
      // (empty_cpu skips the dispatcher: these are made once per request)
      const bool plain_cpu = t.is_cpu() && t.layout() == at::kStrided && !t.is_quantized();
      out.batched.push_back(plain_cpu ? at::Tensor(at::detail::empty_cpu(shape, t.scalar_type(), false))
                                      : at::empty(shape, t.options()));
    }
    out.batch_index = at::Tensor(at::detail::empty_cpu({0, 3}, at::kLong, false));
  }
  return out;
}

std::string BatchResource::stats_json(const std::string& queue_name) {
  QueueStats copy;
  {
    // Copy under the lock, format (percentiles) outside it: reading never stalls batching for long.
    std::lock_guard<std::mutex> lk(state_->mu);
    auto it = state_->queues.find(queue_name);
    if (it == state_->queues.end()) return "";
    copy = it->second->stats;
  }
  return copy.to_json();
}

void BatchResource::record_rejection(const std::string& queue_name, const std::string& reason) {
  std::lock_guard<std::mutex> lk(state_->mu);
  if (state_->closed) return;
  ++state_->queue_locked(queue_name).stats.rejections[reason];
}

std::vector<std::string> BatchResource::queue_names() {
  std::lock_guard<std::mutex> lk(state_->mu);
  std::vector<std::string> names;
  for (const auto& kv : state_->queues) names.push_back(kv.first);
  return names;
}

}  // namespace batching
}  // namespace torchops
