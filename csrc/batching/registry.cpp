// Process-wide registries of the batching resources, keyed by (container, shared_name), one per kind.
#include "batching/batching.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdio>
#include <sstream>

namespace torchops {
namespace batching {

namespace {

using Key = std::pair<std::string, std::string>;

struct Registry {
  std::mutex mu;
  std::map<Key, std::shared_ptr<BatchResource>> batch;
  std::map<Key, std::shared_ptr<UnbatchResource>> unbatch;
  std::map<Key, std::shared_ptr<UnbatchGradResource>> unbatch_grad;
};

// Never destroyed (resources may be used by threads still running at exit); ExitHook below closes
// everything when the library is unloaded / the process exits.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::string key_str(const Key& k) {
  std::ostringstream ss;
  ss << "(container='" << k.first << "', shared_name='" << k.second << "')";
  return ss.str();
}

void check_same(const Key& k, const char* what, int64_t have, int64_t want) {
  TORCH_CHECK_VALUE(have == want, "Batch: the batching resource ", key_str(k), " was created with ", what, "=",
                    have, " but this call passes ", what, "=", want,
                    "; the attributes of a shared batching resource are fixed by its creator");
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::atomic<bool> g_shutdown{false};
std::atomic<int64_t> g_in_flight{0};

void check_not_shut_down() {
  TORCH_CHECK(!g_shutdown.load(), "the batching resources were shut down (the process is exiting); "
              "no new batching calls are accepted");
}

struct ExitHook {
  ~ExitHook() {
    try {
      close_all(/*shutdown=*/true);
    } catch (...) {
    }
  }
} exit_hook;

}  // namespace

std::shared_ptr<BatchResource> get_or_create_batch(const std::string& container, const std::string& shared_name,
                                                   const BatchOptions& o) {
  auto& r = registry();
  const Key k{container, shared_name};
  std::lock_guard<std::mutex> lk(r.mu);
  check_not_shut_down();
  auto it = r.batch.find(k);
  if (it == r.batch.end()) {
    auto res = std::make_shared<BatchResource>(o);
    r.batch.emplace(k, res);
    return res;
  }
  const auto& have = it->second->options();
  check_same(k, "num_batch_threads", have.num_batch_threads, o.num_batch_threads);
  check_same(k, "max_batch_size", have.max_batch_size, o.max_batch_size);
  check_same(k, "batch_timeout_micros", have.batch_timeout_micros, o.batch_timeout_micros);
  check_same(k, "max_enqueued_batches", have.max_enqueued_batches, o.max_enqueued_batches);
  check_same(k, "grad_timeout_micros", have.grad_timeout_micros, o.grad_timeout_micros);
  TORCH_CHECK_VALUE(have.allowed_batch_sizes == o.allowed_batch_sizes, "Batch: the batching resource ", key_str(k),
                    " was created with allowed_batch_sizes=", c10::IntArrayRef(have.allowed_batch_sizes),
                    " but this call passes allowed_batch_sizes=", c10::IntArrayRef(o.allowed_batch_sizes),
                    "; the attributes of a shared batching resource are fixed by its creator");
  return it->second;
}

std::shared_ptr<UnbatchResource> get_or_create_unbatch(const std::string& container, const std::string& shared_name,
                                                       int64_t timeout_micros) {
  auto& r = registry();
  const Key k{container, shared_name};
  std::lock_guard<std::mutex> lk(r.mu);
  check_not_shut_down();
  auto it = r.unbatch.find(k);
  if (it == r.unbatch.end()) {
    auto res = std::make_shared<UnbatchResource>(timeout_micros);
    r.unbatch.emplace(k, res);
    return res;
  }
  TORCH_CHECK_VALUE(it->second->timeout_micros() == timeout_micros, "Unbatch: the unbatch resource ", key_str(k),
                    " was created with timeout_micros=", it->second->timeout_micros(),
                    " but this call passes timeout_micros=", timeout_micros,
                    "; the attributes of a shared unbatch resource are fixed by its creator");
  return it->second;
}

std::shared_ptr<UnbatchResource> find_unbatch(const std::string& container, const std::string& shared_name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.unbatch.find(Key{container, shared_name});
  return it == r.unbatch.end() ? nullptr : it->second;
}

std::shared_ptr<UnbatchGradResource> get_or_create_unbatch_grad(const std::string& container,
                                                               const std::string& shared_name) {
  auto& r = registry();
  const Key k{container, shared_name};
  std::lock_guard<std::mutex> lk(r.mu);
  check_not_shut_down();
  auto it = r.unbatch_grad.find(k);
  if (it == r.unbatch_grad.end()) {
    auto res = std::make_shared<UnbatchGradResource>();
    r.unbatch_grad.emplace(k, res);
    return res;
  }
  return it->second;
}

InFlight::InFlight() { ++g_in_flight; }
InFlight::~InFlight() { --g_in_flight; }
int64_t in_flight() { return g_in_flight.load(); }

void close_all(bool shutdown) {
  auto& r = registry();
  std::map<Key, std::shared_ptr<BatchResource>> batch;
  std::map<Key, std::shared_ptr<UnbatchResource>> unbatch;
  std::map<Key, std::shared_ptr<UnbatchGradResource>> unbatch_grad;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (shutdown) g_shutdown = true;
    batch.swap(r.batch);
    unbatch.swap(r.unbatch);
    unbatch_grad.swap(r.unbatch_grad);
  }
  // Batch first: flushing hands the queued batches to their callers.
  for (auto& kv : batch) kv.second->close(/*wait=*/true);
  for (auto& kv : unbatch) kv.second->close();
  for (auto& kv : unbatch_grad) kv.second->close();
}

std::string stats_json(const std::string& container, const std::string& shared_name, const std::string& queue) {
  std::shared_ptr<BatchResource> res;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    auto it = r.batch.find(Key{container, shared_name});
    if (it == r.batch.end()) return "";
    res = it->second;
  }
  return res->stats_json(queue);
}

std::string list_queues_json() {
  std::vector<std::pair<Key, std::shared_ptr<BatchResource>>> all;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (const auto& kv : r.batch) all.emplace_back(kv.first, kv.second);
  }
  std::ostringstream ss;
  ss << "[";
  bool first = true;
  for (const auto& [k, res] : all) {
    for (const auto& q : res->queue_names()) {
      ss << (first ? "" : ", ") << "[\"" << json_escape(k.first) << "\", \"" << json_escape(k.second) << "\", \""
         << json_escape(q) << "\"]";
      first = false;
    }
  }
  ss << "]";
  return ss.str();
}

}  // namespace batching
}  // namespace torchops
