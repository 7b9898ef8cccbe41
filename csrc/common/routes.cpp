// The route registry, the CPU capability in use and the control ops (torch.ops.torchops._route_* and
// _*cpu_capability), which torchops.backends wraps and TorchScript / libtorch programs can call directly.
// The only place in csrc/ that reads the environment: TORCHOPS_ROUTES and TORCHOPS_CPU_CAPABILITY, once.
#include "common/routes.h"
#include "cpu/cpu_isa.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

namespace torchops {
namespace routes {
namespace {

struct Registry {
  std::mutex mu;
  std::vector<Route*> routes;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: routes are read until the process exits
  return *r;
}

const char* kCapabilityNames[] = {"default", "avx2", "avx512"};

std::string known_routes() {
  std::ostringstream s;
  const auto rs = all();
  for (size_t i = 0; i < rs.size(); ++i) s << (i ? ", " : "") << rs[i]->id();
  return s.str();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\n");
  return s.substr(b, e - b + 1);
}

// The fallback of a slot is its last route: it covers every case and cannot be turned off.
bool is_fallback(const Route& r) {
  const auto rs = all();
  const Route* last = nullptr;
  for (const Route* o : rs) {
    if (std::string(o->family()) == r.family() && std::string(o->slot()) == r.slot() && o->device() == r.device())
      last = o;
  }
  return last == &r;
}

// TORCHOPS_ROUTES parsed once, when the first route registers: each route takes its value as it registers
// (so a libtorch program gets them too); apply_environment() reports what is malformed or unknown.
struct EnvRoutes {
  std::map<std::string, bool> values;
  std::string error;  // the first malformed item, if any
};

const EnvRoutes& env_routes() {
  static const EnvRoutes* e = [] {
    auto* r = new EnvRoutes();
    const char* v = std::getenv("TORCHOPS_ROUTES");
    if (v == nullptr) return r;
    std::stringstream items(v);
    std::string item;
    while (std::getline(items, item, ',')) {
      item = trim(item);
      if (item.empty()) continue;
      const auto eq = item.find('=');
      const std::string id = trim(item.substr(0, eq)), value = eq == std::string::npos ? "" : trim(item.substr(eq + 1));
      if (eq == std::string::npos || (value != "on" && value != "off")) {
        if (r->error.empty())
          r->error = "TORCHOPS_ROUTES: '" + item + "' must be <route>=on or <route>=off";
        continue;
      }
      r->values[id] = value == "on";
    }
    return r;
  }();
  return *e;
}

std::atomic<int> g_capability{-1};
std::once_flag g_capability_once;

void init_capability() {
  std::call_once(g_capability_once, [] {
    int c = static_cast<int>(best_capability());
    if (const char* v = std::getenv("TORCHOPS_CPU_CAPABILITY"); v != nullptr && *v != '\0') {
      const Capability want = parse_capability(v);
      TORCH_CHECK_VALUE(want <= best_capability(), "TORCHOPS_CPU_CAPABILITY=", v, ": this CPU (or this build) runs at most '",
                        capability_name(best_capability()), "'");
      c = static_cast<int>(want);
    }
    int expected = -1;
    g_capability.compare_exchange_strong(expected, c);
  });
}

}  // namespace

const char* capability_name(Capability c) { return kCapabilityNames[static_cast<int>(c)]; }

Capability best_capability() {
  static const Capability best = static_cast<Capability>(cpu::isa_level());
  return best;
}

Capability capability() {
  int c = g_capability.load(std::memory_order_relaxed);
  if (c < 0) {
    init_capability();
    c = g_capability.load(std::memory_order_relaxed);
  }
  return static_cast<Capability>(c);
}

void set_capability(Capability c) {
  TORCH_CHECK_VALUE(c <= best_capability(), "CPU capability '", capability_name(c), "' cannot run here: this CPU (or ",
                    "this build) runs at most '", capability_name(best_capability()), "'");
  init_capability();  // (the environment's value is validated even when overridden)
  g_capability.store(static_cast<int>(c), std::memory_order_relaxed);
}

Capability parse_capability(const std::string& name) {
  for (int i = 0; i < 3; ++i)
    if (name == kCapabilityNames[i]) return static_cast<Capability>(i);
  TORCH_CHECK_VALUE(false, "CPU capability must be one of 'default', 'avx2', 'avx512', got '", name, "'");
}

Route::Route(const char* family, const char* slot, const char* name, c10::DeviceType device, int capability,
             const char* covers, const char* verified, bool default_on)
    : family_(family),
      slot_(slot),
      name_(name),
      device_(device),
      capability_(capability),
      covers_(covers),
      verified_(verified),
      default_on_(verified != nullptr && default_on),
      id_(std::string(family) + "." + c10::DeviceTypeName(device, /*lower_case=*/true) + "." + name),
      on_(verified != nullptr && default_on) {
  const auto& env = env_routes().values;
  if (const auto it = env.find(id_); it != env.end()) on_.store(it->second);
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mu);
  r.routes.push_back(this);
}

CapabilityRoutes::CapabilityRoutes(const char* family, const char* slot_name)
    : avx512(family, slot_name, "avx512", c10::DeviceType::CPU, static_cast<int>(Capability::AVX512),
             "every case (AVX-512 build)", kCpuSuite),
      avx2(family, slot_name, "avx2", c10::DeviceType::CPU, static_cast<int>(Capability::AVX2),
           "every case (AVX2 + FMA build)", kCpuSuite),
      base(family, slot_name, "default", c10::DeviceType::CPU, static_cast<int>(Capability::Default),
           "every case (baseline x86-64 build)", kCpuSuite),
      slot{&avx512, &avx2, &base} {}

std::vector<Route*> all() {
  Registry& r = registry();
  std::vector<Route*> out;
  {
    const std::lock_guard<std::mutex> lock(r.mu);
    out = r.routes;
  }
  // By family (the order the libraries' static initializers ran in is the linker's), each family's routes in
  // the order its routes.cpp declares them.
  std::stable_sort(out.begin(), out.end(),
                   [](const Route* a, const Route* b) { return std::string(a->family()) < b->family(); });
  return out;
}

Route& find(const std::string& id) {
  for (Route* r : all())
    if (r->id() == id) return *r;
  TORCH_CHECK_VALUE(false, "unknown torchops route '", id, "'; the routes are: ", known_routes());
}

namespace {

void set_route(const std::string& id, bool on) {
  Route& r = find(id);
  TORCH_CHECK_VALUE(on || !is_fallback(r), "route '", id, "' is the fallback of ", r.family(), "'s ", r.slot(),
                    " slot on ", c10::DeviceTypeName(r.device(), true), ": it covers every case and cannot be turned off");
  r.set_on(on);
}

}  // namespace

void apply_environment() {
  init_capability();
  const EnvRoutes& env = env_routes();
  TORCH_CHECK_VALUE(env.error.empty(), env.error);
  for (const auto& [id, on] : env.values) {
    Route& r = find(id);
    TORCH_CHECK_VALUE(on || !is_fallback(r), "TORCHOPS_ROUTES: route '", id, "' is the fallback of ", r.family(), "'s ",
                      r.slot(), " slot on ", c10::DeviceTypeName(r.device(), true), " and cannot be turned off");
  }
}

namespace {

// One route as a tab-separated record (torchops.backends parses it): id, family, slot, device, name, the CPU
// capability it needs ("" if none), verified ("" if never), on, on by default, fallback, hits, covers.
std::string record(const Route& r) {
  std::ostringstream s;
  s << r.id() << '\t' << r.family() << '\t' << r.slot() << '\t' << c10::DeviceTypeName(r.device(), true) << '\t'
    << r.name() << '\t'
    << (r.capability_needed() == kNoCapability ? "" : capability_name(static_cast<Capability>(r.capability_needed())))
    << '\t' << (r.verified() ? r.verified() : "") << '\t' << (r.on() ? 1 : 0) << '\t' << (r.default_on() ? 1 : 0)
    << '\t' << (is_fallback(r) ? 1 : 0) << '\t' << r.hits() << '\t' << r.covers();
  return s.str();
}

std::vector<std::string> route_list() {
  std::vector<std::string> out;
  for (const Route* r : all()) out.push_back(record(*r));
  return out;
}

void route_set(c10::string_view id, bool on) { set_route(std::string(id), on); }
bool route_enabled(c10::string_view id) { return find(std::string(id)).enabled(); }
int64_t route_hits(c10::string_view id) { return find(std::string(id)).hits(); }
std::string cpu_capability() { return capability_name(capability()); }
std::string best_cpu_capability() { return capability_name(best_capability()); }
void set_cpu_capability(c10::string_view name) { set_capability(parse_capability(std::string(name))); }

}  // namespace
}  // namespace routes
}  // namespace torchops

TORCH_LIBRARY_FRAGMENT(torchops, m) {
  using namespace torchops::routes;
  // Conservative alias analysis: these ops read and change process state, so TorchScript must neither drop nor
  // merge their calls.
  const auto state = c10::AliasAnalysisKind::CONSERVATIVE;
  m.def(torch::schema("_route_list() -> str[]", state), &route_list);
  m.def(torch::schema("_route_set(str id, bool on) -> ()", state), &route_set);
  m.def(torch::schema("_route_enabled(str id) -> bool", state), &route_enabled);
  m.def(torch::schema("_route_hits(str id) -> int", state), &route_hits);
  m.def(torch::schema("_routes_apply_environment() -> ()", state), &apply_environment);
  m.def(torch::schema("_cpu_capability() -> str", state), &cpu_capability);
  m.def(torch::schema("_best_cpu_capability() -> str", state), &best_cpu_capability);
  m.def(torch::schema("_set_cpu_capability(str name) -> ()", state), &set_cpu_capability);
}
