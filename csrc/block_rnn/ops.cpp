// GRU / LSTM block ops: validation (TF's order and key phrases) and the device-independent
// orchestration. One algorithm for every op: the input projections of all
// time steps are one GEMM (x rows of the weight), each step adds the recurrent GEMM (h rows of the
// weight) in place and runs one fused elementwise kernel per gate step. The weight/input gradients
// of a sequence are GEMMs over all steps at once after the time loop. Cells are sequences of length 1.
// On CUDA the sequence ops first try the backend's whole-sequence recurrence (Kernels::*_sequence), which
// replaces the time loop only.
// Outputs and workspaces are allocated once per call; the loops write into slices.
#include "block_rnn/block_rnn.h"
#include "common/arg_checks.h"
#include "common/block_rnn_math.h"
#include "rnn_util.h"

#include <ATen/Parallel.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstddef>
#include <limits>
#include <optional>
#include <vector>


namespace torchops {
namespace brnn {
namespace {

using rnn_util::for_batch_slices;
using rnn_util::rows_of;
using rnn_util::shared_step_gemm;
using rnn_util::slice_gemm;
using rnn_util::StepGemm;

// ------------------------------------------------------------------------------------------------
// validation helpers
// ------------------------------------------------------------------------------------------------
// Non-optional tensor arguments passed as None arrive undefined.
void need(std::initializer_list<std::pair<const at::Tensor*, const char*>> ts) {
  for (const auto& t : ts) check_defined(*t.first, t.second);
}

// NaN or infinite attributes would make every output NaN.
void check_lstm_attrs(double forget_bias, double cell_clip) {
  TORCH_CHECK_VALUE(std::isfinite(forget_bias), "forget_bias must be finite, got ", forget_bias);
  TORCH_CHECK_VALUE(!std::isnan(cell_clip), "cell_clip must be a number (<= 0: no clipping), got ", cell_clip);
}

void check_float(const at::Tensor& x, const char* name) {
  const auto t = x.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, name,
              " must be float32, float64, float16 or bfloat16, got ", t);
}

void check_like(const at::Tensor& x, const at::Tensor& t, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), name, " must have the same dtype as x (", x.scalar_type(),
              "), got ", t.scalar_type());
  TORCH_CHECK(t.device() == x.device(), name, " must be on the same device as x (", x.device(), "), got ",
              t.device());
}

void check_shape(const at::Tensor& t, at::IntArrayRef want, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.sizes() == want, name, " must have shape ", want, ", got ", t.sizes());
}

void check_opt(const OptT& t, const at::Tensor& x, at::IntArrayRef want, const char* name) {
  if (t.has_value() && t->defined()) {
    check_like(x, *t, name);
    check_shape(*t, want, name);
  }
}

at::Tensor opt_contig(const OptT& t) {
  return t.has_value() && t->defined() ? t->contiguous() : at::Tensor();
}

// Reads and validates seq_len_max (0-d int64, any device) against T.
int64_t read_seq_len_max(const at::Tensor& s, int64_t T) {
  TORCH_CHECK(s.dim() == 0, "`seq_len_max_tensor` must be rank 0 but is rank ", s.dim());
  TORCH_CHECK(s.scalar_type() == at::kLong, "seq_len_max must be an int64 tensor, got ", s.scalar_type());
  const int64_t v = s.item<int64_t>();
  TORCH_CHECK(v >= 0 && v <= T, "seq_len_max must be between 0 and ", T, " but is ", v);
  return v;
}

// The sequence ops accept seq_len_max on any device, so a CUDA seq_len_max beside CPU data dispatches
// to the CUDA kernels (and vice versa would not): refuse rather than run them on host memory.
void check_backend(const at::Tensor& x, const Kernels& k) {
  check_defined(x, "x");
  TORCH_CHECK(x.device().type() == k.device, "x is on ", x.device(), " but another argument is on ",
              c10::DeviceTypeName(k.device, /*lower_case=*/true),
              ": every tensor must be on x's device, except seq_len_max, which may also be on the CPU");
}

// A GEMM into a preallocated output (a view of a larger buffer).
void mm_into(at::Tensor out, const at::Tensor& a, const at::Tensor& b) { at::mm_out(out, a, b); }


// Whether the sequence ops may run a backend's whole-sequence recurrence (Kernels::*_sequence): its route.
bool persistent_enabled() { return route::cuda_persistent.enabled(); }

// Runs a whole-sequence recurrence if its route allows and it takes the case, counting the route that runs
// the sequence on CUDA (persistent, or the per-step loop the caller then runs).
template <typename Args>
bool run_sequence(bool (*fn)(const Args&), const Args& a) {
  if (fn != nullptr && persistent_enabled() && fn(a)) {
    route::cuda_persistent.ran();
    return true;
  }
  route::cuda_steps.ran();
  return false;
}

// x_t @ w_x + bias for steps [0, L) as one GEMM: [L, B, N]. On CUDA one GEMM over all steps beats chunks.
at::Tensor input_projection(const at::Tensor& x3, int64_t L, const at::Tensor& w_x, const at::Tensor& bias) {
  const int64_t B = x3.size(1), I = x3.size(2);
  return at::addmm(bias, x3.narrow(0, 0, L).reshape({L * B, I}), w_x).view({L, B, w_x.size(1)});
}

// Steps whose input projections are computed by one GEMM: enough rows (>= 256) for an efficient
// GEMM, few enough that the projection buffer stays cache-sized instead of [T, B, nC].
int64_t projection_chunk(int64_t L, int64_t B) {
  return std::max<int64_t>(1, std::min<int64_t>(L, (256 + B - 1) / std::max<int64_t>(B, 1)));
}


// x[t0 : t0 + n] of a batch slice as an [n * nb, I] matrix: a view when the slice is contiguous (the
// whole batch, or one step), else gathered into `buf` ([chunk, nb, I]).
at::Tensor steps_2d(const at::Tensor& xs, int64_t t0, int64_t n, at::Tensor& buf) {
  at::Tensor v = xs.narrow(0, t0, n);
  if (!v.is_contiguous()) {
    if (!buf.defined()) buf = at::empty({std::max<int64_t>(n, 1), xs.size(1), xs.size(2)}, xs.options());
    v = buf.narrow(0, 0, n).copy_(v);
  }
  return v.view({n * xs.size(1), xs.size(2)});
}

// Row sum over the batch (and time) axes of a 2-D matrix, accumulated in the op math type.
at::Tensor sum_rows(const at::Tensor& m) {
  const auto st = m.scalar_type();
  if (st == at::kHalf || st == at::kBFloat16) return at::sum(m, {0}, false, at::kFloat).to(st);
  return at::sum(m, {0});
}

// ------------------------------------------------------------------------------------------------
// GRU validation
// ------------------------------------------------------------------------------------------------
struct Dims {
  int64_t B, I, C;
};

void check_gru_weights(const at::Tensor& x, const at::Tensor& w_ru, const at::Tensor& w_c, const at::Tensor& b_ru,
                       const at::Tensor& b_c, const Dims& d) {
  TORCH_CHECK(w_ru.dim() == 2, "Rank of w_ru must be 2, got ", w_ru.dim());
  TORCH_CHECK(w_ru.size(0) == d.I + d.C, "w_ru.dim_size(0) != input_size + cell_size: ", w_ru.size(0), " vs. ",
              d.I + d.C);
  TORCH_CHECK(w_ru.size(1) == d.C * 2, "w_ru.dim_size(1) != cell_size * 2: ", w_ru.size(1), " vs. ", d.C * 2);
  TORCH_CHECK(w_c.dim() == 2, "Rank of w_c must be 2, got ", w_c.dim());
  TORCH_CHECK(w_c.size(0) == d.I + d.C, "w_c.dim_size(0) != input_size + cell_size: ", w_c.size(0), " vs. ",
              d.I + d.C);
  TORCH_CHECK(w_c.size(1) == d.C, "w_c.dim_size(1) != cell_size: ", w_c.size(1), " vs. ", d.C);
  TORCH_CHECK(b_ru.dim() == 1, "Rank of b_ru must be 1, got ", b_ru.dim());
  TORCH_CHECK(b_ru.size(0) == d.C * 2, "b_ru.dim_size(0) != cell_size * 2: ", b_ru.size(0), " vs. ", d.C * 2);
  TORCH_CHECK(b_c.dim() == 1, "Rank of b_c must be 1, got ", b_c.dim());
  TORCH_CHECK(b_c.size(0) == d.C, "b_c.dim_size(0) != cell_size: ", b_c.size(0), " vs. ", d.C);
  check_like(x, w_ru, "w_ru");
  check_like(x, w_c, "w_c");
  check_like(x, b_ru, "b_ru");
  check_like(x, b_c, "b_c");
}

// h_prev [B, C] and the weights, once x gave B and I (cells and sequences alike).
void check_gru_h_prev_and_weights(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                                  const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c,
                                  const Dims& d) {
  TORCH_CHECK(h_prev.size(0) == d.B, "h_prev.dims(0) != batch_size: ", h_prev.size(0), " vs. ", d.B);
  check_like(x, h_prev, "h_prev");
  check_gru_weights(x, w_ru, w_c, b_ru, b_c, d);
}

Dims check_gru_cell(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                    const at::Tensor& b_ru, const at::Tensor& b_c) {
  need({{&x, "x"}, {&h_prev, "h_prev"}, {&w_ru, "w_ru"}, {&w_c, "w_c"}, {&b_ru, "b_ru"}, {&b_c, "b_c"}});
  TORCH_CHECK(x.dim() == 2, "Rank of x must be 2, got ", x.dim());
  TORCH_CHECK(h_prev.dim() == 2, "Rank of h_prev must be 2, got ", h_prev.dim());
  check_float(x, "x");
  const Dims d{x.size(0), x.size(1), h_prev.size(1)};
  check_gru_h_prev_and_weights(x, h_prev, w_ru, w_c, b_ru, b_c, d);
  return d;
}

void check_gru_state(const at::Tensor& x, const at::Tensor& t, const Dims& d, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.dim() == 2, "Rank of ", name, " must be 2, got ", t.dim());
  TORCH_CHECK(t.size(0) == d.B, name, ".dims(0) != batch_size: ", t.size(0), " vs. ", d.B);
  TORCH_CHECK(t.size(1) == d.C, name, ".dims(1) != cell_size: ", t.size(1), " vs. ", d.C);
  check_like(x, t, name);
}

Dims check_block_gru(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& h_prev,
                     const at::Tensor& w_ru, const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&h_prev, "h_prev"}, {&w_ru, "w_ru"}, {&w_c, "w_c"},
        {&b_ru, "b_ru"}, {&b_c, "b_c"}});
  TORCH_CHECK(seq_len_max.dim() == 0, "`seq_len_max_tensor` must be rank 0 but is rank ", seq_len_max.dim());
  TORCH_CHECK(x.dim() == 3, "x must be 3D, got rank ", x.dim());
  TORCH_CHECK(h_prev.dim() == 2, "Rank of h_prev must be 2, got ", h_prev.dim());
  check_float(x, "x");
  const Dims d{x.size(1), x.size(2), h_prev.size(1)};
  check_gru_h_prev_and_weights(x, h_prev, w_ru, w_c, b_ru, b_c, d);
  return d;
}

// ------------------------------------------------------------------------------------------------
// GRU orchestration
// ------------------------------------------------------------------------------------------------

// The bfloat16 CPU loops' recurrent GEMMs by torchops' float32-output kernel (rnn.cpu.packed_avx512_bf16),
// both or neither (then the loop runs ATen's bfloat16 GEMM).
void bf16_step_gemms(std::optional<rnn_util::Bf16StepGemm>& a, const at::Tensor& wa,
                     std::optional<rnn_util::Bf16StepGemm>& b, const at::Tensor& wb, bool trans) {
  a.emplace(wa, trans);
  if (!a->packed()) {
    a.reset();
    return;
  }
  b.emplace(wb, trans);
  if (!b->packed()) a.reset(), b.reset();
}

// Forward of L steps. x3 [T,B,I], h_prev [B,C], weights contiguous; r,u,c,h [T,B,C] contiguous
// outputs (steps >= L are zeroed by the caller). B, C > 0, L > 0.
void gru_forward_core(const at::Tensor& x3, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                      const at::Tensor& b_ru, const at::Tensor& b_c, int64_t L, const at::Tensor& r,
                      const at::Tensor& u, const at::Tensor& c, const at::Tensor& h, bool seq_op,
                      const Kernels& k) {
  const int64_t B = x3.size(1), I = x3.size(2), C = h_prev.size(1);
  const auto opts = x3.options();
  const at::Tensor wru_x = w_ru.narrow(0, 0, I), wru_h = w_ru.narrow(0, I, C);
  const at::Tensor wc_x = w_c.narrow(0, 0, I), wc_h = w_c.narrow(0, I, C);
  // On CUDA the projections of all steps are computed first (one GEMM each), for the whole-sequence
  // kernel or else the loop.
  at::Tensor pre_ru_all, pre_c_all;
  if (x3.is_cuda()) {
    pre_ru_all = input_projection(x3, L, wru_x, b_ru);
    pre_c_all = input_projection(x3, L, wc_x, b_c);
    if (seq_op && run_sequence(k.gru_forward_sequence,
                               GruSeqForward{pre_ru_all, pre_c_all, wru_h, wc_h, h_prev, L, r, u, c, h}))
      return;
  }
  const bool pre_done = pre_ru_all.defined();
  const int64_t chunk0 = pre_done ? L : projection_chunk(L, B), chunks0 = (L + chunk0 - 1) / chunk0;
  const auto rec_ru_s = shared_step_gemm(wru_h, false, L), rec_c_s = shared_step_gemm(wc_h, false, L);
  const auto prj_ru_s = shared_step_gemm(wru_x, false, chunks0), prj_c_s = shared_step_gemm(wc_x, false, chunks0);
  std::optional<rnn_util::Bf16StepGemm> rec_ru16, rec_c16;
  if (x3.is_cpu() && x3.scalar_type() == at::kBFloat16)
    L > 1 ? bf16_step_gemms(rec_ru16, wru_h, rec_c16, wc_h, false) : rnn_util::Bf16StepGemm::ran_aten();
  for_batch_slices(x3, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    const at::Tensor xs = rows_of(x3, 1, b0, nb), hs = rows_of(h, 1, b0, nb), h0 = rows_of(h_prev, 0, b0, nb);
    const at::Tensor rs = rows_of(r, 1, b0, nb), us = rows_of(u, 1, b0, nb), cs = rows_of(c, 1, b0, nb);
    const int64_t chunk = pre_done ? L : projection_chunk(L, nb);
    at::Tensor pre_ru = pre_done ? rows_of(pre_ru_all, 1, b0, nb) : at::empty({chunk, nb, 2 * C}, opts);
    at::Tensor pre_c = pre_done ? rows_of(pre_c_all, 1, b0, nb) : at::empty({chunk, nb, C}, opts);
    at::Tensor hr = at::empty({nb, C}, opts);
    at::Tensor xbuf;
    const at::Tensor ru32 = rec_ru16 ? at::empty({nb, 2 * C}, opts.dtype(at::kFloat)) : at::Tensor();
    const at::Tensor c32 = rec_ru16 ? at::empty({nb, C}, opts.dtype(at::kFloat)) : at::Tensor();
    const int64_t chunks = (L + chunk - 1) / chunk;
    std::optional<StepGemm> l_rec_ru, l_rec_c, l_prj_ru, l_prj_c;
    const StepGemm& rec_ru = slice_gemm(rec_ru_s, l_rec_ru, wru_h, false, nb, L);
    const StepGemm& rec_c = slice_gemm(rec_c_s, l_rec_c, wc_h, false, nb, L);
    const StepGemm& prj_ru = slice_gemm(prj_ru_s, l_prj_ru, wru_x, false, chunk * nb, chunks);
    const StepGemm& prj_c = slice_gemm(prj_c_s, l_prj_c, wc_x, false, chunk * nb, chunks);
    for (int64_t t = 0; t < L; ++t) {
      if (t % chunk == 0 && !pre_done) {  // input projections of the next `chunk` steps, one GEMM each
        const int64_t n = std::min(chunk, L - t);
        const at::Tensor x2d = steps_2d(xs, t, n, xbuf);
        prj_ru.bias_addmm(pre_ru.narrow(0, 0, n).view({n * nb, 2 * C}), b_ru, x2d);
        prj_c.bias_addmm(pre_c.narrow(0, 0, n).view({n * nb, C}), b_c, x2d);
      }
      const at::Tensor hp = t == 0 ? h0 : hs.select(0, t - 1);
      at::Tensor ru_t = pre_ru.select(0, t % chunk);
      if (rec_ru16)
        rec_ru16->run_rounded(ru_t, hp, /*accumulate=*/true, ru32);
      else
        rec_ru.addmm(ru_t, hp);
      const at::Tensor u_t = us.select(0, t);
      k.gru_gates(ru_t, hp, rs.select(0, t), u_t, hr);
      at::Tensor c_t = pre_c.select(0, t % chunk);
      if (rec_c16)
        rec_c16->run_rounded(c_t, hr, /*accumulate=*/true, c32);
      else
        rec_c.addmm(c_t, hr);
      k.gru_output(c_t, u_t, hp, cs.select(0, t), hs.select(0, t));
    }
  });
}

struct GruGrads {
  at::Tensor x_grad, h_prev_grad, w_ru_grad, w_c_grad, b_ru_grad, b_c_grad;
};

// Backward of L steps (time recursion like BlockLSTM's). d_c_bar [L,B,C] and d_rbu
// [L,B,2C] are caller-provided buffers (outputs of gru_block_cell_grad, workspaces otherwise).
// h [T,B,C] is only read for t >= 1. Gradients arriving at r/u/c (g_*) are optional.
void gru_backward_core(const at::Tensor& x3, const at::Tensor& h_prev, const at::Tensor& w_ru,
                       const at::Tensor& w_c, const at::Tensor& r, const at::Tensor& u, const at::Tensor& c,
                       const at::Tensor& h, const at::Tensor& h_grad, const at::Tensor& g_r, const at::Tensor& g_u,
                       const at::Tensor& g_c, int64_t L, bool weight_grads, const at::Tensor& d_c_bar,
                       const at::Tensor& d_rbu, GruGrads& out, bool seq_op, const Kernels& k) {
  const int64_t B = x3.size(1), I = x3.size(2), C = h_prev.size(1);
  const auto opts = x3.options();
  const at::Tensor wru_x = w_ru.narrow(0, 0, I), wru_h = w_ru.narrow(0, I, C);
  const at::Tensor wc_x = w_c.narrow(0, 0, I), wc_h = w_c.narrow(0, I, C);
  const bool any_gate = g_r.defined() || g_u.defined() || g_c.defined();
  at::Tensor zero_bc;
  if (!h_grad.defined() || (any_gate && !(g_r.defined() && g_u.defined() && g_c.defined())))
    zero_bc = at::zeros({B, C}, opts);
  at::Tensor dh_carry = at::zeros({B, C}, opts);
  at::Tensor hr_all = weight_grads ? at::empty({L, B, C}, opts) : at::Tensor();
  // The whole recurrence in one launch where the backend has it (else the loop below).
  const bool whole = x3.is_cuda() && seq_op &&
                     run_sequence(k.gru_backward_sequence, GruSeqBackward{wru_h, wc_h, h_prev, r, u, c, h, h_grad, g_r,
                                                                          g_u, g_c, L, d_c_bar, d_rbu, hr_all, dh_carry});
  const int64_t loop_steps = whole ? 0 : L;
  // A single step's backward runs unsplit: its transposed-weight GEMMs would re-pack the whole weight in
  // every thread (measured: GRUBlockCell B=64 backward 0.50 split vs 0.46 ms unsplit).
  const auto rec_c_s = shared_step_gemm(wc_h, true, loop_steps), rec_ru_s = shared_step_gemm(wru_h, true, loop_steps);
  std::optional<rnn_util::Bf16StepGemm> rec_ru16, rec_c16;
  if (x3.is_cpu() && x3.scalar_type() == at::kBFloat16 && loop_steps > 0)
    loop_steps > 1 ? bf16_step_gemms(rec_ru16, wru_h, rec_c16, wc_h, true) : rnn_util::Bf16StepGemm::ran_aten();
  if (!whole) for_batch_slices(x3, B, /*split=*/L > 1, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const at::Tensor& t3) { return rows_of(t3, 1, b0, nb); };
    const at::Tensor zero_s = rows_of(zero_bc, 0, b0, nb), h0 = rows_of(h_prev, 0, b0, nb), hs = s3(h);
    const at::Tensor rs = s3(r), us = s3(u), cs = s3(c), hgs = s3(h_grad), grs = s3(g_r), gus = s3(g_u),
                     gcs = s3(g_c), dcbs = s3(d_c_bar), drbus = s3(d_rbu), hrs = s3(hr_all);
    auto step = [&](const at::Tensor& t3, int64_t t) { return t3.defined() ? t3.select(0, t) : zero_s; };
    auto gate = [&](const at::Tensor& t3, int64_t t) {
      return !any_gate ? at::Tensor() : (t3.defined() ? t3.select(0, t) : zero_s);
    };
    at::Tensor carry = rows_of(dh_carry, 0, b0, nb);
    at::Tensor dh = at::empty({nb, C}, opts);
    at::Tensor d_hr = at::empty({nb, C}, opts);
    const at::Tensor c32 = rec_c16 ? at::empty({nb, C}, opts.dtype(at::kFloat)) : at::Tensor();
    std::optional<StepGemm> l_rec_c, l_rec_ru;
    const StepGemm& rec_c = slice_gemm(rec_c_s, l_rec_c, wc_h, true, nb, L);
    const StepGemm& rec_ru = slice_gemm(rec_ru_s, l_rec_ru, wru_h, true, nb, L);
    for (int64_t t = L - 1; t >= 0; --t) {
      const at::Tensor hp = t == 0 ? h0 : hs.select(0, t - 1);
      const at::Tensor r_t = rs.select(0, t), u_t = us.select(0, t);
      const at::Tensor dcb_t = dcbs.select(0, t), drbu_t = drbus.select(0, t);
      k.gru_backward_a(step(hgs, t), carry, gate(gus, t), gate(gcs, t), u_t, cs.select(0, t), hp, dh, dcb_t,
                       drbu_t);
      if (rec_c16)
        rec_c16->run_rounded(d_hr, dcb_t, /*accumulate=*/false, c32);
      else
        rec_c.mm(d_hr, dcb_t);
      k.gru_backward_b(d_hr, gate(grs, t), dh, r_t, u_t, hp, drbu_t, carry,
                       weight_grads ? hrs.select(0, t) : at::Tensor());
      if (rec_ru16)
        rec_ru16->run_rounded(carry, drbu_t, /*accumulate=*/true, c32);
      else
        rec_ru.addmm(carry, drbu_t);
    }
  });
  out.h_prev_grad = dh_carry;
  const at::Tensor dcb2d = d_c_bar.view({L * B, C}), drbu2d = d_rbu.view({L * B, 2 * C});
  const at::Tensor xg2d = out.x_grad.narrow(0, 0, L).view({L * B, I});
  mm_into(xg2d, dcb2d, wc_x.t());
  xg2d.addmm_(drbu2d, wru_x.t());
  if (!weight_grads) return;
  const at::Tensor x2d = x3.narrow(0, 0, L).view({L * B, I});
  mm_into(out.w_ru_grad.narrow(0, 0, I), x2d.t(), drbu2d);
  at::Tensor wru_h_grad = out.w_ru_grad.narrow(0, I, C);
  mm_into(wru_h_grad, h_prev.t(), d_rbu.select(0, 0));
  if (L > 1) {
    wru_h_grad.addmm_(h.narrow(0, 0, L - 1).view({(L - 1) * B, C}).t(),
                      d_rbu.narrow(0, 1, L - 1).view({(L - 1) * B, 2 * C}));
  }
  mm_into(out.w_c_grad.narrow(0, 0, I), x2d.t(), dcb2d);
  mm_into(out.w_c_grad.narrow(0, I, C), hr_all.view({L * B, C}).t(), dcb2d);
  out.b_ru_grad.copy_(sum_rows(drbu2d));
  out.b_c_grad.copy_(sum_rows(dcb2d));
}

GruGrads alloc_gru_grads(const at::Tensor& x3, int64_t C, bool weight_grads) {
  const auto opts = x3.options();
  const int64_t I = x3.size(2), B = x3.size(1);
  GruGrads g;
  g.x_grad = at::empty(x3.sizes(), opts);
  g.h_prev_grad = at::zeros({B, C}, opts);
  if (weight_grads) {
    g.w_ru_grad = at::empty({I + C, 2 * C}, opts);
    g.w_c_grad = at::empty({I + C, C}, opts);
    g.b_ru_grad = at::empty({2 * C}, opts);
    g.b_c_grad = at::empty({C}, opts);
  }
  return g;
}

void zero_gru_grads(GruGrads& g, int64_t L) {
  const int64_t T = g.x_grad.size(0);
  g.x_grad.narrow(0, L, T - L).zero_();
  if (L == 0 && g.w_ru_grad.defined()) {
    g.w_ru_grad.zero_();
    g.w_c_grad.zero_();
    g.b_ru_grad.zero_();
    g.b_c_grad.zero_();
  }
}

// ------------------------------------------------------------------------------------------------
// LSTM validation
// ------------------------------------------------------------------------------------------------
void check_rank_cell(const at::Tensor& t, int64_t rank, const char* name) {
  check_defined(t, name);
  TORCH_CHECK(t.dim() == rank, name, "_tensor must be rank ", rank, " but is rank ", t.dim(), ".");
}

void check_peepholes(const at::Tensor& x, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                     int64_t C) {
  TORCH_CHECK(wci.size(0) == C, "wci.dim_size(0) != cell_size: ", wci.size(0), " vs. ", C);
  TORCH_CHECK(wcf.size(0) == C, "wcf.dim_size(0) != cell_size: ", wcf.size(0), " vs. ", C);
  TORCH_CHECK(wco.size(0) == C, "wco.dim_size(0) != cell_size: ", wco.size(0), " vs. ", C);
  check_like(x, wci, "wci");
  check_like(x, wcf, "wcf");
  check_like(x, wco, "wco");
}

Dims check_lstm_cell(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev, const at::Tensor& w,
                     const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b) {
  check_rank_cell(x, 2, "x");
  check_rank_cell(cs_prev, 2, "cs_prev");
  check_rank_cell(h_prev, 2, "h_prev");
  check_rank_cell(w, 2, "w");
  check_rank_cell(wci, 1, "wci");
  check_rank_cell(wcf, 1, "wcf");
  check_rank_cell(wco, 1, "wco");
  check_rank_cell(b, 1, "b");
  check_float(x, "x");
  // cell_size from w's columns (which must be 4 * cell_size), so that a bad cs_prev or h_prev is named.
  TORCH_CHECK(w.size(1) % 4 == 0, "w.dim_size(1) must be a multiple of 4 (4 * cell_size), got ", w.size(1));
  Dims d{x.size(0), x.size(1), w.size(1) / 4};
  TORCH_CHECK(cs_prev.size(0) == d.B, "cs_prev.dims(0) != batch_size: ", cs_prev.size(0), " vs. ", d.B);
  TORCH_CHECK(cs_prev.size(1) == d.C, "cs_prev.dims(1) != cell_size (w.dim_size(1) / 4): ", cs_prev.size(1),
              " vs. ", d.C);
  TORCH_CHECK(h_prev.size(0) == d.B, "h_prev.dims(0) != batch_size: ", h_prev.size(0), " vs. ", d.B);
  TORCH_CHECK(h_prev.size(1) == d.C, "h_prev.dims(1) != cell_size: ", h_prev.size(1), " vs. ", d.C);
  TORCH_CHECK(w.size(0) == d.I + d.C, "w.dim_size(0) != input_size + cell_size: ", w.size(0), " vs. ", d.I + d.C);
  TORCH_CHECK(w.size(1) == d.C * 4, "w.dim_size(1) != cell_size * 4: ", w.size(1), " vs. ", d.C * 4);
  TORCH_CHECK(b.size(0) == d.C * 4, "b.dim_size(0) != cell_size * 4: ", b.size(0), " vs. ", d.C * 4);
  check_peepholes(x, wci, wcf, wco, d.C);
  TORCH_CHECK(d.B > 0 && d.C > 0, "cs_prev_tensor is empty, has shape: (", d.B, ",", d.C, ").");
  check_like(x, cs_prev, "cs_prev");
  check_like(x, h_prev, "h_prev");
  check_like(x, w, "w");
  check_like(x, b, "b");
  return d;
}

void check_lstm_cell_state(const at::Tensor& x, const at::Tensor& t, const Dims& d, const char* name) {
  check_defined(t, name);
  check_rank_cell(t, 2, name);
  TORCH_CHECK(t.size(0) == d.B, name, ".dim_size(0) != batch_size: ", t.size(0), " vs. ", d.B);
  TORCH_CHECK(t.size(1) == d.C, name, ".dim_size(1) != cell_size: ", t.size(1), " vs. ", d.C);
  check_like(x, t, name);
}

void check_lstm_cell_grad_in(const at::Tensor& x, const at::Tensor& t, const Dims& d, const char* name) {
  check_defined(t, name);
  check_rank_cell(t, 2, name);
  TORCH_CHECK(t.size(0) == d.B, name, "_tensor.dims(0) != batch_size: ", t.size(0), " vs. ", d.B);
  TORCH_CHECK(t.size(1) == d.C, name, "_tensor.dims(1) != cell_size: ", t.size(1), " vs. ", d.C);
  check_like(x, t, name);
}

struct SeqDims {
  int64_t T, B, I, C;
};

SeqDims check_block_lstm(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
                         const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                         const at::Tensor& wco, const at::Tensor& b) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&cs_prev, "cs_prev"}, {&h_prev, "h_prev"}, {&w, "w"},
        {&wci, "wci"}, {&wcf, "wcf"}, {&wco, "wco"}, {&b, "b"}});
  TORCH_CHECK(seq_len_max.dim() == 0, "`seq_len_max_tensor` must be rank 0 but is rank ", seq_len_max.dim());
  TORCH_CHECK(x.dim() == 3, "x must be 3D, got rank ", x.dim());
  check_float(x, "x");
  SeqDims d{x.size(0), x.size(1), x.size(2), 0};
  TORCH_CHECK(cs_prev.dim() == 2, "cs_prev must be 2D, got rank ", cs_prev.dim());
  TORCH_CHECK(h_prev.dim() == 2, "h_prev must be 2D, got rank ", h_prev.dim());
  TORCH_CHECK(w.dim() == 2, "w must be 2D, got rank ", w.dim());
  // cell_size from w's columns (4 * cell_size), so that a bad cs_prev or h_prev is the one named
  TORCH_CHECK(w.size(1) % 4 == 0, "w.dim_size(1) must be a multiple of 4 (4 * cell_size), got ", w.size(1));
  d.C = w.size(1) / 4;
  TORCH_CHECK(cs_prev.size(0) == d.B, "cs_prev.dims(0) != batch_size: ", cs_prev.size(0), " vs. ", d.B);
  TORCH_CHECK(cs_prev.size(1) == d.C, "cs_prev.dims(1) != cell_size (w.dim_size(1) / 4): ", cs_prev.size(1), " vs. ",
              d.C);
  TORCH_CHECK(h_prev.size(0) == d.B, "h_prev.dims(0) != batch_size: ", h_prev.size(0), " vs. ", d.B);
  TORCH_CHECK(h_prev.size(1) == d.C, "h_prev.dims(1) != cell_size: ", h_prev.size(1), " vs. ", d.C);
  TORCH_CHECK(w.size(0) == d.I + d.C, "w.dim_size(0) != input_size + cell_size: ", w.size(0), " vs. ", d.I + d.C);
  TORCH_CHECK(w.size(1) == d.C * 4, "w.dim_size(1) != cell_size * 4: ", w.size(1), " vs. ", d.C * 4);
  TORCH_CHECK(wci.dim() == 1, "wci must be 1D, got rank ", wci.dim());
  TORCH_CHECK(wcf.dim() == 1, "wcf must be 1D, got rank ", wcf.dim());
  TORCH_CHECK(wco.dim() == 1, "wco must be 1D, got rank ", wco.dim());
  check_peepholes(x, wci, wcf, wco, d.C);
  TORCH_CHECK(b.dim() == 1, "b must be 1D, got rank ", b.dim());
  TORCH_CHECK(b.size(0) == d.C * 4, "b.dim_size(0) != cell_size * 4: ", b.size(0), " vs. ", d.C * 4);
  check_like(x, cs_prev, "cs_prev");
  check_like(x, h_prev, "h_prev");
  check_like(x, w, "w");
  check_like(x, b, "b");
  return d;
}

SeqDims check_block_lstm_grad(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
                              const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci,
                              const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b,
                              const std::vector<std::pair<const at::Tensor*, const char*>>& seq, bool tf_grad_op) {
  need({{&seq_len_max, "seq_len_max"}, {&x, "x"}, {&cs_prev, "cs_prev"}, {&h_prev, "h_prev"}, {&w, "w"},
        {&wci, "wci"}, {&wcf, "wcf"}, {&wco, "wco"}, {&b, "b"}});
  for (const auto& p : seq) check_defined(*p.first, p.second);
  TORCH_CHECK(seq_len_max.dim() == 0, "`seq_len_max_tensor` must be rank 0 but is rank ", seq_len_max.dim());
  TORCH_CHECK(x.dim() == 3, "x must be rank 3 but is rank ", x.dim());
  TORCH_CHECK(cs_prev.dim() == 2, "cs_prev must be rank 2 but is rank ", cs_prev.dim());
  TORCH_CHECK(h_prev.dim() == 2, "h_prev must be rank 2 but is rank ", h_prev.dim());
  TORCH_CHECK(w.dim() == 2, "w must be rank 2 but is rank ", w.dim());
  check_float(x, "x");
  SeqDims d{x.size(0), x.size(1), x.size(2), 0};
  // TF's grad op rejects C = 0; the autograd backward (tf_grad_op false) accepts it, since the forward
  // does, and returns zero / empty gradients.
  TORCH_CHECK(w.size(1) % 4 == 0 && (w.size(1) > 0 || !tf_grad_op),
              "w matrix columns must be a positive multiple of 4, but got ", w.size(1));
  d.C = w.size(1) / 4;
  TORCH_CHECK(w.size(0) == d.I + d.C, "w matrix rows don't match: ", d.I + d.C, " vs. ", w.size(0),
              " (w must have input_size + cell_size rows: x.dim_size(2) + w.dim_size(1) / 4)");
  TORCH_CHECK(wci.dim() == 1, "wci must be rank 1 but is rank ", wci.dim());
  TORCH_CHECK(wcf.dim() == 1, "wcf must be rank 1 but is rank ", wcf.dim());
  TORCH_CHECK(wco.dim() == 1, "wco must be rank 1 but is rank ", wco.dim());
  TORCH_CHECK(b.dim() == 1, "b must be rank 1 but is rank ", b.dim());
  TORCH_CHECK(b.size(0) == 4 * d.C, "w and b cell_size don't match: ", d.C, " vs. ", b.size(0),
              " / 4 (b must have 4 * cell_size elements)");
  for (const auto& p : seq) {
    TORCH_CHECK(p.first->dim() == 3, p.second, " must be rank 3. Received: ", p.first->dim());
  }
  check_shape(cs_prev, {d.B, d.C}, "cs_prev");
  check_shape(h_prev, {d.B, d.C}, "h_prev");
  check_shape(wci, {d.C}, "wci");
  check_shape(wcf, {d.C}, "wcf");
  check_shape(wco, {d.C}, "wco");
  for (const auto& p : seq) check_shape(*p.first, {d.T, d.B, d.C}, p.second);
  check_like(x, cs_prev, "cs_prev");
  check_like(x, h_prev, "h_prev");
  check_like(x, w, "w");
  check_like(x, wci, "wci");
  check_like(x, wcf, "wcf");
  check_like(x, wco, "wco");
  check_like(x, b, "b");
  for (const auto& p : seq) check_like(x, *p.first, p.second);
  return d;
}

// ------------------------------------------------------------------------------------------------
// LSTM orchestration
// ------------------------------------------------------------------------------------------------
struct LstmOuts {
  at::Tensor i, cs, f, o, ci, co, h;  // [T,B,C]
};

LstmOuts alloc_lstm_outs(int64_t T, int64_t B, int64_t C, const at::TensorOptions& opts) {
  LstmOuts o;
  o.i = at::empty({T, B, C}, opts);
  o.cs = at::empty({T, B, C}, opts);
  o.f = at::empty({T, B, C}, opts);
  o.o = at::empty({T, B, C}, opts);
  o.ci = at::empty({T, B, C}, opts);
  o.co = at::empty({T, B, C}, opts);
  o.h = at::empty({T, B, C}, opts);
  return o;
}

bool is_low(const at::Tensor& t) { return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16; }

// The CPU forward of float16/bfloat16 (route block_rnn.cpu.float32_cell): the GEMMs in the dtype (ATen's
// low-precision GEMMs, float32 accumulation), the cell's element-wise math by the float32 kernels (vectorized,
// where the dtype's convert element by element) with the cell state carried in float32 between steps, each
// output rounded once; h is rounded before the next step's GEMM reads it, as the dtype path does.
void lstm_forward_mixed(const at::Tensor& x3, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                        const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                        const at::Tensor& b, int64_t L, double forget_bias, double cell_clip, bool use_peephole,
                        bool ifco, const LstmOuts& out, const Kernels& k) {
  const int64_t B = x3.size(1), I = x3.size(2), C = cs_prev.size(1);
  const at::Tensor w_x = w.narrow(0, 0, I), w_h = w.narrow(0, I, C);
  const auto o32 = x3.options().dtype(at::kFloat);
  const at::Tensor pre_all = input_projection(x3, L, w_x, b);
  const at::Tensor cs0 = cs_prev.to(at::kFloat), ci32 = wci.to(at::kFloat), cf32 = wcf.to(at::kFloat),
                   co32 = wco.to(at::kFloat);
  auto buf = [&] { return at::empty({L, B, C}, o32); };
  // (h goes straight to the output: the next step's GEMM reads it there)
  const LstmOuts f32{buf(), buf(), buf(), buf(), buf(), buf(), at::Tensor()};
  for_batch_slices(x3, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const at::Tensor& t3) { return rows_of(t3, 1, b0, nb); };
    const LstmOuts o{s3(f32.i), s3(f32.cs), s3(f32.f), s3(f32.o), s3(f32.ci), s3(f32.co), at::Tensor()};
    const at::Tensor pre = s3(pre_all), hs = s3(out.h), c0 = rows_of(cs0, 0, b0, nb), h0 = rows_of(h_prev, 0, b0, nb);
    const at::Tensor g32 = at::empty({nb, 4 * C}, o32), h_t = at::empty({nb, C}, o32);
    for (int64_t t = 0; t < L; ++t) {
      at::Tensor g = pre.select(0, t);
      g.addmm_(t == 0 ? h0 : hs.select(0, t - 1), w_h);
      g32.copy_(g);
      k.lstm_forward(g32, t == 0 ? c0 : o.cs.select(0, t - 1), ci32, cf32, co32, forget_bias, cell_clip, use_peephole,
                     ifco, o.i.select(0, t), o.cs.select(0, t), o.f.select(0, t), o.o.select(0, t), o.ci.select(0, t),
                     o.co.select(0, t), h_t);
      hs.select(0, t).copy_(h_t);
    }
  });
  out.i.narrow(0, 0, L).copy_(f32.i);
  out.cs.narrow(0, 0, L).copy_(f32.cs);
  out.f.narrow(0, 0, L).copy_(f32.f);
  out.o.narrow(0, 0, L).copy_(f32.o);
  out.ci.narrow(0, 0, L).copy_(f32.ci);
  out.co.narrow(0, 0, L).copy_(f32.co);
}

// lstm_forward_mixed in bfloat16 by torchops' kernel (route rnn.cpu.packed_avx512_bf16; `rec` packs all of w):
// per batch slice and step, [x_t, h_{t-1}] @ w by one GEMM into float32 sums (no pre-activation rounded to
// bfloat16; the packed w stays in cache across the steps, so the projection needs no [T, B, 4C] buffer, and one
// K = I + C GEMM passes over the block once), then one fused kernel adds the bias, runs the cell on the sums
// with the cell state carried in float32, and rounds each output once.
void lstm_forward_bf16(const at::Tensor& x3, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                       const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                       const at::Tensor& b, int64_t L, double forget_bias, double cell_clip, bool use_peephole,
                       bool ifco, const LstmOuts& out, const Kernels& k, const rnn_util::Bf16StepGemm& rec) {
  const int64_t B = x3.size(1), I = x3.size(2), C = cs_prev.size(1);
  const auto o32 = x3.options().dtype(at::kFloat);
  const at::Tensor cs0 = cs_prev.to(at::kFloat).contiguous(), ci32 = wci.to(at::kFloat).contiguous(),
                   cf32 = wcf.to(at::kFloat).contiguous(), co32 = wco.to(at::kFloat).contiguous(),
                   b32 = b.to(at::kFloat).contiguous();
  const GateOffsets off = gate_offsets(ifco, C);
  for_batch_slices(x3, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    const at::Tensor g = at::empty({nb, 4 * C}, o32), cs = rows_of(cs0, 0, b0, nb).clone();
    const at::Tensor xh = at::empty({nb, I + C}, x3.options());
    // (raw rows: a step's ATen views and copies cost more than its element-wise work here)
    using Bits = uint16_t;
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<Bits*>(t.mutable_data_ptr()); };
    Bits* const xhp = bits(xh);
    const Bits *const xp = reinterpret_cast<const Bits*>(x3.const_data_ptr()) + b0 * I,
                      *const h0p = reinterpret_cast<const Bits*>(h_prev.const_data_ptr()) + b0 * C;
    float* const gp = g.mutable_data_ptr<float>();
    const float* const bp = b32.const_data_ptr<float>();
    auto out_rows = [&](const at::Tensor& t3, int64_t t) { return bits(t3) + (t * B + b0) * C; };
    LstmBf16Rows a{};
    a.rows = nb;
    a.n = C;
    a.ldg = 4 * C;
    a.ldcs = C;
    a.ldo = C;
    a.g_i = gp + off.i;
    a.g_ci = gp + off.ci;
    a.g_f = gp + off.f;
    a.g_o = gp + off.o;
    a.b_i = bp + off.i;
    a.b_ci = bp + off.ci;
    a.b_f = bp + off.f;
    a.b_o = bp + off.o;
    a.wci = ci32.const_data_ptr<float>();
    a.wcf = cf32.const_data_ptr<float>();
    a.wco = co32.const_data_ptr<float>();
    a.forget_bias = static_cast<float>(forget_bias);
    a.cell_clip = static_cast<float>(cell_clip);
    a.use_peephole = use_peephole;
    a.cs = cs.mutable_data_ptr<float>();
    for (int64_t t = 0; t < L; ++t) {
      const Bits* hp = t == 0 ? h0p : out_rows(out.h, t - 1);
      for (int64_t r = 0; r < nb; ++r) {
        std::memcpy(xhp + r * (I + C), xp + (t * B + r) * I, I * sizeof(Bits));
        std::memcpy(xhp + r * (I + C) + I, hp + r * C, C * sizeof(Bits));
      }
      rec.run(g, xh, /*accumulate=*/false);
      a.i = out_rows(out.i, t);
      a.cs_out = out_rows(out.cs, t);
      a.f = out_rows(out.f, t);
      a.o = out_rows(out.o, t);
      a.ci = out_rows(out.ci, t);
      a.co = out_rows(out.co, t);
      a.h = out_rows(out.h, t);
      k.lstm_forward_bf16_rows(a);
    }
  });
}

void lstm_forward_core(const at::Tensor& x3, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                       const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                       const at::Tensor& b, int64_t L, double forget_bias, double cell_clip, bool use_peephole,
                       bool ifco, const LstmOuts& out, bool seq_op, const Kernels& k) {
  if (x3.is_cpu() && is_low(x3)) {
    if (route::cpu_float32_cell.enabled()) {
      route::cpu_float32_cell.ran();
      // (one step: ATen's GEMM, packing the weight would cost as much; the kernel's loop reads raw rows)
      const bool flat = x3.is_contiguous() && h_prev.is_contiguous() && out.i.is_contiguous() &&
                        out.cs.is_contiguous() && out.f.is_contiguous() && out.o.is_contiguous() &&
                        out.ci.is_contiguous() && out.co.is_contiguous() && out.h.is_contiguous();
      std::optional<rnn_util::Bf16StepGemm> rec;
      if (L > 1 && x3.scalar_type() == at::kBFloat16 && flat)
        rec.emplace(w, /*trans=*/false);
      else if (x3.scalar_type() == at::kBFloat16)
        rnn_util::Bf16StepGemm::ran_aten();
      if (rec && rec->packed()) {
        lstm_forward_bf16(x3, cs_prev, h_prev, wci, wcf, wco, b, L, forget_bias, cell_clip, use_peephole, ifco, out, k,
                          *rec);
        return;
      }
      lstm_forward_mixed(x3, cs_prev, h_prev, w, wci, wcf, wco, b, L, forget_bias, cell_clip, use_peephole, ifco, out,
                         k);
      return;
    }
    route::cpu_dtype_cell.ran();
  }
  const int64_t B = x3.size(1), I = x3.size(2), C = cs_prev.size(1);
  const at::Tensor w_x = w.narrow(0, 0, I), w_h = w.narrow(0, I, C);
  // As GRU's: on CUDA all steps' projections first, for the whole-sequence kernel or else the loop.
  at::Tensor pre_all;
  if (x3.is_cuda()) {
    pre_all = input_projection(x3, L, w_x, b);
    if (seq_op && run_sequence(k.lstm_forward_sequence,
                               LstmSeqForward{pre_all, w_h, cs_prev, h_prev, wci, wcf, wco, forget_bias, cell_clip,
                                              use_peephole, ifco, L, out.i, out.cs, out.f, out.o, out.ci, out.co,
                                              out.h}))
      return;
  }
  const bool pre_done = pre_all.defined();
  const int64_t chunk0 = pre_done ? L : projection_chunk(L, B);
  const auto rec_s = shared_step_gemm(w_h, false, L), prj_s = shared_step_gemm(w_x, false, (L + chunk0 - 1) / chunk0);
  for_batch_slices(x3, B, /*split=*/true, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const at::Tensor& t3) { return rows_of(t3, 1, b0, nb); };
    const LstmOuts o{s3(out.i), s3(out.cs), s3(out.f), s3(out.o), s3(out.ci), s3(out.co), s3(out.h)};
    const at::Tensor xs = s3(x3), cs0 = rows_of(cs_prev, 0, b0, nb), h0 = rows_of(h_prev, 0, b0, nb);
    const int64_t chunk = pre_done ? L : projection_chunk(L, nb);
    at::Tensor pre = pre_done ? rows_of(pre_all, 1, b0, nb) : at::empty({chunk, nb, 4 * C}, x3.options());
    at::Tensor xbuf;
    std::optional<StepGemm> l_rec, l_prj;
    const StepGemm& rec = slice_gemm(rec_s, l_rec, w_h, false, nb, L);
    const StepGemm& prj = slice_gemm(prj_s, l_prj, w_x, false, chunk * nb, (L + chunk - 1) / chunk);
    for (int64_t t = 0; t < L; ++t) {
      if (t % chunk == 0 && !pre_done) {  // input projections of the next `chunk` steps, one GEMM
        const int64_t n = std::min(chunk, L - t);
        prj.bias_addmm(pre.narrow(0, 0, n).view({n * nb, 4 * C}), b, steps_2d(xs, t, n, xbuf));
      }
      const at::Tensor csp = t == 0 ? cs0 : o.cs.select(0, t - 1);
      const at::Tensor hp = t == 0 ? h0 : o.h.select(0, t - 1);
      at::Tensor g = pre.select(0, t % chunk);
      rec.addmm(g, hp);
      k.lstm_forward(g, csp, wci, wcf, wco, forget_bias, cell_clip, use_peephole, ifco, o.i.select(0, t),
                     o.cs.select(0, t), o.f.select(0, t), o.o.select(0, t), o.ci.select(0, t), o.co.select(0, t),
                     o.h.select(0, t));
    }
  });
}

struct LstmGrads {
  at::Tensor x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad;
};

LstmGrads alloc_lstm_grads(const at::Tensor& x3, int64_t C) {
  const auto opts = x3.options();
  const int64_t B = x3.size(1), I = x3.size(2);
  LstmGrads g;
  g.x_grad = at::empty(x3.sizes(), opts);
  g.cs_prev_grad = at::zeros({B, C}, opts);
  g.h_prev_grad = at::zeros({B, C}, opts);
  g.w_grad = at::zeros({I + C, 4 * C}, opts);
  g.wci_grad = at::zeros({C}, opts);
  g.wcf_grad = at::zeros({C}, opts);
  g.wco_grad = at::zeros({C}, opts);
  g.b_grad = at::zeros({4 * C}, opts);
  return g;
}

// Sum over (t, b) of a [n, B, C] product, in the op math type, as a [C] tensor of x's dtype.
at::Tensor sum_tb(const at::Tensor& a, const at::Tensor& b) {
  const auto st = a.scalar_type();
  const bool low = st == at::kHalf || st == at::kBFloat16;
  at::Tensor p = low ? a.to(at::kFloat).mul(b.to(at::kFloat)) : a.mul(b);
  return at::sum(p.reshape({-1, p.size(-1)}), {0}).to(st);
}

// The time loop of the CPU backward of float16/bfloat16 (route block_rnn.cpu.float32_cell), as the forward: the
// element-wise math on float32 copies of the activations with the state gradients carried in float32, the gate
// gradients rounded once into `dgates` for the recurrent GEMM in the dtype (in bfloat16 by torchops' kernel
// where its route runs, dh straight into float32); dh_carry and dcs_carry (the dtype's) receive the final state
// gradients. With torchops' kernel and x_grad defined, each thread also computes its rows of x_grad = dgates @
// w_x^T step by step while dgates_t is in its cache (each float32 sum rounded once, as ATen's GEMM after the loop
// does), and it returns true.
bool lstm_backward_steps_mixed(const at::Tensor& cs_prev, const at::Tensor& w_x, const at::Tensor& w_h,
                               const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco, const LstmOuts& fw,
                               const at::Tensor& cs_grad, const at::Tensor& h_grad, const at::Tensor& g_i,
                               const at::Tensor& g_f, const at::Tensor& g_o, const at::Tensor& g_ci,
                               const at::Tensor& g_co, int64_t L, bool use_peephole, bool ifco, bool input_grads,
                               const at::Tensor& dgates, const at::Tensor& dh_carry, const at::Tensor& dcs_carry,
                               const at::Tensor& x_grad, const Kernels& k) {
  const int64_t B = cs_prev.size(0), C = cs_prev.size(1);
  const auto o32 = cs_prev.options().dtype(at::kFloat);
  std::optional<rnn_util::Bf16StepGemm> rec, xg;
  if (input_grads && L > 1)
    rec.emplace(w_h, /*trans=*/true);
  else if (input_grads && cs_prev.scalar_type() == at::kBFloat16)
    rnn_util::Bf16StepGemm::ran_aten();
  if (rec && rec->packed() && x_grad.defined() && w_x.size(0) > 0) xg.emplace(w_x, /*trans=*/true);
  // With torchops' kernel each thread widens its rows of a step into cache-resident float32 rows (vector
  // conversions), not whole [L, B, C] float32 copies of every activation and incoming gradient.
  const bool per_step = rec && rec->packed();
  auto wide = [&](const at::Tensor& t) {
    if (!t.defined()) return t;
    const at::Tensor r = t.narrow(0, 0, std::min(L, t.size(0)));
    return per_step ? r.contiguous() : r.to(at::kFloat);
  };
  const LstmOuts f{wide(fw.i), wide(fw.cs), wide(fw.f), wide(fw.o), wide(fw.ci), wide(fw.co), at::Tensor()};
  const at::Tensor hg = wide(h_grad), csg = wide(cs_grad), gi = wide(g_i), gf = wide(g_f), go = wide(g_o),
                   gci = wide(g_ci), gco = wide(g_co);
  const bool any_gate = gi.defined() || gf.defined() || go.defined() || gci.defined() || gco.defined();
  const at::Tensor cs0 = cs_prev.to(at::kFloat), ci32 = wci.to(at::kFloat), cf32 = wcf.to(at::kFloat),
                   co32 = wco.to(at::kFloat);
  const at::Tensor zero = at::zeros({B, C}, o32), dh32 = at::zeros({B, C}, o32), dcs32 = at::zeros({B, C}, o32);
  for_batch_slices(cs_prev, B, /*split=*/L > 1, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const at::Tensor& t3) { return rows_of(t3, 1, b0, nb); };
    const LstmOuts fs{s3(f.i), s3(f.cs), s3(f.f), s3(f.o), s3(f.ci), s3(f.co), at::Tensor()};
    const at::Tensor zs = rows_of(zero, 0, b0, nb), c0 = rows_of(cs0, 0, b0, nb), dgs = s3(dgates);
    const at::Tensor hgs = s3(hg), csgs = s3(csg), gis = s3(gi), gfs = s3(gf), gos = s3(go), gcis = s3(gci),
                     gcos = s3(gco);
    // (per_step: step t's rows of the 12 inputs below, and cs in two alternating rows)
    const at::Tensor rows = per_step ? at::empty({14, nb, C}, o32) : at::Tensor();
    auto row = [&](const at::Tensor& t3, int64_t t, int64_t slot) {
      if (!per_step) return t3.select(0, t);
      const at::Tensor r = rows.select(0, slot);
      rnn_util::Bf16StepGemm::widen_into(r, t3.select(0, t));
      return r;
    };
    auto step = [&](const at::Tensor& t3, int64_t t, int64_t slot) { return t3.defined() ? row(t3, t, slot) : zs; };
    auto gate = [&](const at::Tensor& t3, int64_t t, int64_t slot) {
      return !any_gate ? at::Tensor() : step(t3, t, slot);
    };
    // cs_{t-1}: widened at step t, it is step t-1's cs
    auto cs_at = [&](int64_t t) {
      if (!per_step) return fs.cs.select(0, t);
      return t == L - 1 ? row(fs.cs, t, 12 + t % 2) : rows.select(0, 12 + t % 2);
    };
    const at::Tensor dh_s = rows_of(dh32, 0, b0, nb), dcs_s = rows_of(dcs32, 0, b0, nb);
    const at::Tensor dg32 = at::empty({nb, 4 * C}, o32);
    at::Tensor dh_low = at::empty({nb, C}, dgates.options());
    const at::Tensor xgs = xg ? s3(x_grad) : at::Tensor();
    const at::Tensor xg32 = xg ? at::empty({nb, w_x.size(0)}, o32) : at::Tensor();
    for (int64_t t = L - 1; t >= 0; --t) {
      const at::Tensor dg_t = dgs.select(0, t);
      const at::Tensor cs_t = cs_at(t), csp = t == 0 ? c0 : row(fs.cs, t - 1, 12 + (t - 1) % 2);
      k.lstm_backward(row(fs.i, t, 0), cs_t, row(fs.f, t, 1), row(fs.o, t, 2), row(fs.ci, t, 3), row(fs.co, t, 4),
                      csp, ci32, cf32, co32, step(hgs, t, 5), dh_s, step(csgs, t, 6), gate(gis, t, 7),
                      gate(gfs, t, 8), gate(gos, t, 9), gate(gcis, t, 10), gate(gcos, t, 11), use_peephole, ifco,
                      dg32, dcs_s);
      if (per_step && dg_t.is_contiguous())
        rnn_util::Bf16StepGemm::round_into(dg_t, dg32);
      else
        dg_t.copy_(dg32);
      if (input_grads && rec && rec->packed()) {
        rec->run(dh_s, dg_t, /*accumulate=*/false);
      } else if (input_grads) {
        at::mm_out(dh_low, dg_t, w_h.t());
        dh_s.copy_(dh_low);
      }
      if (xg) xg->run_rounded(xgs.select(0, t), dg_t, /*accumulate=*/false, xg32);
    }
  });
  dh_carry.copy_(dh32);
  dcs_carry.copy_(dcs32);
  return xg.has_value();
}

// Backward of L steps (with gradients arriving at the gate outputs too). `dgates` [L,B,4C] is a
// caller-provided buffer. With input_grads = false only the cell part (LSTMBlockCellGrad) runs.
void lstm_backward_core(const at::Tensor& x3, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                        const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                        const LstmOuts& fw, const at::Tensor& cs_grad, const at::Tensor& h_grad,
                        const at::Tensor& g_i, const at::Tensor& g_f, const at::Tensor& g_o, const at::Tensor& g_ci,
                        const at::Tensor& g_co, int64_t L, bool use_peephole, bool ifco, bool input_grads,
                        const at::Tensor& dgates, LstmGrads& out, bool seq_op, const Kernels& k) {
  const int64_t B = x3.size(1), I = x3.size(2), C = cs_prev.size(1);
  const auto opts = x3.options();
  const at::Tensor w_x = w.narrow(0, 0, I), w_h = w.narrow(0, I, C);
  const bool any_gate = g_i.defined() || g_f.defined() || g_o.defined() || g_ci.defined() || g_co.defined();
  const bool all_gate = g_i.defined() && g_f.defined() && g_o.defined() && g_ci.defined() && g_co.defined();
  at::Tensor zero_bc;
  if (!h_grad.defined() || !cs_grad.defined() || (any_gate && !all_gate)) zero_bc = at::zeros({B, C}, opts);
  at::Tensor dh_carry = at::zeros({B, C}, opts);
  // torchops' kernel: each thread also computes its rows of x_grad step by step, while dgates_t is still in
  // its cache (one GEMM over all steps after the loop cost a pass over dgates and a fork/join more).
  const bool own = input_grads && StepGemm::own_kernel(w) && L * B > 1 && I > 0;
  std::optional<StepGemm> x_gemm;
  if (own) x_gemm.emplace(w_x, /*trans=*/true, B, 2);
  const bool whole = x3.is_cuda() && seq_op && input_grads &&
                     run_sequence(k.lstm_backward_sequence,
                                  LstmSeqBackward{w_h, cs_prev, wci, wcf, wco, fw.i, fw.cs, fw.f, fw.o, fw.ci, fw.co,
                                                  h_grad, cs_grad, g_i, g_f, g_o, g_ci, g_co, use_peephole, ifco, L,
                                                  dgates, dh_carry, out.cs_prev_grad});
  const bool mixed = !whole && x3.is_cpu() && is_low(x3) && route::cpu_float32_cell.enabled();
  bool x_grad_done = false;
  if (mixed) {
    route::cpu_float32_cell.ran();
    x_grad_done = lstm_backward_steps_mixed(cs_prev, w_x, w_h, wci, wcf, wco, fw, cs_grad, h_grad, g_i, g_f, g_o,
                                            g_ci, g_co, L, use_peephole, ifco, input_grads, dgates, dh_carry,
                                            out.cs_prev_grad, input_grads ? out.x_grad : at::Tensor(), k);
  } else if (x3.is_cpu() && is_low(x3)) {
    route::cpu_dtype_cell.ran();
  }
  // As GRU's: a single step runs unsplit.
  const auto rec_s = shared_step_gemm(w_h, true, input_grads && !whole && !mixed ? L : 0);
  if (!whole && !mixed) for_batch_slices(x3, B, /*split=*/L > 1, [&](int64_t b0, int64_t b1) {
    const int64_t nb = b1 - b0;
    auto s3 = [&](const at::Tensor& t3) { return rows_of(t3, 1, b0, nb); };
    const LstmOuts f{s3(fw.i), s3(fw.cs), s3(fw.f), s3(fw.o), s3(fw.ci), s3(fw.co), at::Tensor()};
    const at::Tensor zero_s = rows_of(zero_bc, 0, b0, nb), cs0 = rows_of(cs_prev, 0, b0, nb);
    const at::Tensor hgs = s3(h_grad), csgs = s3(cs_grad), gis = s3(g_i), gfs = s3(g_f), gos = s3(g_o),
                     gcis = s3(g_ci), gcos = s3(g_co), dgs = s3(dgates);
    auto step = [&](const at::Tensor& t3, int64_t t) { return t3.defined() ? t3.select(0, t) : zero_s; };
    auto gate = [&](const at::Tensor& t3, int64_t t) {
      return !any_gate ? at::Tensor() : (t3.defined() ? t3.select(0, t) : zero_s);
    };
    at::Tensor dh_s = rows_of(dh_carry, 0, b0, nb);
    const at::Tensor dcs_s = rows_of(out.cs_prev_grad, 0, b0, nb);  // zeros, updated in place
    std::optional<StepGemm> l_rec;
    const StepGemm& rec = slice_gemm(rec_s, l_rec, w_h, true, nb, input_grads ? L : 0);
    const at::Tensor xgs = own ? s3(out.x_grad) : at::Tensor();
    for (int64_t t = L - 1; t >= 0; --t) {
      const at::Tensor csp = t == 0 ? cs0 : f.cs.select(0, t - 1);
      const at::Tensor dg_t = dgs.select(0, t);
      k.lstm_backward(f.i.select(0, t), f.cs.select(0, t), f.f.select(0, t), f.o.select(0, t), f.ci.select(0, t),
                      f.co.select(0, t), csp, wci, wcf, wco, step(hgs, t), dh_s, step(csgs, t), gate(gis, t),
                      gate(gfs, t), gate(gos, t), gate(gcis, t), gate(gcos, t), use_peephole, ifco, dg_t, dcs_s);
      if (input_grads) rec.mm(dh_s, dg_t);
      if (own) {
        at::Tensor xg_t = xgs.select(0, t);
        x_gemm->mm(xg_t, dg_t);
      }
    }
  });
  if (use_peephole) {
    const GateOffsets off = gate_offsets(ifco, C);
    const at::Tensor di = dgates.narrow(2, off.i, C), df = dgates.narrow(2, off.f, C);
    const at::Tensor dO = dgates.narrow(2, off.o, C);
    at::Tensor wci_g = sum_tb(di.narrow(0, 0, 1), cs_prev.unsqueeze(0));
    at::Tensor wcf_g = sum_tb(df.narrow(0, 0, 1), cs_prev.unsqueeze(0));
    if (L > 1) {
      const at::Tensor csl = fw.cs.narrow(0, 0, L - 1);
      wci_g = wci_g.add(sum_tb(di.narrow(0, 1, L - 1), csl));
      wcf_g = wcf_g.add(sum_tb(df.narrow(0, 1, L - 1), csl));
    }
    out.wci_grad.copy_(wci_g);
    out.wcf_grad.copy_(wcf_g);
    out.wco_grad.copy_(sum_tb(dO, fw.cs.narrow(0, 0, L)));
  }
  if (!input_grads) return;
  out.h_prev_grad.copy_(dh_carry);
  const at::Tensor dg2d = dgates.view({L * B, 4 * C});
  if (!own && !x_grad_done) mm_into(out.x_grad.narrow(0, 0, L).view({L * B, I}), dg2d, w_x.t());
  // w_grad = [x_t, h_{t-1}]^T @ dgates over all steps as one GEMM (as TF's per-step xh, gathered once):
  // one K = L*B GEMM with I + C rows beats three (x rows, h_prev, h[0 : L-1]) by ~6 % at T=50 B=32.
  at::Tensor xh = at::empty({L * B, I + C}, opts);
  // Gathered step by step over the intra-op threads on the CPU (one 2.4 MB copy at T=50 B=32 ran on one
  // thread while the other waited); copies inside a parallel region run on the calling thread.
  auto gather = [&](int64_t t0, int64_t t1) {  // rows of steps [t0, t1): [x_t, h_{t-1}]
    xh.narrow(0, t0 * B, (t1 - t0) * B).narrow(1, 0, I).copy_(x3.narrow(0, t0, t1 - t0).reshape({(t1 - t0) * B, I}));
    if (t0 == 0) xh.narrow(0, 0, B).narrow(1, I, C).copy_(h_prev);
    const int64_t s = std::max<int64_t>(t0, 1);
    if (s < t1) xh.narrow(0, s * B, (t1 - s) * B).narrow(1, I, C).copy_(fw.h.narrow(0, s - 1, t1 - s).reshape({(t1 - s) * B, C}));
  };
  if (x3.is_cpu()) {
    rnn_util::parallel_with_state(L, gather);
  } else {
    gather(0, L);
  }
  if (own) {
    // torchops' kernel reads xh^T in place (a transposed gather of xh cost ~5 % of the backward).
    StepGemm(dg2d, /*trans=*/false, I + C, 2).mm(out.w_grad, xh.t());
  } else {
    mm_into(out.w_grad, xh.t(), dg2d);
  }
  out.b_grad.copy_(sum_rows(dg2d));
}

LstmOuts lstm_outs_of(const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f, const at::Tensor& o,
                      const at::Tensor& ci, const at::Tensor& co, const at::Tensor& h) {
  return LstmOuts{i.contiguous(), cs.contiguous(), f.contiguous(), o.contiguous(),
                  ci.contiguous(), co.contiguous(), h.defined() ? h.contiguous() : at::Tensor()};
}

}  // namespace

// =================================================================================================
// GRU ops
// =================================================================================================
T4 gru_block_cell(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                  const at::Tensor& b_ru, const at::Tensor& b_c, const Kernels& k) {
  const Dims d = check_gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c);
  const auto opts = x.options();
  at::Tensor r = at::empty({d.B, d.C}, opts), u = at::empty({d.B, d.C}, opts);
  at::Tensor c = at::empty({d.B, d.C}, opts), h = at::empty({d.B, d.C}, opts);
  if (d.B > 0 && d.C > 0) {
    gru_forward_core(x.contiguous().unsqueeze(0), h_prev.contiguous(), w_ru.contiguous(), w_c.contiguous(),
                     b_ru.contiguous(), b_c.contiguous(), 1, r.unsqueeze(0), u.unsqueeze(0), c.unsqueeze(0),
                     h.unsqueeze(0), false, k);
  }
  return {r, u, c, h};
}

T4 gru_block_cell_grad(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru, const at::Tensor& w_c,
                       const at::Tensor& b_ru, const at::Tensor& b_c, const at::Tensor& r, const at::Tensor& u,
                       const at::Tensor& c, const at::Tensor& d_h, const Kernels& k) {
  const Dims d = check_gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c);
  check_gru_state(x, r, d, "r");
  check_gru_state(x, u, d, "u");
  check_gru_state(x, c, d, "c");
  check_gru_state(x, d_h, d, "d_h");
  const auto opts = x.options();
  at::Tensor d_c_bar = at::empty({d.B, d.C}, opts), d_rbu = at::empty({d.B, 2 * d.C}, opts);
  const at::Tensor x3 = x.contiguous().unsqueeze(0);
  GruGrads g = alloc_gru_grads(x3, d.C, false);
  if (d.B > 0 && d.C > 0) {
    gru_backward_core(x3, h_prev.contiguous(), w_ru.contiguous(), w_c.contiguous(), r.contiguous().unsqueeze(0),
                      u.contiguous().unsqueeze(0), c.contiguous().unsqueeze(0), at::Tensor(),
                      d_h.contiguous().unsqueeze(0), at::Tensor(), at::Tensor(), at::Tensor(), 1, false,
                      d_c_bar.unsqueeze(0), d_rbu.unsqueeze(0), g, false, k);
  } else {
    g.x_grad.zero_();
  }
  return {g.x_grad.squeeze(0), g.h_prev_grad, d_c_bar, d_rbu};
}

T6 gru_block_cell_backward(const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
                           const at::Tensor& w_c, const at::Tensor& r, const at::Tensor& u, const at::Tensor& c,
                           const OptT& d_r, const OptT& d_u, const OptT& d_c, const OptT& d_h, const Kernels& k) {
  need({{&x, "x"}, {&h_prev, "h_prev"}, {&w_ru, "w_ru"}, {&w_c, "w_c"}, {&r, "r"}, {&u, "u"}, {&c, "c"}});
  TORCH_CHECK(x.dim() == 2, "Rank of x must be 2, got ", x.dim());
  TORCH_CHECK(h_prev.dim() == 2, "Rank of h_prev must be 2, got ", h_prev.dim());
  check_float(x, "x");
  const Dims d{x.size(0), x.size(1), h_prev.size(1)};
  TORCH_CHECK(h_prev.size(0) == d.B, "h_prev.dims(0) != batch_size: ", h_prev.size(0), " vs. ", d.B);
  check_like(x, h_prev, "h_prev");
  // Biases are not needed; validate the weights with dummy-free checks.
  TORCH_CHECK(w_ru.dim() == 2 && w_ru.size(0) == d.I + d.C && w_ru.size(1) == 2 * d.C, "w_ru must have shape [",
              d.I + d.C, ", ", 2 * d.C, "], got ", w_ru.sizes());
  TORCH_CHECK(w_c.dim() == 2 && w_c.size(0) == d.I + d.C && w_c.size(1) == d.C, "w_c must have shape [",
              d.I + d.C, ", ", d.C, "], got ", w_c.sizes());
  check_like(x, w_ru, "w_ru");
  check_like(x, w_c, "w_c");
  check_gru_state(x, r, d, "r");
  check_gru_state(x, u, d, "u");
  check_gru_state(x, c, d, "c");
  check_opt(d_r, x, {d.B, d.C}, "d_r");
  check_opt(d_u, x, {d.B, d.C}, "d_u");
  check_opt(d_c, x, {d.B, d.C}, "d_c");
  check_opt(d_h, x, {d.B, d.C}, "d_h");
  const at::Tensor x3 = x.contiguous().unsqueeze(0);
  GruGrads g = alloc_gru_grads(x3, d.C, true);
  if (d.B > 0 && d.C > 0) {
    const auto opts = x.options();
    at::Tensor d_c_bar = at::empty({1, d.B, d.C}, opts), d_rbu = at::empty({1, d.B, 2 * d.C}, opts);
    auto u3 = [](const OptT& t) {
      at::Tensor c = opt_contig(t);
      return c.defined() ? c.unsqueeze(0) : c;
    };
    gru_backward_core(x3, h_prev.contiguous(), w_ru.contiguous(), w_c.contiguous(), r.contiguous().unsqueeze(0),
                      u.contiguous().unsqueeze(0), c.contiguous().unsqueeze(0), at::Tensor(), u3(d_h), u3(d_r),
                      u3(d_u), u3(d_c), 1, true, d_c_bar, d_rbu, g, false, k);
  } else {
    zero_gru_grads(g, 0);
  }
  return {g.x_grad.squeeze(0), g.h_prev_grad, g.w_ru_grad, g.w_c_grad, g.b_ru_grad, g.b_c_grad};
}

T4 block_gru(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& h_prev, const at::Tensor& w_ru,
             const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c, const Kernels& k) {
  check_backend(x, k);
  const Dims d = check_block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c);
  const int64_t T = x.size(0);
  const int64_t L = read_seq_len_max(seq_len_max, T);
  const auto opts = x.options();
  at::Tensor r = at::empty({T, d.B, d.C}, opts), u = at::empty({T, d.B, d.C}, opts);
  at::Tensor c = at::empty({T, d.B, d.C}, opts), h = at::empty({T, d.B, d.C}, opts);
  if (L > 0 && d.B > 0 && d.C > 0) {
    gru_forward_core(x.contiguous(), h_prev.contiguous(), w_ru.contiguous(), w_c.contiguous(), b_ru.contiguous(),
                     b_c.contiguous(), L, r, u, c, h, true, k);
  }
  for (auto* t : {&r, &u, &c, &h}) t->narrow(0, L, T - L).zero_();
  return {r, u, c, h};
}

T6 block_gru_grad(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& h_prev,
                  const at::Tensor& w_ru, const at::Tensor& w_c, const at::Tensor& b_ru, const at::Tensor& b_c,
                  const at::Tensor& r, const at::Tensor& u, const at::Tensor& c, const at::Tensor& h,
                  const at::Tensor& h_grad, const OptT& r_grad, const OptT& u_grad, const OptT& c_grad,
                  const Kernels& k) {
  check_backend(x, k);
  const Dims d = check_block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c);
  const int64_t T = x.size(0);
  const std::vector<std::pair<const at::Tensor*, const char*>> seq = {
      {&r, "r"}, {&u, "u"}, {&c, "c"}, {&h, "h"}, {&h_grad, "h_grad"}};
  for (const auto& p : seq) {
    check_like(x, *p.first, p.second);
    check_shape(*p.first, {T, d.B, d.C}, p.second);
  }
  check_opt(r_grad, x, {T, d.B, d.C}, "r_grad");
  check_opt(u_grad, x, {T, d.B, d.C}, "u_grad");
  check_opt(c_grad, x, {T, d.B, d.C}, "c_grad");
  const int64_t L = read_seq_len_max(seq_len_max, T);
  const at::Tensor x3 = x.contiguous();
  GruGrads g = alloc_gru_grads(x3, d.C, true);
  if (L > 0 && d.B > 0 && d.C > 0) {
    const auto opts = x.options();
    at::Tensor d_c_bar = at::empty({L, d.B, d.C}, opts), d_rbu = at::empty({L, d.B, 2 * d.C}, opts);
    gru_backward_core(x3, h_prev.contiguous(), w_ru.contiguous(), w_c.contiguous(), r.contiguous(), u.contiguous(),
                      c.contiguous(), h.contiguous(), h_grad.contiguous(), opt_contig(r_grad), opt_contig(u_grad),
                      opt_contig(c_grad), L, true, d_c_bar, d_rbu, g, true, k);
    zero_gru_grads(g, L);
  } else {
    zero_gru_grads(g, 0);
    g.x_grad.zero_();
  }
  return {g.x_grad, g.h_prev_grad, g.w_ru_grad, g.w_c_grad, g.b_ru_grad, g.b_c_grad};
}

// =================================================================================================
// LSTM ops
// =================================================================================================
T7 lstm_block_cell(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev, const at::Tensor& w,
                   const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco, const at::Tensor& b,
                   double forget_bias, double cell_clip, bool use_peephole, const Kernels& k) {
  check_lstm_attrs(forget_bias, cell_clip);
  const Dims d = check_lstm_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b);
  LstmOuts o = alloc_lstm_outs(1, d.B, d.C, x.options());
  lstm_forward_core(x.contiguous().unsqueeze(0), cs_prev.contiguous(), h_prev.contiguous(), w.contiguous(),
                    wci.contiguous(), wcf.contiguous(), wco.contiguous(), b.contiguous(), 1, forget_bias, cell_clip,
                    use_peephole, /*ifco=*/false, o, false, k);
  return {o.i.squeeze(0), o.cs.squeeze(0), o.f.squeeze(0), o.o.squeeze(0), o.ci.squeeze(0), o.co.squeeze(0),
          o.h.squeeze(0)};
}

namespace {
Dims check_lstm_cell_grad(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                          const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                          const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                          const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co) {
  const Dims d = check_lstm_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b);
  check_lstm_cell_state(x, i, d, "i");
  check_lstm_cell_state(x, cs, d, "cs");
  check_lstm_cell_state(x, f, d, "f");
  check_lstm_cell_state(x, o, d, "o");
  check_lstm_cell_state(x, ci, d, "ci");
  check_lstm_cell_state(x, co, d, "co");
  return d;
}

at::Tensor u3(const at::Tensor& t) { return t.defined() ? t.contiguous().unsqueeze(0) : t; }
at::Tensor u3(const OptT& t) { return u3(opt_contig(t)); }
}  // namespace

T5 lstm_block_cell_grad(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                        const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                        const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                        const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const at::Tensor& cs_grad,
                        const at::Tensor& h_grad, bool use_peephole, const Kernels& k) {
  const Dims d = check_lstm_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co);
  check_lstm_cell_grad_in(x, cs_grad, d, "cs_grad");
  check_lstm_cell_grad_in(x, h_grad, d, "h_grad");
  const at::Tensor x3 = x.contiguous().unsqueeze(0);
  LstmGrads g = alloc_lstm_grads(x3, d.C);
  at::Tensor dicfo = at::empty({d.B, 4 * d.C}, x.options());
  const LstmOuts fw{u3(i), u3(cs), u3(f), u3(o), u3(ci), u3(co), at::Tensor()};
  lstm_backward_core(x3, cs_prev.contiguous(), h_prev.contiguous(), w.contiguous(), wci.contiguous(),
                     wcf.contiguous(), wco.contiguous(), fw, u3(cs_grad), u3(h_grad), at::Tensor(), at::Tensor(),
                     at::Tensor(), at::Tensor(), at::Tensor(), 1, use_peephole, false, /*input_grads=*/false,
                     dicfo.unsqueeze(0), g, false, k);
  return {g.cs_prev_grad, dicfo, g.wci_grad, g.wcf_grad, g.wco_grad};
}

T8 lstm_block_cell_backward(const at::Tensor& x, const at::Tensor& cs_prev, const at::Tensor& h_prev,
                            const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf, const at::Tensor& wco,
                            const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs, const at::Tensor& f,
                            const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co, const OptT& cs_grad,
                            const OptT& h_grad, const OptT& i_grad, const OptT& f_grad, const OptT& o_grad,
                            const OptT& ci_grad, const OptT& co_grad, bool use_peephole, const Kernels& k) {
  const Dims d = check_lstm_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co);
  const std::vector<std::pair<const OptT*, const char*>> opt = {{&cs_grad, "cs_grad"}, {&h_grad, "h_grad"},
                                                                {&i_grad, "i_grad"},   {&f_grad, "f_grad"},
                                                                {&o_grad, "o_grad"},   {&ci_grad, "ci_grad"},
                                                                {&co_grad, "co_grad"}};
  for (const auto& p : opt) check_opt(*p.first, x, {d.B, d.C}, p.second);
  const at::Tensor x3 = x.contiguous().unsqueeze(0);
  LstmGrads g = alloc_lstm_grads(x3, d.C);
  at::Tensor dicfo = at::empty({1, d.B, 4 * d.C}, x.options());
  const LstmOuts fw{u3(i), u3(cs), u3(f), u3(o), u3(ci), u3(co), at::Tensor()};
  lstm_backward_core(x3, cs_prev.contiguous(), h_prev.contiguous(), w.contiguous(), wci.contiguous(),
                     wcf.contiguous(), wco.contiguous(), fw, u3(cs_grad), u3(h_grad), u3(i_grad), u3(f_grad),
                     u3(o_grad), u3(ci_grad), u3(co_grad), 1, use_peephole, false, /*input_grads=*/true, dicfo, g,
                     false, k);
  return {g.x_grad.squeeze(0), g.cs_prev_grad, g.h_prev_grad, g.w_grad, g.wci_grad, g.wcf_grad, g.wco_grad,
          g.b_grad};
}

T7 block_lstm(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
              const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
              const at::Tensor& wco, const at::Tensor& b, double forget_bias, double cell_clip, bool use_peephole,
              bool ifco, const Kernels& k) {
  check_lstm_attrs(forget_bias, cell_clip);
  check_backend(x, k);
  const SeqDims d = check_block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b);
  const int64_t L = read_seq_len_max(seq_len_max, d.T);
  LstmOuts o = alloc_lstm_outs(d.T, d.B, d.C, x.options());
  if (L > 0 && d.B > 0 && d.C > 0) {
    lstm_forward_core(x.contiguous(), cs_prev.contiguous(), h_prev.contiguous(), w.contiguous(), wci.contiguous(),
                      wcf.contiguous(), wco.contiguous(), b.contiguous(), L, forget_bias, cell_clip, use_peephole,
                      ifco, o, true, k);
  }
  for (auto* t : {&o.i, &o.cs, &o.f, &o.o, &o.ci, &o.co, &o.h}) t->narrow(0, L, d.T - L).zero_();
  return {o.i, o.cs, o.f, o.o, o.ci, o.co, o.h};
}

T8 block_lstm_backward(const at::Tensor& seq_len_max, const at::Tensor& x, const at::Tensor& cs_prev,
                       const at::Tensor& h_prev, const at::Tensor& w, const at::Tensor& wci, const at::Tensor& wcf,
                       const at::Tensor& wco, const at::Tensor& b, const at::Tensor& i, const at::Tensor& cs,
                       const at::Tensor& f, const at::Tensor& o, const at::Tensor& ci, const at::Tensor& co,
                       const at::Tensor& h, const OptT& cs_grad, const OptT& h_grad, const OptT& i_grad,
                       const OptT& f_grad, const OptT& o_grad, const OptT& ci_grad, const OptT& co_grad,
                       bool use_peephole, bool ifco, bool tf_grad_op, const Kernels& k) {
  check_backend(x, k);
  std::vector<std::pair<const at::Tensor*, const char*>> seq = {{&i, "i"},   {&cs, "cs"}, {&f, "f"}, {&o, "o"},
                                                                {&ci, "ci"}, {&co, "co"}, {&h, "h"}};
  const std::vector<std::pair<const OptT*, const char*>> opt = {{&cs_grad, "cs_grad"}, {&h_grad, "h_grad"},
                                                                {&i_grad, "i_grad"},   {&f_grad, "f_grad"},
                                                                {&o_grad, "o_grad"},   {&ci_grad, "ci_grad"},
                                                                {&co_grad, "co_grad"}};
  for (const auto& p : opt)
    if (p.first->has_value() && (*p.first)->defined()) seq.emplace_back(&**p.first, p.second);
  const SeqDims d = check_block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, seq, tf_grad_op);
  const int64_t L = read_seq_len_max(seq_len_max, d.T);
  const at::Tensor x3 = x.contiguous();
  LstmGrads g = alloc_lstm_grads(x3, d.C);
  if (L > 0 && d.B > 0 && d.C > 0) {
    at::Tensor dgates = at::empty({L, d.B, 4 * d.C}, x.options());
    const LstmOuts fw = lstm_outs_of(i, cs, f, o, ci, co, h);
    lstm_backward_core(x3, cs_prev.contiguous(), h_prev.contiguous(), w.contiguous(), wci.contiguous(),
                       wcf.contiguous(), wco.contiguous(), fw, opt_contig(cs_grad), opt_contig(h_grad),
                       opt_contig(i_grad), opt_contig(f_grad), opt_contig(o_grad), opt_contig(ci_grad),
                       opt_contig(co_grad), L, use_peephole, ifco, /*input_grads=*/true, dgates, g, true, k);
  }
  g.x_grad.narrow(0, L, d.T - L).zero_();
  if (L == 0 || d.B == 0 || d.C == 0) g.x_grad.zero_();
  return {g.x_grad, g.cs_prev_grad, g.h_prev_grad, g.w_grad, g.wci_grad, g.wcf_grad, g.wco_grad, g.b_grad};
}

}  // namespace brnn
}  // namespace torchops
