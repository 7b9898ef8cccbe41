// Process-wide registry of the accumulators, keyed by (container, shared_name), plus a weak
// list of every live accumulator so that close_all() (and library unload) reaches private ones too.
#include "accumulator/accumulator.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <map>

namespace torchops {
namespace accumulator {
namespace {

using Key = std::pair<std::string, std::string>;

struct Registry {
  std::mutex mu;
  std::map<Key, std::shared_ptr<CoreBase>> shared;
  std::vector<std::weak_ptr<CoreBase>> all;
};

// Never destroyed: handles may outlive static destruction in threads still running at exit.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::atomic<bool> g_shutdown{false};
std::atomic<int64_t> g_in_flight{0};

struct ExitHook {
  ~ExitHook() {
    try {
      close_all(/*shutdown=*/true);
    } catch (...) {
    }
  }
} exit_hook;

const char* kind(bool sparse) { return sparse ? "SparseConditionalAccumulator" : "ConditionalAccumulator"; }
const char* reduction(bool mean) { return mean ? "MEAN" : "SUM"; }

void track_locked(Registry& r, const std::shared_ptr<CoreBase>& core) {
  if (r.all.size() >= 64 && r.all.size() % 64 == 0) {  // prune expired entries now and then
    r.all.erase(std::remove_if(r.all.begin(), r.all.end(), [](const auto& w) { return w.expired(); }), r.all.end());
  }
  r.all.push_back(core);
}

template <typename C>
std::shared_ptr<C> get_or_create(bool sparse, const std::string& container, const std::string& shared_name,
                                 c10::ScalarType dtype, const PartialShape& shape, bool mean) {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  TORCH_CHECK(!g_shutdown.load(), kind(sparse), ": the accumulators were shut down (the process is exiting)");
  if (shared_name.empty()) {  // private to this handle (TF: empty shared_name)
    auto core = std::make_shared<C>(dtype, shape, mean);
    track_locked(r, core);
    return core;
  }
  const Key key{container, shared_name};
  auto it = r.shared.find(key);
  if (it == r.shared.end()) {
    auto core = std::make_shared<C>(dtype, shape, mean);
    r.shared.emplace(key, core);
    track_locked(r, core);
    return core;
  }
  const auto& have = it->second;
  const auto where = [&] {
    return c10::str("(container='", container, "', shared_name='", shared_name, "')");
  };
  TORCH_CHECK_VALUE(have->sparse == sparse, kind(sparse), ": the accumulator ", where(), " already exists as a ",
                    kind(have->sparse), "; a dense and a sparse accumulator cannot share a name");
  TORCH_CHECK_VALUE(have->dtype == dtype, kind(sparse), ": the shared accumulator ", where(), " was created with dtype ",
                    have->dtype, " but this handle asks for ", dtype);
  TORCH_CHECK_VALUE(have->shape == shape, kind(sparse), ": the shared accumulator ", where(), " was created with shape ",
                    have->shape.str(), " but this handle asks for ", shape.str());
  TORCH_CHECK_VALUE(have->mean == mean, kind(sparse), ": the shared accumulator ", where(),
                    " was created with reduction_type ", reduction(have->mean), " but this handle asks for ",
                    reduction(mean));
  return std::static_pointer_cast<C>(have);
}

}  // namespace

std::shared_ptr<DenseCore> get_or_create_dense(const std::string& container, const std::string& shared_name,
                                               c10::ScalarType dtype, const PartialShape& shape, bool mean) {
  return get_or_create<DenseCore>(false, container, shared_name, dtype, shape, mean);
}

std::shared_ptr<SparseCore> get_or_create_sparse(const std::string& container, const std::string& shared_name,
                                                 c10::ScalarType dtype, const PartialShape& shape, bool mean) {
  return get_or_create<SparseCore>(true, container, shared_name, dtype, shape, mean);
}

void close_all(bool shutdown) {
  auto& r = registry();
  std::vector<std::shared_ptr<CoreBase>> live;
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (shutdown) g_shutdown = true;
    for (auto& w : r.all)
      if (auto c = w.lock()) live.push_back(std::move(c));
    r.all.clear();
    r.shared.clear();  // a later creation under the same name gets a fresh accumulator
  }
  for (auto& c : live) c->close();
}

InFlight::InFlight() { ++g_in_flight; }
InFlight::~InFlight() { --g_in_flight; }
int64_t in_flight() { return g_in_flight.load(); }

}  // namespace accumulator
}  // namespace torchops
