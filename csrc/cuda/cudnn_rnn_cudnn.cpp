// CudnnRNN through cuDNN, as TensorFlow's GPU kernels run it, via ATen's _cudnn_rnn / _cudnn_rnn_backward
// (ATen's cuDNN handle, descriptors and plans). Host code only: compiled by the C++ compiler in CUDA builds.
//
// Covered: float32, every rnn_mode, one or two directions, linear_input, lstm projection, variable lengths,
// and in training no dropout between layers (TF's seeded masks are torchops' own). The rest runs the time
// loops. TORCHOPS_CUDNN_RNN=0 turns the route off (read on every call, so one process can compare routes).
//
// cuDNN's training state (its reserve, the flat weight buffer it ran with, its outputs) is owned by the
// returned reserve_space, which keeps the loop's size so that shapes do not depend on the route: its storage is
// a DataPtr whose context holds that state. A copy of the reserve does not carry it, and the backward then
// recomputes the forward with the loops.
#include "cuda/cudnn_rnn_cudnn.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/ops/_cudnn_rnn.h>
#include <ATen/ops/_cudnn_rnn_backward.h>
#include <ATen/ops/_pack_padded_sequence.h>
#include <ATen/ops/_pad_packed_sequence.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

namespace torchops {
namespace crnn {
namespace {

using at::Tensor;

bool covers(const Cfg& c, const Tensor& x, double dropout, bool is_training) {
  const bool shape_ok = !c.skip && c.B > 0 && c.I > 0 && c.T > 0;
  const bool train_ok = !is_training || !(dropout > 0.0 && c.L > 1);
  return shape_ok && train_ok && x.is_cuda() && x.scalar_type() == at::kFloat &&
         at::globalContext().userEnabledCuDNN() && at::detail::getCUDAHooks().compiledWithCuDNN();
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

// Variable lengths: cuDNN runs packed sequences sorted by decreasing length, none empty. The rows are sorted
// (stably) and empty ones left out: those keep their initial state and output zeros, as in the time loops.
struct Packing {
  Tensor order;                      // int64 [n] on the data's device: the rows cuDNN runs, longest first
  Tensor lengths;                    // int64 [n] on the CPU, decreasing, > 0
  std::vector<int64_t> batch_sizes;  // rows still running at each step, as ATen's packed sequences
};

std::optional<Packing> packing_of(const Tensor& lens, const at::Device& dev) {
  const Tensor host = lens.to(at::kCPU, at::kLong).contiguous();
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
  Tensor buf;                               // the reserve's memory (header + unused space)
  Tensor out, hy, cy, reserve, weight_buf;  // as _cudnn_rnn returned them
  std::optional<Packing> packing;
};

void delete_state(void* ctx) { delete static_cast<CudnnState*>(ctx); }

}  // namespace

std::optional<LibraryForward> cudnn_forward(const Cfg& c, const Layout& lay, const Tensor& x, const Tensor& h0,
                                            const Tensor& c0, const Tensor& p, const Tensor& lens, double dropout,
                                            bool is_training, int64_t reserve_numel) {
  if (!covers(c, x, dropout, is_training)) return std::nullopt;
  std::optional<Packing> pk;
  if (lens.defined()) {
    pk = packing_of(lens, x.device());
    if (!pk) return std::nullopt;  // every sequence empty: nothing for cuDNN to run
  }
  const std::vector<Tensor> w = weight_list(c, lay, p);
  const bool lstm = c.mode == kLstm;
  const std::optional<Tensor> cx = lstm ? std::optional<Tensor>(rows_of(pk, c0, 1)) : std::nullopt;
  auto o = at::_cudnn_rnn(packed(pk, x), w, weight_stride(c), /*weight_buf=*/std::nullopt, rows_of(pk, h0, 1), cx,
                          c.mode, c.H, c.P, c.L, /*batch_first=*/false, /*dropout=*/0.0, is_training, c.D == 2,
                          pk ? at::IntArrayRef(pk->batch_sizes) : at::IntArrayRef(), /*dropout_state=*/std::nullopt);
  const Tensor out = std::get<0>(o), hy = std::get<1>(o), cy = std::get<2>(o);
  LibraryForward r;
  // Training: the backward reads cuDNN's own outputs, so the caller gets copies.
  const bool copy = is_training && !pk;
  r.out = copy ? out.clone() : padded(pk, out, c.T, c.B);
  r.hN = copy ? hy.clone() : merged(pk, h0, hy);
  r.cN = lstm ? (copy ? cy.clone() : merged(pk, c0, cy)) : Tensor();
  if (is_training) {
    auto state = std::make_unique<CudnnState>();
    state->out = out;
    state->hy = hy;
    state->cy = cy;
    state->reserve = std::get<3>(o);
    state->weight_buf = std::get<4>(o);
    state->packing = std::move(pk);
    state->buf = at::empty({reserve_numel}, x.options());
    void* data = state->buf.data_ptr();
    r.reserve = reserve_owning(data, reserve_numel, x.options(), state.release(), &delete_state);
  }
  return r;
}

std::optional<T4> cudnn_backward(const Cfg& c, const Layout& lay, const Tensor& reserve, const Tensor& x,
                                 const Tensor& h0, const Tensor& c0, const Tensor& p, const Tensor& dY,
                                 const Tensor& dhN, const Tensor& dcN) {
  const auto* s = static_cast<const CudnnState*>(reserve_state(reserve, &delete_state));
  if (s == nullptr) return std::nullopt;
  const std::optional<Packing>& pk = s->packing;
  const std::vector<Tensor> w = weight_list(c, lay, p);
  const bool lstm = c.mode == kLstm;
  const std::optional<Tensor> cx = lstm ? std::optional<Tensor>(rows_of(pk, c0, 1)) : std::nullopt;
  const std::optional<Tensor> dcy = lstm ? std::optional<Tensor>(rows_of(pk, dcN, 1)) : std::nullopt;
  auto g = at::_cudnn_rnn_backward(packed(pk, x), w, weight_stride(c), s->weight_buf, rows_of(pk, h0, 1), cx, s->out,
                                   packed(pk, dY), rows_of(pk, dhN, 1), dcy, c.mode, c.H, c.P, c.L,
                                   /*batch_first=*/false, /*dropout=*/0.0, /*train=*/true, c.D == 2,
                                   pk ? at::IntArrayRef(pk->batch_sizes) : at::IntArrayRef(),
                                   /*dropout_state=*/std::nullopt, s->reserve, {true, true, lstm, true});
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

}  // namespace crnn
}  // namespace torchops
