// CudnnRNN family: CudnnRNN / V2 / V3 and their Backprop ops,
// CudnnRNNParamsSize and the canonical converters. Validation, the params layout and the
// device-independent orchestration (GEMMs through ATen, the time loops, dropout, the reserve_space
// layout) live in ops.cpp; each backend provides the fused per-step kernels below
// (csrc/cpu/cudnn_rnn_kernel.cpp, csrc/cuda/cudnn_rnn_kernel.cu) over the scalar math of
// csrc/common/cudnn_rnn_math.h and registers the op entry points bound to its table (Impls<K>), and
// optionally a whole-op library route (CPU: oneDNN's LSTM, csrc/cpu/cudnn_rnn_onednn.cpp; CUDA: cuDNN,
// cudnn_rnn/cudnn_route.cpp, with a CPU stand-in of cuDNN in cudnn_rnn/cudnn_standin.cpp). The routes themselves
// are in cudnn_rnn/routes.cpp.
#pragma once

#include "common/routes.h"
#include "cudnn_rnn/step_kernels.h"

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace torchops {
namespace crnn {

enum Mode { kRelu = 0, kTanh = 1, kLstm = 2, kGru = 3 };

// A validated configuration: G gates, L layers, D directions, H units, P projection (0: none), O = P or H,
// I input size; T, B data sizes (0 for the size/converter ops).
struct Cfg {
  int mode = kLstm, G = 4;
  bool skip = false;
  int64_t L = 1, D = 1, H = 1, P = 0, O = 1, I = 1;
  int64_t T = 0, B = 0;
};

// ---- params layout: all matrices of every pseudo-layer, then all biases ----
struct Region {
  int64_t off, rows, cols;  // cols < 0 marks a bias (1-D, rows elements)
  int64_t numel() const { return cols < 0 ? rows : rows * cols; }
};
struct Layout {
  std::vector<Region> weights, biases;  // canonical order
  std::vector<int64_t> w_off, r_off, p_off, bw_off, br_off;  // per pseudo-layer
  int64_t size = 0;
};

// Views of one pseudo-layer's (pl = layer * D + direction) parameters in a params buffer.
struct PlParams {
  at::Tensor W, R, Pm, bW, bR;  // W [G*H, in] (undefined with skip on layer 0), R [G*H, O], Pm [P, H], b* [G*H]
};
PlParams pl_params(const Cfg& c, const Layout& lay, const at::Tensor& p, int64_t pl);

// What a library route's forward returns, time-major in the dtype of the tensors it was given. `reserve`
// (training only) has the size the orchestration asked for; the orchestration writes its header.
struct LibraryForward {
  at::Tensor out, hN, cN, reserve;
};
using T4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// What a library route's backward returns: (dx, dh0, dc0, dp) in the compute dtype or the input dtype (the
// orchestration rounds them to the input's and params' dtypes).
struct LibraryBackward {
  LibraryBackward(T4 g) : grads(std::move(g)) {}
  T4 grads;
};

// The orchestration's header at the start of every reserve_space (a library route keeps its own data after it).
constexpr int64_t kReserveHeaderBytes = 16 * 8;

// A library route's reserve_space: `numel` elements over `data` (the orchestration writes its header), whose
// storage (storage_bytes, at least the elements' bytes: what `data` holds) owns `state` and releases it with
// `deleter`. reserve_state finds the state again; a copy of the reserve does not carry it (null).
at::Tensor reserve_owning(void* data, int64_t numel, const at::TensorOptions& options, void* state,
                          void (*deleter)(void*), int64_t storage_bytes = 0);
const void* reserve_state(const at::Tensor& reserve, void (*deleter)(void*));

// One backend's table: its per-step kernels (StepKernels) and its routes.
struct Kernels : StepKernels {
  c10::DeviceType device;
  // The route counted when the time loops ran the op.
  const routes::Route* loops_route = nullptr;
  // Optional whole-op routes through a vendor library, tried in order after validation with time-major,
  // contiguous tensors; `lens` is the validated int32 lengths on the CPU (undefined when every length is T).
  // nullopt leaves the case to the next route and finally to the time loops. An entry is tried only for the input
  // dtypes it takes (`dtype`) and while its route is enabled, which then counts the run. A training forward
  // returns a reserve of `reserve_numel` elements (of the input dtype) that only its backward can use.
  struct LibraryRoute {
    const routes::Route* route = nullptr;
    std::optional<LibraryForward> (*forward)(const Cfg& c, const Layout& lay, const at::Tensor& x,
                                             const at::Tensor& h0, const at::Tensor& c0, const at::Tensor& p,
                                             const at::Tensor& lens, double dropout, bool is_training,
                                             int64_t reserve_numel) = nullptr;
    // (dx, dh0, dc0, dp) from a library forward's reserve; nullopt when the reserve no longer carries the
    // library's state (a copy of it), and the orchestration recomputes the forward with the time loops.
    std::optional<LibraryBackward> (*backward)(const Cfg& c, const Layout& lay, const at::Tensor& reserve,
                                               const at::Tensor& x, const at::Tensor& h0, const at::Tensor& c0,
                                               const at::Tensor& p, const at::Tensor& dY, const at::Tensor& dhN,
                                               const at::Tensor& dcN) = nullptr;
    // Undefined: float32 and float64, given in that dtype. float16 or bfloat16: that input dtype only, given in it
    // (the low-precision dtypes' other cases run the time loops in float32); an entry serves such a dtype through
    // a route of its own, so that it is listed, switched and verified apart from the float32 one.
    at::ScalarType dtype = at::ScalarType::Undefined;
    bool takes(at::ScalarType t) const {
      return dtype == at::ScalarType::Undefined ? t == at::kFloat || t == at::kDouble : t == dtype;
    }
  };
  LibraryRoute library[3] = {};
};

using T5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Str = c10::string_view;

// The family's routes (cudnn_rnn/routes.cpp).
namespace route {
extern routes::Route cpu_onednn, cpu_onednn_bf16, cpu_cudnn_standin, cpu_loops, cuda_cudnn, cuda_loops;
extern routes::CapabilityRoutes cpu_gate_kernels;
}  // namespace route

// Forward ops (version 1, 2, 3). V1/V2 pass an undefined sequence_lengths, num_proj 0, time_major true.
T5 cudnn_rnn_forward(int version, const at::Tensor& input, const at::Tensor& input_h, const at::Tensor& input_c,
                     const at::Tensor& params, const at::Tensor& sequence_lengths, Str rnn_mode, Str input_mode,
                     Str direction, double dropout, int64_t seed, int64_t seed2, int64_t num_proj, bool is_training,
                     bool time_major, const Kernels& k);
T4 cudnn_rnn_backward(int version, const at::Tensor& input, const at::Tensor& input_h, const at::Tensor& input_c,
                      const at::Tensor& params, const at::Tensor& sequence_lengths, const at::Tensor& output,
                      const at::Tensor& output_h, const at::Tensor& output_c, const at::Tensor& output_backprop,
                      const at::Tensor& output_h_backprop, const at::Tensor& output_c_backprop,
                      const at::Tensor& reserve_space, const at::Tensor& host_reserved, Str rnn_mode,
                      Str input_mode, Str direction, double dropout, int64_t seed, int64_t seed2, int64_t num_proj,
                      bool time_major, const Kernels& k);

// ParamsSize and the canonical converters: device-independent (CompositeExplicitAutograd).
at::Tensor params_size(int64_t num_layers, int64_t num_units, int64_t input_size, c10::optional<at::ScalarType> T,
                       c10::optional<at::ScalarType> S, Str rnn_mode, Str input_mode, Str direction, double dropout,
                       int64_t seed, int64_t seed2, int64_t num_proj);
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> params_to_canonical(
    int64_t L, int64_t H, int64_t I, const at::Tensor& params, int64_t num_params, Str mode, Str im, Str dir,
    double dropout, int64_t seed, int64_t seed2);
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>> params_to_canonical_v2(
    int64_t L, int64_t H, int64_t I, const at::Tensor& params, int64_t nw, int64_t nb, Str mode, Str im, Str dir,
    double dropout, int64_t seed, int64_t seed2, int64_t num_proj);
at::Tensor canonical_to_params(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode, Str im,
                               Str dir, double dropout, int64_t seed, int64_t seed2);
at::Tensor canonical_to_params_v2(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode,
                                  Str im, Str dir, double dropout, int64_t seed, int64_t seed2, int64_t num_proj);

// The op entry points of one backend (its Kernels table K); each backend file registers them.
template <const Kernels& K>
struct Impls {
  static T4 v1(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p, Str mode, Str im,
               Str dir, double dropout, int64_t seed, int64_t seed2, bool is_training) {
    auto r = cudnn_rnn_forward(1, x, h, c, p, at::Tensor(), mode, im, dir, dropout, seed, seed2, 0, is_training, true,
                               K);
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
  }
  static T5 v2(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p, Str mode, Str im,
               Str dir, double dropout, int64_t seed, int64_t seed2, bool is_training) {
    return cudnn_rnn_forward(2, x, h, c, p, at::Tensor(), mode, im, dir, dropout, seed, seed2, 0, is_training, true, K);
  }
  static T5 v3(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p,
               const at::Tensor& lens, Str mode, Str im, Str dir, double dropout, int64_t seed, int64_t seed2,
               int64_t num_proj, bool is_training, bool time_major) {
    return cudnn_rnn_forward(3, x, h, c, p, lens, mode, im, dir, dropout, seed, seed2, num_proj, is_training,
                             time_major, K);
  }
  static T4 bwd_v1(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p,
                   const at::Tensor& y, const at::Tensor& hy, const at::Tensor& cy, const at::Tensor& dy,
                   const at::Tensor& dhy, const at::Tensor& dcy, const at::Tensor& reserve, Str mode, Str im, Str dir,
                   double dropout, int64_t seed, int64_t seed2) {
    return cudnn_rnn_backward(1, x, h, c, p, at::Tensor(), y, hy, cy, dy, dhy, dcy, reserve, at::Tensor(), mode, im, dir,
                              dropout, seed, seed2, 0, true, K);
  }
  static T4 bwd_v2(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p,
                   const at::Tensor& y, const at::Tensor& hy, const at::Tensor& cy, const at::Tensor& dy,
                   const at::Tensor& dhy, const at::Tensor& dcy, const at::Tensor& reserve, const at::Tensor& host,
                   Str mode, Str im, Str dir, double dropout, int64_t seed, int64_t seed2) {
    return cudnn_rnn_backward(2, x, h, c, p, at::Tensor(), y, hy, cy, dy, dhy, dcy, reserve, host, mode, im, dir,
                              dropout, seed, seed2, 0, true, K);
  }
  static T4 bwd_v3(const at::Tensor& x, const at::Tensor& h, const at::Tensor& c, const at::Tensor& p,
                   const at::Tensor& lens, const at::Tensor& y, const at::Tensor& hy, const at::Tensor& cy,
                   const at::Tensor& dy, const at::Tensor& dhy, const at::Tensor& dcy, const at::Tensor& reserve,
                   const at::Tensor& host, Str mode, Str im, Str dir, double dropout, int64_t seed, int64_t seed2,
                   int64_t num_proj, bool time_major) {
    return cudnn_rnn_backward(3, x, h, c, p, lens, y, hy, cy, dy, dhy, dcy, reserve, host, mode, im, dir, dropout,
                              seed, seed2, num_proj, time_major, K);
  }
};

}  // namespace crnn
}  // namespace torchops
