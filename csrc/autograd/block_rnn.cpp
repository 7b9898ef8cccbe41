// Autograd of the GRU / LSTM block ops, registered at the Autograd key (eager, TorchScript, libtorch).
//
// * gru_block_cell: backward = _gru_block_cell_backward, which takes the gradients arriving at all
//   four outputs r, u, c, h (gru_block_cell_grad keeps TF's d_h-only signature).
// * lstm_block_cell: backward = _lstm_block_cell_backward (gradients of all seven outputs).
// * block_lstm / block_lstm_v2: backward = block_lstm_grad / block_lstm_grad_v2 (the V2 op has the
//   correct IFCO gradient) when only cs and h receive gradients; _block_lstm_backward when
//   gate outputs do too.
// * block_gru: backward = block_gru_grad.
// Double backward is not supported (TF has none): the grad ops are registered with PyTorch's
// "not implemented" autograd fallback, so differentiating a gradient raises
// "derivative for torchops::<grad op> is not implemented".
#include "block_rnn/block_rnn.h"
#include "common/arg_checks.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

namespace torchops {
namespace brnn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

OptT opt(const Tensor& g) { return g.defined() ? OptT(g) : OptT(); }

variable_list vec(const T4& t) { return {std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t)}; }
variable_list vec(const T6& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t), std::get<4>(t), std::get<5>(t)};
}
variable_list vec(const T7& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t),
          std::get<4>(t), std::get<5>(t), std::get<6>(t)};
}
variable_list vec(const T8& t) {
  return {std::get<0>(t), std::get<1>(t), std::get<2>(t), std::get<3>(t),
          std::get<4>(t), std::get<5>(t), std::get<6>(t), std::get<7>(t)};
}

bool none_defined(const variable_list& g) {
  for (const auto& t : g)
    if (t.defined()) return false;
  return true;
}

// ------------------------------------------------------------------------------------------------
// GRU
// ------------------------------------------------------------------------------------------------
using GruCellSig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&);
using GruCellBwdSig = T6(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const OptT&, const OptT&, const OptT&, const OptT&);
using BlockGruSig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&);
using BlockGruGradSig = T6(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const OptT&, const OptT&, const OptT&);

class GruBlockCellFunction : public torch::autograd::Function<GruBlockCellFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& h_prev, const Tensor& w_ru,
                               const Tensor& w_c, const Tensor& b_ru, const Tensor& b_c) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = find_op<GruCellSig>("torchops::gru_block_cell");
    auto out = vec(op.call(x, h_prev, w_ru, w_c, b_ru, b_c));
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, h_prev, w_ru, w_c, out[0], out[1], out[2]});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (none_defined(grads)) return variable_list(6);
    const auto s = ctx->get_saved_variables();
    static auto op = find_op<GruCellBwdSig>("torchops::_gru_block_cell_backward");
    return vec(op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], opt(grads[0]), opt(grads[1]), opt(grads[2]),
                       opt(grads[3])));
  }
};

class BlockGruFunction : public torch::autograd::Function<BlockGruFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& seq_len_max, const Tensor& x,
                               const Tensor& h_prev, const Tensor& w_ru, const Tensor& w_c, const Tensor& b_ru,
                               const Tensor& b_c) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = find_op<BlockGruSig>("torchops::block_gru");
    auto out = vec(op.call(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c));
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, out[0], out[1], out[2], out[3]});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(7);
    if (none_defined(grads)) return result;
    const auto s = ctx->get_saved_variables();
    static auto op = find_op<BlockGruGradSig>("torchops::block_gru_grad");
    const Tensor h_grad = grads[3].defined() ? grads[3] : at::zeros_like(s[10]);
    auto g = vec(op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], h_grad, opt(grads[0]),
                         opt(grads[1]), opt(grads[2])));
    for (int k = 0; k < 6; ++k) result[k + 1] = g[k];
    return result;
  }
};

// ------------------------------------------------------------------------------------------------
// LSTM
// ------------------------------------------------------------------------------------------------
using LstmCellSig = T7(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, double, double, bool);
using LstmCellBwdSig = T8(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const OptT&, const OptT&, const OptT&, const OptT&,
                          const OptT&, const OptT&, const OptT&, bool);
using BlockLstmSig = T7(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, const Tensor&, const Tensor&, double, double, bool);
using BlockLstmV2Sig = T7(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, double, bool);
using BlockLstmGradSig = T8(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, bool);
using BlockLstmBwdSig = T8(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptT&, const OptT&,
                           const OptT&, const OptT&, const OptT&, const OptT&, const OptT&, bool, bool);

class LstmBlockCellFunction : public torch::autograd::Function<LstmBlockCellFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& cs_prev, const Tensor& h_prev,
                               const Tensor& w, const Tensor& wci, const Tensor& wcf, const Tensor& wco,
                               const Tensor& b, double forget_bias, double cell_clip, bool use_peephole) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = find_op<LstmCellSig>("torchops::lstm_block_cell");
    auto out = vec(op.call(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole));
    ctx->set_materialize_grads(false);
    ctx->saved_data["use_peephole"] = use_peephole;
    ctx->save_for_backward({x, cs_prev, h_prev, w, wci, wcf, wco, b, out[0], out[1], out[2], out[3], out[4], out[5]});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list g) {
    variable_list result(11);
    if (none_defined(g)) return result;
    const auto s = ctx->get_saved_variables();
    static auto op = find_op<LstmCellBwdSig>("torchops::_lstm_block_cell_backward");
    // outputs: i, cs, f, o, ci, co, h
    auto r = vec(op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13],
                         opt(g[1]), opt(g[6]), opt(g[0]), opt(g[2]), opt(g[3]), opt(g[4]), opt(g[5]),
                         ctx->saved_data["use_peephole"].toBool()));
    for (int k = 0; k < 8; ++k) result[k] = r[k];
    return result;
  }
};

template <bool V2>
class BlockLstmFunction : public torch::autograd::Function<BlockLstmFunction<V2>> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& seq_len_max, const Tensor& x,
                               const Tensor& cs_prev, const Tensor& h_prev, const Tensor& w, const Tensor& wci,
                               const Tensor& wcf, const Tensor& wco, const Tensor& b, double forget_bias,
                               double cell_clip, bool use_peephole) {
    at::AutoDispatchBelowADInplaceOrView guard;
    variable_list out;
    if (V2) {
      static auto op = find_op<BlockLstmV2Sig>("torchops::block_lstm_v2");
      out = vec(op.call(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip, use_peephole));
    } else {
      static auto op = find_op<BlockLstmSig>("torchops::block_lstm");
      out = vec(op.call(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole));
    }
    ctx->set_materialize_grads(false);
    ctx->saved_data["use_peephole"] = use_peephole;
    variable_list saved = {seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b};
    saved.insert(saved.end(), out.begin(), out.end());
    ctx->save_for_backward(saved);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list g) {
    variable_list result(12);
    if (none_defined(g)) return result;
    const auto s = ctx->get_saved_variables();
    const bool peep = ctx->saved_data["use_peephole"].toBool();
    const bool gates = g[0].defined() || g[2].defined() || g[3].defined() || g[4].defined() || g[5].defined();
    variable_list r;
    if (!gates && s[2].size(1) > 0) {
      // Only cs and h receive gradients: TF's BlockLSTMGrad(V2) (which rejects cell size 0, so an empty
      // cell, which the forward accepts, takes the general backward below).
      static auto op = find_op<BlockLstmGradSig>(V2 ? "torchops::block_lstm_grad_v2" : "torchops::block_lstm_grad");
      const Tensor cs_grad = g[1].defined() ? g[1] : at::zeros_like(s[10]);
      const Tensor h_grad = g[6].defined() ? g[6] : at::zeros_like(s[15]);
      r = vec(op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
                      s[15], cs_grad, h_grad, peep));
    } else {
      static auto op = find_op<BlockLstmBwdSig>("torchops::_block_lstm_backward");
      r = vec(op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], s[14],
                      s[15], opt(g[1]), opt(g[6]), opt(g[0]), opt(g[2]), opt(g[3]), opt(g[4]), opt(g[5]), peep, V2));
    }
    for (int k = 0; k < 8; ++k) result[k + 1] = r[k];
    return result;
  }
};

// ------------------------------------------------------------------------------------------------
// Autograd-key kernels
// ------------------------------------------------------------------------------------------------
T4 to4(const variable_list& v) { return {v[0], v[1], v[2], v[3]}; }
T7 to7(const variable_list& v) { return {v[0], v[1], v[2], v[3], v[4], v[5], v[6]}; }

// Non-optional tensor arguments passed as None arrive undefined: named before autograd touches them.
void need(std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  for (const auto& t : ts) check_defined(*t.first, t.second);
}

T4 gru_block_cell_autograd(const Tensor& x, const Tensor& h_prev, const Tensor& w_ru, const Tensor& w_c,
                           const Tensor& b_ru, const Tensor& b_c) {
  need({{&x, "x"}, {&h_prev, "h_prev"}, {&w_ru, "w_ru"}, {&w_c, "w_c"}, {&b_ru, "b_ru"}, {&b_c, "b_c"}});
  return to4(GruBlockCellFunction::apply(x, h_prev, w_ru, w_c, b_ru, b_c));
}

T4 block_gru_autograd(const Tensor& seq_len_max, const Tensor& x, const Tensor& h_prev, const Tensor& w_ru,
                      const Tensor& w_c, const Tensor& b_ru, const Tensor& b_c) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&h_prev, "h_prev"}, {&w_ru, "w_ru"}, {&w_c, "w_c"},
        {&b_ru, "b_ru"}, {&b_c, "b_c"}});
  return to4(BlockGruFunction::apply(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c));
}

T7 lstm_block_cell_autograd(const Tensor& x, const Tensor& cs_prev, const Tensor& h_prev, const Tensor& w,
                            const Tensor& wci, const Tensor& wcf, const Tensor& wco, const Tensor& b,
                            double forget_bias, double cell_clip, bool use_peephole) {
  need({{&x, "x"}, {&cs_prev, "cs_prev"}, {&h_prev, "h_prev"}, {&w, "w"}, {&wci, "wci"}, {&wcf, "wcf"},
        {&wco, "wco"}, {&b, "b"}});
  return to7(LstmBlockCellFunction::apply(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
                                          use_peephole));
}

T7 block_lstm_autograd(const Tensor& seq_len_max, const Tensor& x, const Tensor& cs_prev, const Tensor& h_prev,
                       const Tensor& w, const Tensor& wci, const Tensor& wcf, const Tensor& wco, const Tensor& b,
                       double forget_bias, double cell_clip, bool use_peephole) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&cs_prev, "cs_prev"}, {&h_prev, "h_prev"}, {&w, "w"},
        {&wci, "wci"}, {&wcf, "wcf"}, {&wco, "wco"}, {&b, "b"}});
  return to7(BlockLstmFunction<false>::apply(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias,
                                             cell_clip, use_peephole));
}

T7 block_lstm_v2_autograd(const Tensor& seq_len_max, const Tensor& x, const Tensor& cs_prev, const Tensor& h_prev,
                          const Tensor& w, const Tensor& wci, const Tensor& wcf, const Tensor& wco, const Tensor& b,
                          double cell_clip, bool use_peephole) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&cs_prev, "cs_prev"}, {&h_prev, "h_prev"}, {&w, "w"},
        {&wci, "wci"}, {&wcf, "wcf"}, {&wco, "wco"}, {&b, "b"}});
  return to7(BlockLstmFunction<true>::apply(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, 0.0, cell_clip,
                                            use_peephole));
}

}  // namespace
}  // namespace brnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, Autograd, m) {
  using namespace torchops::brnn;
  m.impl("gru_block_cell", &gru_block_cell_autograd);
  m.impl("block_gru", &block_gru_autograd);
  m.impl("lstm_block_cell", &lstm_block_cell_autograd);
  m.impl("block_lstm", &block_lstm_autograd);
  m.impl("block_lstm_v2", &block_lstm_v2_autograd);
  // Gradient ops: no double backward (clear error when attempted).
  m.impl("gru_block_cell_grad", torch::autograd::autogradNotImplementedFallback());
  m.impl("_gru_block_cell_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("block_gru_grad", torch::autograd::autogradNotImplementedFallback());
  m.impl("lstm_block_cell_grad", torch::autograd::autogradNotImplementedFallback());
  m.impl("_lstm_block_cell_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("block_lstm_grad", torch::autograd::autogradNotImplementedFallback());
  m.impl("block_lstm_grad_v2", torch::autograd::autogradNotImplementedFallback());
  m.impl("_block_lstm_backward", torch::autograd::autogradNotImplementedFallback());
}
