"""Fake kernels of the GRU / LSTM block ops (mirror csrc/block_rnn/ops.cpp): shapes and dtypes only."""
import math
from typing import Optional

import torch

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _need(t, name):
    if t is None:
        raise ValueError(f"{name} must be a tensor, got None")


def _lstm_attrs(forget_bias, cell_clip):
    torch._check_value(math.isfinite(forget_bias), lambda: f"forget_bias must be finite, got {forget_bias}")
    torch._check_value(not math.isnan(cell_clip), lambda: f"cell_clip must be a number, got {cell_clip}")


def _check_x(x, rank):
    _need(x, "x")
    torch._check(x.dim() == rank, lambda: f"x must be rank {rank}, got {x.dim()}")
    torch._check(x.dtype in _FLOATS, lambda: f"x must be float32, float64, float16 or bfloat16, got {x.dtype}")


def _same(x, t, name):
    _need(t, name)
    torch._check(t.dtype == x.dtype, lambda: f"{name} must have the same dtype as x ({x.dtype}), got {t.dtype}")
    # (a meta tensor beside CPU data dispatches here: refuse, as the real kernels refuse mixed devices)
    torch._check(t.device == x.device,
                 lambda: f"{name} must be on the same device as x ({x.device}), got {t.device}")


def _seq_len_max(seq_len_max, x):
    torch._check(seq_len_max.dim() == 0,
                 lambda: f"`seq_len_max_tensor` must be rank 0 but is rank {seq_len_max.dim()}")
    torch._check(seq_len_max.dtype == torch.int64,
                 lambda: f"seq_len_max must be an int64 tensor, got {seq_len_max.dtype}")
    # any device, but its value is read: a meta seq_len_max beside real data has none
    torch._check(seq_len_max.device.type != "meta" or x.device.type == "meta",
                 lambda: f"seq_len_max is a meta tensor but x is on {x.device}")


def _shape(t, shape, name):
    torch._check(t.dim() == len(shape), lambda: f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    for a, b in zip(t.shape, shape):
        torch._check(a == b, lambda: f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def _opt(t: Optional[torch.Tensor], x, shape, name):
    if t is not None:
        _same(x, t, name)
        _shape(t, shape, name)


def _gru_weights(x, w_ru, w_c, b_ru, b_c, i, c):
    for t, shape, name in ((w_ru, (i + c, 2 * c), "w_ru"), (w_c, (i + c, c), "w_c"), (b_ru, (2 * c,), "b_ru"),
                           (b_c, (c,), "b_c")):
        _same(x, t, name)
        _shape(t, shape, name)


def _new(x, *shape):
    return x.new_empty(shape)


# ---------------------------------------------------------------------------------------------- GRU
@torch.library.register_fake("torchops::gru_block_cell")
def _gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c):
    _check_x(x, 2)
    torch._check(h_prev.dim() == 2, lambda: f"Rank of h_prev must be 2, got {h_prev.dim()}")
    b, i, c = x.shape[0], x.shape[1], h_prev.shape[1]
    _shape(h_prev, (b, c), "h_prev")
    _same(x, h_prev, "h_prev")
    _gru_weights(x, w_ru, w_c, b_ru, b_c, i, c)
    return _new(x, b, c), _new(x, b, c), _new(x, b, c), _new(x, b, c)


@torch.library.register_fake("torchops::gru_block_cell_grad")
def _gru_block_cell_grad(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    _gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
    b, i, cs = x.shape[0], x.shape[1], h_prev.shape[1]
    for t, name in ((r, "r"), (u, "u"), (c, "c"), (d_h, "d_h")):
        _same(x, t, name)
        _shape(t, (b, cs), name)
    return _new(x, b, i), _new(x, b, cs), _new(x, b, cs), _new(x, b, 2 * cs)


@torch.library.register_fake("torchops::_gru_block_cell_backward")
def _gru_block_cell_backward(x, h_prev, w_ru, w_c, r, u, c, d_r, d_u, d_c, d_h):
    _check_x(x, 2)
    b, i, cs = x.shape[0], x.shape[1], h_prev.shape[1]
    for t, shape, name in ((h_prev, (b, cs), "h_prev"), (w_ru, (i + cs, 2 * cs), "w_ru"), (w_c, (i + cs, cs), "w_c"),
                           (r, (b, cs), "r"), (u, (b, cs), "u"), (c, (b, cs), "c")):
        _same(x, t, name)
        _shape(t, shape, name)
    for t, name in ((d_r, "d_r"), (d_u, "d_u"), (d_c, "d_c"), (d_h, "d_h")):
        _opt(t, x, (b, cs), name)
    return (_new(x, b, i), _new(x, b, cs), _new(x, i + cs, 2 * cs), _new(x, i + cs, cs), _new(x, 2 * cs),
            _new(x, cs))


def _block_gru_check(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
    _check_x(x, 3)
    _seq_len_max(seq_len_max, x)
    t, b, i = x.shape
    c = h_prev.shape[1]
    _shape(h_prev, (b, c), "h_prev")
    _same(x, h_prev, "h_prev")
    _gru_weights(x, w_ru, w_c, b_ru, b_c, i, c)
    return t, b, i, c


@torch.library.register_fake("torchops::block_gru")
def _block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
    t, b, i, c = _block_gru_check(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c)
    return _new(x, t, b, c), _new(x, t, b, c), _new(x, t, b, c), _new(x, t, b, c)


@torch.library.register_fake("torchops::block_gru_grad")
def _block_gru_grad(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, h, h_grad, r_grad=None, u_grad=None,
                    c_grad=None):
    t, b, i, cs = _block_gru_check(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c)
    for v, name in ((r, "r"), (u, "u"), (c, "c"), (h, "h"), (h_grad, "h_grad")):
        _same(x, v, name)
        _shape(v, (t, b, cs), name)
    for v, name in ((r_grad, "r_grad"), (u_grad, "u_grad"), (c_grad, "c_grad")):
        _opt(v, x, (t, b, cs), name)
    return (_new(x, t, b, i), _new(x, b, cs), _new(x, i + cs, 2 * cs), _new(x, i + cs, cs), _new(x, 2 * cs),
            _new(x, cs))


# ---------------------------------------------------------------------------------------------- LSTM
def _lstm_params(x, w, wci, wcf, wco, b, i, c):
    for t, shape, name in ((w, (i + c, 4 * c), "w"), (wci, (c,), "wci"), (wcf, (c,), "wcf"), (wco, (c,), "wco"),
                           (b, (4 * c,), "b")):
        _same(x, t, name)
        _shape(t, shape, name)


def _lstm_cell_check(x, cs_prev, h_prev, w, wci, wcf, wco, b):
    _check_x(x, 2)
    torch._check(cs_prev.dim() == 2, lambda: f"cs_prev_tensor must be rank 2 but is rank {cs_prev.dim()}.")
    _need(w, "w")
    torch._check(w.dim() == 2, lambda: f"w_tensor must be rank 2 but is rank {w.dim()}.")
    torch._check(w.shape[1] % 4 == 0, lambda: f"w.dim_size(1) must be a multiple of 4, got {w.shape[1]}")
    bs, i, c = x.shape[0], x.shape[1], w.shape[1] // 4
    for t, name in ((cs_prev, "cs_prev"), (h_prev, "h_prev")):
        _same(x, t, name)
        _shape(t, (bs, c), name)
    _lstm_params(x, w, wci, wcf, wco, b, i, c)
    torch._check(bs > 0 and c > 0, lambda: f"cs_prev_tensor is empty, has shape: ({bs},{c}).")
    return bs, i, c


@torch.library.register_fake("torchops::lstm_block_cell")
def _lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False):
    _lstm_attrs(forget_bias, cell_clip)
    bs, _, c = _lstm_cell_check(x, cs_prev, h_prev, w, wci, wcf, wco, b)
    return tuple(_new(x, bs, c) for _ in range(7))


def _lstm_cell_grad_check(x, cs_prev, h_prev, w, wci, wcf, wco, b, gates):
    bs, i, c = _lstm_cell_check(x, cs_prev, h_prev, w, wci, wcf, wco, b)
    for t, name in gates:
        if t is not None:
            _same(x, t, name)
            _shape(t, (bs, c), name)
    return bs, i, c


@torch.library.register_fake("torchops::lstm_block_cell_grad")
def _lstm_block_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad,
                          use_peephole):
    _need(cs_grad, "cs_grad")
    _need(h_grad, "h_grad")
    bs, _, c = _lstm_cell_grad_check(x, cs_prev, h_prev, w, wci, wcf, wco, b,
                                     ((i, "i"), (cs, "cs"), (f, "f"), (o, "o"), (ci, "ci"), (co, "co"),
                                      (cs_grad, "cs_grad"), (h_grad, "h_grad")))
    return _new(x, bs, c), _new(x, bs, 4 * c), _new(x, c), _new(x, c), _new(x, c)


@torch.library.register_fake("torchops::_lstm_block_cell_backward")
def _lstm_block_cell_backward(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad, i_grad,
                              f_grad, o_grad, ci_grad, co_grad, use_peephole):
    bs, isz, c = _lstm_cell_grad_check(
        x, cs_prev, h_prev, w, wci, wcf, wco, b,
        ((i, "i"), (cs, "cs"), (f, "f"), (o, "o"), (ci, "ci"), (co, "co"), (cs_grad, "cs_grad"), (h_grad, "h_grad"),
         (i_grad, "i_grad"), (f_grad, "f_grad"), (o_grad, "o_grad"), (ci_grad, "ci_grad"), (co_grad, "co_grad")))
    return (_new(x, bs, isz), _new(x, bs, c), _new(x, bs, c), _new(x, isz + c, 4 * c), _new(x, c), _new(x, c),
            _new(x, c), _new(x, 4 * c))


def _block_lstm_check(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b):
    _check_x(x, 3)
    _seq_len_max(seq_len_max, x)
    t, bs, i = x.shape
    _need(w, "w")
    torch._check(w.dim() == 2, lambda: f"w must be 2D, got rank {w.dim()}")
    torch._check(w.shape[1] % 4 == 0, lambda: f"w.dim_size(1) must be a multiple of 4, got {w.shape[1]}")
    c = w.shape[1] // 4
    for v, name in ((cs_prev, "cs_prev"), (h_prev, "h_prev")):
        _same(x, v, name)
        _shape(v, (bs, c), name)
    _lstm_params(x, w, wci, wcf, wco, b, i, c)
    return t, bs, i, c


@torch.library.register_fake("torchops::block_lstm")
def _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0,
                use_peephole=False):
    _lstm_attrs(forget_bias, cell_clip)
    t, bs, _, c = _block_lstm_check(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b)
    return tuple(_new(x, t, bs, c) for _ in range(7))


@torch.library.register_fake("torchops::block_lstm_v2")
def _block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0, use_peephole=False):
    return _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, 0.0, cell_clip)


def _block_lstm_grad_common(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, seq, tf_grad_op=True):
    torch._check(w.dim() == 2, lambda: f"w must be rank 2 but is rank {w.dim()}")
    torch._check(w.shape[1] % 4 == 0 and (w.shape[1] > 0 or not tf_grad_op),
                 lambda: f"w matrix columns must be a positive multiple of 4, but got {w.shape[1]}")
    t, bs, i, c = _block_lstm_check(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b)
    for v, name in seq:
        if v is not None:
            _same(x, v, name)
            _shape(v, (t, bs, c), name)
    return (_new(x, t, bs, i), _new(x, bs, c), _new(x, bs, c), _new(x, i + c, 4 * c), _new(x, c), _new(x, c),
            _new(x, c), _new(x, 4 * c))


@torch.library.register_fake("torchops::block_lstm_grad")
def _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad,
                     use_peephole):
    _need(cs_grad, "cs_grad")
    _need(h_grad, "h_grad")
    return _block_lstm_grad_common(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                                   ((i, "i"), (cs, "cs"), (f, "f"), (o, "o"), (ci, "ci"), (co, "co"), (h, "h"),
                                    (cs_grad, "cs_grad"), (h_grad, "h_grad")))


@torch.library.register_fake("torchops::block_lstm_grad_v2")
def _block_lstm_grad_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad,
                        h_grad, use_peephole):
    return _block_lstm_grad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad,
                            h_grad, use_peephole)


@torch.library.register_fake("torchops::_block_lstm_backward")
def _block_lstm_backward(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad,
                         i_grad, f_grad, o_grad, ci_grad, co_grad, use_peephole, ifco):
    return _block_lstm_grad_common(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                                   ((i, "i"), (cs, "cs"), (f, "f"), (o, "o"), (ci, "ci"), (co, "co"), (h, "h"),
                                    (cs_grad, "cs_grad"), (h_grad, "h_grad"), (i_grad, "i_grad"), (f_grad, "f_grad"),
                                    (o_grad, "o_grad"), (ci_grad, "ci_grad"), (co_grad, "co_grad")), tf_grad_op=False)
