// CudnnRNN through cuDNN, as TensorFlow's GPU kernels run it: the glue around ATen's _cudnn_rnn /
// _cudnn_rnn_backward (ATen's cuDNN handle, descriptors and plans), over a vendor table (cudnn_route.h) so that
// the CPU stand-in of cudnn_standin.cpp exercises the same code in CPU builds.
//
// Covered: float32, every rnn_mode, one or two directions, linear_input, lstm projection smaller than num_units
// (cuDNN disables the projection at num_proj == num_units, which the time loops run), variable lengths, and in
// training no dropout between layers (TF's seeded masks are torchops' own). The rest runs the time loops.
//
// cuDNN's training state (its reserve, the flat weight buffer it ran with, its outputs) is owned by the returned
// reserve_space, which keeps the loop's size so that shapes do not depend on the route: its storage is a DataPtr
// whose context holds that state, and cuDNN's reserve bytes are moved into that storage (one buffer, not the
// loop's and cuDNN's). cuDNN's backward overwrites the reserve it is given, so every backward gets a copy and the
// same reserve_space can be backpropagated more than once. A copy of reserve_space does not carry the state, and
// the backward then recomputes the forward with the loops.
#include "cudnn_rnn/cudnn_route.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/_cudnn_rnn.h>
#include <ATen/ops/_cudnn_rnn_backward.h>
#include <ATen/ops/_cudnn_rnn_flatten_weight.h>
#include <ATen/ops/_pack_padded_sequence.h>
#include <ATen/ops/_pad_packed_sequence.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <vector>

namespace torchops {
namespace crnn {
namespace {

using at::Tensor;

bool aten_runs_on(const Tensor& x) {
  return x.is_cuda() && at::globalContext().userEnabledCuDNN() && at::detail::getCUDAHooks().compiledWithCuDNN();
}

Tensor aten_flatten_weight(at::TensorList w, int64_t stride, int64_t input_size, int64_t mode, int64_t hidden_size,
                           int64_t proj_size, int64_t num_layers, bool batch_first, bool bidirectional) {
  return at::_cudnn_rnn_flatten_weight(w, stride, input_size, mode, hidden_size, proj_size, num_layers, batch_first,
                                       bidirectional);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> aten_rnn(
    const Tensor& input, at::TensorList weight, int64_t weight_stride0, const std::optional<Tensor>& weight_buf,
    const Tensor& hx, const std::optional<Tensor>& cx, int64_t mode, int64_t hidden_size, int64_t proj_size,
    int64_t num_layers, bool batch_first, double dropout, bool train, bool bidirectional, at::IntArrayRef batch_sizes,
    const std::optional<Tensor>& dropout_state) {
  return at::_cudnn_rnn(input, weight, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size, num_layers,
                        batch_first, dropout, train, bidirectional, batch_sizes, dropout_state);
}

std::tuple<Tensor, Tensor, Tensor, std::vector<Tensor>> aten_rnn_backward(
    const Tensor& input, at::TensorList weight, int64_t weight_stride0, const Tensor& weight_buf, const Tensor& hx,
    const std::optional<Tensor>& cx, const Tensor& output, const std::optional<Tensor>& grad_output,
    const std::optional<Tensor>& grad_hy, const std::optional<Tensor>& grad_cy, int64_t mode, int64_t hidden_size,
    int64_t proj_size, int64_t num_layers, bool batch_first, double dropout, bool train, bool bidirectional,
    at::IntArrayRef batch_sizes, const std::optional<Tensor>& dropout_state, const Tensor& reserve,
    std::array<bool, 4> output_mask) {
  return at::_cudnn_rnn_backward(input, weight, weight_stride0, weight_buf, hx, cx, output, grad_output, grad_hy,
                                 grad_cy, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
                                 bidirectional, batch_sizes, dropout_state, reserve, output_mask);
}

bool covers(const CudnnVendor& v, const Cfg& c, const Tensor& x, double dropout, bool is_training) {
  const bool shape_ok = !c.skip && c.B > 0 && c.I > 0 && c.T > 0 && (c.P == 0 || c.P < c.H);
  const bool train_ok = !is_training || !(dropout > 0.0 && c.L > 1);
  return shape_ok && train_ok && x.scalar_type() == at::kFloat && v.runs_on(x);
}

// ATen's weight list: per pseudo-layer w_ih, w_hh, b_ih, b_hh (and w_hr with a projection), views of the
// params buffer p. The gate order of torchops' layout is cuDNN's, which ATen's cuDNN route also uses.
int64_t weight_stride(const Cfg& c) { return c.P > 0 ? 5 : 4; }

std::vector<Tensor> weight_list(const Cfg& c, const Layout& lay, const Tensor& p) {
  std::vector<Tensor> w;
  for (int64_t pl = 0; pl < c.L * c.D; ++pl) {
    const PlParams v = pl_params(c, lay, p, pl);
    w.insert(w.end(), {v.W, v.R, v.bW, v.bR});
    if (c.P > 0) w.push_back(v.Pm);
  }
  return w;
}

// cuDNN's flat weight buffer for p. Without one, ATen's forward warns and copies the weights into a buffer of
// its own on every call.
Tensor flat_weights(const CudnnVendor& v, const Cfg& c, const Layout& lay, const Tensor& p) {
  // (a list of its own: ATen's flatten points the tensors it is given at the buffer)
  return v.flatten_weight(weight_list(c, lay, p), weight_stride(c), c.I, c.mode, c.H, c.P, c.L,
                          /*batch_first=*/false, c.D == 2);
}

// Variable lengths: cuDNN runs packed sequences sorted by decreasing length, none empty. The rows are sorted
// (stably) and empty ones left out: those keep their initial state and output zeros, as in the time loops.
struct Packing {
  Tensor order;                      // int64 [n] on the data's device: the rows cuDNN runs, longest first
  Tensor lengths;                    // int64 [n] on the CPU, decreasing, > 0
  std::vector<int64_t> batch_sizes;  // rows still running at each step, as ATen's packed sequences
};

// host_lens: the validated lengths on the CPU (the orchestration's copy: no second device-to-host copy).
std::optional<Packing> packing_of(const Tensor& host_lens, const at::Device& dev) {
  TORCH_INTERNAL_ASSERT(host_lens.is_cpu());
  const Tensor host = host_lens.to(at::kLong).contiguous();
  const int64_t* l = host.const_data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < host.numel(); ++b)
    if (l[b] > 0) rows.push_back(b);
  if (rows.empty()) return std::nullopt;
  std::stable_sort(rows.begin(), rows.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
  Packing pk;
  const auto n = static_cast<int64_t>(rows.size());
  pk.lengths = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) pk.lengths.mutable_data_ptr<int64_t>()[i] = l[rows[i]];
  for (int64_t t = 0; t < l[rows[0]]; ++t) {
    int64_t k = 0;
    while (k < n && l[rows[k]] > t) ++k;
    pk.batch_sizes.push_back(k);
  }
  pk.order = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(dev);
  return pk;
}

// [T, B, *] -> the rows cuDNN runs ([T, n, *]) -> packed [sum of lengths, *]; identity without a Packing.
Tensor rows_of(const std::optional<Packing>& pk, const Tensor& t, int64_t dim) {
  return pk ? t.index_select(dim, pk->order) : t;
}
Tensor packed(const std::optional<Packing>& pk, const Tensor& t) {
  return pk ? std::get<0>(at::_pack_padded_sequence(rows_of(pk, t, 1), pk->lengths, /*batch_first=*/false)) : t;
}
// packed [sum, *] -> [T, B, *] with zeros for the rows left out and past each row's length.
Tensor padded(const std::optional<Packing>& pk, const Tensor& t, int64_t T, int64_t B) {
  if (!pk) return t;
  const Tensor bs = at::tensor(pk->batch_sizes, at::TensorOptions().dtype(at::kLong));
  const Tensor rows = std::get<0>(at::_pad_packed_sequence(t, bs, /*batch_first=*/false, 0.0, T));
  return at::zeros({T, B, t.size(1)}, t.options()).index_copy_(1, pk->order, rows);
}
// States [L*D, n, *] of the rows cuDNN ran, merged into `all` (the value of the rows left out).
Tensor merged(const std::optional<Packing>& pk, const Tensor& all, const Tensor& ran) {
  return pk ? all.clone().index_copy_(1, pk->order, ran) : ran;
}

struct CudnnState {
  const CudnnVendor* vendor = nullptr;
  Tensor buf;                      // the reserve_space's memory: header, then cuDNN's reserve bytes
  int64_t reserve_offset = 0;      // where cuDNN's reserve starts in buf (bytes)
  int64_t reserve_bytes = 0;       // its size
  at::ScalarType reserve_dtype = at::kByte;
  Tensor out, hy, cy, weight_buf;  // as the forward returned them
  std::optional<Packing> packing;

  // A fresh copy of cuDNN's reserve for one backward (which overwrites it).
  Tensor reserve_copy() const {
    return buf.view(at::kByte).narrow(0, reserve_offset, reserve_bytes).view(reserve_dtype).clone();
  }
};

void delete_state(void* ctx) { delete static_cast<CudnnState*>(ctx); }

std::optional<LibraryForward> route_forward(const CudnnVendor& v, const Cfg& c, const Layout& lay, const Tensor& x,
                                            const Tensor& h0, const Tensor& c0, const Tensor& p, const Tensor& lens,
                                            double dropout, bool is_training, int64_t reserve_numel) {
  if (!covers(v, c, x, dropout, is_training)) return std::nullopt;
  std::optional<Packing> pk;
  if (lens.defined()) {
    pk = packing_of(lens, x.device());
    if (!pk) return std::nullopt;  // every sequence empty: nothing for cuDNN to run
  }
  const Tensor weight_buf = flat_weights(v, c, lay, p);
  const std::vector<Tensor> w = weight_list(c, lay, p);
  const bool lstm = c.mode == kLstm;
  const std::optional<Tensor> cx = lstm ? std::optional<Tensor>(rows_of(pk, c0, 1)) : std::nullopt;
  auto o = v.rnn(packed(pk, x), w, weight_stride(c), weight_buf, rows_of(pk, h0, 1), cx, c.mode, c.H, c.P, c.L,
                 /*batch_first=*/false, /*dropout=*/0.0, is_training, c.D == 2,
                 pk ? at::IntArrayRef(pk->batch_sizes) : at::IntArrayRef(), /*dropout_state=*/std::nullopt);
  const Tensor out = std::get<0>(o), hy = std::get<1>(o), cy = std::get<2>(o);
  LibraryForward r;
  // Training: the backward reads cuDNN's own outputs, so the caller gets copies.
  const bool copy = is_training && !pk;
  r.out = copy ? out.clone() : padded(pk, out, c.T, c.B);
  r.hN = copy ? hy.clone() : merged(pk, h0, hy);
  r.cN = lstm ? (copy ? cy.clone() : merged(pk, c0, cy)) : Tensor();
  if (is_training) {
    const Tensor& reserve = std::get<3>(o);
    auto state = std::make_unique<CudnnState>();
    state->vendor = &v;
    state->out = out;
    state->hy = hy;
    state->cy = cy;
    state->weight_buf = std::get<4>(o);
    state->packing = std::move(pk);
    // One buffer for reserve_space and cuDNN's reserve: the header (the orchestration's), then cuDNN's bytes.
    const int64_t item = static_cast<int64_t>(x.element_size());
    const int64_t header_bytes = kReserveHeaderBytes;
    state->reserve_offset = header_bytes;
    state->reserve_bytes = static_cast<int64_t>(reserve.nbytes());
    state->reserve_dtype = reserve.scalar_type();
    const int64_t bytes = std::max(reserve_numel * item, header_bytes + state->reserve_bytes);
    state->buf = at::empty({(bytes + item - 1) / item}, x.options());
    if (state->reserve_bytes > 0) {
      state->buf.view(at::kByte).narrow(0, header_bytes, state->reserve_bytes).copy_(reserve.reshape({-1}).view(at::kByte));
    }
    void* data = state->buf.data_ptr();
    const int64_t held = static_cast<int64_t>(state->buf.nbytes());
    r.reserve = reserve_owning(data, reserve_numel, x.options(), state.release(), &delete_state, held);
  }
  return r;
}

std::optional<LibraryBackward> route_backward(const CudnnVendor& v, const Cfg& c, const Layout& lay,
                                              const Tensor& reserve, const Tensor& x, const Tensor& h0,
                                              const Tensor& c0, const Tensor& p, const Tensor& dY, const Tensor& dhN,
                                              const Tensor& dcN) {
  const auto* s = static_cast<const CudnnState*>(reserve_state(reserve, &delete_state));
  if (s == nullptr || s->vendor != &v) return std::nullopt;
  const std::optional<Packing>& pk = s->packing;
  const std::vector<Tensor> w = weight_list(c, lay, p);
  const bool lstm = c.mode == kLstm;
  const std::optional<Tensor> cx = lstm ? std::optional<Tensor>(rows_of(pk, c0, 1)) : std::nullopt;
  const std::optional<Tensor> dcy = lstm ? std::optional<Tensor>(rows_of(pk, dcN, 1)) : std::nullopt;
  auto g = v.rnn_backward(packed(pk, x), w, weight_stride(c), s->weight_buf, rows_of(pk, h0, 1), cx, s->out,
                          packed(pk, dY), rows_of(pk, dhN, 1), dcy, c.mode, c.H, c.P, c.L,
                          /*batch_first=*/false, /*dropout=*/0.0, /*train=*/true, c.D == 2,
                          pk ? at::IntArrayRef(pk->batch_sizes) : at::IntArrayRef(),
                          /*dropout_state=*/std::nullopt, s->reserve_copy(), {true, true, lstm, true});
  const std::vector<Tensor>& dw = std::get<3>(g);
  TORCH_INTERNAL_ASSERT(dw.size() == w.size(), "cuDNN returned ", dw.size(), " weight gradients, expected ",
                        w.size());
  const Tensor dp = at::empty({lay.size}, x.options());
  const std::vector<Tensor> dst = weight_list(c, lay, dp);
  for (size_t i = 0; i < dw.size(); ++i) dst[i].copy_(dw[i]);
  // The rows left out kept their state: their state gradients pass through.
  return T4{padded(pk, std::get<0>(g), c.T, c.B), merged(pk, dhN, std::get<1>(g)),
            lstm ? merged(pk, dcN, std::get<2>(g)) : Tensor(), dp};
}

}  // namespace

const CudnnVendor kAtenCudnn{aten_runs_on, aten_flatten_weight, aten_rnn, aten_rnn_backward};

std::optional<LibraryForward> cudnn_forward(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0,
                                            const Tensor& c0, const Tensor& p, const Tensor& lens, double dropout,
                                            bool is_training, int64_t reserve_numel) {
  return route_forward(kAtenCudnn, c, lay, x, h0, c0, p, lens, dropout, is_training, reserve_numel);
}
std::optional<LibraryBackward> cudnn_backward(const Cfg& c, const Layout& lay, const Tensor& reserve,
                                              const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& p,
                                              const Tensor& dY, const Tensor& dhN, const Tensor& dcN) {
  return route_backward(kAtenCudnn, c, lay, reserve, x, h0, c0, p, dY, dhN, dcN);
}
std::optional<LibraryForward> standin_forward(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0,
                                              const Tensor& c0, const Tensor& p, const Tensor& lens, double dropout,
                                              bool is_training, int64_t reserve_numel) {
  return route_forward(kCudnnStandin, c, lay, x, h0, c0, p, lens, dropout, is_training, reserve_numel);
}
std::optional<LibraryBackward> standin_backward(const Cfg& c, const Layout& lay, const Tensor& reserve,
                                                const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& p,
                                                const Tensor& dY, const Tensor& dhN, const Tensor& dcN) {
  return route_backward(kCudnnStandin, c, lay, reserve, x, h0, c0, p, dY, dhN, dcN);
}

}  // namespace crnn
}  // namespace torchops
