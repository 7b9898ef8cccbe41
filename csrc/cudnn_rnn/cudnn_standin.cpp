// A CPU stand-in for the cuDNN calls of the cuDNN route (cudnn_route.h's vendor table), so that the route's glue
// runs in CPU CI (route::cpu_cudnn_standin, off by default). It keeps the contract of ATen's
// _cudnn_rnn_flatten_weight / _cudnn_rnn / _cudnn_rnn_backward and the quirks the glue has to handle:
//   - the weight list per layer and direction: w_ih, w_hh, b_ih, b_hh (and w_hr with a projection), each shape
//     checked; weight_stride0 must be cuDNN's slot count, and cuDNN disables the projection at
//     proj_size == hidden_size, so a 5-weight list is refused there;
//   - packed input with batch_sizes (positive, non-increasing, summing to the rows), or [T, B, *];
//   - without a flat weight buffer: a warning and a copy of the weights on every call (ATen's);
//   - flatten_weight points the tensors it is given at the new buffer (ATen's set_orig_weights_to_flat_buf);
//   - a training forward returns a reserve of cuDNN's size that the backward reads, and the backward overwrites
//     it: a second backward from the same reserve gives wrong gradients.
// The math is ATen's CPU RNNs (at::lstm / gru / rnn_tanh / rnn_relu, the same gate equations as cuDNN), and the
// backward differentiates them with autograd from what the reserve holds.
#include "cudnn_rnn/cudnn_route.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/gru.h>
#include <ATen/ops/lstm.h>
#include <ATen/ops/rnn_relu.h>
#include <ATen/ops/rnn_tanh.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

namespace torchops {
namespace crnn {
namespace {

using at::Tensor;

struct Shape {
  int64_t mode, G, L, D, H, P, O, slots;
  bool proj;
};

Shape shape_of(int64_t mode, int64_t hidden_size, int64_t proj_size, int64_t num_layers, bool bidirectional) {
  TORCH_CHECK(mode >= 0 && mode <= 3, "cuDNN stand-in: mode must be 0..3 (relu, tanh, lstm, gru), got ", mode);
  TORCH_CHECK(proj_size >= 0 && proj_size <= hidden_size, "cuDNN stand-in: proj_size must be in [0, hidden_size = ",
              hidden_size, "], got ", proj_size);
  TORCH_CHECK(proj_size == 0 || mode == kLstm, "cuDNN stand-in: proj_size is only supported for LSTM");
  Shape s;
  s.mode = mode;
  s.G = mode == kLstm ? 4 : (mode == kGru ? 3 : 1);
  s.L = num_layers;
  s.D = bidirectional ? 2 : 1;
  s.H = hidden_size;
  // cuDNN runs no projection at proj_size == hidden_size: its weight list then has no w_hr slot.
  s.proj = proj_size != 0 && proj_size != hidden_size;
  s.P = s.proj ? proj_size : 0;
  s.O = s.proj ? proj_size : hidden_size;
  s.slots = s.proj ? 5 : 4;
  return s;
}

void expect_shape(const Tensor& t, at::IntArrayRef want, const char* name, int64_t layer, int64_t dir) {
  TORCH_CHECK(t.defined() && t.sizes() == want, "cuDNN stand-in: ", name, " of layer ", layer, " direction ", dir,
              " must have shape ", want, ", got ", t.defined() ? t.sizes() : at::IntArrayRef{});
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat, "cuDNN stand-in: ", name, " must be float32 on the CPU");
}

void check_weights(const Shape& s, at::TensorList w, int64_t weight_stride0, int64_t input_size) {
  TORCH_CHECK(weight_stride0 == s.slots, "cuDNN stand-in: weight_stride0 is ", weight_stride0, ", but cuDNN has ",
              s.slots, " weights per layer and direction here (proj_size ", s.proj ? s.P : 0,
              ", cuDNN's projection is ", s.proj ? "on" : "off", ")");
  TORCH_CHECK(static_cast<int64_t>(w.size()) == s.slots * s.L * s.D, "cuDNN stand-in: expected ",
              s.slots * s.L * s.D, " weights, got ", w.size());
  for (int64_t l = 0; l < s.L; ++l) {
    for (int64_t d = 0; d < s.D; ++d) {
      const int64_t i = (l * s.D + d) * s.slots, in = l == 0 ? input_size : s.D * s.O, GH = s.G * s.H;
      expect_shape(w[i], {GH, in}, "w_ih", l, d);
      expect_shape(w[i + 1], {GH, s.O}, "w_hh", l, d);
      expect_shape(w[i + 2], {GH}, "b_ih", l, d);
      expect_shape(w[i + 3], {GH}, "b_hh", l, d);
      if (s.proj) expect_shape(w[i + 4], {s.P, s.H}, "w_hr", l, d);
    }
  }
}

int64_t flat_numel(at::TensorList w) {
  int64_t n = 0;
  for (const Tensor& t : w) n += t.numel();
  return n;
}

// Views of the flat buffer, shaped as the weight list (in its order).
std::vector<Tensor> views_of(const Tensor& buf, at::TensorList w) {
  std::vector<Tensor> v;
  int64_t off = 0;
  for (const Tensor& t : w) {
    v.push_back(buf.narrow(0, off, t.numel()).view(t.sizes()));
    off += t.numel();
  }
  return v;
}

Tensor copy_to_flat(at::TensorList w) {
  Tensor buf = at::empty({flat_numel(w)}, w[0].options());
  const std::vector<Tensor> v = views_of(buf, w);
  for (size_t i = 0; i < v.size(); ++i) v[i].copy_(w[i]);
  return buf;
}

Tensor standin_flatten_weight(at::TensorList w, int64_t weight_stride0, int64_t input_size, int64_t mode,
                              int64_t hidden_size, int64_t proj_size, int64_t num_layers, bool /*batch_first*/,
                              bool bidirectional) {
  const Shape s = shape_of(mode, hidden_size, proj_size, num_layers, bidirectional);
  check_weights(s, w, weight_stride0, input_size);
  Tensor buf = copy_to_flat(w);
  const std::vector<Tensor> v = views_of(buf, w);
  for (size_t i = 0; i < v.size(); ++i) w[i].set_(v[i]);  // as ATen's: the given tensors now view the buffer
  return buf;
}

// Rows of the input (packed: the sum of batch_sizes) and the batch size, with the checks of ATen's packed input.
std::pair<int64_t, int64_t> rows_and_batch(const Tensor& input, at::IntArrayRef batch_sizes, bool batch_first) {
  if (batch_sizes.empty()) {
    TORCH_CHECK(input.dim() == 3, "cuDNN stand-in: input must be [T, B, I] without batch_sizes, got ",
                input.sizes());
    return {input.size(0) * input.size(1), input.size(batch_first ? 0 : 1)};
  }
  TORCH_CHECK(input.dim() == 2, "cuDNN stand-in: packed input must be [sum(batch_sizes), I], got ", input.sizes());
  int64_t sum = 0;
  for (size_t t = 0; t < batch_sizes.size(); ++t) {
    TORCH_CHECK(batch_sizes[t] > 0 && (t == 0 || batch_sizes[t] <= batch_sizes[t - 1]),
                "cuDNN stand-in: batch_sizes must be positive and non-increasing, got ", batch_sizes);
    sum += batch_sizes[t];
  }
  TORCH_CHECK(sum == input.size(0), "cuDNN stand-in: batch_sizes sum to ", sum, " but the packed input has ",
              input.size(0), " rows");
  return {sum, batch_sizes[0]};
}

struct Outputs {
  Tensor out, hy, cy;
};

Outputs run(const Shape& s, const Tensor& input, at::IntArrayRef batch_sizes, const Tensor& hx, const Tensor& cx,
            const std::vector<Tensor>& params, bool batch_first, bool train) {
  const bool bidi = s.D == 2;
  if (!batch_sizes.empty()) {
    const Tensor bs = at::tensor(batch_sizes, at::TensorOptions().dtype(at::kLong));
    switch (s.mode) {
      case kLstm: {
        auto r = at::lstm(input, bs, {hx, cx}, params, true, s.L, 0.0, train, bidi);
        return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
      }
      case kGru: {
        auto r = at::gru(input, bs, hx, params, true, s.L, 0.0, train, bidi);
        return {std::get<0>(r), std::get<1>(r), Tensor()};
      }
      case kTanh: {
        auto r = at::rnn_tanh(input, bs, hx, params, true, s.L, 0.0, train, bidi);
        return {std::get<0>(r), std::get<1>(r), Tensor()};
      }
      default: {
        auto r = at::rnn_relu(input, bs, hx, params, true, s.L, 0.0, train, bidi);
        return {std::get<0>(r), std::get<1>(r), Tensor()};
      }
    }
  }
  switch (s.mode) {
    case kLstm: {
      auto r = at::lstm(input, {hx, cx}, params, true, s.L, 0.0, train, bidi, batch_first);
      return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    }
    case kGru: {
      auto r = at::gru(input, hx, params, true, s.L, 0.0, train, bidi, batch_first);
      return {std::get<0>(r), std::get<1>(r), Tensor()};
    }
    case kTanh: {
      auto r = at::rnn_tanh(input, hx, params, true, s.L, 0.0, train, bidi, batch_first);
      return {std::get<0>(r), std::get<1>(r), Tensor()};
    }
    default: {
      auto r = at::rnn_relu(input, hx, params, true, s.L, 0.0, train, bidi, batch_first);
      return {std::get<0>(r), std::get<1>(r), Tensor()};
    }
  }
}

void check_states(const Shape& s, int64_t B, const Tensor& hx, const std::optional<Tensor>& cx) {
  TORCH_CHECK(hx.sizes() == at::IntArrayRef({s.L * s.D, B, s.O}), "cuDNN stand-in: hx must have shape ",
              at::IntArrayRef({s.L * s.D, B, s.O}), ", got ", hx.sizes());
  if (s.mode == kLstm) {
    TORCH_CHECK(cx.has_value() && cx->defined() && cx->sizes() == at::IntArrayRef({s.L * s.D, B, s.H}),
                "cuDNN stand-in: an LSTM needs cx of shape ", at::IntArrayRef({s.L * s.D, B, s.H}));
  } else {
    TORCH_CHECK(!cx.has_value() || !cx->defined(), "cuDNN stand-in: cx is only for LSTMs");
  }
}

// The reserve holds what the backward reads (copies of input, hx, cx) at the front of cuDNN's size: per row of
// the input, layer and direction, the gate activations and two states.
int64_t stored_numel(const Tensor& input, const Tensor& hx, const Tensor& cx) {
  return input.numel() + hx.numel() + (cx.defined() ? cx.numel() : 0);
}
int64_t reserve_numel(const Shape& s, int64_t rows, int64_t stored) {
  return std::max(stored, rows * s.L * s.D * (s.G + 2) * s.H);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> standin_rnn(
    const Tensor& input, at::TensorList weight, int64_t weight_stride0, const std::optional<Tensor>& weight_buf,
    const Tensor& hx, const std::optional<Tensor>& cx, int64_t mode, int64_t hidden_size, int64_t proj_size,
    int64_t num_layers, bool batch_first, double dropout, bool train, bool bidirectional, at::IntArrayRef batch_sizes,
    const std::optional<Tensor>& /*dropout_state*/) {
  TORCH_CHECK(input.is_cpu() && input.scalar_type() == at::kFloat, "cuDNN stand-in: input must be float32 on the CPU");
  TORCH_CHECK(dropout == 0.0, "cuDNN stand-in: dropout is not modelled, got ", dropout);
  const Shape s = shape_of(mode, hidden_size, proj_size, num_layers, bidirectional);
  check_weights(s, weight, weight_stride0, input.size(-1));
  const auto [rows, B] = rows_and_batch(input, batch_sizes, batch_first);
  check_states(s, B, hx, cx);
  Tensor buf;
  if (weight_buf.has_value() && weight_buf->defined()) {
    buf = *weight_buf;
    TORCH_CHECK(buf.dim() == 1 && buf.numel() == flat_numel(weight), "cuDNN stand-in: weight_buf must have ",
                flat_numel(weight), " elements, got ", buf.sizes());
  } else {
    TORCH_WARN(
        "RNN module weights are not part of single contiguous chunk of memory. This means they need to be "
        "compacted at every call, possibly greatly increasing memory usage. To compact weights again call "
        "flatten_parameters().");
    buf = copy_to_flat(weight);
  }
  const Tensor c = s.mode == kLstm ? *cx : Tensor();
  const Outputs o = run(s, input, batch_sizes, hx, c, views_of(buf, weight), batch_first, train);
  Tensor reserve = at::empty({0}, input.options().dtype(at::kByte));
  if (train) {
    const int64_t stored = stored_numel(input, hx, c);
    Tensor r = at::empty({reserve_numel(s, rows, stored)}, input.options());
    r.narrow(0, 0, input.numel()).copy_(input.reshape({-1}));
    r.narrow(0, input.numel(), hx.numel()).copy_(hx.reshape({-1}));
    if (c.defined()) r.narrow(0, input.numel() + hx.numel(), c.numel()).copy_(c.reshape({-1}));
    reserve = r.view(at::kByte);
  }
  return {o.out, o.hy, o.cy.defined() ? o.cy : at::empty({0}, hx.options()), reserve, buf};
}

std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>> standin_rnn_backward(
    const Tensor& input, at::TensorList weight, int64_t weight_stride0, const Tensor& weight_buf, const Tensor& hx,
    const std::optional<Tensor>& cx, const Tensor& output, const std::optional<Tensor>& grad_output,
    const std::optional<Tensor>& grad_hy, const std::optional<Tensor>& grad_cy, int64_t mode, int64_t hidden_size,
    int64_t proj_size, int64_t num_layers, bool batch_first, double dropout, bool train, bool bidirectional,
    at::IntArrayRef batch_sizes, const std::optional<Tensor>& /*dropout_state*/, const Tensor& reserve,
    std::array<bool, 4> output_mask) {
  TORCH_CHECK(train, "cuDNN stand-in: the backward needs train=True");
  TORCH_CHECK(dropout == 0.0, "cuDNN stand-in: dropout is not modelled, got ", dropout);
  const Shape s = shape_of(mode, hidden_size, proj_size, num_layers, bidirectional);
  check_weights(s, weight, weight_stride0, input.size(-1));
  const auto [rows, B] = rows_and_batch(input, batch_sizes, batch_first);
  check_states(s, B, hx, cx);
  TORCH_CHECK(weight_buf.defined() && weight_buf.numel() == flat_numel(weight),
              "cuDNN stand-in: the backward needs the forward's weight_buf (", flat_numel(weight), " elements)");
  const Tensor c = s.mode == kLstm ? *cx : Tensor();
  const int64_t stored = stored_numel(input, hx, c);
  TORCH_CHECK(reserve.scalar_type() == at::kByte && reserve.is_contiguous() &&
                  reserve.numel() == reserve_numel(s, rows, stored) * 4,
              "cuDNN stand-in: reserve is not one of this configuration's forwards (", reserve.numel(), " bytes)");
  const Tensor r = reserve.view(at::kFloat);
  TORCH_CHECK(output.sizes()[0] == input.sizes()[0], "cuDNN stand-in: output does not match the input");

  Tensor dx, dhx, dcx, dbuf;
  {
    // Autograd inside a kernel: lift the dispatcher's below-autograd state for the recomputation.
    c10::InferenceMode not_inference(false);
    c10::impl::ForceDispatchKeyGuard keys(c10::default_included_set, c10::default_excluded_set);
    at::AutoGradMode grad(true);
    const Tensor xr = r.narrow(0, 0, input.numel()).view(input.sizes()).clone().requires_grad_(true);
    const Tensor hr = r.narrow(0, input.numel(), hx.numel()).view(hx.sizes()).clone().requires_grad_(true);
    const Tensor cr = c.defined() ? r.narrow(0, input.numel() + hx.numel(), c.numel()).view(c.sizes()).clone().requires_grad_(true)
                                  : Tensor();
    const Tensor wr = weight_buf.detach().clone().requires_grad_(true);
    const Outputs o = run(s, xr, batch_sizes, hr, cr, views_of(wr, weight), batch_first, true);
    auto or_zeros = [](const std::optional<Tensor>& g, const Tensor& like) {
      return g.has_value() && g->defined() ? *g : at::zeros_like(like);
    };
    std::vector<Tensor> outs{o.out, o.hy}, grads{or_zeros(grad_output, o.out), or_zeros(grad_hy, o.hy)};
    std::vector<Tensor> ins{xr, hr, wr};
    if (cr.defined()) {
      outs.push_back(o.cy);
      grads.push_back(or_zeros(grad_cy, o.cy));
      ins.push_back(cr);
    }
    const auto g = torch::autograd::grad(outs, ins, grads, /*retain_graph=*/false, /*create_graph=*/false,
                                         /*allow_unused=*/true);
    auto value = [](const Tensor& t, const Tensor& like) { return t.defined() ? t.detach() : at::zeros_like(like); };
    dx = value(g[0], xr);
    dhx = value(g[1], hr);
    dbuf = value(g[2], wr);
    if (cr.defined()) dcx = value(g[3], cr);
  }
  // cuDNN's backward uses its reserve as scratch: what it held is gone.
  r.narrow(0, 0, stored).add_(1.0);
  std::vector<Tensor> dw;
  if (output_mask[3]) dw = views_of(dbuf, weight);
  return {output_mask[0] ? dx : Tensor(), output_mask[1] ? dhx : Tensor(),
          output_mask[2] && dcx.defined() ? dcx : Tensor(), dw};
}

bool standin_runs_on(const Tensor& x) { return x.is_cpu(); }

}  // namespace

const CudnnVendor kCudnnStandin{standin_runs_on, standin_flatten_weight, standin_rnn, standin_rnn_backward};

}  // namespace crnn
}  // namespace torchops
