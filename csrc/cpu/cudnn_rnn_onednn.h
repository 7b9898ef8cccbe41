// CudnnRNN's CPU library route: oneDNN's LSTM through ATen (at::mkldnn_rnn_layer and its backward), what
// torch.nn.LSTM runs on the CPU. The CPU Kernels table (csrc/cpu/cudnn_rnn_kernel.cpp) points at these.
#pragma once

#include "cudnn_rnn/cudnn_rnn.h"

namespace torchops {
namespace crnn {

std::optional<LibraryForward> onednn_forward(const Cfg& c, const Layout& lay, const at::Tensor& x,
                                             const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                             const at::Tensor& lens, double dropout, bool is_training,
                                             int64_t reserve_numel);

std::optional<LibraryBackward> onednn_backward(const Cfg& c, const Layout& lay, const at::Tensor& reserve,
                                               const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                               const at::Tensor& p, const at::Tensor& dY, const at::Tensor& dhN,
                                               const at::Tensor& dcN);

}  // namespace crnn
}  // namespace torchops
