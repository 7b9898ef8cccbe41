// CudnnRNN through cuDNN on CUDA (ATen's _cudnn_rnn ops): the CUDA Kernels table's library route (see
// Kernels::library_forward / library_backward in cudnn_rnn.h).
#pragma once

#include "cudnn_rnn/cudnn_rnn.h"

namespace torchops {
namespace crnn {

std::optional<LibraryForward> cudnn_forward(const Cfg& c, const Layout& lay, const at::Tensor& x,
                                            const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                            const at::Tensor& lens, double dropout, bool is_training,
                                            int64_t reserve_numel);

std::optional<T4> cudnn_backward(const Cfg& c, const Layout& lay, const at::Tensor& reserve, const at::Tensor& x,
                                 const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                 const at::Tensor& dY, const at::Tensor& dhN, const at::Tensor& dcN);

}  // namespace crnn
}  // namespace torchops
