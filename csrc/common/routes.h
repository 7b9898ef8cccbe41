// Routes: the one mechanism that decides which implementation of a kernel slot runs, as ATen's DispatchStub
// (CPU capabilities) and torch.backends.cudnn (the vendor library) do.
//
// A family declares, per kernel slot (e.g. cudnn_rnn's whole "sequence"), an ordered list of routes in its
// <family>/routes.cpp (compiled in every build, so a CPU build lists the CUDA routes too). Each route has a
// name, a device, the CPU capability it needs (where it matters), what it covers, and whether it is verified:
// it has passed the test suite on its device. A route is on by default only once verified. The orchestration
// asks a route `enabled()` before trying it and calls `ran()` when it ran, so tests can assert which route
// ran. The defaults come from TORCHOPS_ROUTES (read once, at load) and are switched at run time through the
// ops `torchops::_set_route` etc. (torchops.backends in Python), from any thread.
#pragma once

#include <c10/core/DeviceType.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torchops {
namespace routes {

// CPU capabilities, ATen's names and order: every capability includes the ones below it.
enum class Capability : int { Default = 0, AVX2 = 1, AVX512 = 2 };
constexpr int kNoCapability = -1;  // a route whose instruction set does not matter

const char* capability_name(Capability c);
// The best capability this CPU and this build can run (AVX2 means AVX2 + FMA; AVX512 means F, VL, BW, DQ).
Capability best_capability();
// The capability in use: TORCHOPS_CPU_CAPABILITY at load (default: the best), or set_capability's.
Capability capability();
// Throws a ValueError for a capability this CPU or build cannot run.
void set_capability(Capability c);
Capability parse_capability(const std::string& name);  // ValueError for unknown names

class Route {
 public:
  // verified: where the route passed the suite on its device ("NVIDIA H200, torch 2.11, 2026-10-28"), or nullptr
  // if it never has. default_on: whether a verified route is on by default (an unverified one never is).
  Route(const char* family, const char* slot, const char* name, c10::DeviceType device, int capability,
        const char* covers, const char* verified, bool default_on = true);
  Route(const Route&) = delete;
  Route& operator=(const Route&) = delete;

  // On, and (for a CPU capability route) within the capability in use.
  bool enabled() const {
    return on_.load(std::memory_order_relaxed) &&
           (capability_ == kNoCapability || capability_ <= static_cast<int>(routes::capability()));
  }
  // Records that this route ran (once per op call, or per kernel call for capability routes).
  void ran() const { hits_.fetch_add(1, std::memory_order_relaxed); }

  const std::string& id() const { return id_; }  // "<family>.<device>.<name>"
  const char* family() const { return family_; }
  const char* slot() const { return slot_; }
  const char* name() const { return name_; }
  c10::DeviceType device() const { return device_; }
  int capability_needed() const { return capability_; }
  const char* covers() const { return covers_; }
  const char* verified() const { return verified_; }
  bool on() const { return on_.load(std::memory_order_relaxed); }
  bool default_on() const { return default_on_; }
  int64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  void set_on(bool v) { on_.store(v, std::memory_order_relaxed); }

 private:
  const char* family_;
  const char* slot_;
  const char* name_;
  c10::DeviceType device_;
  int capability_;
  const char* covers_;
  const char* verified_;
  bool default_on_;
  std::string id_;
  std::atomic<bool> on_;
  mutable std::atomic<int64_t> hits_{0};
};

// Where the CPU routes are verified: they run in every CI run of the test suite.
constexpr const char* kCpuSuite = "CPU test suite (CI)";

// The three CPU capability routes of a kernel slot ("<family>.cpu.avx512", ".avx2", ".default"), best first in
// `slot`, for TORCHOPS_ISA_PICK.
struct CapabilityRoutes {
  CapabilityRoutes(const char* family, const char* slot_name);
  Route avx512, avx2, base;
  const Route* const slot[3];
};

// Every route, in registration order (each family's slots in its routes.cpp order).
std::vector<Route*> all();
// The route with this id, or a ValueError that lists the known ones.
Route& find(const std::string& id);
// Applies TORCHOPS_ROUTES ("<id>=on|off,..."); called once when the library is loaded, after every route
// registered. Throws a ValueError naming an unknown route (and listing the known ones) or a bad value.
void apply_environment();

// The first of `candidates` (CPU capability routes of one slot, best first, the last one needing Default) that
// is enabled: the caller runs the implementation at that index. The Default route is the slot's fallback.
inline int pick(const Route* const* candidates, int n) {
  for (int i = 0; i + 1 < n; ++i) {
    if (candidates[i]->enabled()) {
      candidates[i]->ran();
      return i;
    }
  }
  candidates[n - 1]->ran();
  return n - 1;
}

}  // namespace routes
}  // namespace torchops
