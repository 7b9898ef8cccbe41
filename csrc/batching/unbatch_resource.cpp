// The resources behind torchops::unbatch and torchops::unbatch_grad.
#include "batching/batching.h"

#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace torchops {
namespace batching {

namespace {
Clock::time_point deadline_after(Clock::time_point now, int64_t micros) { return now + clamp_timeout(micros); }
constexpr const char* kClosed =
    "the batching resources were closed (torchops.batching.close_all() was called or the process is exiting)";
}  // namespace

// ---------------------------------------------------------------------------------------------
// Unbatch

void UnbatchResource::sweep_locked(Clock::time_point now) {
  if (now <= next_expiry_) return;  // nothing has expired yet: no scan on every call
  next_expiry_ = Clock::time_point::max();
  for (auto it = pieces_.begin(); it != pieces_.end();) {
    if (it->second.deadline < now) {
      it = pieces_.erase(it);
    } else {
      next_expiry_ = std::min(next_expiry_, it->second.deadline);
      ++it;
    }
  }
}

void UnbatchResource::store_locked(int64_t key, Piece piece) {
  next_expiry_ = std::min(next_expiry_, piece.deadline);
  pieces_[key] = std::move(piece);
}

void UnbatchResource::complete(Waiter& w, at::Tensor value, const std::string& error,
                               const std::optional<c10::Stream>& stream) {
  {
    std::lock_guard<std::mutex> lk(w.m);
    w.value = std::move(value);
    w.stream = stream;
    w.error = error;
    w.done = true;
  }
  w.cv.notify_one();
}

at::Tensor UnbatchResource::run(int64_t id, std::vector<std::pair<int64_t, at::Tensor>> pieces,
                                int64_t timeout_micros, const std::optional<c10::Stream>& producer) {
  std::shared_ptr<Waiter> me;  // (only made when this call has to wait)
  std::vector<std::pair<std::shared_ptr<Waiter>, at::Tensor>> completions;
  {
    std::unique_lock<std::mutex> lk(mu_);
    TORCH_CHECK(!closed_, "Unbatch: ", kClosed);
    const auto now = Clock::now();
    const auto deadline = deadline_after(now, timeout_micros);
    sweep_locked(now);
    // 1. A piece is already waiting for this invocation.
    auto found = pieces_.find(id);
    if (found != pieces_.end()) {
      Piece p = std::move(found->second);
      pieces_.erase(found);
      lk.unlock();
      TORCH_CHECK(p.error.empty(), p.error);
      order_after(p.value, p.stream);
      return p.value;
    }
    // 2. Register as a waiter.
    TORCH_CHECK(waiters_.find(id) == waiters_.end(), "Multiple session runs with the same batch key.");
    me = std::make_shared<Waiter>();
    me->deadline = deadline;
    waiters_.emplace(id, me);
    // 3. Hand out the pieces of a non-empty batch (completions happen outside the lock).
    for (auto& [key, value] : pieces) {
      auto w = waiters_.find(key);
      if (w != waiters_.end()) {
        completions.emplace_back(std::move(w->second), std::move(value));
        waiters_.erase(w);
      } else if (pieces_.find(key) != pieces_.end()) {
        auto mine = waiters_.find(id);
        if (mine != waiters_.end() && mine->second == me) waiters_.erase(mine);
        lk.unlock();
        for (auto& [w2, v2] : completions) complete(*w2, std::move(v2), "", producer);
        TORCH_CHECK(false, "Multiple tensors returned for same batch key.");
      } else {
        store_locked(key, Piece{std::move(value), "", deadline, producer});
      }
    }
  }
  for (auto& [w, v] : completions) complete(*w, std::move(v), "", producer);
  // 4. Wait for our own piece.
  std::unique_lock<std::mutex> wl(me->m);
  while (!me->done) {
    const bool expired = me->deadline < Clock::now();
    if (expired || closed_flag_.load()) {
      // Leave the waiters, unless someone is already completing us (then wait for it).
      wl.unlock();
      bool removed = false;
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = waiters_.find(id);
        if (it != waiters_.end() && it->second == me) {
          waiters_.erase(it);
          removed = true;
        }
      }
      wl.lock();
      if (removed) {
        TORCH_CHECK(!expired, "Batched data did not arrive within timeout window. (Unbatch: timeout_micros=",
                    timeout_micros, ")");
        TORCH_CHECK(false, "Unbatch: ", kClosed, " while waiting for the batched data");
      }
      while (!me->done) me->cv.wait_for(wl, std::chrono::milliseconds(10));
      break;
    }
    me->cv.wait_until(wl, me->deadline + std::chrono::microseconds(1));
  }
  wl.unlock();
  TORCH_CHECK(me->error.empty(), me->error);
  order_after(me->value, me->stream);
  return me->value;
}

void UnbatchResource::fail(const std::vector<int64_t>& keys, const std::string& message) {
  std::vector<std::shared_ptr<Waiter>> failed;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const auto deadline = deadline_after(Clock::now(), timeout_micros_);
    for (int64_t key : keys) {
      auto w = waiters_.find(key);
      if (w != waiters_.end()) {
        failed.push_back(std::move(w->second));
        waiters_.erase(w);
      } else {
        store_locked(key, Piece{at::Tensor(), message, deadline});
      }
    }
  }
  for (auto& w : failed) complete(*w, at::Tensor(), message);
}

void UnbatchResource::close() {
  std::vector<std::shared_ptr<Waiter>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    closed_flag_ = true;
    pieces_.clear();
    for (auto& kv : waiters_) all.push_back(std::move(kv.second));
    waiters_.clear();
  }
  for (auto& w : all)
    complete(*w, at::Tensor(), std::string("Unbatch: ") + kClosed + " while waiting for the batched data");
}

// ---------------------------------------------------------------------------------------------
// UnbatchGrad

at::Tensor UnbatchGradResource::run(const at::Tensor& original_input, const at::Tensor& batch_index,
                                    const at::Tensor& grad, int64_t id, int64_t timeout_micros) {
  std::unique_lock<std::mutex> lk(mu_);
  TORCH_CHECK(!closed_, "UnbatchGrad: ", kClosed);
  TORCH_CHECK_VALUE(grads_.find(id) == grads_.end(), "Two runs with the same batch key.");
  grads_.emplace(id, grad);
  std::shared_ptr<Holder> me;
  if (original_input.numel() > 0) {
    TORCH_CHECK_VALUE(batch_index.numel() > 0, "batch_index is empty while the tensor isn't.");
    const int64_t rows = batch_index.dim() > 0 ? batch_index.size(0) : 1;
    TORCH_CHECK_VALUE(batch_index.numel() == rows * 3, "batch_index should contain ", rows * 3,
                      " elements. Received ", batch_index.numel());
    const at::Tensor idx = batch_index.to(at::kCPU).contiguous();
    const int64_t* p = idx.data_ptr<int64_t>();
    me = std::make_shared<Holder>();
    me->keys.reserve(rows);
    std::vector<int64_t> missing;
    for (int64_t j = 0; j < rows; ++j) {
      me->keys.push_back(p[3 * j]);
      if (grads_.find(p[3 * j]) == grads_.end()) missing.push_back(p[3 * j]);
    }
    if (!missing.empty()) {
      TORCH_CHECK_VALUE(holders_.find(id) == holders_.end(), "Batch key with valid batch used twice.");
      for (int64_t key : missing) {
        TORCH_CHECK_VALUE(missing_to_holder_.find(key) == missing_to_holder_.end(),
                          "Missing tensor wanted by more than one batch.");
      }
      for (int64_t key : missing) missing_to_holder_.emplace(key, id);
      me->missing = missing.size();
      holders_.emplace(id, me);
    }
  }
  // 5. A holder may be waiting for this invocation's gradient.
  bool notify = false;
  auto m = missing_to_holder_.find(id);
  if (m != missing_to_holder_.end()) {
    auto h = holders_.find(m->second);
    missing_to_holder_.erase(m);
    TORCH_CHECK(h != holders_.end(), "Batch no longer exists.");
    if (--h->second->missing == 0) notify = true;
  }
  if (notify) cv_.notify_all();

  if (!me) {
    std::vector<int64_t> shape(grad.sizes().begin(), grad.sizes().end());
    shape[0] = 0;
    return at::empty(shape, grad.options());
  }
  const bool forever = timeout_micros < 0;
  const auto deadline = deadline_after(Clock::now(), timeout_micros);
  auto cleanup = [&] {
    holders_.erase(id);
    for (auto it = missing_to_holder_.begin(); it != missing_to_holder_.end();) {
      if (it->second == id)
        it = missing_to_holder_.erase(it);
      else
        ++it;
    }
    for (int64_t key : me->keys) grads_.erase(key);
  };
  while (me->missing > 0) {
    if (closed_) {
      cleanup();
      TORCH_CHECK(false, "UnbatchGrad: ", kClosed, " while waiting for the gradients of the batch");
    }
    if (!forever && deadline < Clock::now()) {
      const size_t missing = me->missing;
      cleanup();
      TORCH_CHECK(false, "UnbatchGrad: the gradients of ", missing, " of the batch's ", me->keys.size(),
                  " invocations did not arrive within timeout (timeout_micros=", timeout_micros, ")");
    }
    if (forever)
      cv_.wait_for(lk, std::chrono::milliseconds(100));
    else
      cv_.wait_until(lk, deadline + std::chrono::microseconds(1));
  }
  std::vector<at::Tensor> parts;
  parts.reserve(me->keys.size());
  for (int64_t key : me->keys) {
    auto g = grads_.find(key);
    TORCH_CHECK(g != grads_.end(), "bad bookkeeping of available tensors.");
    parts.push_back(std::move(g->second));
    grads_.erase(g);
  }
  holders_.erase(id);
  lk.unlock();
  // The invocations' gradients are concatenated in batch order: TF's concat checks, named.
  for (size_t k = 1; k < parts.size(); ++k) {
    TORCH_CHECK_VALUE(parts[k].dim() == parts[0].dim(), "UnbatchGrad: ranks of all gradients of a batch should match: ",
                      "shape[0] = ", parts[0].sizes(), " vs. shape[", k, "] = ", parts[k].sizes());
    TORCH_CHECK_VALUE(parts[k].dim() == 0 || parts[k].sizes().slice(1) == parts[0].sizes().slice(1),
                      "UnbatchGrad: dimensions of the gradients of a batch should match beyond dim 0: shape[0] = ",
                      parts[0].sizes(), " vs. shape[", k, "] = ", parts[k].sizes());
    TORCH_CHECK_VALUE(parts[k].scalar_type() == parts[0].scalar_type(),
                      "UnbatchGrad: dtypes of the gradients of a batch should match: ", parts[0].scalar_type(),
                      " vs. ", parts[k].scalar_type());
  }
  return at::cat(parts, 0);
}

void UnbatchGradResource::close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    closed_ = true;
    grads_.clear();
  }
  cv_.notify_all();
}

}  // namespace batching
}  // namespace torchops
