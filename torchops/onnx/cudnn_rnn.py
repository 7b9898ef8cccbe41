"""ONNX translations of `cudnn_rnn`, `cudnn_rnn_v2`, `cudnn_rnn_v3` (inference), semantics of docs/cudnn_rnn.md.

Each layer is one ONNX `LSTM` / `GRU(linear_before_reset=1)` / `RNN` node over both directions, its W/R/B
sliced from the params buffer (layout: torchops/_cudnn_rnn_params.py) and reordered to ONNX's gate order.
skip_input layer 0 gets identity input matrices and zero input biases. `sequence_lengths` become
`sequence_lens` (clamped to >= 1 for the runtime); steps past each length are zeroed and a zero-length row's
final state is set to its initial state. An LSTM projection (num_proj > 0), which ONNX `LSTM` lacks, runs as
an ONNX `Loop` per direction (the backward direction reverses each sequence within its length).
"""
from typing import List

import numpy as np
import onnx_ir as ir
from onnxscript import opset18 as op

from .. import _cudnn_rnn_params as layout
from ._graph import ExportError, dim, empty_like, ints, like, loop, static_dim, time_mask

# ONNX gate order as indices into the cuDNN order: LSTM i,f,c,o -> i,o,f,c; GRU r,z,n -> z,r,h.
_ONNX_GATES = {"lstm": (0, 3, 1, 2), "gru": (1, 0, 2), "rnn_tanh": (0,), "rnn_relu": (0,)}


class _Params:
    """Slices of the flat params buffer, in the order of docs/cudnn_rnn.md."""

    def __init__(self, params, g: int, d: int, num_layers: int, h: int, i: int, p: int, skip: bool):
        weights, biases = layout.canonical_shapes(g, d, num_layers, h, i, p, skip)
        self.params = params
        self.weights: List = []
        self.biases: List = []
        offset = 0
        for shapes, out in ((weights, self.weights), (biases, self.biases)):
            for shape in shapes:
                n = int(np.prod(shape))
                out.append((offset, shape))
                offset += n
        self.per_layer_w = 2 * g + (1 if p > 0 else 0)
        self.g = g

    def _get(self, entry):
        start, shape = entry
        n = int(np.prod(shape))
        if n == 0:
            return None
        return op.Reshape(op.Slice(self.params, ints([start]), ints([start + n])), ints(shape))

    def matrices(self, pseudo_layer: int):
        """(W_g list, R_g list, projection or None) of one pseudo-layer."""
        base = pseudo_layer * self.per_layer_w
        ws = [self._get(self.weights[base + k]) for k in range(self.g)]
        rs = [self._get(self.weights[base + self.g + k]) for k in range(self.g)]
        proj = self._get(self.weights[base + 2 * self.g]) if self.per_layer_w > 2 * self.g else None
        return ws, rs, proj

    def bias_vectors(self, pseudo_layer: int):
        base = pseudo_layer * 2 * self.g
        return ([self._get(self.biases[base + k]) for k in range(self.g)],
                [self._get(self.biases[base + self.g + k]) for k in range(self.g)])


def _direction_weights(P: _Params, pl: int, order, skip_layer: bool, H: int, ref):
    """ONNX W [G*H, in], R [G*H, O], B [2*G*H] of pseudo-layer `pl` in ONNX gate order."""
    ws, rs, _ = P.matrices(pl)
    bws, brs = P.bias_vectors(pl)
    if skip_layer:
        # skip_input: x replaces W_g x + b_Wg, i.e. identity input matrices and zero input biases.
        W = like(np.tile(np.eye(H), (len(order), 1)), ref)
        bw = like(np.zeros(len(order) * H), ref)
    else:
        W = op.Concat(*[ws[k] for k in order], axis=0)
        bw = op.Concat(*[bws[k] for k in order], axis=0)
    R = op.Concat(*[rs[k] for k in order], axis=0)
    B = op.Concat(bw, *[brs[k] for k in order], axis=0)
    return W, R, B


def _projected_lstm_direction(xw, R, proj, h0, c0, valid, H: int, dtype):
    """One direction of an LSTM with projection as a Loop. `xw` [T, B, 4H] holds `W x + b_W + b_R` (gates
    i, f, c, o), `valid` [T, B, 1] (bool) which steps are inside the sequence. Returns (y [T, B, P], h, c)."""
    Rt, Pt = op.Transpose(R), op.Transpose(proj)
    gates = ints([0, 4, H])
    idx = [op.Constant(value_int=k) for k in range(4)]
    zero = like(0.0, xw)

    def body(E, t, h, c):
        g = E.Reshape(E.Add(E.Gather(xw, t, axis=0), E.MatMul(h, Rt)), gates)
        gi, gf, gc, go = (E.Gather(g, k, axis=1) for k in idx)
        c_new = E.Add(E.Mul(E.Sigmoid(gf), c), E.Mul(E.Sigmoid(gi), E.Tanh(gc)))
        h_new = E.MatMul(E.Mul(E.Sigmoid(go), E.Tanh(c_new)), Pt)
        v = E.Gather(valid, t, axis=0)
        return (E.Where(v, h_new, h), E.Where(v, c_new, c)), (E.Where(v, h_new, zero),)

    steps = op.Squeeze(dim(xw, 0), ints([0]))
    h, c, y = loop(steps, [h0, c0], body, 1, dtype)
    return y, h, c


def _cudnn_rnn(name, x, h0, c0, params, lengths, rnn_mode, input_mode, direction, dropout, is_training,
               num_proj, time_major, v1):
    if rnn_mode not in _ONNX_GATES:
        raise ExportError(f"{name}: rnn_mode must be one of {list(_ONNX_GATES)}, got {rnn_mode!r}")
    if direction not in ("unidirectional", "bidirectional"):
        raise ExportError(f"{name}: direction must be 'unidirectional' or 'bidirectional', got {direction!r}")
    lstm = rnn_mode == "lstm"
    dtype = x.dtype
    D = 2 if direction == "bidirectional" else 1
    I = static_dim(x, 2, f"{name}: input_size (input.shape[2])")
    LD = static_dim(h0, 0 if time_major else 1, f"{name}: num_layers * num_dirs (input_h's layer axis)")
    O = static_dim(h0, 2, f"{name}: the state width (input_h.shape[2])")
    H = static_dim(c0, 2, f"{name}: num_units (input_c.shape[2])") if lstm else O
    if not time_major:
        x, h0 = op.Transpose(x, perm=[1, 0, 2]), op.Transpose(h0, perm=[1, 0, 2])
        if lstm:
            c0 = op.Transpose(c0, perm=[1, 0, 2])
    L = LD // D
    if is_training and dropout > 0 and L > 1:
        raise ExportError(f"{name} with is_training=True and dropout={dropout} applies dropout between layers (a "
                          f"training-mode torchops.nn.Cudnn* module); an ONNX export is for inference: call "
                          f"model.eval() before exporting")
    if num_proj > 0 and (not lstm or num_proj != O):
        raise ExportError(f"{name}: num_proj={num_proj} needs rnn_mode 'lstm' and input_h.shape[2] == num_proj, got "
                          f"rnn_mode {rnn_mode!r} and {O}")
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and I == H)
    order = _ONNX_GATES[rnn_mode]
    G = len(order)
    P = _Params(params, G, D, L, H, I, num_proj, skip)
    T, Bdim = dim(x, 0), dim(x, 1)

    run_lens = mask = zero_rows = None
    if lengths is not None:
        lens32 = op.Cast(lengths, to=ir.DataType.INT32)
        # ONNX Runtime rejects zero lengths: run them as length 1 and restore TF's result below.
        run_lens = op.Max(lens32, op.Constant(value=ir.tensor(np.array([1], dtype=np.int32))))
        mask = time_mask(lens32, T, x)
        zero_rows = op.Reshape(op.Equal(lens32, op.Constant(value=ir.tensor(np.array([0], dtype=np.int32)))),
                               ints([1, -1, 1]))
    onnx_dir = "bidirectional" if D == 2 else "forward"

    out = x
    final_h, final_c = [], []
    for layer in range(L):
        h_init = op.Slice(h0, ints([layer * D]), ints([(layer + 1) * D]), ints([0]))
        c_init = op.Slice(c0, ints([layer * D]), ints([(layer + 1) * D]), ints([0])) if lstm else None
        # The projection Loop computes the gates in the params' own order.
        gate_order = order if num_proj == 0 else tuple(range(G))
        dirs = [_direction_weights(P, layer * D + d, gate_order, skip and layer == 0, H, x) for d in range(D)]
        if num_proj == 0:
            W = op.Concat(*[op.Unsqueeze(w, ints([0])) for w, _, _ in dirs], axis=0)
            R = op.Concat(*[op.Unsqueeze(r, ints([0])) for _, r, _ in dirs], axis=0)
            B = op.Concat(*[op.Unsqueeze(b, ints([0])) for _, _, b in dirs], axis=0)
            if lstm:
                Y, Y_h, Y_c = op.LSTM(out, W, R, B, run_lens, h_init, c_init, hidden_size=H, direction=onnx_dir)
            elif rnn_mode == "gru":
                Y, Y_h = op.GRU(out, W, R, B, run_lens, h_init, hidden_size=H, direction=onnx_dir,
                                linear_before_reset=1)
            else:
                act = "Tanh" if rnn_mode == "rnn_tanh" else "Relu"
                Y, Y_h = op.RNN(out, W, R, B, run_lens, h_init, hidden_size=H, direction=onnx_dir,
                                activations=[act] * D)
            # [T, D, B, H] -> [T, B, D * H]
            out = op.Reshape(op.Transpose(Y, perm=[0, 2, 1, 3]), ints([0, 0, -1]))
        else:
            ys, hs, cs = [], [], []
            valid = op.Cast(mask, to=ir.DataType.BOOL) if mask is not None else op.Cast(
                op.Expand(op.Constant(value=ir.tensor(True)), op.Concat(T, Bdim, ints([1]), axis=0)),
                to=ir.DataType.BOOL)
            rev_lens = op.Cast(run_lens, to=ir.DataType.INT64) if run_lens is not None else op.Expand(T, Bdim)
            for d, (W, R, B) in enumerate(dirs):
                _, _, proj = P.matrices(layer * D + d)
                xw = op.Add(op.MatMul(out, op.Transpose(W)), op.Add(op.Slice(B, ints([0]), ints([4 * H])),
                                                                    op.Slice(B, ints([4 * H]), ints([8 * H]))))
                if d == 1:
                    xw = op.ReverseSequence(xw, rev_lens, batch_axis=1, time_axis=0)
                hd = op.Squeeze(op.Slice(h_init, ints([d]), ints([d + 1]), ints([0])), ints([0]))
                cd = op.Squeeze(op.Slice(c_init, ints([d]), ints([d + 1]), ints([0])), ints([0]))
                y, h_n, c_n = _projected_lstm_direction(xw, R, proj, hd, cd, valid, H, dtype)
                if d == 1:
                    y = op.ReverseSequence(y, rev_lens, batch_axis=1, time_axis=0)
                ys.append(y)
                hs.append(op.Unsqueeze(h_n, ints([0])))
                cs.append(op.Unsqueeze(c_n, ints([0])))
            out = op.Concat(*ys, axis=2) if D == 2 else ys[0]
            Y_h = op.Concat(*hs, axis=0) if D == 2 else hs[0]
            Y_c = op.Concat(*cs, axis=0) if D == 2 else cs[0]
        if mask is not None:
            out = op.Mul(out, mask)
            Y_h = op.Where(zero_rows, h_init, Y_h)
            if lstm:
                Y_c = op.Where(zero_rows, c_init, Y_c)
        final_h.append(Y_h)
        if lstm:
            final_c.append(Y_c)

    output_h = op.Concat(*final_h, axis=0) if L > 1 else op.Identity(final_h[0])
    output_c = (op.Concat(*final_c, axis=0) if L > 1 else op.Identity(final_c[0])) if lstm else like(0.0, x)
    if not time_major:
        out, output_h = op.Transpose(out, perm=[1, 0, 2]), op.Transpose(output_h, perm=[1, 0, 2])
        if lstm:
            output_c = op.Transpose(output_c, perm=[1, 0, 2])
    outputs = (op.Identity(out), output_h, output_c, empty_like(x))
    if v1:
        return outputs
    return outputs + (op.Cast(op.ConstantOfShape(ints([0])), to=ir.DataType.INT8),)


def cudnn_rnn(input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
              direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
    return _cudnn_rnn("cudnn_rnn", input, input_h, input_c, params, None, rnn_mode, input_mode, direction, dropout,
                      is_training, 0, True, True)


def cudnn_rnn_v2(input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
                 direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
    return _cudnn_rnn("cudnn_rnn_v2", input, input_h, input_c, params, None, rnn_mode, input_mode, direction,
                      dropout, is_training, 0, True, False)


def cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm", input_mode="linear_input",
                 direction="unidirectional", dropout=0.0, seed=0, seed2=0, num_proj=0, is_training=True,
                 time_major=True):
    return _cudnn_rnn("cudnn_rnn_v3", input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode,
                      direction, dropout, is_training, num_proj, time_major, False)


def _config(rnn_mode, direction, input_mode, num_units, input_size):
    if rnn_mode not in _ONNX_GATES:
        raise ExportError(f"rnn_mode must be one of {list(_ONNX_GATES)}, got {rnn_mode!r}")
    d = 2 if direction == "bidirectional" else 1
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and input_size == num_units)
    return len(_ONNX_GATES[rnn_mode]), d, skip


def cudnn_rnn_params_size(num_layers, num_units, input_size, T=None, S=None, rnn_mode="lstm",
                          input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                          num_proj=0):
    g, d, skip = _config(rnn_mode, direction, input_mode, num_units, input_size)
    size = layout.params_size(g, d, num_layers, num_units, input_size, num_proj, skip)
    wide = S is not None and "int64" in str(S).lower()
    return op.Constant(value=ir.tensor(np.array([size], dtype=np.int64 if wide else np.int32)))


def _to_params(weights, biases):
    return op.Concat(*[op.Reshape(t, ints([-1])) for t in list(weights) + list(biases)], axis=0)


def cudnn_rnn_canonical_to_params(num_layers, num_units, input_size, weights, biases, rnn_mode="lstm",
                                  input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                                  seed2=0):
    return _to_params(weights, biases)


def cudnn_rnn_canonical_to_params_v2(num_layers, num_units, input_size, weights, biases, rnn_mode="lstm",
                                     input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                                     seed2=0, num_proj=0):
    return _to_params(weights, biases)
