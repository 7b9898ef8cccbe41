import torchops  # noqa: F401  (loads the ops)
from conftest import forced_route

import math
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

ops = torch.ops.torchops
F64 = torch.float64

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")


def rnd(*shape, dtype=F64, scale=1.0, gen=None, requires_grad=False):
    t = (torch.rand(*shape, dtype=F64, generator=gen) * 2 - 1) * scale
    return t.to(dtype).requires_grad_(requires_grad)


# ================================================================================================
# Plain-PyTorch references (float64), written from the documented cell equations (docs/block_rnn.md).
# ================================================================================================
def ref_gru_cell(x, h_prev, w_ru, w_c, b_ru, b_c):
    C = h_prev.shape[1]
    ru = torch.sigmoid(torch.cat([x, h_prev], 1) @ w_ru + b_ru)
    r, u = ru[:, :C], ru[:, C:]
    c = torch.tanh(torch.cat([x, h_prev * r], 1) @ w_c + b_c)
    h = u * (h_prev - c) + c
    return r, u, c, h


def ref_block_gru(x, h_prev, w_ru, w_c, b_ru, b_c, L=None):
    T = x.shape[0]
    L = T if L is None else L
    outs = [[], [], [], []]
    h = h_prev
    for t in range(T):
        if t < L:
            step = ref_gru_cell(x[t], h, w_ru, w_c, b_ru, b_c)
            h = step[3]
        else:
            step = [torch.zeros_like(h_prev)] * 4
        for k in range(4):
            outs[k].append(step[k])
    return tuple(torch.stack(o) for o in outs)


def split_gates(g, C, ifco):
    blocks = [g[:, k * C:(k + 1) * C] for k in range(4)]
    if ifco:
        gi, gf, gc, go = blocks
    else:
        gi, gc, gf, go = blocks
    return gi, gc, gf, go


def ref_lstm_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False,
                  ifco=False):
    C = cs_prev.shape[1]
    g = torch.cat([x, h_prev], 1) @ w + b
    gi, gc, gf, go = split_gates(g, C, ifco)
    if use_peephole:
        gi = gi + cs_prev * wci
        gf = gf + cs_prev * wcf
    i = torch.sigmoid(gi)
    ci = torch.tanh(gc)
    f = torch.sigmoid(gf + forget_bias)
    cs = i * ci + f * cs_prev
    if cell_clip > 0:  # straight-through clip
        cs = cs + (cs.clamp(-cell_clip, cell_clip) - cs).detach()
    co = torch.tanh(cs)
    o = torch.sigmoid(go + cs * wco) if use_peephole else torch.sigmoid(go)
    h = o * co
    return i, cs, f, o, ci, co, h


def ref_block_lstm(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False,
                   ifco=False, L=None):
    T = x.shape[0]
    L = T if L is None else L
    outs = [[] for _ in range(7)]
    cs, h = cs_prev, h_prev
    for t in range(T):
        if t < L:
            step = ref_lstm_cell(x[t], cs, h, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole, ifco)
            cs, h = step[1], step[6]
        else:
            step = [torch.zeros_like(cs_prev)] * 7
        for k in range(7):
            outs[k].append(step[k])
    return tuple(torch.stack(o) for o in outs)


def gru_inputs(B=3, I=4, C=5, dtype=F64, seed=0, scale=1.0, T=None, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    xs = (T, B, I) if T is not None else (B, I)
    return [rnd(*s, dtype=dtype, gen=g, scale=scale, requires_grad=requires_grad)
            for s in (xs, (B, C), (I + C, 2 * C), (I + C, C), (2 * C,), (C,))]


def lstm_inputs(B=3, I=4, C=5, dtype=F64, seed=0, scale=1.0, T=None, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    xs = (T, B, I) if T is not None else (B, I)
    return [rnd(*s, dtype=dtype, gen=g, scale=scale, requires_grad=requires_grad)
            for s in (xs, (B, C), (B, C), (I + C, 4 * C), (C,), (C,), (C,), (4 * C,))]


def sl(n):
    return torch.tensor(n, dtype=torch.int64)


def close(a, b, rtol=1e-10, atol=1e-10):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


# ================================================================================================
# GRUBlockCell
# ================================================================================================
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_gru_cell_forward_matches_reference(dtype, tol):
    args = gru_inputs(B=4, I=6, C=5)
    out = ops.gru_block_cell(*[a.to(dtype) for a in args])
    for got, want in zip(out, ref_gru_cell(*args)):
        assert got.dtype == dtype and got.shape == (4, 5)
        close(got.double(), want, rtol=tol, atol=tol)


def test_gru_cell_tf_single_and_multi_step():
    # gru_ops_test SingleStep / MultiStep: weights U(-0.01, 0.01), b_ru = 1, b_c = 0, float32, 1e-6.
    rs = np.random.RandomState(1994)
    B, C, I = 4, 5, 6
    x = torch.from_numpy(rs.rand(B, I))
    h = torch.from_numpy(rs.rand(B, C))
    w_ru = torch.from_numpy(rs.uniform(-0.01, 0.01, (I + C, 2 * C)))
    w_c = torch.from_numpy(rs.uniform(-0.01, 0.01, (I + C, C)))
    b_ru, b_c = torch.ones(2 * C, dtype=F64), torch.zeros(C, dtype=F64)
    got = ops.gru_block_cell(*[t.float() for t in (x, h, w_ru, w_c, b_ru, b_c)])[3]
    close(got.double(), ref_gru_cell(x, h, w_ru, w_c, b_ru, b_c)[3], rtol=1e-6, atol=1e-6)
    # MultiStep: T=4, B=2, C=3, I=3 time-major, unrolled cell == block_gru
    T, B, C, I = 4, 2, 3, 3
    x = torch.from_numpy(rs.rand(T, B, I)).float()
    h0 = torch.zeros(B, C)
    w_ru = torch.from_numpy(rs.uniform(-0.01, 0.01, (I + C, 2 * C))).float()
    w_c = torch.from_numpy(rs.uniform(-0.01, 0.01, (I + C, C))).float()
    b_ru, b_c = torch.ones(2 * C), torch.zeros(C)
    hs, h = [], h0
    for t in range(T):
        h = ops.gru_block_cell(x[t], h, w_ru, w_c, b_ru, b_c)[3]
        hs.append(h)
    close(ops.block_gru(sl(T), x, h0, w_ru, w_c, b_ru, b_c)[3], torch.stack(hs), rtol=1e-6, atol=1e-6)
    want = ref_block_gru(*[t.double() for t in (x, h0, w_ru, w_c, b_ru, b_c)])[3]
    close(torch.stack(hs).double(), want, rtol=1e-6, atol=1e-6)


def test_gru_cell_grad_raw_op_matches_tf_formula():
    x, h_prev, w_ru, w_c, b_ru, b_c = gru_inputs(B=3, I=4, C=5, seed=1)
    r, u, c, _ = ops.gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
    d_h = rnd(3, 5, gen=torch.Generator().manual_seed(2))
    d_x, d_h_prev, d_c_bar, d_rbu = ops.gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h)
    I, C = 4, 5
    # the GRU cell backward, written independently
    e_dcb = d_h * (1 - u) * (1 - c * c)
    e_dub = d_h * (h_prev - c) * u * (1 - u)
    xh2 = e_dcb @ w_c.T
    dx2, d_hr = xh2[:, :I], xh2[:, I:]
    e_drb = d_hr * h_prev * r * (1 - r)
    e_drbu = torch.cat([e_drb, e_dub], 1)
    xh1 = e_drbu @ w_ru.T
    close(d_c_bar, e_dcb)
    close(d_rbu, e_drbu)
    close(d_x, xh1[:, :I] + dx2)
    close(d_h_prev, xh1[:, I:] + d_hr * r + d_h * u)


def test_gru_cell_gradients_all_outputs_match_reference():
    args = gru_inputs(B=3, I=4, C=5, seed=3, requires_grad=True)
    g = torch.Generator().manual_seed(4)
    ups = [rnd(3, 5, gen=g) for _ in range(4)]
    out = ops.gru_block_cell(*args)
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(out, ups)), args)
    ref = ref_gru_cell(*args)
    want = torch.autograd.grad(sum((o * w).sum() for o, w in zip(ref, ups)), args)
    for a, b in zip(got, want):
        close(a, b)
    # only h: the TF 1.x gradient
    got = torch.autograd.grad(ops.gru_block_cell(*args)[3].sum(), args)
    want = torch.autograd.grad(ref_gru_cell(*args)[3].sum(), args)
    for a, b in zip(got, want):
        close(a, b)


def test_gru_cell_gradcheck_and_no_double_backward():
    args = gru_inputs(B=2, I=3, C=2, seed=5, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ops.gru_block_cell(*a), args)
    assert torch.autograd.gradcheck(lambda *a: ops.gru_block_cell(*a)[0], args)  # r only
    # (fast mode here and below: the first double backward raises either way, after fewer numerical evaluations)
    with pytest.raises(RuntimeError, match="derivative for torchops::_gru_block_cell_backward is not implemented"):
        torch.autograd.gradgradcheck(lambda *a: ops.gru_block_cell(*a)[3], args, fast_mode=True)


def test_gru_tf_gradient_test_small_error():
    # gru_ops_test Gradient: B=1, C=3, I=2, x and h zeros, glorot-like weights; error < 1e-4.
    torch.manual_seed(0)
    B, C, I = 1, 3, 2
    x = torch.zeros(B, I, dtype=F64, requires_grad=True)
    h = torch.zeros(B, C, dtype=F64, requires_grad=True)
    lim_ru, lim_c = (6 / (I + C + 2 * C)) ** 0.5, (6 / (I + C + C)) ** 0.5
    w_ru = ((torch.rand(I + C, 2 * C, dtype=F64) * 2 - 1) * lim_ru).requires_grad_()
    w_c = ((torch.rand(I + C, C, dtype=F64) * 2 - 1) * lim_c).requires_grad_()
    b_ru = torch.ones(2 * C, dtype=F64, requires_grad=True)
    b_c = torch.zeros(C, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ops.gru_block_cell(*a)[3], (x, h, w_ru, w_c, b_ru, b_c), atol=1e-4)


def test_gru_cell_batch_zero():
    args = gru_inputs(B=0, I=4, C=5, requires_grad=True)
    out = ops.gru_block_cell(*args)
    assert all(o.shape == (0, 5) for o in out)
    grads = torch.autograd.grad(out[3].sum(), args, allow_unused=True)
    assert grads[0].shape == (0, 4)
    assert torch.equal(grads[2], torch.zeros(9, 10, dtype=F64))
    raw = ops.gru_block_cell_grad(*[a.detach() for a in args], *[o.detach() for o in out[:3]], out[3].detach())
    assert [tuple(t.shape) for t in raw] == [(0, 4), (0, 5), (0, 5), (0, 10)]


def test_gru_cell_noncontiguous_inputs():
    args = gru_inputs(B=3, I=4, C=5, seed=7)
    nc = [args[0].T.contiguous().T, args[1].T.contiguous().T, args[2].T.contiguous().T, args[3].T.contiguous().T,
          torch.stack([args[4], args[4]], 1)[:, 0], torch.stack([args[5], args[5]], 1)[:, 0]]
    assert not any(t.is_contiguous() for t in nc)
    for got, want in zip(ops.gru_block_cell(*nc), ref_gru_cell(*args)):
        close(got, want)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3), (torch.bfloat16, 3e-2)])
def test_gru_low_precision_vs_float32(dtype, tol):
    args = gru_inputs(B=4, I=8, C=6, seed=8, scale=0.5)
    low = [a.to(dtype) for a in args]
    out = ops.gru_block_cell(*low)
    ref = ops.gru_block_cell(*[a.to(dtype).float() for a in args])
    for a, b in zip(out, ref):
        assert a.dtype == dtype
        close(a.float(), b, rtol=tol, atol=tol)
    seq = gru_inputs(B=2, I=3, C=4, T=3, seed=9, scale=0.5)
    out = ops.block_gru(sl(3), *[a.to(dtype) for a in seq])
    ref = ops.block_gru(sl(3), *[a.to(dtype).float() for a in seq])
    for a, b in zip(out, ref):
        close(a.float(), b, rtol=tol, atol=tol)
    # gradients of the low-precision path
    low = [a.to(dtype).requires_grad_() for a in args]
    g = torch.autograd.grad(ops.gru_block_cell(*low)[3].float().sum(), low)
    f32 = [a.to(dtype).float().requires_grad_() for a in args]
    gr = torch.autograd.grad(ops.gru_block_cell(*f32)[3].sum(), f32)
    for a, b in zip(g, gr):
        assert a.dtype == dtype
        close(a.float(), b, rtol=4 * tol, atol=4 * tol)


def _ulp_error(got, want64):
    """|got - want| in units of the float32 spacing at want (subnormal spacing below 2^-126)."""
    want32 = want64.astype(np.float32)
    err = np.abs(got.astype(np.float64) - want64) / np.spacing(np.abs(want32)).astype(np.float64)
    err[np.isnan(want64) & np.isnan(got)] = 0.0
    err[np.isinf(want64) & (got == want64)] = 0.0
    return err


def test_cpu_float_sigmoid_tanh_accuracy():
    # The float CPU gate nonlinearities are TF's (Eigen's) algorithms; their error bounds over all floats
    # (tools/tf_compare/ulp_check.cpp): tanh 5.8 ulp, sigmoid 6.6 ulp for normal results and 2.3 subnormal
    # spacings below. Regression: the float CPU exp() once clamped its argument to [-87.3, 88.3], so
    # sigmoid(x) for x < -88.3 (and -inf) was stuck at 4.5e-39 instead of e^x (TF: e^x, or 0). Sweep the
    # gate nonlinearities through the op over a dense range and compare with float64 in float32 ulps. With
    # w_ru = [1 | -1] and w_c = 1 on the x rows (exact products), r = sigmoid(x), u = sigmoid(-x), c = tanh(x);
    # C = 37 exercises the vector body and the remainder loop.
    C = 37
    sweep = np.concatenate([np.linspace(-110, 95, 40001), -np.logspace(-37, 2.05, 3000), np.logspace(-37, 2.05, 3000),
                            [0.0, -88.5, -95.0, -103.9, 88.72, 89.5]])
    sweep = np.concatenate([sweep, np.zeros(-sweep.size % C)])
    v32 = torch.from_numpy(sweep.astype(np.float32)).reshape(-1, C)
    eye = torch.eye(C)
    w_ru = torch.cat([torch.cat([eye, -eye], 1), torch.zeros(C, 2 * C)])
    w_c = torch.cat([eye, torch.zeros(C, C)])
    r, u, c, h = ops.gru_block_cell(v32, torch.zeros_like(v32), w_ru, w_c, torch.zeros(2 * C), torch.zeros(C))
    x = v32.double().numpy().ravel()
    with np.errstate(over="ignore"):
        sig = np.where(x < 0, np.exp(x) / (1 + np.exp(x)), 1 / (1 + np.exp(-x)))
        sig_neg = np.where(-x < 0, np.exp(-x) / (1 + np.exp(-x)), 1 / (1 + np.exp(x)))
    assert _ulp_error(r.numpy().ravel(), sig).max() <= 6.6
    assert _ulp_error(u.numpy().ravel(), sig_neg).max() <= 6.6
    assert _ulp_error(c.numpy().ravel(), np.tanh(x)).max() <= 5.8
    got = dict(zip(x.tolist(), r.numpy().ravel().tolist()))
    assert got[-95.0] == pytest.approx(math.exp(-95.0), rel=1e-3)  # subnormal: 2.5e-4 relative spacing
    assert got[-88.5] == pytest.approx(math.exp(-88.5), rel=1e-5)
    # Specials through the bias (0 * inf in a GEMM would be NaN): the values TF and libm give.
    spec = torch.tensor([-math.inf, math.inf, math.nan, -200.0, 1e-40, -1e-40, 100.0])
    n = spec.numel()
    z = torch.zeros
    r, u, c, h = ops.gru_block_cell(z(1, 1), z(1, n), z(n + 1, 2 * n), z(n + 1, n), torch.cat([spec, -spec]), z(n))
    assert r[0, :2].tolist() == [0.0, 1.0] and u[0, :2].tolist() == [1.0, 0.0] and math.isnan(r[0, 2].item())
    assert r[0, 3].item() == 0.0 and r[0, 6].item() == 1.0
    # subnormal (old code: 4.5e-39): within one subnormal spacing of e^-100
    assert abs(u[0, 6].item() - math.exp(-100.0)) <= 1.5e-45
    # (separately: a NaN r would reach every c through (h_prev * r) @ w_c)
    r, u, c, h = ops.gru_block_cell(z(1, 1), z(1, n), z(n + 1, 2 * n), z(n + 1, n), z(2 * n), spec)
    assert c[0, :2].tolist() == [-1.0, 1.0] and math.isnan(c[0, 2].item())
    assert c[0, 4].item() == spec[4].item() and c[0, 5].item() == spec[5].item()  # tanh(x) = x for tiny x


# float32 bit patterns (x, tanh(x), sigmoid(x)) from tf.math.tanh / tf.math.sigmoid of TensorFlow 2.21.0
# (x86-64 CPU wheel): the Eigen functors that TF's LSTM / GRU block kernels apply to the gates. 25 of
# the tanh and 30 of the sigmoid values differ from torchops' earlier (more accurate) Cephes-style math.
_TF_TANH_SIGMOID_BITS = [
    (0xbf2462a8, 0xbf10fc35, 0x3eb0850f),
    (0x3e8f4566, 0x3e8ba526, 0x3f11cafe),
    (0xbd861192, 0xbd85e0a0, 0x3ef79fab),
    (0xbe849b83, 0xbe81b845, 0x3edf083c),
    (0xbe94908d, 0xbe9087eb, 0x3edb1e03),
    (0x3f14becf, 0x3f05fec0, 0x3f242ca0),
    (0x3f4f6f03, 0x3f2b74ab, 0x3f31321c),
    (0xbf2531f6, 0xbf1188c4, 0x3eb02771),
    (0x3e9c739f, 0x3e97c1e8, 0x3f1367db),
    (0xbece89b8, 0xbec404de, 0x3ecd0df2),
    (0x40ef15ab, 0x3f7ffff6, 0x3f7fdab9),
    (0x40d6f69a, 0x3f7fffd0, 0x3f7fb0d6),
    (0x400b21b7, 0x3f797650, 0x3f65dbbc),
    (0x4081661a, 0x3f7fd7ba, 0x3f7b96ce),
    (0x3e784736, 0x3e738659, 0x3f0f711a),
    (0x40a6dbbe, 0x3f7ffc21, 0x3f7e9d89),
    (0xbf536eec, 0xbf2da365, 0x3e9be8c7),
    (0xc0250e59, 0xbf7d123d, 0x3d906372),
    (0xc0636e63, 0xbf7f94b9, 0x3ce3f09b),
    (0xc08c1e13, 0xbf7feb64, 0x3c4af168),
    (0x3ed37dd8, 0x3ec83b19, 0x3f1a111e),
    (0xbf8d7dfa, 0xbf4d6c3d, 0x3e7eb295),
    (0x402718d2, 0x3f7d404e, 0x3f6e7aa9),
    (0xc0f96cf9, 0xbf7ffffb, 0x39d7e757),
    (0xc048d31f, 0xbf7f09e0, 0x3d2a46a1),
    (0xc1016d2b, 0xbf800000, 0x39a0d40b),
    (0xc192358b, 0xbf800000, 0x3246839a),
    (0x40b62479, 0x3f7ffe83, 0x3f7f23b1),
    (0xc07865c1, 0xbf7fc842, 0x3ca58d5e),
    (0xc1400217, 0xbf800000, 0x36ce0f22),
    (0xc18b7af2, 0xbf800000, 0x32e62bf1),
    (0x41b3d1ce, 0x3f800000, 0x3f800000),
    (0xba0620bf, 0xba0620be, 0x3effef3c),
    (0x3ab12369, 0x3ab12362, 0x3f001624),
    (0x3a5a9ba0, 0x3a5a9b9c, 0x3f000daa),
    (0x3a951f71, 0x3a951f6d, 0x3f0012a4),
    (0xba682320, 0xba68231d, 0x3effe2fc),
    (0x3a3373b6, 0x3a3373b4, 0x3f000b36),
    (0xc1d49007, 0xbf800000, 0x2c4b4064),
    (0xc281d8cd, 0xbf800000, 0x10a17cba),
    (0xc22041e2, 0xbf800000, 0x2292f84d),
    (0xc2829362, 0xbf800000, 0x1060569b),
    (0x40e584d9, 0x3f7ffff2, 0x3f7fcdbf),
    (0xc09b3962, 0xbf7ff7fb, 0x3bfe564c),
    (0x3f200000, 0x3f0dfa3f, 0x3f26bf32),
    (0xbf200000, 0xbf0dfa3f, 0x3eb2819f),
    (0x40000000, 0x3f76ca83, 0x3f617beb),
    (0xc0000000, 0xbf76ca83, 0x3df420ac),
    (0x41080000, 0x3f800000, 0x3f7ff2ab),
    (0xc1400000, 0xbf800000, 0x36ce2a0f),
    (0x00000000, 0x00000000, 0x3f000000),
    (0x00000000, 0x00000000, 0x3f000000),
    (0x00000000, 0x00000000, 0x3f000000),
    (0x00000000, 0x00000000, 0x3f000000),
    (0x00000000, 0x00000000, 0x3f000000),
    (0x00000000, 0x00000000, 0x3f000000),
]


def test_cpu_float_gate_math_is_tf_bitwise():
    bits = np.array(_TF_TANH_SIGMOID_BITS, dtype=np.uint32)
    x, tanh, sig = (torch.from_numpy(bits[:, k].view(np.float32).copy()) for k in range(3))
    C = x.numel()
    # Zero x / h / w: every gate pre-activation is its bias value exactly, so i, f, o = sigmoid(x) and
    # ci = tanh(x) (both V1 orders of the four blocks hold x).
    z = torch.zeros
    i, cs, f, o, ci, co, h = ops.lstm_block_cell(z(2, 3), z(2, C), z(2, C), z(3 + C, 4 * C), z(C), z(C), z(C),
                                                  x.repeat(4), forget_bias=0.0, cell_clip=-1.0, use_peephole=False)
    for g in (i, f, o):
        assert torch.equal(g[1].view(torch.int32), sig.view(torch.int32))
    assert torch.equal(ci[1].view(torch.int32), tanh.view(torch.int32))
    # GRU: identity weights on the x rows (exact products) give r = sigmoid(x), c = tanh(x).
    eye = torch.eye(C)
    w_ru = torch.cat([torch.cat([eye, eye], 1), z(C, 2 * C)])
    w_c = torch.cat([eye, z(C, C)])
    r, u, c, h = ops.gru_block_cell(x[None], z(1, C), w_ru, w_c, z(2 * C), z(C))
    assert torch.equal(r[0].view(torch.int32), sig.view(torch.int32))
    assert torch.equal(c[0].view(torch.int32), tanh.view(torch.int32))


# LSTMBlockCellGrad of TensorFlow 2.21.0 (x86-64 CPU wheel), use_peephole=True, on the inputs drawn below:
# cs_prev_grad [2, 8], dicfo [2, 32], wci_grad, wcf_grad, wco_grad [8] as float32 bit patterns.
_TF_LSTM_CELL_GRAD_BITS = [
    0xbde81210, 0x3cc396c6, 0x3da48b85, 0xbdb22e47, 0x3f750634, 0xbd59642a, 0xbe55e394, 0xbc98f2c5,
    0x3fcd23de, 0xbf4b9193, 0xbf315952, 0x3f564e68, 0xbf5c26cf, 0x3f93a9a7, 0xbf9ca22a, 0x3ef2aa3e,
    0x3b7bc1a4, 0xbd8c6abe, 0xbd84c637, 0xbb1f7c5f, 0x3e1a7b77, 0xbd23829d, 0x3e04f241, 0x3bc435a3,
    0xbda2ce27, 0xbdd84a6b, 0x3e5b6843, 0xbe6285f9, 0x3fa6ea48, 0xbda12e6f, 0xbf06afb9, 0xbe2c9a4c,
    0x3c337b06, 0x3e0d4d32, 0x3e42d9f2, 0xbd24ed68, 0xbec0fb2e, 0xbaf83de5, 0xbe0e4abd, 0x3c940589,
    0xbdb5fb73, 0x3cdbca94, 0xbdea6541, 0x3ccdd1d4, 0x3d9a7281, 0x3dc2ce2b, 0x3e00d1df, 0xbec947f5,
    0xbd147d1b, 0x3e032f03, 0xbe58639f, 0x3df2798a, 0xbd240f5f, 0x3df01fc6, 0xbce09c9c, 0xbcd08699,
    0x3be8769e, 0xbf43f51c, 0xbcffba4f, 0x3f0819bb, 0xbea5253e, 0x3f41498d, 0xbf613882, 0x3f28a096,
    0xbe842209, 0xbf0cd6a1, 0xbe57e44c, 0x3d00ecdd, 0xbee93aa8, 0x3d8183c5, 0xbfdc983e, 0xbebabbf8,
    0x3c06e57b, 0xbc6b9783, 0x3b230772, 0xbcaea0f2, 0xbb038b38, 0x3a09763c, 0x3e87b87a, 0xbd7cc6e5,
    0x3d8cfeb4, 0x3ebf5658, 0xbec7e1dc, 0x3be5ea05, 0xbe47600a, 0x3d023c4e, 0x3d43873c, 0x3d17c98b,
    0x3f0847e4, 0xbfa0efad, 0x3e97bbde, 0xbcde110b, 0xbf11c55a, 0x3c977ba5, 0xc0a379a0, 0x3f1f4c6c,
    0x3c5dc1a8, 0x3dc2820b, 0x3dfd8f08, 0xbd217172, 0x3e1e4aa7, 0x3df5d070, 0xbf088c72, 0xbf8ba5c1,
]


def test_lstm_block_cell_grad_is_tf_bitwise():
    # The element-wise backward follows TF's order of operations, so the cell gradient (no GEMM involved)
    # equals TF's bit for bit, the batch sums of the peephole gradients included.
    rng = np.random.default_rng(11)
    B, I, C = 2, 3, 8

    def u(*s, lo=-1.0, hi=1.0):
        return torch.from_numpy((lo + (hi - lo) * rng.random(s)).astype(np.float32))

    x, cs_prev, h_prev, w = u(B, I), u(B, C, lo=-3, hi=3), u(B, C), u(I + C, 4 * C)
    wci, wcf, wco, b = u(C), u(C), u(C), u(4 * C)
    i, f, o = u(B, C, lo=0, hi=1), u(B, C, lo=0, hi=1), u(B, C, lo=0, hi=1)
    ci, co, cs = u(B, C), u(B, C), u(B, C, lo=-3, hi=3)
    cs_grad, h_grad = u(B, C, lo=-2, hi=2), u(B, C, lo=-2, hi=2)
    got = ops.lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad,
                                   True)
    want = torch.from_numpy(np.array(_TF_LSTM_CELL_GRAD_BITS, dtype=np.uint32).view(np.int32))
    assert torch.equal(torch.cat([g.reshape(-1) for g in got]).view(torch.int32), want)


# ================================================================================================
# BlockGRU
# ================================================================================================
@pytest.mark.parametrize("L", [4, 2, 0])
def test_block_gru_matches_reference_and_zero_tail(L):
    args = gru_inputs(B=3, I=4, C=5, T=4, seed=10)
    out = ops.block_gru(sl(L), *args)
    want = ref_block_gru(*args, L=L)
    for a, b in zip(out, want):
        close(a, b)
    for o in out:
        assert torch.count_nonzero(o[L:]) == 0


@pytest.mark.parametrize("L", [3, 1, 0])
def test_block_gru_gradcheck(L):
    args = gru_inputs(B=2, I=3, C=2, T=3, seed=11, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ops.block_gru(sl(L), *a), args)


def test_block_gru_grads_match_reference_all_outputs():
    args = gru_inputs(B=3, I=4, C=5, T=4, seed=12, requires_grad=True)
    g = torch.Generator().manual_seed(13)
    ups = [rnd(4, 3, 5, gen=g) for _ in range(4)]
    got = torch.autograd.grad(sum((o * w).sum() for o, w in zip(ops.block_gru(sl(3), *args), ups)), args)
    want = torch.autograd.grad(sum((o * w).sum() for o, w in zip(ref_block_gru(*args, L=3), ups)), args)
    for a, b in zip(got, want):
        close(a, b)
    with pytest.raises(RuntimeError, match="derivative for torchops::block_gru_grad is not implemented"):
        torch.autograd.gradgradcheck(lambda *a: ops.block_gru(sl(4), *a)[3], args, fast_mode=True)


def test_block_gru_cell_equivalence_and_batch_zero():
    args = gru_inputs(B=3, I=4, C=5, T=1, seed=14)
    a = ops.block_gru(sl(1), *args)
    b = ops.gru_block_cell(args[0][0], *args[1:])
    for p, q in zip(a, b):
        close(p[0], q, rtol=1e-14, atol=1e-14)
    args = gru_inputs(B=0, I=4, C=5, T=3, requires_grad=True)
    out = ops.block_gru(sl(3), *args)
    assert out[3].shape == (3, 0, 5)
    g = torch.autograd.grad(out[3].sum(), args)
    assert g[0].shape == (3, 0, 4) and torch.count_nonzero(g[2]) == 0


# ================================================================================================
# LSTMBlockCell
# ================================================================================================
def test_lstm_block_cell_tf_literal_values():
    # lstm_ops_test.testLSTMBlockCell: two stacked LSTMBlockCell(2), weights 0.5, b 0, forget_bias 1.
    for dtype in (torch.float32, torch.float64):
        x = torch.ones(1, 2, dtype=dtype)
        st = torch.full((1, 2), 0.1, dtype=dtype)
        w = torch.full((4, 8), 0.5, dtype=dtype)
        z2, b = torch.zeros(2, dtype=dtype), torch.zeros(8, dtype=dtype)
        _, c0, _, _, _, _, h0 = ops.lstm_block_cell(x, st, st, w, z2, z2, z2, b, 1.0, -1.0, False)
        _, c1, _, _, _, _, h1 = ops.lstm_block_cell(h0, st, st, w, z2, z2, z2, b, 1.0, -1.0, False)
        tol = dict(rtol=1e-6, atol=1e-6)
        close(c0, torch.full((1, 2), 0.68967271, dtype=dtype), **tol)
        close(h0, torch.full((1, 2), 0.44848421, dtype=dtype), **tol)
        close(c1, torch.full((1, 2), 0.39897051, dtype=dtype), **tol)
        close(h1, torch.full((1, 2), 0.24024698, dtype=dtype), **tol)


@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("cell_clip", [-1.0, 0.5])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_lstm_cell_forward_matches_reference(use_peephole, cell_clip, dtype, tol):
    args = lstm_inputs(B=3, I=4, C=5, seed=20, scale=2.0)
    out = ops.lstm_block_cell(*[a.to(dtype) for a in args], 0.7, cell_clip, use_peephole)
    want = ref_lstm_cell(*args, 0.7, cell_clip, use_peephole)
    for a, b in zip(out, want):
        close(a.double(), b, rtol=tol, atol=tol)
    if cell_clip > 0:
        assert out[1].abs().max() <= cell_clip and (out[1].abs() == cell_clip).any()  # clip active


def test_lstm_cell_defaults_v1():
    args = lstm_inputs(B=2, I=3, C=4, seed=21, scale=3.0)
    args[1] = args[1].sign() * 6.0  # |cs| > 3 for most entries: the default clip is active
    out = ops.lstm_block_cell(*args)  # forget_bias=1, cell_clip=3, no peephole
    for a, b in zip(out, ref_lstm_cell(*args, 1.0, 3.0, False)):
        close(a, b)
    assert (out[1].abs() == 3.0).any()


@pytest.mark.parametrize("use_peephole", [False, True])
def test_lstm_cell_grad_raw_op_matches_tf_formula(use_peephole):
    args = lstm_inputs(B=3, I=4, C=5, seed=22)
    x, cs_prev, h_prev, w, wci, wcf, wco, b = args
    i, cs, f, o, ci, co, h = ops.lstm_block_cell(*args, 1.0, 0.5, use_peephole)
    g = torch.Generator().manual_seed(23)
    cs_grad, h_grad = rnd(3, 5, gen=g), rnd(3, 5, gen=g)
    cs_prev_grad, dicfo, wci_g, wcf_g, wco_g = ops.lstm_block_cell_grad(*args, i, cs, f, o, ci, co, cs_grad, h_grad,
                                                                        use_peephole)
    # the LSTM cell backward, written independently
    do = o * (1 - o) * h_grad * co
    dcs = (1 - co * co) * h_grad * o + cs_grad
    if use_peephole:
        dcs = dcs + do * wco
    dci = (1 - ci * ci) * dcs * i
    df = f * (1 - f) * dcs * cs_prev
    di = i * (1 - i) * dcs * ci
    e_cs_prev = dcs * f + ((di * wci + df * wcf) if use_peephole else 0)  # peephole terms added once
    close(cs_prev_grad, e_cs_prev)
    close(dicfo, torch.cat([di, dci, df, do], 1))
    zero = torch.zeros(5, dtype=F64)
    close(wci_g, (di * cs_prev).sum(0) if use_peephole else zero)
    close(wcf_g, (df * cs_prev).sum(0) if use_peephole else zero)
    close(wco_g, (do * cs).sum(0) if use_peephole else zero)


@pytest.mark.parametrize("use_peephole", [False, True])
def test_lstm_cell_gradients_match_reference_straight_through(use_peephole):
    args = lstm_inputs(B=3, I=4, C=5, seed=24, scale=2.0, requires_grad=True)
    g = torch.Generator().manual_seed(25)
    ups = [rnd(3, 5, gen=g) for _ in range(7)]
    out = ops.lstm_block_cell(*args, 1.0, 0.5, use_peephole)
    assert (out[1].detach().abs() == 0.5).any()
    got = torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, ups)), args)
    ref = ref_lstm_cell(*args, 1.0, 0.5, use_peephole)
    want = torch.autograd.grad(sum((o * u).sum() for o, u in zip(ref, ups)), args, allow_unused=True)
    for a, b in zip(got, want):
        close(a, torch.zeros_like(a) if b is None else b)


@pytest.mark.parametrize("use_peephole", [False, True])
def test_lstm_cell_gradcheck_and_no_double_backward(use_peephole):
    args = lstm_inputs(B=2, I=3, C=2, seed=26, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: ops.lstm_block_cell(*a, 1.0, -1.0, use_peephole), args)
    with pytest.raises(RuntimeError, match="derivative for torchops::_lstm_block_cell_backward is not implemented"):
        torch.autograd.gradgradcheck(lambda *a: ops.lstm_block_cell(*a, 1.0, -1.0, use_peephole)[6], args,
                                       fast_mode=True)


def test_lstm_cell_cpu_consistency_random_sizes():
    # rnn_grad_test.testLSTMBlockCell (random B, I, C in [1, 32)), float32 op vs float64 reference.
    rs = np.random.RandomState(0)
    for peep in (False, True):
        B, I, C = (int(v) for v in rs.randint(1, 32, 3))
        args = lstm_inputs(B=B, I=I, C=C, seed=int(rs.randint(1000)))
        out = ops.lstm_block_cell(*[a.float() for a in args], 1.0, 0.0, peep)
        for a, b in zip(out, ref_lstm_cell(*args, 1.0, 0.0, peep)):
            close(a.double(), b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 8e-3), (torch.bfloat16, 4e-2)])
def test_lstm_low_precision_vs_float32(dtype, tol):
    args = lstm_inputs(B=2, I=3, C=4, T=4, seed=27, scale=0.5)
    for peep in (False, True):
        out = ops.block_lstm(sl(4), *[a.to(dtype) for a in args], 1.0, 0.5, peep)
        ref = ops.block_lstm(sl(4), *[a.to(dtype).float() for a in args], 1.0, 0.5, peep)
        for a, b in zip(out, ref):
            assert a.dtype == dtype
            close(a.float(), b, rtol=tol, atol=tol)
    cell = [a[0] if k == 0 else a for k, a in enumerate(args)]
    out = ops.lstm_block_cell(*[a.to(dtype) for a in cell], 1.0, 3.0, True)
    ref = ops.lstm_block_cell(*[a.to(dtype).float() for a in cell], 1.0, 3.0, True)
    for a, b in zip(out, ref):
        close(a.float(), b, rtol=tol, atol=tol)
    low = [a.to(dtype).requires_grad_() for a in args]
    g = torch.autograd.grad(ops.block_lstm_v2(sl(4), *low)[6].float().sum(), low)
    f32 = [a.to(dtype).float().requires_grad_() for a in args]
    gr = torch.autograd.grad(ops.block_lstm_v2(sl(4), *f32)[6].sum(), f32)
    for a, b in zip(g, gr):
        assert a.dtype == dtype
        close(a.float(), b, rtol=4 * tol, atol=4 * tol)


# ================================================================================================
# BlockLSTM / BlockLSTMV2
# ================================================================================================
@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("L", [4, 2, 0])
def test_block_lstm_forward_matches_reference(v2, use_peephole, L):
    args = lstm_inputs(B=2, I=3, C=4, T=4, seed=30, scale=2.0)
    if v2:
        out = ops.block_lstm_v2(sl(L), *args, 0.5, use_peephole)
        want = ref_block_lstm(*args, 0.0, 0.5, use_peephole, True, L=L)
    else:
        out = ops.block_lstm(sl(L), *args, 0.8, 0.5, use_peephole)
        want = ref_block_lstm(*args, 0.8, 0.5, use_peephole, False, L=L)
    for a, b in zip(out, want):
        close(a, b)
    for o in out:  # all seven outputs are zero beyond seq_len_max
        assert torch.count_nonzero(o[L:]) == 0
    if L > 0:
        assert (out[1][:L].abs() == 0.5).any()


def test_block_lstm_v1_v2_defaults():
    args = lstm_inputs(B=2, I=3, C=4, T=3, seed=31, scale=3.0)
    args[1] = args[1].sign() * 6.0  # large initial cell state: |cs| > 3 without clipping
    v1 = ops.block_lstm(sl(3), *args)  # forget_bias 1, cell_clip 3
    for a, b in zip(v1, ref_block_lstm(*args, 1.0, 3.0, False, False)):
        close(a, b)
    v2 = ops.block_lstm_v2(sl(3), *args)  # no forget bias, no clip
    for a, b in zip(v2, ref_block_lstm(*args, 0.0, 0.0, False, True)):
        close(a, b)
    assert v2[1].abs().max() > 3.0 and v1[1].abs().max() == 3.0


def icfo_to_ifco(t):
    C = t.shape[-1] // 4
    i, c, f, o = (t[..., k * C:(k + 1) * C] for k in range(4))
    return torch.cat([i, f, c, o], -1)


def test_block_lstm_v1_v2_consistency():
    # rnn_grad_test.testBlockLSTMV1V2Consistency: T=1, B=1, I=1, C=8; V1 forget_bias 0, cell_clip 0.
    g = torch.Generator().manual_seed(32)
    x, cs, h = torch.rand(1, 1, 1, generator=g), torch.rand(1, 8, generator=g), torch.rand(1, 8, generator=g)
    w, b = torch.rand(9, 32, generator=g), torch.rand(32, generator=g)
    p = [torch.rand(8, generator=g) for _ in range(3)]
    v1 = [t.requires_grad_() for t in (x, cs, h, w, b)]
    v2 = [t.detach().clone().requires_grad_() for t in (x, cs, h)] + [
        icfo_to_ifco(w).requires_grad_(), icfo_to_ifco(b).requires_grad_()]
    o1 = ops.block_lstm(sl(1), v1[0], v1[1], v1[2], v1[3], *p, v1[4], 0.0, 0.0, False)
    o2 = ops.block_lstm_v2(sl(1), v2[0], v2[1], v2[2], v2[3], *p, v2[4], 0.0, False)
    torch.testing.assert_close(o1[1], o2[1], rtol=2e-7, atol=0)
    torch.testing.assert_close(o1[6], o2[6], rtol=2e-7, atol=0)
    g1 = torch.autograd.grad(o1[1].sum() + o1[6].sum(), v1)
    g2 = torch.autograd.grad(o2[1].sum() + o2[6].sum(), v2)
    close(icfo_to_ifco(g1[3]), g2[3], rtol=1e-6, atol=1e-6)  # V2's gradient is V1's with the gate blocks permuted, not equal
    close(icfo_to_ifco(g1[4]), g2[4], rtol=1e-6, atol=1e-6)
    for a, b in zip(g1[:3], g2[:3]):
        close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("use_peephole", [False, True])
def test_block_lstm_grads_match_reference_all_outputs(v2, use_peephole):
    args = lstm_inputs(B=2, I=3, C=4, T=4, seed=33, scale=2.0, requires_grad=True)
    g = torch.Generator().manual_seed(34)
    ups = [rnd(4, 2, 4, gen=g) for _ in range(7)]
    if v2:
        out = ops.block_lstm_v2(sl(3), *args, 0.5, use_peephole)
        ref = ref_block_lstm(*args, 0.0, 0.5, use_peephole, True, L=3)
    else:
        out = ops.block_lstm(sl(3), *args, 1.0, 0.5, use_peephole)
        ref = ref_block_lstm(*args, 1.0, 0.5, use_peephole, False, L=3)
    for only_cs_h in (False, True):
        pairs = [(o, r, u) for k, (o, r, u) in enumerate(zip(out, ref, ups)) if not only_cs_h or k in (1, 6)]
        got = torch.autograd.grad(sum((o * u).sum() for o, _, u in pairs), args, retain_graph=True)
        want = torch.autograd.grad(sum((r * u).sum() for _, r, u in pairs), args, retain_graph=True,
                                   allow_unused=True)
        for a, b in zip(got, want):
            close(a, torch.zeros_like(a) if b is None else b)


def _outputs_and_grads_match(out, ref, args, ups):
    for a, b in zip(out, ref):
        close(a, b)
    got = torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, ups)), args)
    want = torch.autograd.grad(sum((r * u).sum() for r, u in zip(ref, ups)), args)
    for a, b in zip(got, want):
        close(a, b)


@pytest.mark.parametrize("threads", [1, 3, 4, 8])
def test_sequence_ops_batch_slices_per_thread(threads, restore_threads):
    # On the CPU the time loops run one slice of the batch per intra-op thread (B = 5: slices of 2, 2, 1 or
    # 2, 2, 1 and an empty one, or one row each): forward and all gradients against the references, with
    # every output and gate gradient in use, and float32 (packed recurrent GEMM per slice) against float64.
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(71)
    args = lstm_inputs(B=5, I=3, C=4, T=4, seed=70, requires_grad=True)
    ups = [rnd(4, 5, 4, gen=g) for _ in range(7)]
    _outputs_and_grads_match(ops.block_lstm(sl(3), *args, 1.0, 0.5, True),
                             ref_block_lstm(*args, 1.0, 0.5, True, False, L=3), args, ups)
    f32 = [a.detach().float().requires_grad_() for a in args]
    out32 = ops.block_lstm(sl(4), *f32, 1.0, 0.5, True)
    ref32 = ref_block_lstm(*args, 1.0, 0.5, True, False, L=4)
    for a, b in zip(out32, ref32):
        close(a.double(), b, rtol=1e-5, atol=1e-5)
    gargs = gru_inputs(B=5, I=3, C=4, T=4, seed=72, requires_grad=True)
    gups = [rnd(4, 5, 4, gen=g) for _ in range(4)]
    _outputs_and_grads_match(ops.block_gru(sl(4), *gargs), ref_block_gru(*gargs, L=4), gargs, gups)


@pytest.mark.parametrize("v2", [False, True])
def test_block_lstm_grad_raw_ops_match_reference(v2):
    args = lstm_inputs(B=2, I=3, C=4, T=3, seed=35, requires_grad=True)
    op, grad_op = (ops.block_lstm_v2, ops.block_lstm_grad_v2) if v2 else (ops.block_lstm, ops.block_lstm_grad)
    attrs = (0.0, True) if v2 else (1.0, 0.0, True)
    out = op(sl(3), *args, *attrs)
    g = torch.Generator().manual_seed(36)
    cs_grad, h_grad = rnd(3, 2, 4, gen=g), rnd(3, 2, 4, gen=g)
    raw = grad_op(sl(3), *[a.detach() for a in args], *[o.detach() for o in out], cs_grad, h_grad, True)
    ref = ref_block_lstm(*args, 0.0 if v2 else 1.0, 0.0, True, v2)
    want = torch.autograd.grad((ref[1] * cs_grad).sum() + (ref[6] * h_grad).sum(), args)
    for a, b in zip(raw, want):
        close(a, b)


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("L", [3, 1, 0])
def test_block_lstm_gradcheck(v2, L):
    args = lstm_inputs(B=2, I=2, C=2, T=3, seed=37, requires_grad=True)
    if v2:
        fn = lambda *a: ops.block_lstm_v2(sl(L), *a, 0.0, True)  # noqa: E731
    else:
        fn = lambda *a: ops.block_lstm(sl(L), *a, 1.0, -1.0, True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args)
    if L == 3:
        with pytest.raises(RuntimeError, match="is not implemented"):
            torch.autograd.gradgradcheck(lambda *a: fn(*a)[6], args, fast_mode=True)


def test_block_lstm_batch_zero_and_c_zero():
    args = lstm_inputs(B=0, I=3, C=4, T=2, requires_grad=True)
    out = ops.block_lstm_v2(sl(2), *args)
    assert out[6].shape == (2, 0, 4)
    g = torch.autograd.grad(out[6].sum(), args)
    assert g[0].shape == (2, 0, 3) and torch.count_nonzero(g[3]) == 0
    args = lstm_inputs(B=3, I=2, C=0, T=2)
    assert ops.block_lstm(sl(2), *args)[6].shape == (2, 3, 0)


def _odd_strides(t):
    """The same values with every size-1 dimension given stride 1: still "contiguous" to PyTorch, but
    not a valid BLAS leading dimension (found by fuzzing: MKL's packed GEMM rejected it and the
    recurrent GEMM read garbage)."""
    return t.as_strided(t.shape, [1] * t.dim()) if t.numel() == max(t.shape, default=1) else t


@pytest.mark.parametrize("I,C", [(0, 1), (1, 2)])  # odd strides on the weights / on h_prev and cs_prev
def test_sequences_with_size_one_dims_and_odd_strides(I, C):
    T, B = 3, 1
    largs = [a.float() for a in lstm_inputs(B=B, I=I, C=C, T=T, seed=38)]
    odd = [_odd_strides(a.clone()) for a in largs]
    assert any(a.stride() != b.stride() for a, b in zip(odd, largs))
    for op, ifco in ((ops.block_lstm, False), (ops.block_lstm_v2, True)):
        ins = [a.clone().requires_grad_() for a in odd]
        out = op(sl(T), *ins)
        want = ref_block_lstm(*[a.double() for a in largs], *((1.0, 3.0) if not ifco else (0.0, 0.0)), False, ifco)
        for a, b in zip(out, want):
            close(a.double(), b, rtol=1e-5, atol=1e-6)
        grads = torch.autograd.grad(out[6].sum(), ins)
        ref_ins = [a.double().requires_grad_() for a in largs]
        ref_out = ref_block_lstm(*ref_ins, *((1.0, 3.0) if not ifco else (0.0, 0.0)), False, ifco)
        ref_grads = torch.autograd.grad(ref_out[6].sum(), ref_ins, allow_unused=True)  # no peepholes: wc* unused
        for a, b, r in zip(grads, ref_grads, ref_ins):
            close(a.double(), torch.zeros_like(r) if b is None else b, rtol=1e-5, atol=1e-6)
    gargs = [a.float() for a in gru_inputs(B=B, I=I, C=C, T=T, seed=39)]
    ins = [_odd_strides(a.clone()).requires_grad_() for a in gargs]
    out = ops.block_gru(sl(T), *ins)
    ref_ins = [a.double().requires_grad_() for a in gargs]
    want = ref_block_gru(*ref_ins)
    for a, b in zip(out, want):
        close(a.double(), b, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(out[3].sum(), ins), torch.autograd.grad(want[3].sum(), ref_ins)):
        close(a.double(), b, rtol=1e-5, atol=1e-6)


# ================================================================================================
# Errors (type and message)
# ================================================================================================
def _replaced(args, k, v):
    """args with its k-th entry replaced by v (one bad argument per error case)."""
    a = list(args)
    a[k] = v
    return a


def _gru_err_cases():
    B, I, C = 2, 3, 4
    good = gru_inputs(B=B, I=I, C=C)
    z = torch.zeros
    with_ = lambda k, v: _replaced(good, k, v)  # noqa: E731
    return [
        (with_(0, z(B * I, dtype=F64)), "Rank of x must be 2, got 1"),
        (with_(1, z(C, dtype=F64)), "Rank of h_prev must be 2, got 1"),
        (with_(1, z(B + 1, C, dtype=F64)), r"h_prev.dims\(0\) != batch_size: 3 vs. 2"),
        (with_(2, z(I + C, dtype=F64)), "Rank of w_ru must be 2, got 1"),
        (with_(2, z(I + C + 1, 2 * C, dtype=F64)), r"w_ru.dim_size\(0\) != input_size \+ cell_size: 8 vs. 7"),
        (with_(2, z(I + C, 2 * C + 1, dtype=F64)), r"w_ru.dim_size\(1\) != cell_size \* 2: 9 vs. 8"),
        (with_(3, z(I + C, dtype=F64)), "Rank of w_c must be 2, got 1"),
        (with_(3, z(I + C - 1, C, dtype=F64)), r"w_c.dim_size\(0\) != input_size \+ cell_size: 6 vs. 7"),
        (with_(3, z(I + C, C + 1, dtype=F64)), r"w_c.dim_size\(1\) != cell_size: 5 vs. 4"),
        (with_(4, z(1, 2 * C, dtype=F64)), "Rank of b_ru must be 1, got 2"),
        (with_(4, z(C, dtype=F64)), r"b_ru.dim_size\(0\) != cell_size \* 2: 4 vs. 8"),
        (with_(5, z(1, C, dtype=F64)), "Rank of b_c must be 1, got 2"),
        (with_(5, z(C + 2, dtype=F64)), r"b_c.dim_size\(0\) != cell_size: 6 vs. 4"),
        (with_(3, z(I + C, C, dtype=torch.float32)), r"w_c must have the same dtype as x \(Double\), got Float"),
        ([a.int() for a in good], "x must be float32, float64, float16 or bfloat16, got Int"),
    ]


@pytest.mark.parametrize("case", range(15))
def test_gru_cell_errors(case):
    args, msg = _gru_err_cases()[case]
    with pytest.raises(RuntimeError, match=msg):
        ops.gru_block_cell(*args)


def test_gru_cell_grad_errors():
    args = gru_inputs(B=2, I=3, C=4)
    r, u, c, h = ops.gru_block_cell(*args)
    bad = torch.zeros(2, 5, dtype=F64)
    with pytest.raises(RuntimeError, match=r"Rank of r must be 2, got 1"):
        ops.gru_block_cell_grad(*args, r[0], u, c, h)
    with pytest.raises(RuntimeError, match=r"u.dims\(1\) != cell_size: 5 vs. 4"):
        ops.gru_block_cell_grad(*args, r, bad, c, h)
    with pytest.raises(RuntimeError, match=r"Rank of c must be 2, got 3"):
        ops.gru_block_cell_grad(*args, r, u, c[None], h)
    with pytest.raises(RuntimeError, match=r"d_h.dims\(0\) != batch_size: 1 vs. 2"):
        ops.gru_block_cell_grad(*args, r, u, c, h[:1])
    with pytest.raises(RuntimeError, match=r"Rank of w_ru must be 2, got 1"):
        ops.gru_block_cell_grad(args[0], args[1], args[2][0], *args[3:], r, u, c, h)


def test_block_gru_errors():
    args = gru_inputs(B=2, I=3, C=4, T=3)
    with pytest.raises(RuntimeError, match="`seq_len_max_tensor` must be rank 0 but is rank 1"):
        ops.block_gru(torch.tensor([3]), *args)
    with pytest.raises(RuntimeError, match="seq_len_max must be between 0 and 3 but is 4"):
        ops.block_gru(sl(4), *args)
    with pytest.raises(RuntimeError, match="seq_len_max must be between 0 and 3 but is -1"):
        ops.block_gru(sl(-1), *args)
    with pytest.raises(RuntimeError, match="seq_len_max must be an int64 tensor, got Int"):
        ops.block_gru(torch.tensor(3, dtype=torch.int32), *args)
    with pytest.raises(RuntimeError, match="x must be 3D, got rank 2"):
        ops.block_gru(sl(3), args[0][0], *args[1:])
    out = ops.block_gru(sl(3), *args)
    with pytest.raises(RuntimeError, match=r"h must have shape \[3, 2, 4\], got \[2, 2, 4\]"):
        ops.block_gru_grad(sl(3), *args, out[0], out[1], out[2], out[3][:2], out[3])
    with pytest.raises(RuntimeError, match=r"r_grad must have shape \[3, 2, 4\]"):
        ops.block_gru_grad(sl(3), *args, *out, out[3], out[3][:1])


def _lstm_cell_err_cases():
    B, I, C = 2, 3, 4
    good = lstm_inputs(B=B, I=I, C=C)
    z = torch.zeros
    with_ = lambda k, v: _replaced(good, k, v)  # noqa: E731
    return [
        (with_(0, z(B * I, dtype=F64)), r"x_tensor must be rank 2 but is rank 1\."),
        (with_(1, z(B, C, 1, dtype=F64)), "cs_prev_tensor must be rank 2 but is rank 3"),
        (with_(2, z(C, dtype=F64)), "h_prev_tensor must be rank 2 but is rank 1"),
        (with_(3, z(4 * C, dtype=F64)), "w_tensor must be rank 2 but is rank 1"),
        (with_(4, z((), dtype=F64)), "wci_tensor must be rank 1 but is rank 0"),  # TF testLSTMBlockCellErrorHandling
        (with_(6, z(28, 17, dtype=F64)), "wco_tensor must be rank 1 but is rank 2"),
        (with_(7, z(1, 4 * C, dtype=F64)), "b_tensor must be rank 1 but is rank 2"),
        (with_(1, z(B + 1, C, dtype=F64)), r"cs_prev.dims\(0\) != batch_size: 3 vs. 2"),
        (with_(2, z(B, C + 1, dtype=F64)), r"h_prev.dims\(1\) != cell_size: 5 vs. 4"),
        (with_(2, z(B - 1, C, dtype=F64)), r"h_prev.dims\(0\) != batch_size: 1 vs. 2"),
        (with_(3, z(I + C + 1, 4 * C, dtype=F64)), r"w.dim_size\(0\) != input_size \+ cell_size: 8 vs. 7"),
        (with_(3, z(I + C, 4 * C - 1, dtype=F64)),
         r"w.dim_size\(1\) must be a multiple of 4 \(4 \* cell_size\), got 15"),
        (with_(7, z(4 * C + 1, dtype=F64)), r"b.dim_size\(0\) != cell_size \* 4: 17 vs. 16"),
        (with_(5, z(C + 1, dtype=F64)), r"wcf.dim_size\(0\) != cell_size: 5 vs. 4"),  # peephole sizes are checked
        (with_(0, z(B, I, dtype=torch.float32)), r"wci must have the same dtype as x \(Float\), got Double"),
    ]


@pytest.mark.parametrize("case", range(15))
def test_lstm_cell_errors(case):
    args, msg = _lstm_cell_err_cases()[case]
    with pytest.raises(RuntimeError, match=msg):
        ops.lstm_block_cell(*args)


def test_lstm_cell_empty_and_grad_errors():
    # testLSTMBlockCellEmptyInputRaisesError (half, cs_prev [2, 0])
    h = torch.float16
    args = [torch.zeros(2, 3, dtype=h), torch.zeros(2, 0, dtype=h), torch.zeros(2, 0, dtype=h),
            torch.zeros(3, 0, dtype=h), *[torch.zeros(0, dtype=h)] * 4]
    with pytest.raises(RuntimeError, match="is empty"):
        ops.lstm_block_cell(*args)
    args = lstm_inputs(B=2, I=3, C=4)
    out = ops.lstm_block_cell(*args)
    with pytest.raises(RuntimeError, match="must be rank 2"):  # rnn_grad_test invalid rank, grad op
        ops.lstm_block_cell_grad(args[0][0], *args[1:], *out[:6], out[1], out[6], False)
    with pytest.raises(RuntimeError, match=r"f.dim_size\(1\) != cell_size: 3 vs. 4"):
        ops.lstm_block_cell_grad(*args, out[0], out[1], out[2][:, :3], *out[3:6], out[1], out[6], False)
    with pytest.raises(RuntimeError, match=r"h_grad_tensor.dims\(0\) != batch_size: 1 vs. 2"):
        ops.lstm_block_cell_grad(*args, *out[:6], out[1], out[6][:1], False)


def test_block_lstm_errors():
    args = lstm_inputs(B=2, I=3, C=4, T=3)
    with pytest.raises(RuntimeError, match="`seq_len_max_tensor` must be rank 0 but is rank 3"):
        # testLSTMBlockInvalidArgument: seq_len_max [13, 11, 0], C = 0
        ops.block_lstm(torch.zeros(13, 11, 0, dtype=torch.int64), torch.zeros(1, 3, 12), torch.zeros(3, 0),
                       torch.zeros(3, 0), torch.zeros(12, 0), torch.zeros(0), torch.zeros(0), torch.zeros(0),
                       torch.zeros(0))
    with pytest.raises(RuntimeError, match="seq_len_max must be between 0 and 3 but is 5"):
        ops.block_lstm_v2(sl(5), *args)
    with pytest.raises(RuntimeError, match="seq_len_max must be between 0 and 3 but is -2"):
        ops.block_lstm(sl(-2), *args)
    with pytest.raises(RuntimeError, match="x must be 3D"):
        ops.block_lstm(sl(3), args[0][0], *args[1:])
    with pytest.raises(RuntimeError, match="cs_prev must be 2D"):
        ops.block_lstm(sl(3), args[0], args[1][0], *args[2:])
    with pytest.raises(RuntimeError, match=r"wco.dim_size\(0\) != cell_size: 3 vs. 4"):
        ops.block_lstm(sl(3), *args[:6], args[6][:3], args[7])
    with pytest.raises(RuntimeError, match=r"b.dim_size\(0\) != cell_size \* 4: 15 vs. 16"):
        ops.block_lstm(sl(3), *args[:7], args[7][:15])


def test_block_lstm_grad_errors():
    args = lstm_inputs(B=2, I=3, C=4, T=3)
    out = ops.block_lstm_v2(sl(3), *args)
    gr = (out[1], out[6], False)
    with pytest.raises(RuntimeError, match="must be rank"):  # testLSTMBlockCellGradErrorHandling
        ops.block_lstm_grad_v2(sl(3), args[0], args[1][None], *args[2:], *out, *gr)
    with pytest.raises(RuntimeError, match="x must be rank 3 but is rank 2"):
        ops.block_lstm_grad(sl(3), args[0][0], *args[1:], *out, *gr)
    with pytest.raises(RuntimeError, match="w matrix columns must be a positive multiple of 4, but got 15"):
        ops.block_lstm_grad(sl(3), *args[:3], args[3][:, :15], *args[4:], *out, *gr)
    with pytest.raises(RuntimeError, match="w matrix columns must be a positive multiple of 4, but got 0"):
        ops.block_lstm_grad(sl(3), *args[:3], args[3][:, :0], *args[4:], *out, *gr)
    with pytest.raises(RuntimeError, match="w matrix rows don't match: 7 vs. 6"):
        ops.block_lstm_grad(sl(3), *args[:3], args[3][:6], *args[4:], *out, *gr)
    with pytest.raises(RuntimeError, match="w and b cell_size don't match"):
        ops.block_lstm_grad(sl(3), *args[:7], args[7][:12], *out, *gr)
    with pytest.raises(RuntimeError, match=r"o must be rank 3. Received: 2"):
        ops.block_lstm_grad(sl(3), *args, *out[:3], out[3][0], *out[4:], *gr)
    with pytest.raises(RuntimeError, match=r"h_grad must have shape \[3, 2, 4\], got \[3, 2, 3\]"):
        ops.block_lstm_grad(sl(3), *args, *out, out[1], out[6][..., :3], False)
    with pytest.raises(RuntimeError, match=r"wci must have shape \[4\], got \[5\]"):
        ops.block_lstm_grad(sl(3), *args[:4], torch.zeros(5, dtype=F64), *args[5:], *out, *gr)
    with pytest.raises(RuntimeError, match="seq_len_max must be between 0 and 3 but is 4"):
        ops.block_lstm_grad(sl(4), *args, *out, *gr)
    with pytest.raises(RuntimeError, match="`seq_len_max_tensor` must be rank 0 but is rank 1"):
        ops.block_lstm_grad(sl(3)[None], *args, *out, *gr)


# ================================================================================================
# opcheck, torch.compile, TorchScript, Python autograd Functions
# ================================================================================================
def _opcheck_cases():
    gi = gru_inputs(B=2, I=3, C=2, seed=40, requires_grad=True)
    gs = gru_inputs(B=2, I=3, C=2, T=3, seed=41, requires_grad=True)
    li = lstm_inputs(B=2, I=3, C=2, seed=42, requires_grad=True)
    ls = lstm_inputs(B=2, I=3, C=2, T=3, seed=43, requires_grad=True)
    det = lambda ts: [t.detach() for t in ts]  # noqa: E731
    gc = det(ops.gru_block_cell(*gi))
    gq = det(ops.block_gru(sl(2), *gs))
    lc = det(ops.lstm_block_cell(*li, 1.0, 0.5, True))
    lq = det(ops.block_lstm(sl(2), *ls, 1.0, 0.5, True))
    d2 = torch.ones(2, 2, dtype=F64)
    d3 = torch.ones(3, 2, 2, dtype=F64)
    return {
        "gru_block_cell": (ops.gru_block_cell.default, gi),
        "gru_block_cell_grad": (ops.gru_block_cell_grad.default, det(gi) + gc[:3] + [d2]),
        "_gru_block_cell_backward": (ops._gru_block_cell_backward.default, det(gi)[:4] + gc[:3] + [d2, None, d2, d2]),
        "block_gru": (ops.block_gru.default, [sl(2)] + gs),
        "block_gru_grad": (ops.block_gru_grad.default, [sl(2)] + det(gs) + gq + [d3, d3, None, d3]),
        "lstm_block_cell": (ops.lstm_block_cell.default, li + [1.0, 0.5, True]),
        "lstm_block_cell_grad": (ops.lstm_block_cell_grad.default, det(li) + lc[:6] + [d2, d2, True]),
        "_lstm_block_cell_backward": (ops._lstm_block_cell_backward.default,
                                      det(li) + lc[:6] + [d2, None, d2, None, d2, d2, None, True]),
        "block_lstm": (ops.block_lstm.default, [sl(2)] + ls + [1.0, 0.5, True]),
        "block_lstm_v2": (ops.block_lstm_v2.default, [sl(3)] + ls + [0.0, False]),
        "block_lstm_grad": (ops.block_lstm_grad.default, [sl(2)] + det(ls) + lq + [d3, d3, True]),
        "block_lstm_grad_v2": (ops.block_lstm_grad_v2.default, [sl(2)] + det(ls) + lq + [d3, d3, False]),
        "_block_lstm_backward": (ops._block_lstm_backward.default,
                                 [sl(2)] + det(ls) + lq + [None, d3, d3, None, None, d3, None, True, True]),
    }


@pytest.mark.parametrize("name", sorted(_opcheck_cases()))
def test_opcheck(name):
    op, args = _opcheck_cases()[name]
    torch.library.opcheck(op, tuple(args))


def _compile_cases():
    gi = gru_inputs(B=2, I=3, C=4, seed=50, requires_grad=True)
    gs = gru_inputs(B=2, I=3, C=4, T=3, seed=51, requires_grad=True)
    li = lstm_inputs(B=2, I=3, C=4, seed=52, requires_grad=True)
    ls = lstm_inputs(B=2, I=3, C=4, T=3, seed=53, requires_grad=True)
    return {
        "gru_block_cell": (lambda *a: sum(o.sum() for o in ops.gru_block_cell(*a)), gi),
        "block_gru": (lambda *a: ops.block_gru(sl(2), *a)[3].pow(2).sum(), gs),
        "lstm_block_cell": (lambda *a: ops.lstm_block_cell(*a, 1.0, 0.5, True)[6].sum(), li),
        "block_lstm": (lambda *a: ops.block_lstm(sl(3), *a, 1.0, 3.0, True)[1].sum(), ls),
        "block_lstm_v2": (lambda *a: sum(o.sum() for o in ops.block_lstm_v2(sl(3), *a)), ls),
    }


@pytest.mark.parametrize("name", sorted(_compile_cases()))
def test_compile_matches_eager(name):
    fn, args = _compile_cases()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    lc = compiled(*args)
    gc = torch.autograd.grad(lc, args)
    le = fn(*args)
    ge = torch.autograd.grad(le, args)
    close(lc, le)
    for a, b in zip(gc, ge):
        close(a, b)


def test_torchscript_gru_and_lstm_backprop():
    @torch.jit.script
    def gru_loss(x: torch.Tensor, h: torch.Tensor, w_ru: torch.Tensor, w_c: torch.Tensor, b_ru: torch.Tensor,
                 b_c: torch.Tensor) -> torch.Tensor:
        r, u, c, hn = torch.ops.torchops.gru_block_cell(x, h, w_ru, w_c, b_ru, b_c)
        return (hn * hn).sum() + r.sum()

    @torch.jit.script
    def lstm_loss(s: torch.Tensor, x: torch.Tensor, cs: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                  wci: torch.Tensor, wcf: torch.Tensor, wco: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = torch.ops.torchops.block_lstm_v2(s, x, cs, h, w, wci, wcf, wco, b, 0.0, True)
        return out[6].sum() + out[1].sum()

    args = gru_inputs(B=2, I=3, C=4, seed=60, requires_grad=True)
    g = torch.autograd.grad(gru_loss(*args), args)
    r, u, c, hn = ref_gru_cell(*args)
    want = torch.autograd.grad((hn * hn).sum() + r.sum(), args)
    for a, b in zip(g, want):
        close(a, b)
    args = lstm_inputs(B=2, I=3, C=4, T=3, seed=61, requires_grad=True)
    g = torch.autograd.grad(lstm_loss(sl(3), *args), args)
    ref = ref_block_lstm(*args, 0.0, 0.0, True, True)
    want = torch.autograd.grad(ref[6].sum() + ref[1].sum(), args)
    for a, b in zip(g, want):
        close(a, b)


def test_torchscript_functional_wrappers():
    from torchops.functional import block_rnn as F
    scripted = torch.jit.script(F.block_lstm)
    args = lstm_inputs(B=2, I=3, C=4, T=3, seed=62)
    x, cs, h, w, wci, wcf, wco, b = args
    got = scripted(x, cs, h, w, b, wci, wcf, wco, 1.0, 0.5, True, 2)
    for a, e in zip(got, ref_block_lstm(*args, 1.0, 0.5, True, False, L=2)):
        close(a, e)
    sg = torch.jit.script(F.block_gru)
    gi = gru_inputs(B=2, I=3, C=4, T=3, seed=63)
    for a, e in zip(sg(*gi), ref_block_gru(*gi)):
        close(a, e)


def test_python_autograd_functions_agree_with_cpp():
    from torchops import autograd as A
    g = torch.Generator().manual_seed(70)
    cases = [
        (A.GRUBlockCell.apply, ops.gru_block_cell, gru_inputs(B=2, I=3, C=4, seed=71, requires_grad=True), (), 4),
        (A.BlockGRU.apply, ops.block_gru, gru_inputs(B=2, I=3, C=4, T=3, seed=72, requires_grad=True), (sl(2),), 4),
        (A.LSTMBlockCell.apply, ops.lstm_block_cell, lstm_inputs(B=2, I=3, C=4, seed=73, requires_grad=True),
         (), 7),
        (A.BlockLSTM.apply, ops.block_lstm, lstm_inputs(B=2, I=3, C=4, T=3, seed=74, requires_grad=True),
         (sl(3),), 7),
        (A.BlockLSTMV2.apply, ops.block_lstm_v2, lstm_inputs(B=2, I=3, C=4, T=3, seed=75, requires_grad=True),
         (sl(2),), 7),
    ]
    for py, cpp, args, pre, n in cases:
        extra = (1.0, 0.5, True) if n == 7 and cpp is not ops.block_lstm_v2 else ((0.5, True) if n == 7 else ())
        ups = [rnd(*o.shape, gen=g) for o in cpp(*pre, *args, *extra)]
        for subset in (range(n), [n - 1]):
            grads = []
            for fn in (py, cpp):
                out = fn(*pre, *args, *extra)
                loss = sum((out[k] * ups[k]).sum() for k in subset)
                grads.append(torch.autograd.grad(loss, args))
            for a, b in zip(*grads):
                close(a, b, rtol=0, atol=0)


# ================================================================================================
# CUDA parity (skipped without a GPU)
# ================================================================================================
@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cuda_parity_gru(dtype):
    tol = 1e-5 if dtype in (torch.float32, torch.float64) else 2e-2
    args = gru_inputs(B=3, I=4, C=5, T=4, seed=80, scale=0.5)
    cpu = [a.to(dtype).requires_grad_() for a in args]
    gpu = [a.to(dtype).cuda().requires_grad_() for a in args]
    oc = ops.block_gru(sl(3), *cpu)
    og = ops.block_gru(sl(3), *gpu)
    for a, b in zip(oc, og):
        close(a.float(), b.float().cpu(), rtol=tol, atol=tol)
    gc = torch.autograd.grad(sum(o.float().sum() for o in oc), cpu)
    gg = torch.autograd.grad(sum(o.float().sum() for o in og), gpu)
    for a, b in zip(gc, gg):
        close(a.float(), b.float().cpu(), rtol=10 * tol, atol=10 * tol)
    cell_c = ops.gru_block_cell(*[a[0] if k == 0 else a for k, a in enumerate(cpu)])
    cell_g = ops.gru_block_cell(*[a[0] if k == 0 else a for k, a in enumerate(gpu)])
    for a, b in zip(cell_c, cell_g):
        close(a.float(), b.float().cpu(), rtol=tol, atol=tol)


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("use_peephole", [False, True])
def test_cuda_parity_lstm(dtype, use_peephole):
    tol = 1e-5 if dtype in (torch.float32, torch.float64) else 2e-2
    args = lstm_inputs(B=3, I=4, C=5, T=4, seed=81, scale=0.5)
    cpu = [a.to(dtype).requires_grad_() for a in args]
    gpu = [a.to(dtype).cuda().requires_grad_() for a in args]
    for op, attrs in ((ops.block_lstm, (1.0, 0.3, use_peephole)), (ops.block_lstm_v2, (0.3, use_peephole))):
        oc = op(sl(3), *cpu, *attrs)
        og = op(sl(3), *gpu, *attrs)  # seq_len_max stays a CPU tensor
        for a, b in zip(oc, og):
            close(a.float(), b.float().cpu(), rtol=tol, atol=tol)
        gc = torch.autograd.grad(sum(o.float().sum() for o in oc), cpu)
        gg = torch.autograd.grad(sum(o.float().sum() for o in og), gpu)
        for a, b in zip(gc, gg):
            close(a.float(), b.float().cpu(), rtol=10 * tol, atol=10 * tol)
    cell = lambda ts: [a[0] if k == 0 else a for k, a in enumerate(ts)]  # noqa: E731
    oc = ops.lstm_block_cell(*cell(cpu), 1.0, 0.3, use_peephole)
    og = ops.lstm_block_cell(*cell(gpu), 1.0, 0.3, use_peephole)
    for a, b in zip(oc, og):
        close(a.float(), b.float().cpu(), rtol=tol, atol=tol)
    # raw grad op on the device (peephole terms added once)
    rc = ops.lstm_block_cell_grad(*[t.detach() for t in cell(cpu)], *[o.detach() for o in oc[:6]],
                                  oc[1].detach(), oc[6].detach(), use_peephole)
    rg = ops.lstm_block_cell_grad(*[t.detach() for t in cell(gpu)], *[o.detach() for o in og[:6]],
                                  og[1].detach(), og[6].detach(), use_peephole)
    for a, b in zip(rc, rg):
        close(a.float(), b.float().cpu(), rtol=10 * tol, atol=10 * tol)


# CUDA whole-sequence recurrences: the persistent kernels (route block_rnn.cuda.persistent) and
# the per-step loop (0) against the float64 CPU ops, every output and every gradient.
PERSISTENT_CASES = [  # T, L (seq_len_max), B, I, C, use_peephole, cell_clip
    (50, 50, 32, 128, 256, True, 0.5),  # the benchmark shapes
    (100, 100, 64, 512, 512, True, 0.5),
    (7, 7, 3, 5, 13, True, 0.5),  # C a multiple of no tile size
    (7, 7, 3, 5, 13, False, -1.0),
    (7, 4, 3, 5, 13, True, 0.5),  # seq_len_max < T: steps >= L zero
    (1, 1, 1, 1, 1, True, 0.5),
    (5, 5, 4, 8, 1024, True, 0.5),
    (3, 3, 2, 4, 2048, True, 0.5),  # weight slices too large for shared memory: read through L2
]


def _sequence_results(op, T, L, B, I, C, peephole, clip, device, dtype, seed=120):
    """Outputs, autograd gradients (random weights on every output) and the raw grad op's results of one
    sequence op on `device` in `dtype`, from float64 inputs of a 1/sqrt(fan-in) scale; as float64 CPU tensors."""
    scale = (21 / (I + C)) ** 0.5
    make = gru_inputs if op == "block_gru" else lstm_inputs
    args = [a.to(device=device, dtype=dtype).requires_grad_() for a in make(B=B, I=I, C=C, T=T, seed=seed,
                                                                              scale=scale)]
    s = sl(L)
    if op == "block_gru":
        out = ops.block_gru(s, *args)
    elif op == "block_lstm":
        out = ops.block_lstm(s, *args, 0.3, clip, peephole)
    else:
        out = ops.block_lstm_v2(s, *args, clip, peephole)
    g = torch.Generator().manual_seed(seed + 1)
    ups = [torch.rand(o.shape, dtype=F64, generator=g).to(device=device, dtype=dtype) for o in out]
    grads = torch.autograd.grad(sum((o * u).sum() for o, u in zip(out, ups)), args)
    det, outd = [a.detach() for a in args], [o.detach() for o in out]
    if op == "block_gru":
        raw = ops.block_gru_grad(s, *det, *outd, ups[3])
    else:
        grad_op = ops.block_lstm_grad if op == "block_lstm" else ops.block_lstm_grad_v2
        raw = grad_op(s, *det, *outd, ups[1], ups[6], peephole)
    return [t.detach().double().cpu() for t in (*out, *grads, *raw)]


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("op", ["block_lstm", "block_lstm_v2", "block_gru"])
@pytest.mark.parametrize("T,L,B,I,C,peephole,clip", PERSISTENT_CASES)
def test_cuda_persistent_sequences_match_loop_and_cpu(op, T, L, B, I, C, peephole, clip):
    case = (op, T, L, B, I, C, peephole, clip)
    ref = _sequence_results(*case, "cpu", F64)
    with forced_route("block_rnn.cuda.persistent"):
        whole = _sequence_results(*case, "cuda", torch.float32)
    with forced_route("block_rnn.cuda.steps"):
        loop = _sequence_results(*case, "cuda", torch.float32)
    assert len(whole) == len(loop) == len(ref) == (4 + 6 + 6 if op == "block_gru" else 7 + 8 + 8)
    for k, (w, lp, r) in enumerate(zip(whole, loop, ref)):
        # float32 rounding grows with the values' size (sums over C, T and B terms): bounds relative to the
        # largest reference value.
        bound = 1e-4 * max(1.0, r.abs().max().item())
        for got in (w, lp):
            close(got, r, rtol=1e-4, atol=bound)
        close(w, lp, rtol=1e-4, atol=bound)
        if L < T and k < (4 if op == "block_gru" else 7):
            assert torch.count_nonzero(w[L:]) == 0


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("op", ["block_lstm", "block_lstm_v2", "block_gru"])
def test_cuda_persistent_float64_matches_cpu(op):
    # float64 runs the whole-sequence kernels too: equal to the CPU's float64 to rounding.
    case = (op, 9, 8, 5, 6, 37, True, 0.5)
    ref = _sequence_results(*case, "cpu", F64)
    with forced_route("block_rnn.cuda.persistent"):
        got = _sequence_results(*case, "cuda", F64)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        close(g, r, rtol=1e-9, atol=1e-9 * max(1.0, r.abs().max().item()))


def _cuda_kernels_run(fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any("kernel" in n for n in names), f"the profiler recorded no CUDA kernels: {names[:20]}"
    return names


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("op", ["block_lstm", "block_lstm_v2", "block_gru"])
def test_cuda_persistent_switch_selects_the_kernels(op):
    # Which path ran, from the kernels launched: the persistent route runs the whole-sequence kernels
    # (weights in shared memory at C = 13, read through L2 at C = 2048) and no per-step kernel; the steps route
    # runs the per-step kernels only; float16 (unsupported) falls back to the loop.
    fam = "gru" if op == "block_gru" else "lstm"
    step_kernels = ("gru_gates_kernel", "gru_backward_a_kernel") if fam == "gru" else (
        "lstm_forward_kernel", "lstm_backward_kernel")

    def run(flag, C, dtype=torch.float32):
        route = "block_rnn.cuda." + ("persistent" if flag == "1" and dtype != torch.float16 else "steps")
        with forced_route(route), torchops.backends.flags({"block_rnn.cuda.persistent": flag == "1"}):
            return _cuda_kernels_run(lambda: _sequence_results(op, 4, 4, 3, 5, C, True, 0.5, "cuda", dtype))

    def ran(names, kernel, smem=None):
        tail = "" if smem is None else (r"<float, (true|\(bool\)1)>" if smem else r"<float, (false|\(bool\)0)>")
        return any(re.search(kernel + tail, n) for n in names)

    for C, smem in ((13, True), (2048, False)):
        names = run("1", C)
        for d in ("forward", "backward"):
            assert ran(names, f"{fam}_{d}_sequence_kernel", smem), (C, d, [n for n in names if "kernel" in n])
        assert not any(ran(names, k) for k in step_kernels)
    names = run("0", 13)
    assert not ran(names, "sequence_kernel")
    assert all(ran(names, k) for k in step_kernels)
    names = run("1", 13, torch.float16)
    assert not ran(names, "sequence_kernel")
    assert all(ran(names, k) for k in step_kernels)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("op", ["block_lstm", "block_gru"])
def test_cuda_persistent_kernels_from_threads_that_plan_different_sizes(op):
    # The kernels' dynamic shared memory limit is one process-wide attribute: threads that plan different sizes
    # at once must not shrink it under each other's launch (it is set once, to the device's maximum).
    import threading

    sizes = (13, 29, 61, 97)
    want = {C: _sequence_results(op, 4, 4, 3, 5, C, True, 0.5, "cpu", torch.float32) for C in sizes}
    errors, mismatches = [], []

    def work(C):
        try:
            for _ in range(15):
                got = _sequence_results(op, 4, 4, 3, 5, C, True, 0.5, "cuda", torch.float32)
                if not all(torch.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want[C])):
                    mismatches.append(C)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    with forced_route("block_rnn.cuda.persistent"):
        threads = [threading.Thread(target=work, args=(C,)) for C in sizes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert errors == [] and mismatches == []


def test_lstm_noncontiguous_inputs():
    args = lstm_inputs(B=3, I=4, C=5, T=4, seed=90)
    nc = [args[0].transpose(0, 1).contiguous().transpose(0, 1)] + [
        a.T.contiguous().T if a.dim() == 2 else torch.stack([a, a], 1)[:, 0] for a in args[1:]]
    assert not any(t.is_contiguous() for t in nc)
    for a, b in zip(ops.block_lstm(sl(4), *nc, 1.0, 0.5, True), ref_block_lstm(*args, 1.0, 0.5, True, False)):
        close(a, b)
    cell = [nc[0][1]] + nc[1:]
    assert not cell[0].is_contiguous()
    for a, b in zip(ops.lstm_block_cell(*cell, 1.0, 0.5, True), ref_lstm_cell(args[0][1], *args[1:], 1.0, 0.5, True)):
        close(a, b)
    raw = ops.block_lstm_grad(sl(4), *nc, *ops.block_lstm(sl(4), *nc), nc[0].new_ones(4, 3, 5).transpose(1, 2)
                              .contiguous().transpose(1, 2), torch.ones(4, 3, 5, dtype=F64), False)
    ref = ops.block_lstm_grad(sl(4), *args, *ops.block_lstm(sl(4), *args), torch.ones(4, 3, 5, dtype=F64),
                              torch.ones(4, 3, 5, dtype=F64), False)
    for a, b in zip(raw, ref):
        close(a, b)


def test_sequences_longer_than_one_projection_chunk():
    # B = 64: the input projections are computed 4 steps at a time; T = 10 and seq_len_max = 9 cross chunks.
    args = lstm_inputs(B=64, I=3, C=2, T=10, seed=91)
    for a, b in zip(ops.block_lstm_v2(sl(9), *args, 0.0, True), ref_block_lstm(*args, 0.0, 0.0, True, True, L=9)):
        close(a, b)
    args = gru_inputs(B=64, I=3, C=2, T=10, seed=92)
    for a, b in zip(ops.block_gru(sl(9), *args), ref_block_gru(*args, L=9)):
        close(a, b)


@pytest.mark.parametrize("T,L", [(5, 5), (6, 4), (1, 1)])
@pytest.mark.parametrize("B,I,C", [(3, 4, 17), (13, 9, 40), (7, 5, 260)])
def test_float32_sequences_forward_and_grads(T, L, B, I, C):
    # float32 sequences run the packed-weight recurrent GEMM (CPU: torchops' kernel with AVX2, else MKL's;
    # seq_len_max >= 2) or the ATen GEMM (one step): both must match the float64 reference, outputs and
    # all input gradients. The sizes cover the kernel's partial row tiles (a thread's 7 or 4 rows), partial
    # column panels (4C = 68, 2C = 34) and k split into blocks (the backward's k = 4C = 1040: more than one
    # pass of 512 (AVX-512) or 1024 (AVX2)).
    def check(op, ref, args64, n_out):
        a32 = [a.float().requires_grad_() for a in args64]
        a64 = [a.detach().clone().requires_grad_() for a in args64]
        out32, out64 = op(a32), ref(a64)
        for o32, o64 in zip(out32, out64):
            close(o32.double(), o64, rtol=2e-5, atol=2e-5 * max(1.0, o64.abs().max().item()))
        up = [torch.rand(o.shape, dtype=F64, generator=torch.Generator().manual_seed(k)) for k, o in enumerate(out64)]
        g32 = torch.autograd.grad(sum((o.double() * u).sum() for o, u in zip(out32, up)), a32)
        g64 = torch.autograd.grad(sum((o * u).sum() for o, u in zip(out64, up)), a64)
        for x32, x64 in zip(g32, g64):
            # float32 rounding grows with the values' size (sums over C, T and B terms): the absolute
            # tolerances scale with the largest reference value (gradients ~100 at C = 260).
            close(x32.double(), x64, rtol=1e-4, atol=2e-5 * max(5.0, x64.abs().max().item()))

    scale = (21 / (I + C)) ** 0.5  # pre-activations of the same size as at I + C = 21 (as a 1/sqrt(fan-in) init)
    for v2 in (False, True):
        args = lstm_inputs(B=B, I=I, C=C, T=T, seed=95, scale=scale)
        fn = ops.block_lstm_v2 if v2 else ops.block_lstm
        attrs = (0.5, True) if v2 else (0.3, 0.5, True)
        check(lambda a: fn(sl(L), *a, *attrs), lambda a: ref_block_lstm(*a, 0.0 if v2 else 0.3, 0.5, True, v2, L=L),
              args, 7)
    args = gru_inputs(B=B, I=I, C=C, T=T, seed=96, scale=scale)
    check(lambda a: ops.block_gru(sl(L), *a), lambda a: ref_block_gru(*a, L=L), args, 4)


@pytest.mark.parametrize("threads", [1, 2])
def test_float32_long_sequence_packs_split_over_threads(threads, restore_threads):
    # T * B = 2240 rows of dgates: packing them for the weight-gradient GEMM is split over the intra-op threads
    # by column panels (tasks of 65536 floats), and so is the [x_t, h_{t-1}] gather; outputs and gradients
    # against the float64 reference as above.
    torch.set_num_threads(threads)
    test_float32_sequences_forward_and_grads(70, 70, 32, 8, 16)


@pytest.mark.parametrize("route", ["rnn.cpu.packed_avx512", "rnn.cpu.packed_avx2", "rnn.cpu.mkl_packed", "rnn.cpu.aten"])
def test_recurrent_gemm_routes_give_the_same_sequences(route):
    # Each route of the float32 recurrent GEMM (torchops' packed kernel per build, MKL's packed GEMM, ATen):
    # the BlockLSTM outputs and gradients agree with a float64 run to float32 rounding. Rounding scales with
    # each tensor's magnitude (dx reaches ~30 here), so the bound is relative to its largest element: 1e-5 of
    # it, about 7x what the paths measure. A fixed 1e-5 atol failed on an Intel host, whose MKL sums in another
    # order (dx off by 4.5e-5 of 30, 1.5e-6 relative).
    r = next(x for x in torchops.backends.routes() if x["id"] == route)
    order = ["default", "avx2", "avx512"]
    if r["isa"] and order.index(r["isa"]) > order.index(torchops.backends.cpu.get_cpu_capability()):
        pytest.skip(f"{route} needs {r['isa']}")
    if route == "rnn.cpu.mkl_packed" and not torch.backends.mkl.is_available():
        pytest.skip("torch without MKL")

    def run(dt):
        g = torch.Generator().manual_seed(7)
        T, B, I, C = 6, 13, 9, 40
        a = [torch.randn(*s, generator=g).to(dt).requires_grad_() for s in [(T, B, I), (B, C), (B, C), (I + C, 4 * C)]]
        z = torch.zeros(C, dtype=dt)
        b = torch.randn(4 * C, generator=g).to(dt).requires_grad_()
        out = ops.block_lstm_v2(torch.tensor(T), a[0], a[1], a[2], a[3], z, z, z, b)
        grads = torch.autograd.grad(out[6].square().sum() + out[1].sum(), a + [b])
        return [o.detach() for o in out] + list(grads)

    with forced_route(route):
        got = run(torch.float32)
    ref = run(torch.float64)
    assert len(got) == len(ref) == 7 + 5
    for a, e in zip(got, ref):
        assert a.dtype == torch.float32
        close(a.double(), e, rtol=0, atol=1e-5 * e.abs().max().item())


def test_block_lstm_backward_with_empty_cell():
    # The forward accepts C = 0 (TF does); TF's grad op rejects it, so autograd takes the general backward.
    for op in (ops.block_lstm, ops.block_lstm_v2):
        args = lstm_inputs(B=3, I=2, C=0, T=2, requires_grad=True)
        out = op(sl(2), *args)
        grads = torch.autograd.grad(out[6].sum(), args)
        assert [tuple(g.shape) for g in grads] == [tuple(a.shape) for a in args]
        assert all(torch.count_nonzero(g) == 0 for g in grads)  # x_grad was uninitialised memory before
    with pytest.raises(RuntimeError, match="positive multiple of 4"):
        a = lstm_inputs(B=3, I=2, C=0, T=2)
        ops.block_lstm_grad(sl(2), *a, *[torch.zeros(2, 3, 0, dtype=F64)] * 9, False)


def test_mixed_meta_and_cpu_tensors_are_refused():
    # A meta tensor beside CPU data dispatches to the fake kernels, which used to return CPU tensors of
    # uninitialised memory.
    def meta(t):
        return t.to("meta")
    g = gru_inputs(B=2, I=3, C=4)
    with pytest.raises(RuntimeError, match="w_c must be on the same device as x"):
        ops.gru_block_cell(g[0], g[1], g[2], meta(g[3]), g[4], g[5])
    a = lstm_inputs(B=2, I=3, C=4, T=3)
    with pytest.raises(RuntimeError, match="b must be on the same device as x"):
        ops.block_lstm(sl(3), *a[:7], meta(a[7]))
    with pytest.raises(RuntimeError, match="seq_len_max is a meta tensor"):
        ops.block_lstm_v2(meta(sl(3)), *a)
    with pytest.raises(RuntimeError, match="seq_len_max must be an int64 tensor"):
        ops.block_lstm_v2(torch.tensor(3, dtype=torch.int32, device="meta"), *[meta(t) for t in a])
    out = ops.block_lstm_v2(meta(sl(3)), *[meta(t) for t in a])  # all meta: shapes only
    assert out[6].device.type == "meta" and out[6].shape == (3, 2, 4)
