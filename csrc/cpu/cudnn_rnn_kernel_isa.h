// CPU loops of the CudnnRNN ops, compiled once per instruction set: cpu/cpu_isa_sections.h
// includes this file inside namespaces isa_base, isa_avx2 (and isa_avx512 where enabled) of
// cpu/cudnn_rnn_kernel.cpp, after that file's own includes. No include guard, by design.
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
