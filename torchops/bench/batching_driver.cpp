// Benchmark driver for `python -m torchops.bench --filter batching` (mode "cpp"): a Python-free
// libtorch process that dlopens the torchops library, loads a TorchScript model and calls it with
// 1-row requests from N C++ threads for a fixed time (the "TorchScript model served from many C++
// threads" use case, without the Python GIL). Prints: requests_per_s p50_us p99_us cpus_busy
// (cpus_busy: the process's CPU time / wall time; below the core count = threads waiting, not working).
// Optional: the model's batching queue (its statistics are printed as a second line), the rows per
// request (default 1; the bench's compute ceiling runs full batches of the plain model) and the device the
// model runs on ("cuda": libtorch_cuda is loaded first; requests and results stay host tensors, the model
// moves them, as a server receiving requests from the network would). `shape`: a request row's shape,
// e.g. 256 or 1x8x8.
//
// `--handoff clients batch seconds`: the hand-off floor of this machine, with no torch at all: N threads
// form batches of `batch` requests through one mutex and a condition variable per batch (the batch's
// last arrival wakes the others), the least any batcher whose callers block must pay. Prints:
// requests_per_s 0 0 cpus_busy.
//
// `--pipeline batch sleep|spin torchops_lib model.pt clients seconds shape`: the same minimal batcher, whose
// batches' last arrival runs the model on `batch` rows before it releases the others (as nn.Batched's holder
// does), with no batching ops or tensors per request: what a batcher of that structure can reach with this
// model on this machine (how the scheduler places waiting and computing threads, how fast the model runs
// among them). `spin`: the waiters yield-spin on a flag instead of sleeping. Prints as --handoff.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/script.h>

#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The minimal batcher of --handoff / --pipeline. `make_work` runs once on every client thread and returns what
// that thread runs when it completes a batch.
template <typename MakeWork>
int minimal_batcher(int clients, int batch, double seconds, bool spin, MakeWork make_work) {
  struct Batch {
    int n = 0;
    std::atomic<bool> done{false};
    std::condition_variable cv;
  };
  std::mutex mu;
  auto open = std::make_shared<Batch>();
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> ready{0};
  std::atomic<long> requests{0};
  std::vector<std::thread> pool;
  for (int i = 0; i < clients; ++i) {
    pool.emplace_back([&] {
      auto work = make_work();
      ++ready;
      while (!go) std::this_thread::yield();
      long n = 0;
      while (!stop) {
        std::unique_lock<std::mutex> l(mu);
        auto b = open;
        if (++b->n == batch) {
          open = std::make_shared<Batch>();
          l.unlock();
          work();
          l.lock();
          b->done = true;
          l.unlock();
          b->cv.notify_all();
        } else if (spin) {
          l.unlock();
          while (!b->done.load() && !stop.load()) std::this_thread::yield();
        } else {
          b->cv.wait(l, [&] { return b->done.load() || stop.load(); });
        }
        ++n;
      }
      requests += n;
    });
  }
  while (ready < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double cpu0 = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  {
    std::lock_guard<std::mutex> l(mu);
    open->cv.notify_all();
  }
  for (auto& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%f 0 0 %f\n", requests / elapsed, (cpu_seconds() - cpu0) / elapsed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* prog = argv[0];
  if (argc == 5 && std::strcmp(argv[1], "--handoff") == 0)
    return minimal_batcher(std::atoi(argv[2]), std::atoi(argv[3]), std::atof(argv[4]), false,
                           [] { return [] {}; });
  int pipeline_batch = 0;
  bool pipeline_spin = false;
  if (argc >= 4 && std::strcmp(argv[1], "--pipeline") == 0) {
    pipeline_batch = std::atoi(argv[2]);
    pipeline_spin = std::strcmp(argv[3], "spin") == 0;
    if (pipeline_batch < 1 || (!pipeline_spin && std::strcmp(argv[3], "sleep") != 0)) {
      std::fprintf(stderr, "--pipeline: expected a batch size >= 1 and sleep|spin, got %s %s\n", argv[2], argv[3]);
      return 2;
    }
    argv += 3;
    argc -= 3;
  }
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s torchops_lib model.pt clients seconds shape [shared_name|\"\" [rows [cpu|cuda]]]\n",
                 prog);
    return 2;
  }
  if (argc >= 9 && std::strcmp(argv[8], "cuda") == 0 && !dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL)) {
    std::fprintf(stderr, "dlopen libtorch_cuda.so failed: %s\n", dlerror());
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
  const int64_t rows = argc >= 8 ? std::atoll(argv[7]) : 1;
  std::vector<int64_t> shape{rows};
  for (const char* p = argv[5]; *p;) {  // "256" or "1x8x8"
    char* end = nullptr;
    shape.push_back(std::strtoll(p, &end, 10));
    if (end == p || shape.back() < 1 || (*end && *end != 'x')) {
      std::fprintf(stderr, "bad shape %s\n", argv[5]);
      return 2;
    }
    p = *end ? end + 1 : end;
  }
  if (shape.size() < 2) {
    std::fprintf(stderr, "bad shape \"%s\": expected dims such as 256 or 1x8x8\n", argv[5]);
    return 2;
  }
  if (pipeline_batch > 0) {
    shape[0] = pipeline_batch;
    return minimal_batcher(clients, pipeline_batch, seconds, pipeline_spin, [&] {
      at::set_num_threads(1);
      auto x = torch::randn(shape);
      auto run = [&model, x] {
        torch::NoGradGuard no_grad;
        model.forward({x});
      };
      run();  // (warm-up: the first calls of a scripted model optimise it)
      return run;
    });
  }
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::vector<double>> lat(clients);
  std::vector<std::thread> pool;
  for (int i = 0; i < clients; ++i) {
    pool.emplace_back([&, i] {
      torch::NoGradGuard no_grad;
      at::set_num_threads(1);  // OpenMP's thread count is per thread
      auto x = torch::randn(shape);
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
  const double cpu0 = cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  go = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpus_busy = (cpu_seconds() - cpu0) / elapsed;
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  if (all.empty()) return 1;
  auto pct = [&](double q) { return all[std::min(all.size() - 1, static_cast<size_t>(q * (all.size() - 1) + 0.5))]; };
  std::printf("%f %f %f %f\n", all.size() / elapsed, pct(0.5), pct(0.99), cpus_busy);
  if (argc >= 7 && argv[6][0] != '\0') {
    // Second line: the statistics of the model's batching queue (shared_name argv[6]), as JSON.
    auto stats = c10::Dispatcher::singleton()
                     .findSchemaOrThrow("torchops::_batching_stats", "")
                     .typed<std::string(c10::string_view, c10::string_view, c10::string_view)>();
    std::printf("%s\n", stats.call("", argv[6], "").c_str());
  }
  return 0;
}
