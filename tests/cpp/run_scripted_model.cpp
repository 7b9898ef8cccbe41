// A libtorch program with no Python: dlopen the torchops library, load a scripted model that calls
// torchops ops, run forward and backward, print the results for the test to compare.
//   run_scripted_model <libtorchops.so> <model.pt>
#include <dlfcn.h>
#include <torch/script.h>

#include <iomanip>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " <torchops library> <scripted model>\n";
    return 2;
  }
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) {
    std::cerr << "dlopen failed: " << dlerror() << "\n";
    return 3;
  }
  torch::jit::Module model = torch::jit::load(argv[2]);
  // The same deterministic input as the Python side builds.
  torch::Tensor x = torch::linspace(-2.0, 2.0, 2 * 3 * 6 * 6, torch::kFloat32).reshape({2, 3, 6, 6}).sin();
  x.requires_grad_(true);
  model.train();
  torch::Tensor y = model.forward({x}).toTensor();
  y.pow(2).sum().backward();
  std::cout << std::setprecision(9) << "y_sum " << y.sum().item<double>() << "\n"
            << "y_abs_sum " << y.abs().sum().item<double>() << "\n"
            << "x_grad_abs_sum " << x.grad().abs().sum().item<double>() << "\n";
  for (const auto& p : model.named_parameters()) {
    std::cout << "grad " << p.name << " " << p.value.grad().abs().sum().item<double>() << "\n";
  }
  return 0;
}
