// Benchmark driver for `python -m torchops.bench --filter batching` (mode "cpp"): a Python-free
// libtorch process that dlopens the torchops library, loads a TorchScript model and calls it with
// 1-row requests from N C++ threads for a fixed time (the "TorchScript model served from many C++
// threads" use case, without the Python GIL). Prints: requests_per_s p50_us p99_us
#include <ATen/Parallel.h>
#include <torch/script.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s torchops_lib model.pt clients seconds in_features\n", argv[0]);
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  at::set_num_threads(1);
  torch::jit::Module model = torch::jit::load(argv[2]);
  model.eval();
  const int clients = std::atoi(argv[3]);
  const double seconds = std::atof(argv[4]);
  const int64_t in_features = std::atoll(argv[5]);
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::vector<double>> lat(clients);
  std::vector<std::thread> pool;
  for (int i = 0; i < clients; ++i) {
    pool.emplace_back([&, i] {
      torch::NoGradGuard no_grad;
      at::set_num_threads(1);  // OpenMP's thread count is per thread
      auto x = torch::randn({1, in_features});
      model.forward({x});
      ++ready;
      while (!go) std::this_thread::yield();
      while (!stop) {
        const auto t0 = std::chrono::steady_clock::now();
        auto y = model.forward({x}).toTensor();
        const auto t1 = std::chrono::steady_clock::now();
        lat[i].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
    });
  }
  while (ready < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto start = std::chrono::steady_clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  if (all.empty()) return 1;
  auto pct = [&](double q) { return all[std::min(all.size() - 1, static_cast<size_t>(q * (all.size() - 1) + 0.5))]; };
  std::printf("%f %f %f\n", all.size() / elapsed, pct(0.5), pct(0.99));
  return 0;
}
