// A libtorch program with no Python: dlopen the torchops library, load an AOTInductor package (.pt2)
// whose model calls torchops ops, run it on inputs of several batch sizes and print every output value
// for the test to compare with eager.
//   run_aoti_package <libtorchops.so> <model.pt2> <cpu|cuda> <C> <H> <W> <batch>...
#include <dlfcn.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 8) {
    std::cerr << "usage: " << argv[0] << " <torchops library> <package.pt2> <cpu|cuda> <C> <H> <W> <batch>...\n";
    return 2;
  }
  // The package's calls into torchops ops go through the dispatcher: the library must be loaded first.
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::cerr << "dlopen failed: " << dlerror() << "\n";
    return 3;
  }
  const torch::Device device(argv[3]);
  const int64_t c = std::stoll(argv[4]), h = std::stoll(argv[5]), w = std::stoll(argv[6]);
  try {
    torch::inductor::AOTIModelPackageLoader loader(argv[2]);
    torch::NoGradGuard no_grad;
    std::cout << std::setprecision(9);
    for (int i = 7; i < argc; ++i) {
      const int64_t b = std::stoll(argv[i]);
      // The same deterministic input as the Python side builds.
      torch::Tensor x = torch::linspace(-2.0, 2.0, b * c * h * w, torch::kFloat32).reshape({b, c, h, w}).sin();
      std::vector<torch::Tensor> outputs = loader.run({x.to(device)});
      for (size_t k = 0; k < outputs.size(); ++k) {
        torch::Tensor o = outputs[k].to(torch::kCPU, torch::kFloat64).contiguous().reshape({-1});
        std::cout << "batch " << b << " output " << k << " shape";
        for (int64_t d : outputs[k].sizes()) std::cout << " " << d;
        std::cout << "\n";
        const double* p = o.data_ptr<double>();
        for (int64_t j = 0; j < o.numel(); ++j) std::cout << "value " << b << " " << k << " " << j << " " << p[j] << "\n";
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
