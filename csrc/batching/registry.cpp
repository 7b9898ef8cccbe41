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

std::string key_str(c10::string_view container, c10::string_view shared_name) {
  std::ostringstream ss;
  ss << "(container='" << container << "', shared_name='" << shared_name << "')";
  return ss.str();
}

template <typename KeyStr>
void check_same(const KeyStr& k, const char* what, int64_t have, int64_t want) {
  TORCH_CHECK_VALUE(have == want, "Batch: the batching resource ", k(), " was created with ", what, "=",
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
// Bumped (under the registry's mutex) whenever resources leave the registry, so that the per-thread
// caches below never hand out a resource that close_all() has forgotten.
std::atomic<uint64_t> g_generation{0};

// Per-thread cache of the last few resources a thread looked up: a batching call then finds its
// resource without the registry's process-wide mutex (contended by every client thread) or string
// copies. Entries are valid while the generation is unchanged.
template <typename R>
class ThreadCache {
 public:
  std::shared_ptr<R> find(c10::string_view container, c10::string_view shared_name) {
    const uint64_t gen = g_generation.load(std::memory_order_acquire);
    if (gen != gen_) {
      entries_.clear();
      gen_ = gen;
      return nullptr;
    }
    for (auto& e : entries_)
      if (e.shared_name == shared_name && e.container == container) return e.res;
    return nullptr;
  }
  // gen: the generation read under the registry's mutex when `res` was found or created.
  void put(uint64_t gen, c10::string_view container, c10::string_view shared_name, std::shared_ptr<R> res) {
    if (gen != gen_) {
      entries_.clear();
      gen_ = gen;
    }
    if (entries_.size() >= kEntries) entries_.erase(entries_.begin());
    entries_.push_back(Entry{std::string(container), std::string(shared_name), std::move(res)});
  }

 private:
  static constexpr size_t kEntries = 8;
  struct Entry {
    std::string container, shared_name;
    std::shared_ptr<R> res;
  };
  uint64_t gen_ = ~uint64_t(0);
  std::vector<Entry> entries_;
};

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

void check_same_options(c10::string_view container, c10::string_view shared_name, const BatchOptions& have,
                        const BatchOptions& o) {
  const auto k = [&] { return key_str(container, shared_name); };
  check_same(k, "num_batch_threads", have.num_batch_threads, o.num_batch_threads);
  check_same(k, "max_batch_size", have.max_batch_size, o.max_batch_size);
  check_same(k, "batch_timeout_micros", have.batch_timeout_micros, o.batch_timeout_micros);
  check_same(k, "max_enqueued_batches", have.max_enqueued_batches, o.max_enqueued_batches);
  check_same(k, "grad_timeout_micros", have.grad_timeout_micros, o.grad_timeout_micros);
  TORCH_CHECK_VALUE(have.allowed_batch_sizes == o.allowed_batch_sizes, "Batch: the batching resource ", k(),
                    " was created with allowed_batch_sizes=", c10::IntArrayRef(have.allowed_batch_sizes),
                    " but this call passes allowed_batch_sizes=", c10::IntArrayRef(o.allowed_batch_sizes),
                    "; the attributes of a shared batching resource are fixed by its creator");
}

// The registry lookup behind get_or_create_*: the thread's cache first, else the registry (under its
// mutex: the shutdown check, creation).
template <typename R, typename Make>
std::shared_ptr<R> lookup(std::map<Key, std::shared_ptr<R>> Registry::*map, ThreadCache<R>& cache,
                          c10::string_view container, c10::string_view shared_name, bool create, Make make) {
  if (auto hit = cache.find(container, shared_name)) return hit;
  auto& r = registry();
  Key k{std::string(container), std::string(shared_name)};
  std::lock_guard<std::mutex> lk(r.mu);
  if (create) check_not_shut_down();
  auto& m = r.*map;
  auto it = m.find(k);
  if (it == m.end()) {
    if (!create) return nullptr;
    it = m.emplace(k, make()).first;
  }
  cache.put(g_generation.load(std::memory_order_relaxed), container, shared_name, it->second);
  return it->second;
}
}  // namespace

std::shared_ptr<BatchResource> get_or_create_batch(c10::string_view container, c10::string_view shared_name,
                                                   const BatchOptions& o) {
  thread_local ThreadCache<BatchResource> cache;
  auto res = lookup(&Registry::batch, cache, container, shared_name, true, [&] {
    return std::make_shared<BatchResource>(o);
  });
  check_same_options(container, shared_name, res->options(), o);
  return res;
}

std::shared_ptr<UnbatchResource> get_or_create_unbatch(c10::string_view container, c10::string_view shared_name,
                                                       int64_t timeout_micros) {
  thread_local ThreadCache<UnbatchResource> cache;
  auto res = lookup(&Registry::unbatch, cache, container, shared_name, true, [&] {
    return std::make_shared<UnbatchResource>(timeout_micros);
  });
  TORCH_CHECK_VALUE(res->timeout_micros() == timeout_micros, "Unbatch: the unbatch resource ",
                    key_str(container, shared_name), " was created with timeout_micros=", res->timeout_micros(),
                    " but this call passes timeout_micros=", timeout_micros,
                    "; the attributes of a shared unbatch resource are fixed by its creator");
  return res;
}

std::shared_ptr<UnbatchResource> find_unbatch(c10::string_view container, c10::string_view shared_name) {
  thread_local ThreadCache<UnbatchResource> cache;
  return lookup(&Registry::unbatch, cache, container, shared_name, false,
                []() -> std::shared_ptr<UnbatchResource> { return nullptr; });
}

std::shared_ptr<UnbatchGradResource> get_or_create_unbatch_grad(c10::string_view container,
                                                               c10::string_view shared_name) {
  thread_local ThreadCache<UnbatchGradResource> cache;
  return lookup(&Registry::unbatch_grad, cache, container, shared_name, true,
                [] { return std::make_shared<UnbatchGradResource>(); });
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
    g_generation.fetch_add(1, std::memory_order_release);
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
