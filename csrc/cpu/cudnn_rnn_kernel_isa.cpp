// CPU step kernels of the CudnnRNN ops, one build per CPU capability (see cpu/cpu_isa.h): rows (batch
// entries) split across threads unless the caller already runs one batch slice per thread; each row a plain
// loop over the units over the branch-free math of common/cudnn_rnn_math.h, so that it vectorizes.
#include "cpu/cpu_isa.h"
#include "cpu/cudnn_rnn_kernel_isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include "common/cudnn_rnn_math.h"

namespace torchops {
namespace crnn {
namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE {
namespace {

// One batch row of one step. U: float or double. `active`: t < len of the row.

template <typename U>
void lstm_fwd_row(int64_t H, int64_t O, U* __restrict g, const U* __restrict cp, const U* __restrict hp,
                  U* __restrict co, U* __restrict hm, U* __restrict y, bool proj, bool active) {
  if (!active) {
    for (int64_t k = 0; k < H; ++k) co[k] = cp[k];
    if (proj) {
      for (int64_t k = 0; k < H; ++k) hm[k] = U(0);
    } else {
      for (int64_t k = 0; k < O; ++k) hm[k] = hp[k];
      if (y)
        for (int64_t k = 0; k < O; ++k) y[k] = U(0);
    }
    return;
  }
  U* __restrict gi = g;
  U* __restrict gf = g + H;
  U* __restrict gg = g + 2 * H;
  U* __restrict go = g + 3 * H;
  for (int64_t k = 0; k < H; ++k) {
    const LstmFwd<U> r = lstm_fwd<U>(gi[k], gf[k], gg[k], go[k], cp[k]);
    gi[k] = r.i;
    gf[k] = r.f;
    gg[k] = r.g;
    go[k] = r.o;
    co[k] = r.c;
    hm[k] = r.m;
  }
  if (y && !proj)
    for (int64_t k = 0; k < H; ++k) y[k] = hm[k];
}

template <typename U>
void gru_fwd_row(int64_t H, U* __restrict g, const U* __restrict gh, const U* __restrict br, const U* __restrict hp,
                 U* __restrict ghn, U* __restrict ho, U* __restrict y, bool active) {
  if (!active) {
    for (int64_t k = 0; k < H; ++k) {
      ho[k] = hp[k];
      y[k] = U(0);
    }
    return;
  }
  U* __restrict gr = g;
  U* __restrict gz = g + H;
  U* __restrict gn = g + 2 * H;
  for (int64_t k = 0; k < H; ++k) {
    const U hn = gh[2 * H + k] + br[2 * H + k];
    const GruFwd<U> o = gru_fwd<U>(gr[k], gz[k], gn[k], gh[k] + br[k], gh[H + k] + br[H + k], hn, hp[k]);
    gr[k] = o.r;
    gz[k] = o.z;
    gn[k] = o.n;
    ghn[k] = hn;
    ho[k] = o.h;
    y[k] = o.h;
  }
}

template <typename U>
void rnn_fwd_row(int64_t H, U* __restrict g, const U* __restrict hp, U* __restrict ho, U* __restrict y, bool relu,
                 bool active) {
  if (!active) {
    for (int64_t k = 0; k < H; ++k) {
      ho[k] = hp[k];
      y[k] = U(0);
    }
    return;
  }
  if (relu) {
    for (int64_t k = 0; k < H; ++k) {
      const U a = rnn_act<U>(g[k], true);
      g[k] = a;
      ho[k] = a;
      y[k] = a;
    }
  } else {
    for (int64_t k = 0; k < H; ++k) {
      const U a = rnn_act<U>(g[k], false);
      g[k] = a;
      ho[k] = a;
      y[k] = a;
    }
  }
}

template <typename U>
void mask_state_row(int64_t O, U* __restrict hn, const U* __restrict hp, U* __restrict y, bool active) {
  if (active) {
    for (int64_t k = 0; k < O; ++k) y[k] = hn[k];
  } else {
    for (int64_t k = 0; k < O; ++k) {
      hn[k] = hp[k];
      y[k] = U(0);
    }
  }
}

template <typename U>
void bwd_prep_row(int64_t O, const U* __restrict dhc, const U* __restrict dy, U* __restrict dh, U* __restrict dhn,
                  bool active) {
  if (active) {
    if (dy) {
      for (int64_t k = 0; k < O; ++k) dh[k] = dhc[k] + dy[k];
    } else {
      for (int64_t k = 0; k < O; ++k) dh[k] = dhc[k];
    }
    for (int64_t k = 0; k < O; ++k) dhn[k] = U(0);
  } else {
    for (int64_t k = 0; k < O; ++k) {
      dh[k] = U(0);
      dhn[k] = dhc[k];
    }
  }
}

template <typename U>
void lstm_bwd_row(int64_t H, const U* __restrict g, const U* __restrict c, const U* __restrict cp,
                  const U* __restrict dm, U* __restrict dc, U* __restrict dg, bool active) {
  if (!active) {
    for (int64_t k = 0; k < 4 * H; ++k) dg[k] = U(0);
    return;
  }
  for (int64_t k = 0; k < H; ++k) {
    const LstmBwd<U> r = lstm_bwd<U>(g[k], g[H + k], g[2 * H + k], g[3 * H + k], c[k], cp[k], dm[k], dc[k]);
    dg[k] = r.di;
    dg[H + k] = r.df;
    dg[2 * H + k] = r.dg;
    dg[3 * H + k] = r.do_;
    dc[k] = r.dc_prev;
  }
}

template <typename U>
void gru_bwd_row(int64_t H, const U* __restrict g, const U* __restrict ghn, const U* __restrict hp,
                 const U* __restrict dh, U* __restrict dhn, U* __restrict dgx, U* __restrict dgh, bool active) {
  if (!active) {
    for (int64_t k = 0; k < 3 * H; ++k) {
      dgx[k] = U(0);
      dgh[k] = U(0);
    }
    return;
  }
  for (int64_t k = 0; k < H; ++k) {
    const GruBwd<U> o = gru_bwd<U>(g[k], g[H + k], g[2 * H + k], ghn[k], hp[k], dh[k]);
    dgx[k] = o.dr;
    dgx[H + k] = o.dz;
    dgx[2 * H + k] = o.dn;
    dgh[k] = o.dr;
    dgh[H + k] = o.dz;
    dgh[2 * H + k] = o.dhn;
    dhn[k] += o.dh_prev;
  }
}

template <typename U>
void rnn_bwd_row(int64_t H, const U* __restrict g, const U* __restrict dh, U* __restrict dg, bool relu, bool active) {
  if (!active) {
    for (int64_t k = 0; k < H; ++k) dg[k] = U(0);
    return;
  }
  if (relu) {
    for (int64_t k = 0; k < H; ++k) dg[k] = dh[k] * rnn_act_grad<U>(g[k], true);
  } else {
    for (int64_t k = 0; k < H; ++k) dg[k] = dh[k] * rnn_act_grad<U>(g[k], false);
  }
}

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
    auto fn = (lstm_fwd_row<scalar_t>);
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
    auto fn = (gru_fwd_row<scalar_t>);
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
    auto fn = (rnn_fwd_row<scalar_t>);
    rows(nb, H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(h_out, b), rp<scalar_t>(y, b), relu, a);
    });
  });
}

void mask_state_cpu(const at::Tensor& h_new, const at::Tensor& h_prev, const at::Tensor& y, const at::Tensor& lens,
                    int64_t t) {
  const int64_t nb = h_new.size(0), O = h_new.size(1);
  TORCHOPS_CRNN_DISPATCH(h_new, [&] {
    auto fn = (mask_state_row<scalar_t>);
    rows(nb, O, lens, t, [&](int64_t b, bool a) {
      fn(O, rp<scalar_t>(h_new, b), rp<scalar_t>(h_prev, b), rp<scalar_t>(y, b), a);
    });
  });
}

void bwd_prep_cpu(const at::Tensor& dh_carry, const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& dh_next,
                  const at::Tensor& lens, int64_t t) {
  const int64_t nb = dh.size(0), O = dh.size(1);
  TORCHOPS_CRNN_DISPATCH(dh, [&] {
    auto fn = (bwd_prep_row<scalar_t>);
    rows(nb, O, lens, t, [&](int64_t b, bool a) {
      fn(O, rp<scalar_t>(dh_carry, b), rp<scalar_t>(dy, b), rp<scalar_t>(dh, b), rp<scalar_t>(dh_next, b), a);
    });
  });
}

void lstm_bwd_cpu(const at::Tensor& g, const at::Tensor& c, const at::Tensor& c_prev, const at::Tensor& dm,
                  const at::Tensor& dc, const at::Tensor& dg, const at::Tensor& lens, int64_t t) {
  const int64_t nb = g.size(0), H = c.size(1);
  TORCHOPS_CRNN_DISPATCH(g, [&] {
    auto fn = (lstm_bwd_row<scalar_t>);
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
    auto fn = (gru_bwd_row<scalar_t>);
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
    auto fn = (rnn_bwd_row<scalar_t>);
    rows(nb, H, lens, t, [&](int64_t b, bool a) {
      fn(H, rp<scalar_t>(g, b), rp<scalar_t>(dh, b), rp<scalar_t>(dg, b), relu, a);
    });
  });
}

#undef TORCHOPS_CRNN_DISPATCH

}  // namespace
}  // namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE

template <>
const StepKernels& cpu_step_kernels<TORCHOPS_CPU_CAPABILITY>() {
  using namespace TORCHOPS_CPU_CAPABILITY_NAMESPACE;
  static const StepKernels k{lstm_fwd_cpu, gru_fwd_cpu,  rnn_fwd_cpu, mask_state_cpu,
                             bwd_prep_cpu, lstm_bwd_cpu, gru_bwd_cpu, rnn_bwd_cpu};
  return k;
}

}  // namespace crnn
}  // namespace torchops
