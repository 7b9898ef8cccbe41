"""ONNX translations of the block RNN ops (`gru_block_cell`, `block_gru`, `lstm_block_cell`, `block_lstm`,
`block_lstm_v2`), inference semantics of docs/block_rnn.md.

* `block_gru` -> ONNX `GRU(linear_before_reset=0)` (TF's reset-before-the-matmul cell) for `h`; `r`, `u`, `c`
  are recomputed for all steps at once from `h` (dead code, removed, when the model does not read them).
* `block_lstm` / `block_lstm_v2` -> an ONNX `Loop` over the steps: the ops return the cell state of every step
  (and TF clips the cell state itself), which ONNX `LSTM` does not give.
* the single-step cells -> their equations as element-wise ops and one MatMul.
"""
import numpy as np
from onnxscript import opset18 as op

from ._graph import dim, ints, like, loop, static_dim

_ICFO = (0, 2, 1, 3)  # gate block of (i, f, c, o) in block_lstm (V1) / lstm_block_cell's ICFO layout
_IFCO = (0, 1, 2, 3)  # ... in block_lstm_v2


def _gru_gates(E, x, h_prev, w_ru, w_c, b_ru, b_c, C: int, axis: int, consts):
    """GRUBlockCell's r, u, c, h for `x`/`h_prev` whose feature axis is `axis` (element-wise over the others)."""
    ru = E.Sigmoid(E.Add(E.MatMul(E.Concat(x, h_prev, axis=axis), w_ru), b_ru))
    r = E.Slice(ru, consts["0"], consts["C"], consts["axis"])
    u = E.Slice(ru, consts["C"], consts["2C"], consts["axis"])
    c = E.Tanh(E.Add(E.MatMul(E.Concat(x, E.Mul(r, h_prev), axis=axis), w_c), b_c))
    h = E.Add(E.Mul(u, E.Sub(h_prev, c)), c)
    return r, u, c, h


def _gru_consts(C: int, axis: int):
    return {"0": ints([0]), "C": ints([C]), "2C": ints([2 * C]), "axis": ints([axis])}


def gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c):
    C = static_dim(w_c, 1, "cell_size (w_c.shape[1])")
    return _gru_gates(op, x, h_prev, w_ru, w_c, b_ru, b_c, C, 1, _gru_consts(C, 1))


def block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
    I = static_dim(x, 2, "input_size (x.shape[2])")
    C = static_dim(w_c, 1, "cell_size (w_c.shape[1])")
    T, B = dim(x, 0), dim(x, 1)
    steps = op.Min(op.Reshape(op.Cast(seq_len_max, to=7), ints([1])), T)  # 7: INT64

    def rows(w, start, stop):
        return op.Slice(w, ints([start]), ints([stop]), ints([0]))

    def cols(w, start, stop):
        return op.Slice(w, ints([start]), ints([stop]), ints([1]))

    # ONNX GRU gates are (z, r, h) with z = TF's u; W/R are [1, 3C, in], the transposed column blocks.
    w_x, w_h = rows(w_ru, 0, I), rows(w_ru, I, I + C)
    W = op.Unsqueeze(op.Transpose(op.Concat(cols(w_x, C, 2 * C), cols(w_x, 0, C), rows(w_c, 0, I), axis=1)), ints([0]))
    R = op.Unsqueeze(op.Transpose(op.Concat(cols(w_h, C, 2 * C), cols(w_h, 0, C), rows(w_c, I, I + C), axis=1)),
                     ints([0]))
    b_w = op.Concat(op.Slice(b_ru, ints([C]), ints([2 * C])), op.Slice(b_ru, ints([0]), ints([C])), b_c, axis=0)
    Bias = op.Unsqueeze(op.Concat(b_w, op.Mul(b_w, like(0.0, b_w)), axis=0), ints([0]))
    # ONNX Runtime needs every length >= 1; the steps past seq_len_max are zeroed below.
    lens = op.Cast(op.Expand(op.Max(steps, ints([1])), B), to=6)  # 6: INT32
    Y, _ = op.GRU(x, W, R, Bias, lens, op.Unsqueeze(h_prev, ints([0])), hidden_size=C, linear_before_reset=0)
    mask = _step_mask(steps, T, x)
    h = op.Mul(op.Squeeze(Y, ints([1])), mask)
    h_seq_prev = op.Concat(op.Unsqueeze(h_prev, ints([0])), op.Slice(h, ints([0]), ints([-1]), ints([0])), axis=0)
    r, u, c, _ = _gru_gates(op, x, h_seq_prev, w_ru, w_c, b_ru, b_c, C, 2, _gru_consts(C, 2))
    return op.Mul(r, mask), op.Mul(u, mask), op.Mul(c, mask), h


def _step_mask(steps, T, ref):
    """`[T, 1, 1]` mask of the steps `t < steps`."""
    t = op.Range(op.Constant(value_int=0), op.Squeeze(T, ints([0])), op.Constant(value_int=1))
    return op.CastLike(op.Reshape(op.Less(t, steps), ints([-1, 1, 1])), ref)


def _lstm_consts(C: int, forget_bias: float, order, b):
    """Constants of one LSTM step: the [0, 4, C] gate reshape, the gate indices and the forget-bias vector."""
    fb = np.zeros(4 * C)
    fb[order[1] * C:(order[1] + 1) * C] = forget_bias
    return {"gates": ints([0, 4, C]), "idx": [op.Constant(value_int=g) for g in order], "fb": like(fb, b)}


def _lstm_step(E, x, cs_prev, h_prev, w, b, wci, wcf, wco, use_peephole: bool, clip, consts):
    """One LSTMBlockCell step (docs/block_rnn.md); `b` already holds the forget bias. Returns TF's seven outputs
    (i, cs, f, o, ci, co, h)."""
    g = E.Reshape(E.Add(E.MatMul(E.Concat(x, h_prev, axis=1), w), b), consts["gates"])
    gi, gf, gc, go = (E.Gather(g, idx, axis=1) for idx in consts["idx"])
    if use_peephole:
        gi, gf = E.Add(gi, E.Mul(cs_prev, wci)), E.Add(gf, E.Mul(cs_prev, wcf))
    i, f, ci = E.Sigmoid(gi), E.Sigmoid(gf), E.Tanh(gc)
    cs = E.Add(E.Mul(i, ci), E.Mul(f, cs_prev))
    if clip is not None:
        cs = E.Clip(cs, clip[0], clip[1])
    if use_peephole:
        go = E.Add(go, E.Mul(cs, wco))
    o = E.Sigmoid(go)
    co = E.Tanh(cs)
    return i, cs, f, o, ci, co, E.Mul(o, co)


def _clip(cell_clip: float, ref):
    # TF clips the cell state to [-cell_clip, cell_clip] when cell_clip > 0 (ONNX LSTM's clip acts on gate inputs).
    return (like(-cell_clip, ref), like(cell_clip, ref)) if cell_clip > 0 else None


def lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False):
    C = static_dim(w, 1, "4 * cell_size (w.shape[1])") // 4
    consts = _lstm_consts(C, forget_bias, _ICFO, b)
    return _lstm_step(op, x, cs_prev, h_prev, w, op.Add(b, consts["fb"]), wci, wcf, wco, use_peephole,
                      _clip(cell_clip, b), consts)


def _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole, order):
    C = static_dim(w, 1, "4 * cell_size (w.shape[1])") // 4
    T = dim(x, 0)
    steps = op.Min(op.Reshape(op.Cast(seq_len_max, to=7), ints([1])), T)
    consts = _lstm_consts(C, forget_bias, order, b)
    b_eff = op.Add(b, consts["fb"])
    clip = _clip(cell_clip, b)

    def body(E, t, cs, h):
        x_t = E.Gather(x, t, axis=0)
        outs = _lstm_step(E, x_t, cs, h, w, b_eff, wci, wcf, wco, use_peephole, clip, consts)
        return (outs[1], outs[6]), outs

    _, _, *seqs = loop(op.Squeeze(steps, ints([0])), [cs_prev, h_prev], body, 7, x.dtype)
    # Steps at t >= seq_len_max are zeros: pad the scanned [steps, B, C] outputs to [T, B, C].
    pads = op.Concat(ints([0, 0, 0]), op.Sub(T, steps), ints([0, 0]), axis=0)
    return tuple(op.Pad(s, pads) for s in seqs)


def block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0,
               use_peephole=False):
    return _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole,
                       _ICFO)


def block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0, use_peephole=False):
    return _block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, 0.0, cell_clip, use_peephole, _IFCO)
