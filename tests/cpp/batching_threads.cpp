// Python-free libtorch process: dlopen the torchops library, load a scripted nn.Batched model and run
// it (forward + backward) from many C++ threads; every call must get exactly its own answer.
#include <torch/script.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s torchops_lib.so model.pt\n", argv[0]);
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  torch::jit::Module model = torch::jit::load(argv[2]);
  const int threads = 16, requests = 40;
  std::atomic<int> bad{0}, done{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        for (int r = 0; r < requests; ++r) {
          const int64_t rows = 1 + (t + r) % 3;
          auto x = (torch::arange(rows, torch::kFloat64) + 100.0 * t + r).unsqueeze(1).repeat({1, 4});
          x.requires_grad_(true);
          auto y = model.forward({x}).toTensor();
          (y * y).sum().backward();
          // model: 3 * x + 1  ->  d/dx (y^2) = 2 * y * 3
          if (!torch::allclose(y, x.detach() * 3.0 + 1.0) || !torch::allclose(x.grad(), 6.0 * y.detach())) ++bad;
          ++done;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %d: %s\n", t, e.what());
        ++bad;
      }
    });
  }
  for (auto& th : pool) th.join();
  std::printf("done=%d bad=%d\n", done.load(), bad.load());
  return bad.load() == 0 && done.load() == threads * requests ? 0 : 1;
}
