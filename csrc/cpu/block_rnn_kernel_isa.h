// CPU loops of the GRU / LSTM block ops, compiled once per instruction set: cpu/cpu_isa_sections.h
// includes this file inside namespaces isa_base, isa_avx2 (and isa_avx512 where enabled) of
// cpu/block_rnn_kernel.cpp, after that file's own includes. No include guard, by design.
// Row kernels: one batch row, a loop over the cell dimension.
template <typename T>
void gru_gates_row(int64_t C, const T* __restrict ru, const T* __restrict hp, T* __restrict r, T* __restrict u,
                   T* __restrict hr) {
  using U = opm<T>;
  for (int64_t c = 0; c < C; ++c) {
    const GruGates<U> g = gru_gates<U>(static_cast<U>(ru[c]), static_cast<U>(ru[C + c]), static_cast<U>(hp[c]));
    r[c] = static_cast<T>(g.r);
    u[c] = static_cast<T>(g.u);
    hr[c] = static_cast<T>(g.hr);
  }
}

template <typename T>
void gru_output_row(int64_t C, const T* __restrict cb, const T* __restrict u, const T* __restrict hp,
                    T* __restrict c, T* __restrict h) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const GruOutput<U> o = gru_output<U>(static_cast<U>(cb[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    c[k] = static_cast<T>(o.c);
    h[k] = static_cast<T>(o.h);
  }
}

template <typename T, bool GATES>
void gru_backward_a_row(int64_t C, const T* __restrict hg, const T* __restrict carry, const T* __restrict gu,
                        const T* __restrict gc, const T* __restrict u, const T* __restrict c,
                        const T* __restrict hp, T* __restrict dh, T* __restrict dcb, T* __restrict dub) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const U d = static_cast<U>(hg[k]) + static_cast<U>(carry[k]);
    const GruBwdA<U> o = gru_backward_a<U>(d, GATES ? static_cast<U>(gu[k]) : U(0),
                                           GATES ? static_cast<U>(gc[k]) : U(0), static_cast<U>(u[k]),
                                           static_cast<U>(c[k]), static_cast<U>(hp[k]));
    dh[k] = static_cast<T>(d);
    dcb[k] = static_cast<T>(o.d_c_bar);
    dub[k] = static_cast<T>(o.d_u_bar);
  }
}

template <typename T, bool GATES, bool HR>
void gru_backward_b_row(int64_t C, const T* __restrict dhr, const T* __restrict gr, const T* __restrict dh,
                        const T* __restrict r, const T* __restrict u, const T* __restrict hp, T* __restrict drb,
                        T* __restrict part, T* __restrict hr) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const GruBwdB<U> o =
        gru_backward_b<U>(static_cast<U>(dhr[k]), GATES ? static_cast<U>(gr[k]) : U(0), static_cast<U>(dh[k]),
                          static_cast<U>(r[k]), static_cast<U>(u[k]), static_cast<U>(hp[k]));
    drb[k] = static_cast<T>(o.d_r_bar);
    part[k] = static_cast<T>(o.d_h_prev_part);
    if (HR) hr[k] = static_cast<T>(o.hr);
  }
}

template <typename T, bool PEEP>
void lstm_forward_row(int64_t C, const T* __restrict gi, const T* __restrict gci, const T* __restrict gf,
                      const T* __restrict go, const T* __restrict csp, const T* __restrict wci,
                      const T* __restrict wcf, const T* __restrict wco, opm<T> fb, opm<T> clip, T* __restrict i,
                      T* __restrict cs, T* __restrict f, T* __restrict o, T* __restrict ci, T* __restrict co,
                      T* __restrict h) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const LstmForward<U> r = lstm_forward<U>(
        static_cast<U>(gi[k]), static_cast<U>(gci[k]), static_cast<U>(gf[k]), static_cast<U>(go[k]),
        static_cast<U>(csp[k]), PEEP ? static_cast<U>(wci[k]) : U(0), PEEP ? static_cast<U>(wcf[k]) : U(0),
        PEEP ? static_cast<U>(wco[k]) : U(0), fb, clip, PEEP);
    i[k] = static_cast<T>(r.i);
    cs[k] = static_cast<T>(r.cs);
    f[k] = static_cast<T>(r.f);
    o[k] = static_cast<T>(r.o);
    ci[k] = static_cast<T>(r.ci);
    co[k] = static_cast<T>(r.co);
    h[k] = static_cast<T>(r.h);
  }
}

template <typename T, bool PEEP, bool GATES>
void lstm_backward_row(int64_t C, const T* __restrict i, const T* __restrict cs, const T* __restrict f,
                       const T* __restrict o, const T* __restrict ci, const T* __restrict co,
                       const T* __restrict csp, const T* __restrict wci, const T* __restrict wcf,
                       const T* __restrict wco, const T* __restrict hg, const T* __restrict dhc,
                       const T* __restrict csg, const T* __restrict gi, const T* __restrict gf,
                       const T* __restrict go, const T* __restrict gci, const T* __restrict gco, T* __restrict di,
                       T* __restrict dci, T* __restrict df, T* __restrict dout, T* __restrict dcs) {
  using U = opm<T>;
  for (int64_t k = 0; k < C; ++k) {
    const U dh = static_cast<U>(hg[k]) + static_cast<U>(dhc[k]);
    const U dcs_in = static_cast<U>(csg[k]) + static_cast<U>(dcs[k]);
    const LstmBackward<U> r = lstm_backward<U>(
        static_cast<U>(i[k]), static_cast<U>(cs[k]), static_cast<U>(f[k]), static_cast<U>(o[k]),
        static_cast<U>(ci[k]), static_cast<U>(co[k]), static_cast<U>(csp[k]), PEEP ? static_cast<U>(wci[k]) : U(0),
        PEEP ? static_cast<U>(wcf[k]) : U(0), PEEP ? static_cast<U>(wco[k]) : U(0), dh, dcs_in,
        GATES ? static_cast<U>(gi[k]) : U(0), GATES ? static_cast<U>(gf[k]) : U(0),
        GATES ? static_cast<U>(go[k]) : U(0), GATES ? static_cast<U>(gci[k]) : U(0),
        GATES ? static_cast<U>(gco[k]) : U(0), PEEP, GATES);
    di[k] = static_cast<T>(r.di);
    dci[k] = static_cast<T>(r.dci);
    df[k] = static_cast<T>(r.df);
    dout[k] = static_cast<T>(r.do_);
    dcs[k] = static_cast<T>(r.cs_prev_grad);
  }
}
