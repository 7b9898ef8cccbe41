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

// The cell math of the CPU LSTM ops (block_lstm, block_lstm_v2, lstm_block_cell) in float16 / bfloat16.
Route cpu_float32_cell{"block_rnn", "low_precision_lstm", "float32_cell", DeviceType::CPU, kNoCapability,
                       "float16/bfloat16 LSTM ops and their gradients: GEMMs in the dtype, the element-wise math by the "
                       "float32 kernels with the cell state and the state gradients carried in float32 between "
                       "steps, outputs rounded once",
                       routes::kCpuSuite};
Route cpu_dtype_cell{"block_rnn", "low_precision_lstm", "dtype_cell", DeviceType::CPU, kNoCapability,
                     "every case (the dtype's kernels: float32 math per element, every value stored in the dtype)",
                     routes::kCpuSuite};

}  // namespace route
}  // namespace brnn
}  // namespace torchops
