// FusedBatchNorm's routes (common/routes.h), in each slot's order of preference. Compiled in every build.
#include "fused_batch_norm/fused_batch_norm.h"

namespace torchops {
namespace fbn {
namespace route {

using c10::DeviceType;
using routes::Capability;
using routes::kCpuSuite;
using routes::kNoCapability;
using routes::Route;

constexpr const char* kH100 = "NVIDIA H100, torch 2.11, 2026-11-26";

// CPU: the loops per capability (the AVX-512 capability runs the AVX2 build: 32-byte vectors gain nothing from it).
Route cpu_avx2{"fused_batch_norm", "kernels", "avx2", DeviceType::CPU, static_cast<int>(Capability::AVX2),
               "every case (AVX2 + FMA build of the loops)", kCpuSuite};
Route cpu_default{"fused_batch_norm", "kernels", "default", DeviceType::CPU, static_cast<int>(Capability::Default),
                  "every case (baseline x86-64 build)", kCpuSuite};

// CUDA: whole ops through cuDNN, else torchops' kernels.
Route cuda_cudnn{"fused_batch_norm", "op", "cudnn", DeviceType::CUDA, kNoCapability,
                 "training forward and backward, float32/float16, where torch's batch_norm would pick cuDNN "
                 "(torch.backends.cudnn enabled, its epsilon and size limits), at least two elements per channel; "
                 "channels-first data with planes of 1024 elements or more stays on torchops' kernels",
                 nullptr};
Route cuda_cudnn_inference{"fused_batch_norm", "op", "cudnn_inference", DeviceType::CUDA, kNoCapability,
                           "inference forward, float32/float16, where torch's batch_norm would pick cuDNN", nullptr};
Route cuda_kernels{"fused_batch_norm", "op", "kernels", DeviceType::CUDA, kNoCapability,
                   "every case (torchops' reduction and element-wise kernels)", kH100};

// CUDA: the element-wise normalisation pass of torchops' kernels.
Route cuda_vectorized{"fused_batch_norm", "normalize", "vectorized", DeviceType::CUDA, kNoCapability,
                      "16-byte aligned data whose vectors do not straddle a channel, fewer than 2^31 elements",
                      nullptr};
Route cuda_plain{"fused_batch_norm", "normalize", "plain", DeviceType::CUDA, kNoCapability,
                 "every case (one element per thread)", kH100};

}  // namespace route
}  // namespace fbn
}  // namespace torchops
