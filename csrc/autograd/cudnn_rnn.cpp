// Autograd of the CudnnRNN ops, registered at the Autograd key (eager, TorchScript, libtorch).
//
// * cudnn_rnn / _v2 / _v3: backward = cudnn_rnn_backprop / _v2 / _v3 with the forward's inputs and
//   outputs (TF cudnn_rnn_grad.py); undefined upstream gradients are zeros. A forward that ran with
//   is_training=false kept nothing: asking for its gradient raises TF's error.
// * params_to_canonical(_v2) and canonical_to_params(_v2) are each other's gradients (a split and a
//   concatenation of the same layout).
// * The backprop ops and params_size: no derivative ("not implemented" fallback; TF registers none).
#include "cudnn_rnn/cudnn_rnn.h"
#include "common/arg_checks.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <string>

namespace torchops {
namespace crnn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;
using Strs = std::vector<std::string>;

template <typename Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

using FwdSig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Str, Str, Str, double, int64_t, int64_t,
                  bool);
using FwdV2Sig = T5(const Tensor&, const Tensor&, const Tensor&, const Tensor&, Str, Str, Str, double, int64_t, int64_t,
                    bool);
using FwdV3Sig = T5(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Str, Str, Str, double,
                    int64_t, int64_t, int64_t, bool, bool);
using BwdSig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Str, Str, Str, double,
                  int64_t, int64_t);
using BwdV2Sig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Str, Str,
                    Str, double, int64_t, int64_t);
using BwdV3Sig = T4(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                    const Tensor&, Str, Str, Str, double, int64_t, int64_t, int64_t, bool);

const char* kOpNames[] = {"", "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3"};

// Shared by the three versions. V1/V2: lens undefined; V3 saves it.
template <int V>
class CudnnRnnFunction : public torch::autograd::Function<CudnnRnnFunction<V>> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& input, const Tensor& input_h,
                               const Tensor& input_c, const Tensor& params, const Tensor& lens, std::string rnn_mode,
                               std::string input_mode, std::string direction, double dropout, int64_t seed,
                               int64_t seed2, int64_t num_proj, bool is_training, bool time_major) {
    at::AutoDispatchBelowADInplaceOrView guard;
    variable_list out;
    if (V == 1) {
      static auto op = find_op<FwdSig>("torchops::cudnn_rnn");
      const T4 r = op.call(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed, seed2,
                           is_training);
      out = {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
    } else if (V == 2) {
      static auto op = find_op<FwdV2Sig>("torchops::cudnn_rnn_v2");
      const T5 r = op.call(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed, seed2,
                           is_training);
      out = {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<4>(r)};
    } else {
      static auto op = find_op<FwdV3Sig>("torchops::cudnn_rnn_v3");
      const T5 r = op.call(input, input_h, input_c, params, lens, rnn_mode, input_mode, direction, dropout, seed,
                           seed2, num_proj, is_training, time_major);
      out = {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<4>(r)};
    }
    // The backward makes the zeros it needs: materializing a zero gradient for every unused output would
    // allocate and fill one as large as reserve_space on every step.
    ctx->set_materialize_grads(false);
    ctx->saved_data["strs"] = c10::List<std::string>({rnn_mode, input_mode, direction});
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["seed2"] = seed2;
    ctx->saved_data["num_proj"] = num_proj;
    ctx->saved_data["is_training"] = is_training;
    ctx->saved_data["time_major"] = time_major;
    ctx->saved_data["lstm"] = rnn_mode == "lstm";
    variable_list save = {input, input_h, input_c, params, out[0], out[1], out[2], out[3]};
    save.push_back(lens);
    save.push_back(V >= 2 ? out[4] : lens);
    ctx->save_for_backward(save);
    ctx->mark_non_differentiable(V >= 2 ? variable_list{out[3], out[4]} : variable_list{out[3]});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(ctx->saved_data["is_training"].toBool(), "To use ", kOpNames[V],
                " in gradients, is_training must be set to True.");
    const auto s = ctx->get_saved_variables();
    const auto strs = ctx->saved_data["strs"].toList();
    const std::string mode = strs.get(0).toStringRef(), im = strs.get(1).toStringRef(),
                      dir = strs.get(2).toStringRef();
    const double dropout = ctx->saved_data["dropout"].toDouble();
    const int64_t seed = ctx->saved_data["seed"].toInt(), seed2 = ctx->saved_data["seed2"].toInt();
    const bool lstm = ctx->saved_data["lstm"].toBool();
    auto g = [&](int i, const Tensor& like) { return grads[i].defined() ? grads[i] : at::zeros_like(like); };
    const Tensor dy = g(0, s[4]), dhy = g(1, s[5]), dcy = g(2, s[6]);
    T4 r;
    if (V == 1) {
      static auto op = find_op<BwdSig>("torchops::cudnn_rnn_backprop");
      r = op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], dy, dhy, dcy, s[7], mode, im, dir, dropout, seed, seed2);
    } else if (V == 2) {
      static auto op = find_op<BwdV2Sig>("torchops::cudnn_rnn_backprop_v2");
      r = op.call(s[0], s[1], s[2], s[3], s[4], s[5], s[6], dy, dhy, dcy, s[7], s[9], mode, im, dir, dropout, seed,
                  seed2);
    } else {
      static auto op = find_op<BwdV3Sig>("torchops::cudnn_rnn_backprop_v3");
      r = op.call(s[0], s[1], s[2], s[3], s[8], s[4], s[5], s[6], dy, dhy, dcy, s[7], s[9], mode, im, dir, dropout,
                  seed, seed2, ctx->saved_data["num_proj"].toInt(), ctx->saved_data["time_major"].toBool());
    }
    // input, input_h, input_c, params, lens, then the 9 attributes
    variable_list result(14);
    result[0] = std::get<0>(r);
    result[1] = std::get<1>(r);
    result[2] = lstm ? std::get<2>(r) : Tensor();  // non-lstm input_c is ignored
    result[3] = std::get<3>(r);
    return result;
  }
};

// (Function::apply needs defined tensors: V1/V2 pass an empty placeholder for sequence_lengths)
Tensor no_lens(const Tensor& x) { return at::empty({0}, x.options().dtype(at::kInt)); }

T4 to4(const variable_list& v) { return {v[0], v[1], v[2], v[3]}; }
T5 to5(const variable_list& v) { return {v[0], v[1], v[2], v[3], v[4]}; }

// Non-optional tensor arguments passed as None arrive undefined: named before autograd touches them.
void need(std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  for (const auto& t : ts) check_defined(*t.first, t.second);
}

T4 cudnn_rnn_autograd(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& p, Str mode, Str im, Str dir,
                      double dropout, int64_t seed, int64_t seed2, bool is_training) {
  need({{&x, "input"}, {&h, "input_h"}, {&c, "input_c"}, {&p, "params"}});
  return to4(CudnnRnnFunction<1>::apply(x, h, c, p, no_lens(x), std::string(mode), std::string(im), std::string(dir),
                                        dropout, seed, seed2, int64_t(0), is_training, true));
}
T5 cudnn_rnn_v2_autograd(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& p, Str mode, Str im,
                         Str dir, double dropout, int64_t seed, int64_t seed2, bool is_training) {
  need({{&x, "input"}, {&h, "input_h"}, {&c, "input_c"}, {&p, "params"}});
  return to5(CudnnRnnFunction<2>::apply(x, h, c, p, no_lens(x), std::string(mode), std::string(im), std::string(dir),
                                        dropout, seed, seed2, int64_t(0), is_training, true));
}
T5 cudnn_rnn_v3_autograd(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& p, const Tensor& lens,
                         Str mode, Str im, Str dir, double dropout, int64_t seed, int64_t seed2, int64_t num_proj,
                         bool is_training, bool time_major) {
  need({{&x, "input"}, {&h, "input_h"}, {&c, "input_c"}, {&p, "params"}, {&lens, "sequence_lengths"}});
  return to5(CudnnRnnFunction<3>::apply(x, h, c, p, lens, std::string(mode), std::string(im), std::string(dir),
                                        dropout, seed, seed2, num_proj, is_training, time_major));
}

// ---- converters ----
using ToCanonSig = std::tuple<std::vector<Tensor>, std::vector<Tensor>>(int64_t, int64_t, int64_t, const Tensor&,
                                                                         int64_t, int64_t, Str, Str, Str, double,
                                                                         int64_t, int64_t, int64_t);
using ToParamsSig = Tensor(int64_t, int64_t, int64_t, at::TensorList, at::TensorList, Str, Str, Str, double, int64_t,
                           int64_t, int64_t);

// Both converters through their V2 ops (V1 = V2 with num_proj 0 and equal counts).
Tensor call_to_params(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, const Strs& s,
                      double dropout, int64_t seed, int64_t seed2, int64_t num_proj) {
  static auto op = find_op<ToParamsSig>("torchops::cudnn_rnn_canonical_to_params_v2");
  return op.call(L, H, I, w, b, s[0], s[1], s[2], dropout, seed, seed2, num_proj);
}
std::tuple<std::vector<Tensor>, std::vector<Tensor>> call_to_canon(int64_t L, int64_t H, int64_t I, const Tensor& p,
                                                                   int64_t nw, int64_t nb, const Strs& s,
                                                                   double dropout, int64_t seed, int64_t seed2,
                                                                   int64_t num_proj) {
  static auto op = find_op<ToCanonSig>("torchops::cudnn_rnn_params_to_canonical_v2");
  return op.call(L, H, I, p, nw, nb, s[0], s[1], s[2], dropout, seed, seed2, num_proj);
}

void save_cfg(AutogradContext* ctx, int64_t L, int64_t H, int64_t I, const Strs& s, double dropout, int64_t seed,
              int64_t seed2, int64_t num_proj) {
  ctx->saved_data["dims"] = c10::List<int64_t>({L, H, I, seed, seed2, num_proj});
  ctx->saved_data["strs"] = c10::List<std::string>({s[0], s[1], s[2]});
  ctx->saved_data["dropout"] = dropout;
}
struct SavedCfg {
  int64_t L, H, I, seed, seed2, num_proj;
  Strs s;
  double dropout;
};
SavedCfg load_cfg(AutogradContext* ctx) {
  const auto d = ctx->saved_data["dims"].toIntList();
  const auto st = ctx->saved_data["strs"].toList();
  return {d.get(0), d.get(1), d.get(2), d.get(3), d.get(4), d.get(5),
          {st.get(0).toStringRef(), st.get(1).toStringRef(), st.get(2).toStringRef()},
          ctx->saved_data["dropout"].toDouble()};
}

class ToCanonicalFunction : public torch::autograd::Function<ToCanonicalFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const Tensor& params, int64_t L, int64_t H, int64_t I, int64_t nw,
                               int64_t nb, Strs s, double dropout, int64_t seed, int64_t seed2, int64_t num_proj) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto r = call_to_canon(L, H, I, params, nw, nb, s, dropout, seed, seed2, num_proj);
    save_cfg(ctx, L, H, I, s, dropout, seed, seed2, num_proj);
    ctx->saved_data["nw"] = nw;
    ctx->save_for_backward({params});  // (for its length only: symbolic under torch.compile)
    variable_list out = std::get<0>(r);
    for (const auto& b : std::get<1>(r)) out.push_back(b);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCfg c = load_cfg(ctx);
    const int64_t nw = ctx->saved_data["nw"].toInt();
    const c10::SymInt numel = ctx->get_saved_variables()[0].sym_numel();
    std::vector<Tensor> w, b;
    for (size_t i = 0; i < grads.size(); ++i) (static_cast<int64_t>(i) < nw ? w : b).push_back(grads[i]);
    Tensor g = call_to_params(c.L, c.H, c.I, w, b, c.s, c.dropout, c.seed, c.seed2, c.num_proj);
    if (g.sym_numel() != numel) g = at::cat({g, at::zeros_symint({numel - g.sym_numel()}, g.options())});
    variable_list result(11);
    result[0] = g;
    return result;
  }
};

class ToParamsFunction : public torch::autograd::Function<ToParamsFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList w, at::TensorList b, int64_t L, int64_t H,
                               int64_t I, Strs s, double dropout, int64_t seed, int64_t seed2, int64_t num_proj) {
    at::AutoDispatchBelowADInplaceOrView guard;
    Tensor p = call_to_params(L, H, I, w, b, s, dropout, seed, seed2, num_proj);
    save_cfg(ctx, L, H, I, s, dropout, seed, seed2, num_proj);
    ctx->saved_data["nw"] = static_cast<int64_t>(w.size());
    ctx->saved_data["nb"] = static_cast<int64_t>(b.size());
    std::vector<Tensor> inputs(w.begin(), w.end());  // (for their shapes: the op accepts any shape of the size)
    inputs.insert(inputs.end(), b.begin(), b.end());
    ctx->save_for_backward(inputs);
    return {p};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const SavedCfg c = load_cfg(ctx);
    const int64_t nw = ctx->saved_data["nw"].toInt(), nb = ctx->saved_data["nb"].toInt();
    const auto inputs = ctx->get_saved_variables();
    auto r = call_to_canon(c.L, c.H, c.I, grads[0], nw, nb, c.s, c.dropout, c.seed, c.seed2, c.num_proj);
    variable_list result;
    auto add = [&](const Tensor& t) { result.push_back(t.reshape_symint(inputs[result.size()].sym_sizes())); };
    for (const auto& t : std::get<0>(r)) add(t);
    for (const auto& t : std::get<1>(r)) add(t);
    for (int i = 0; i < 8; ++i) result.push_back(Tensor());
    return result;
  }
};

std::tuple<std::vector<Tensor>, std::vector<Tensor>> split(const variable_list& v, int64_t nw) {
  return {std::vector<Tensor>(v.begin(), v.begin() + nw), std::vector<Tensor>(v.begin() + nw, v.end())};
}

std::tuple<std::vector<Tensor>, std::vector<Tensor>> to_canonical_autograd(int64_t L, int64_t H, int64_t I,
                                                                           const Tensor& params, int64_t num_params,
                                                                           Str mode, Str im, Str dir, double dropout,
                                                                           int64_t seed, int64_t seed2) {
  check_defined(params, "params");
  // (V1 goes through its own op for its own error messages, then the V2 op in backward)
  static auto op = find_op<std::tuple<std::vector<Tensor>, std::vector<Tensor>>(
      int64_t, int64_t, int64_t, const Tensor&, int64_t, Str, Str, Str, double, int64_t, int64_t)>(
      "torchops::cudnn_rnn_params_to_canonical");
  if (!params.requires_grad() || !c10::GradMode::is_enabled()) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(L, H, I, params, num_params, mode, im, dir, dropout, seed, seed2);
  }
  const Strs s{std::string(mode), std::string(im), std::string(dir)};
  return split(ToCanonicalFunction::apply(params, L, H, I, num_params, num_params, s, dropout, seed, seed2,
                                          int64_t(0)),
               num_params);
}
std::tuple<std::vector<Tensor>, std::vector<Tensor>> to_canonical_v2_autograd(int64_t L, int64_t H, int64_t I,
                                                                              const Tensor& params, int64_t nw,
                                                                              int64_t nb, Str mode, Str im, Str dir,
                                                                              double dropout, int64_t seed,
                                                                              int64_t seed2, int64_t num_proj) {
  check_defined(params, "params");
  const Strs s{std::string(mode), std::string(im), std::string(dir)};
  return split(ToCanonicalFunction::apply(params, L, H, I, nw, nb, s, dropout, seed, seed2, num_proj), nw);
}
Tensor to_params_autograd(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode, Str im,
                          Str dir, double dropout, int64_t seed, int64_t seed2) {
  const Strs s{std::string(mode), std::string(im), std::string(dir)};
  return ToParamsFunction::apply(w, b, L, H, I, s, dropout, seed, seed2, int64_t(0))[0];
}
Tensor to_params_v2_autograd(int64_t L, int64_t H, int64_t I, at::TensorList w, at::TensorList b, Str mode, Str im,
                             Str dir, double dropout, int64_t seed, int64_t seed2, int64_t num_proj) {
  const Strs s{std::string(mode), std::string(im), std::string(dir)};
  return ToParamsFunction::apply(w, b, L, H, I, s, dropout, seed, seed2, num_proj)[0];
}

}  // namespace
}  // namespace crnn
}  // namespace torchops

TORCH_LIBRARY_IMPL(torchops, Autograd, m) {
  using namespace torchops::crnn;
  m.impl("cudnn_rnn", &cudnn_rnn_autograd);
  m.impl("cudnn_rnn_v2", &cudnn_rnn_v2_autograd);
  m.impl("cudnn_rnn_v3", &cudnn_rnn_v3_autograd);
  m.impl("cudnn_rnn_params_to_canonical", &to_canonical_autograd);
  m.impl("cudnn_rnn_params_to_canonical_v2", &to_canonical_v2_autograd);
  m.impl("cudnn_rnn_canonical_to_params", &to_params_autograd);
  m.impl("cudnn_rnn_canonical_to_params_v2", &to_params_v2_autograd);
  m.impl("cudnn_rnn_backprop", torch::autograd::autogradNotImplementedFallback());
  m.impl("cudnn_rnn_backprop_v2", torch::autograd::autogradNotImplementedFallback());
  m.impl("cudnn_rnn_backprop_v3", torch::autograd::autogradNotImplementedFallback());
  m.impl("cudnn_rnn_params_size", torch::autograd::autogradNotImplementedFallback());
}
