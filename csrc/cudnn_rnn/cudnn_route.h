// CudnnRNN's cuDNN route: the glue around the vendor calls (weight list, flat weight buffer, sorting and packing of
// variable lengths, rows left out, reserve ownership), compiled in every build. The vendor calls sit behind a
// table with ATen's signatures (at::_cudnn_rnn_flatten_weight, _cudnn_rnn, _cudnn_rnn_backward): ATen's cuDNN ops
// on CUDA (route::cuda_cudnn), and a CPU stand-in that keeps their contract and quirks (route::cpu_cudnn_standin,
// a test-only route), so the glue runs in CPU CI. The Kernels tables point at the entry points below.
#pragma once

#include "cudnn_rnn/cudnn_rnn.h"

#include <array>

namespace torchops {
namespace crnn {

struct CudnnVendor {
  // Whether the library runs data on x's device (and is enabled there).
  bool (*runs_on)(const at::Tensor& x);
  at::Tensor (*flatten_weight)(at::TensorList weight_arr, int64_t weight_stride0, int64_t input_size, int64_t mode,
                               int64_t hidden_size, int64_t proj_size, int64_t num_layers, bool batch_first,
                               bool bidirectional);
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> (*rnn)(
      const at::Tensor& input, at::TensorList weight, int64_t weight_stride0,
      const std::optional<at::Tensor>& weight_buf, const at::Tensor& hx, const std::optional<at::Tensor>& cx,
      int64_t mode, int64_t hidden_size, int64_t proj_size, int64_t num_layers, bool batch_first, double dropout,
      bool train, bool bidirectional, at::IntArrayRef batch_sizes, const std::optional<at::Tensor>& dropout_state);
  // Mutates `reserve` (as cuDNN does): a second backward needs a fresh copy of the forward's.
  std::tuple<at::Tensor, at::Tensor, at::Tensor, std::vector<at::Tensor>> (*rnn_backward)(
      const at::Tensor& input, at::TensorList weight, int64_t weight_stride0, const at::Tensor& weight_buf,
      const at::Tensor& hx, const std::optional<at::Tensor>& cx, const at::Tensor& output,
      const std::optional<at::Tensor>& grad_output, const std::optional<at::Tensor>& grad_hy,
      const std::optional<at::Tensor>& grad_cy, int64_t mode, int64_t hidden_size, int64_t proj_size,
      int64_t num_layers, bool batch_first, double dropout, bool train, bool bidirectional,
      at::IntArrayRef batch_sizes, const std::optional<at::Tensor>& dropout_state, const at::Tensor& reserve,
      std::array<bool, 4> output_mask);
};

extern const CudnnVendor kAtenCudnn;     // ATen's cuDNN ops (CUDA data)
extern const CudnnVendor kCudnnStandin;  // the CPU stand-in (cudnn_standin.cpp)

// The Kernels::LibraryRoute entry points of each vendor.
std::optional<LibraryForward> cudnn_forward(const Cfg& c, const Layout& lay, const at::Tensor& x,
                                            const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                            const at::Tensor& lens, double dropout, bool is_training,
                                            int64_t reserve_numel);
std::optional<LibraryBackward> cudnn_backward(const Cfg& c, const Layout& lay, const at::Tensor& reserve,
                                              const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                              const at::Tensor& p, const at::Tensor& dY, const at::Tensor& dhN,
                                              const at::Tensor& dcN);
std::optional<LibraryForward> standin_forward(const Cfg& c, const Layout& lay, const at::Tensor& x,
                                              const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                              const at::Tensor& lens, double dropout, bool is_training,
                                              int64_t reserve_numel);
std::optional<LibraryBackward> standin_backward(const Cfg& c, const Layout& lay, const at::Tensor& reserve,
                                                const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                                const at::Tensor& p, const at::Tensor& dY, const at::Tensor& dhN,
                                                const at::Tensor& dcN);

}  // namespace crnn
}  // namespace torchops
