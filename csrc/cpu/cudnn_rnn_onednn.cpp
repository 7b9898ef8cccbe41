// oneDNN's fused LSTM for CudnnRNN on the CPU: lstm without projection, skip input or sequence lengths (the
// cases it computes as the time loops do), for inference and for training without dropout between layers: its
// packed weights and fused cell beat per-step GEMMs. The CPU table lists these functions twice: for float32
// (route cudnn_rnn.cpu.onednn) and for bfloat16 (cudnn_rnn.cpu.onednn_bf16: oneDNN's bfloat16 LSTM, as
// torch.nn.LSTM runs under CPU autocast).
#include "cpu/cudnn_rnn_onednn.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mkldnn_rnn_layer.h>
#include <ATen/ops/mkldnn_rnn_layer_backward.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/alloc_cpu.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif
#include <string>
#include <vector>

namespace torchops {
namespace crnn {
namespace {

using at::Tensor;

// ATen's own test before it runs oneDNN's bfloat16 LSTM (mkldnn_bf16_device_check, not an exported symbol): a
// CPU where oneDNN would emulate bfloat16 runs the float32 time loops faster.
bool bf16_native() {
  static const bool native = [] {
    const auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_is_mkldnn_bf16_supported", ""});
    return op.has_value() && op->typed<bool()>().call();
  }();
  return native;
}

// Whether oneDNN computes x's dtype here: float32, and bfloat16 where the CPU has it natively. (float64 runs the
// time loops.)
bool dtype_ok(const Tensor& x) {
  return x.scalar_type() == at::kFloat || (x.scalar_type() == at::kBFloat16 && bf16_native());
}

bool covers(const Cfg& c, const Tensor& x, const Tensor& lens, double dropout, bool is_training) {
  const bool shape_ok = c.mode == kLstm && c.P == 0 && !c.skip && !lens.defined() && c.B > 0 && c.I > 0 && c.T > 0;
  const bool train_ok = !is_training || !(dropout > 0.0 && c.L > 1);
  return shape_ok && train_ok && dtype_ok(x) && at::hasMKLDNN() && at::globalContext().userEnabledMkldnn();
}

// What the backward needs from a training forward, per pseudo-layer as oneDNN returned them. It is owned by
// the reserve's storage (the context of its DataPtr), so it lives exactly as long as the reserve and a copy
// of the reserve does not carry it.
struct OnednnState {
  std::vector<Tensor> out, hy, cy, ws;  // out [T, B, H], hy/cy [1, B, H], ws oneDNN's workspace
  std::vector<Tensor> inputs;           // layer l's input, l >= 1 ([T, B, D*H])
  int64_t out_version = 0;              // of out.back() (with one direction, the caller's output)
  at::ScalarType dtype = at::kFloat;    // of the forward's data
  void* memory = nullptr;               // the reserve's memory: header + unused space
  size_t bytes = 0;
};

// The reserve keeps the loop's size (shapes do not depend on the route) but holds only its header: it is an
// anonymous mapping, so its untouched pages are never backed and freeing it leaves the C heap as it was
// (megabytes of heap freed after every step make glibc return memory that the next step faults in again).
void* map_reserve(size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(p != MAP_FAILED, "could not map ", bytes, " bytes for reserve_space");
  return p;
#else
  return c10::alloc_cpu(bytes);
#endif
}

void delete_state(void* ctx) {
  auto* s = static_cast<OnednnState*>(ctx);
#if defined(__unix__) || defined(__APPLE__)
  munmap(s->memory, s->bytes);
#else
  c10::free_cpu(s->memory);
#endif
  delete s;
}

}  // namespace

std::optional<LibraryForward> onednn_forward(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0,
                                             const Tensor& c0, const Tensor& p, const Tensor& lens, double dropout,
                                             bool is_training, int64_t reserve_numel) {
  if (!covers(c, x, lens, dropout, is_training)) return std::nullopt;
  auto state = std::make_unique<OnednnState>();
  state->dtype = x.scalar_type();
  // ATen's oneDNN lstm keeps its workspace only in grad mode. Nothing is recorded: the op's kernels run
  // below the autograd dispatch keys.
  const at::AutoGradMode grad_mode(is_training);
  LibraryForward r;
  r.hN = at::empty({c.L * c.D, c.B, c.H}, x.options());
  r.cN = at::empty({c.L * c.D, c.B, c.H}, x.options());
  Tensor layer_in = x;
  for (int64_t l = 0; l < c.L; ++l) {
    if (is_training && l > 0) state->inputs.push_back(layer_in);
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < c.D; ++d) {
      const int64_t pl = l * c.D + d;
      const PlParams w = pl_params(c, lay, p, pl);
      auto o = at::mkldnn_rnn_layer(layer_in, w.W, w.R, w.bW, w.bR, h0.select(0, pl), c0.select(0, pl), d == 1, {},
                                    /*mode=lstm*/ 2, c.H, c.L, /*has_biases=*/true, c.D == 2, /*batch_first=*/false,
                                    is_training);
      outs.push_back(std::get<0>(o));
      r.hN.select(0, pl).copy_(std::get<1>(o).view({c.B, c.H}));
      r.cN.select(0, pl).copy_(std::get<2>(o).view({c.B, c.H}));
      if (is_training) {
        TORCH_INTERNAL_ASSERT(std::get<3>(o).defined(), "oneDNN's lstm returned no workspace in training mode");
        state->out.push_back(std::get<0>(o));
        state->hy.push_back(std::get<1>(o));
        state->cy.push_back(std::get<2>(o));
        state->ws.push_back(std::get<3>(o));
      }
    }
    layer_in = c.D == 1 ? outs[0] : at::cat(outs, 2);
  }
  // With one direction the caller's output is oneDNN's own, which the backward reads: if it is changed in
  // place, the backward recomputes with the loops.
  r.out = layer_in.contiguous();
  if (is_training) {
    state->out_version = state->out.back()._version();
    state->bytes = static_cast<size_t>(reserve_numel) * x.element_size();
    state->memory = map_reserve(state->bytes);
    void* data = state->memory;
    r.reserve = reserve_owning(data, reserve_numel, x.options(), state.release(), &delete_state);
  }
  return r;
}

std::optional<LibraryBackward> onednn_backward(const Cfg& c, const Layout& lay, const Tensor& reserve,
                                               const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& p,
                                               const Tensor& dY_last, const Tensor& dhN, const Tensor& dcN) {
  const auto* s = static_cast<const OnednnState*>(reserve_state(reserve, &delete_state));
  if (s == nullptr || static_cast<int64_t>(s->ws.size()) != c.L * c.D || s->out.back()._version() != s->out_version)
    return std::nullopt;
  if (s->dtype != x.scalar_type()) return std::nullopt;
  // oneDNN returns float32 gradients for bfloat16 data too: they are kept so, and rounded once by the caller.
  const auto gopts = x.options().dtype(at::kFloat);
  const Tensor dh0 = at::empty({c.L * c.D, c.B, c.H}, gopts), dc0 = at::empty({c.L * c.D, c.B, c.H}, gopts);
  const Tensor dp = at::empty({lay.size}, gopts);
  auto dir = [&](const Tensor& t, int64_t d) { return c.D == 1 ? t : t.narrow(2, d * c.H, c.H).contiguous(); };
  Tensor dY = dY_last;
  for (int64_t l = c.L - 1; l >= 0; --l) {
    const Tensor X = l == 0 ? x : s->inputs[l - 1];
    Tensor dX;
    for (int64_t d = 0; d < c.D; ++d) {
      const int64_t pl = l * c.D + d;
      const PlParams w = pl_params(c, lay, p, pl);
      auto g = at::mkldnn_rnn_layer_backward(X, w.W, w.R, w.bW, w.bR, h0.select(0, pl), c0.select(0, pl), s->out[pl],
                                             s->hy[pl], s->cy[pl], dir(dY, d), dhN.select(0, pl), dcN.select(0, pl),
                                             d == 1, /*mode=lstm*/ 2, c.H, c.L, /*has_biases=*/true, /*train=*/true,
                                             c.D == 2, {}, /*batch_first=*/false, s->ws[pl]);
      dX = d == 0 ? std::get<0>(g) : dX.add_(std::get<0>(g));
      const PlParams gw = pl_params(c, lay, dp, pl);
      gw.W.copy_(std::get<1>(g));
      gw.R.copy_(std::get<2>(g));
      gw.bW.copy_(std::get<3>(g));
      gw.bR.copy_(std::get<4>(g));
      dh0.select(0, pl).copy_(std::get<5>(g).view({c.B, c.H}));
      dc0.select(0, pl).copy_(std::get<6>(g).view({c.B, c.H}));
    }
    // (the layer below reads its output gradient in its data's dtype, as autograd gives it to torch.nn.LSTM)
    dY = l > 0 ? dX.to(x.scalar_type()) : dX;
  }
  return LibraryBackward(T4{dY, dh0, dc0, dp});
}

}  // namespace crnn
}  // namespace torchops
