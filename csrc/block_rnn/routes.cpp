// The block RNN ops' routes (common/routes.h), in each slot's order of preference. Compiled in every build.
#include "block_rnn/block_rnn.h"

namespace torchops {
namespace brnn {
namespace route {

using c10::DeviceType;
using routes::Capability;
using routes::kNoCapability;
using routes::Route;

constexpr const char* kCpuSuite = "CPU test suite (CI)";
constexpr const char* kH100 = "NVIDIA H100, torch 2.11, 2026-11-26";

// The per-step element-wise kernels of the CPU loops, per capability.
Route cpu_avx512{"block_rnn", "step_kernels", "avx512", DeviceType::CPU, static_cast<int>(Capability::AVX512),
                 "every case (AVX-512 build)", kCpuSuite};
Route cpu_avx2{"block_rnn", "step_kernels", "avx2", DeviceType::CPU, static_cast<int>(Capability::AVX2),
               "every case (AVX2 + FMA build)", kCpuSuite};
Route cpu_default{"block_rnn", "step_kernels", "default", DeviceType::CPU, static_cast<int>(Capability::Default),
                  "every case (baseline x86-64 build)", kCpuSuite};
const Route* const cpu_step_kernels[3] = {&cpu_avx512, &cpu_avx2, &cpu_default};

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
