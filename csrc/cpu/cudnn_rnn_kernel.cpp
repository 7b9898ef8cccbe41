// CPU kernels of the CudnnRNN ops: the fused per-step elementwise kernels (the GEMMs and the time loops
// are in csrc/cudnn_rnn/ops.cpp). Rows (batch entries) are split across threads unless the caller already
// runs one batch slice per thread; each row is a plain loop over the units over the branch-free math of
// common/cudnn_rnn_math.h, compiled per instruction set so that it vectorizes.
#include "cpu/cpu_isa.h"
#include "cpu/cudnn_rnn_onednn.h"
#include "cudnn_rnn/cudnn_rnn.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "common/cudnn_rnn_math.h"

namespace torchops {
namespace crnn {
namespace {

#define TORCHOPS_ISA_SELF "cpu/cudnn_rnn_kernel_isa.h"
#define TORCHOPS_ISA_AVX512 1
#include "cpu/cpu_isa_sections.h"
#undef TORCHOPS_ISA_AVX512
#undef TORCHOPS_ISA_SELF

// The build for the capability in use, by the gate kernels' routes.
#define TORCHOPS_PICK(...) TORCHOPS_ISA_PICK(route::cpu_gate_kernels.slot, __VA_ARGS__)

constexpr int64_t kGrainElems = 4096;
inline int64_t row_grain(int64_t n) { return std::max<int64_t>(1, kGrainElems / std::max<int64_t>(n, 1)); }

template <typename U>
U* rp(const at::Tensor& t, int64_t b) {
  return t.defined() ? t.data_ptr<U>() + b * t.stride(0) : nullptr;
}

// Runs fn(b, active) for every row, split across threads (inline inside a parallel region).
template <typename F>
void rows(int64_t nb, int64_t width, const at::Tensor& lens, int64_t t, const F& fn) {
  const int32_t* lp = lens.defined() ? lens.const_data_ptr<int32_t>() : nullptr;
  at::parallel_for(0, nb, row_grain(width), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b, lp == nullptr || t < lp[b]);
  });
}

#define TORCHOPS_CRNN_DISPATCH(t, ...) AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), "cudnn_rnn_cpu", __VA_ARGS__)

void lstm_fwd_cpu(const at::Tensor& g, const at::Tensor& c_prev, const at::Tensor& h_prev, const at::Tensor& c_out,
                  const at::Tensor& hm_out, const at::Tensor& y, bool proj, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = c_prev.size(1), O = h_prev.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(lstm_fwd_row<scalar_t>);
    rows(nb, 4 * H, lens, t, [&](int64_t b, bool a) {
      fn(H, O, rp<scalar_t>(g, b), rp<scalar_t>(c_prev, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(c_out, b),
         rp<scalar_t>(hm_out, b), rp<scalar_t>(y, b), proj, a);
    });
  });
}

void gru_fwd_cpu(const at::Tensor& g, const at::Tensor& gh, const at::Tensor& b_r, const at::Tensor& h_prev,
                 const at::Tensor& ghn_out, const at::Tensor& h_out, const at::Tensor& y, const at::Tensor& lens,
                 int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(gru_fwd_row<scalar_t>);
    const scalar_t* br = b_r.const_data_ptr<scalar_t>();
    rows(nb, 3 * H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(gh, b), br, rp<scalar_t>(h_prev, b), rp<scalar_t>(ghn_out, b),
         rp<scalar_t>(h_out, b), rp<scalar_t>(y, b), a);
    });
  });
}

void rnn_fwd_cpu(const at::Tensor& g, const at::Tensor& h_prev, const at::Tensor& h_out, const at::Tensor& y,
                 bool relu, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(rnn_fwd_row<scalar_t>);
    rows(nb, H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(h_out, b), rp<scalar_t>(y, b), relu, a);
    });
  });
}

void mask_state_cpu(const at::Tensor& h_new, const at::Tensor& h_prev, const at::Tensor& y, const at::Tensor& lens,
                    int64_t t) {
  const int64_t nb = h_new.size(0), O = h_new.size(1);
  TORCHOPS_CRNN_DISPATCH(h_new, [&] {
    auto fn = TORCHOPS_PICK(mask_state_row<scalar_t>);
    rows(nb, O, lens, t, [&](int64_t b, bool a) {
      fn(O, rp<scalar_t>(h_new, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(y, b), a);
    });
  });
}

void bwd_prep_cpu(const at::Tensor& dh_carry, const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& dh_next,
                  const at::Tensor& lens, int64_t t) {
  const int64_t nb = dh.size(0), O = dh.size(1);
  TORCHOPS_CRNN_DISPATCH(dh, [&] {
    auto fn = TORCHOPS_PICK(bwd_prep_row<scalar_t>);
    rows(nb, O, lens, t, [&](int64_t b, bool a) {
      fn(O, rp<scalar_t>(dh_carry, b), rp<scalar_t>(dy, b), rp<scalar_t>(dh, b), rp<scalar_t>(dh_next, b), a);
    });
  });
}

void lstm_bwd_cpu(const at::Tensor& g, const at::Tensor& c, const at::Tensor& c_prev, const at::Tensor& dm,
                  const at::Tensor& dc, const at::Tensor& dg, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = c.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(lstm_bwd_row<scalar_t>);
    rows(nb, 4 * H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(c, b), rp<scalar_t>(c_prev, b), rp<scalar_t>(dm, b),
         rp<scalar_t>(dc, b), rp<scalar_t>(dg, b), a);
    });
  });
}

void gru_bwd_cpu(const at::Tensor& g, const at::Tensor& ghn, const at::Tensor& h_prev, const at::Tensor& dh,
                 const at::Tensor& dh_next, const at::Tensor& dgx, const at::Tensor& dgh, const at::Tensor& lens,
                 int64_t t) {
  const int64_t nb = g.size(0), H = h_prev.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(gru_bwd_row<scalar_t>);
    rows(nb, 3 * H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(ghn, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(dh, b),
         rp<scalar_t>(dh_next, b), rp<scalar_t>(dgx, b), rp<scalar_t>(dgh, b), a);
    });
  });
}

void rnn_bwd_cpu(const at::Tensor& g, const at::Tensor& dh, const at::Tensor& dg, bool relu, const at::Tensor& lens,
                 int64_t t) {
  const int64_t nb = g.size(0), H = g.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = TORCHOPS_PICK(rnn_bwd_row<scalar_t>);
    rows(nb, H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(dh, b), rp<scalar_t>(dg, b), relu, a);
    });
  });
}

#undef TORCHOPS_CRNN_DISPATCH
#undef TORCHOPS_PICK

const Kernels kCpuKernels{lstm_fwd_cpu, gru_fwd_cpu,  rnn_fwd_cpu,          mask_state_cpu,
                          bwd_prep_cpu, lstm_bwd_cpu, gru_bwd_cpu,          rnn_bwd_cpu,
                          c10::DeviceType::CPU,       &route::cpu_loops,    {&route::cpu_onednn, onednn_forward, onednn_backward}};

}  // namespace
}  // namespace crnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, CPU, m) {
  using namespace torchops::crnn;
  m.impl("cudnn_rnn", &Impls<kCpuKernels>::v1);
  m.impl("cudnn_rnn_v2", &Impls<kCpuKernels>::v2);
  m.impl("cudnn_rnn_v3", &Impls<kCpuKernels>::v3);
  m.impl("cudnn_rnn_backprop", &Impls<kCpuKernels>::bwd_v1);
  m.impl("cudnn_rnn_backprop_v2", &Impls<kCpuKernels>::bwd_v2);
  m.impl("cudnn_rnn_backprop_v3", &Impls<kCpuKernels>::bwd_v3);
}

