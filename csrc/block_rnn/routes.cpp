// The block RNN ops' routes (common/routes.h), in each slot's order of preference. Compiled in every build.
#include "block_rnn/block_rnn.h"

namespace torchops {
namespace brnn {
namespace route {

using c10::DeviceType;
using routes::kNoCapability;
using routes::Route;

constexpr const char* kH100 = "NVIDIA H100, torch 2.11, 2026-11-26";

// The per-step element-wise kernels of the CPU loops, per capability.
routes::CapabilityRoutes cpu_step_kernels{"block_rnn", "step_kernels"};

// The recurrence of the sequence ops (block_lstm, block_lstm_v2, block_gru and their gradients) on CUDA.
Route cuda_persistent{"block_rnn", "sequence", "persistent", DeviceType::CUDA, kNoCapability,
                      "float32/float64 sequences whose recurrent weights and state fit the GPU's cooperative "
                      "launch (all steps in one kernel launch)",
                      nullptr};
Route cuda_steps{"block_rnn", "sequence", "steps", DeviceType::CUDA, kNoCapability,
                 "every case (one GEMM and one fused kernel per step)", kH100};

}  // namespace route
}  // namespace brnn
}  // namespace torchops
