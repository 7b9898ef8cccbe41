// CudnnRNN's routes (common/routes.h), in each slot's order of preference. Compiled in every build.
#include "cudnn_rnn/cudnn_rnn.h"

namespace torchops {
namespace crnn {
namespace route {

using c10::DeviceType;
using routes::kCpuSuite;
using routes::kNoCapability;
using routes::Route;

constexpr const char* kH200 = "NVIDIA H200, torch 2.11, 2026-11-26";

// The whole op (forward and its backward).
Route cpu_onednn{"cudnn_rnn", "sequence", "onednn", DeviceType::CPU, kNoCapability,
                 "float32 lstm without projection, skip_input or sequence_lengths; training without dropout between "
                 "layers; oneDNN built and torch.backends.mkldnn enabled (what torch.nn.LSTM runs on the CPU)",
                 kCpuSuite};
Route cpu_onednn_bf16{"cudnn_rnn", "sequence", "onednn_bf16", DeviceType::CPU, kNoCapability,
                      "bfloat16 (torch.autocast's CPU dtype) in cudnn_rnn.cpu.onednn's cases, on CPUs where oneDNN "
                      "runs bfloat16 natively (torch.ops.mkldnn._is_mkldnn_bf16_supported()): oneDNN's bfloat16 "
                      "lstm, what torch.nn.LSTM runs under CPU autocast",
                      kCpuSuite};
Route cpu_cudnn_standin{"cudnn_rnn", "sequence", "cudnn_standin", DeviceType::CPU, kNoCapability,
                        "test-only: the cuDNN route's glue (cudnn_rnn.cuda.cudnn's cases) over a CPU stand-in of "
                        "cuDNN that keeps its contract (weight list, packed batch_sizes, a backward that overwrites "
                        "the reserve); off by default, for tests",
                        kCpuSuite, /*default_on=*/false};
Route cpu_loops{"cudnn_rnn", "sequence", "loops", DeviceType::CPU, kNoCapability,
                "every case (per-step GEMMs and fused gate kernels)", kCpuSuite};
Route cuda_cudnn{"cudnn_rnn", "sequence", "cudnn", DeviceType::CUDA, kNoCapability,
                 "float32, every rnn_mode and direction, linear_input, lstm projection smaller than num_units, "
                 "sequence_lengths; training without dropout between layers; torch.backends.cudnn enabled",
                 nullptr};
Route cuda_loops{"cudnn_rnn", "sequence", "loops", DeviceType::CUDA, kNoCapability,
                 "every case (cuBLAS GEMMs and fused gate kernels)", kH200};

// The per-step gate kernels of the CPU loops, per capability.
routes::CapabilityRoutes cpu_gate_kernels{"cudnn_rnn", "gate_kernels"};

}  // namespace route
}  // namespace crnn
}  // namespace torchops
