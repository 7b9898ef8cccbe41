"""Converters between TensorFlow / Keras weights and the torchops modules.

Each `load_*` takes what the readers return (`torchops.tf.load_checkpoint(path)`, or a mapping name -> array,
for checkpoint variables; one `layer.get_weights()` list from `torchops.tf.load_keras_weights(path)` for Keras),
checks every name and shape first and only then writes into the module, so a failed load changes nothing.
The name mapping tables are in docs/porting.md.
"""
from typing import Any, List, Sequence, Tuple

import torch
from torch import Tensor

from ..nn.block_rnn import _icfo_to_ifco, _ifco_to_icfo
from ..nn.cudnn_rnn import _as_tensor
from .checkpoint import NotFoundError, close_matches

__all__ = ["cudnn_rnn_keras_weights", "load_cudnn_rnn_keras_weights", "cudnn_rnn_checkpoint_weights",
           "load_cudnn_rnn_checkpoint", "gru_block_keras_weights", "load_gru_block_keras_weights",
           "load_gru_block_checkpoint", "lstm_block_keras_weights", "load_lstm_block_keras_weights",
           "load_lstm_block_checkpoint", "load_batch_norm_keras_weights", "load_batch_norm_checkpoint"]

_KERAS_GATE_ORDER = {  # Keras gate k sits at cuDNN gate _KERAS_GATE_ORDER[mode][k]
    "lstm": [0, 1, 2, 3],  # Keras i, f, c, o = cuDNN i, f, c, o
    "gru": [1, 0, 2],  # Keras z, r, h = cuDNN gates 1 (z), 0 (r), 2 (n)
    "rnn_tanh": [0], "rnn_relu": [0],
}
_TF_CELL_NAME = {"lstm": "cudnn_compatible_lstm_cell", "gru": "cudnn_compatible_gru_cell",
                 "rnn_tanh": "basic_rnn_cell", "rnn_relu": "basic_rnn_cell"}


def _get(tensors: Any, key: str) -> Any:
    """`tensors[key]` from a checkpoint reader or a mapping; a missing name lists the close matches."""
    if key not in tensors:
        raise NotFoundError(close_matches(key, tensors.keys(), f"TF checkpoint tensor {key!r} is missing"))
    return tensors.get_tensor(key) if hasattr(tensors, "get_tensor") else tensors[key]


def _scoped(scope: str, name: str) -> str:
    return f"{scope}/{name}" if scope else name


def _check_shape(what: str, t: Tensor, shape: Sequence[int]) -> Tensor:
    if list(t.shape) != list(shape):
        raise ValueError(f"{what} must have shape {list(shape)}, got {list(t.shape)}")
    return t


# -- CudnnLSTM / CudnnGRU / CudnnRNNTanh / CudnnRNNRelu: Keras -----------------------------------------------

def _cudnn_rnn(module) -> None:
    from ..nn.cudnn_rnn import _CudnnRNN
    if not isinstance(module, _CudnnRNN):
        raise TypeError(f"module must be a torchops.nn.CudnnLSTM, CudnnGRU, CudnnRNNTanh or CudnnRNNRelu, got "
                        f"{type(module).__name__}")


def cudnn_rnn_keras_weights(module) -> List[Tensor]:
    """`[kernel [in, G*U], recurrent_kernel [O, G*U], bias]` per pseudo-layer (forward layer, then the
    backward layer of a Keras `Bidirectional`, layer by layer), as `layer.get_weights()` lists them.
    LSTM / SimpleRNN bias `[G*U]` = b_W + b_R (Keras has one bias; the function is the same);
    GRU (reset_after=True) bias `[2, 3U]` = [b_W; b_R], exact."""
    _cudnn_rnn(module)
    module._check_linear_input("Keras")
    if module.num_proj:
        raise ValueError("Keras LSTM has no projection (num_proj); cannot convert")
    out: List[Tensor] = []
    order = _KERAS_GATE_ORDER[module.rnn_mode]
    with torch.no_grad():
        for W, R, _, bW, bR in module._per_pseudo_layer():
            out.append(torch.cat([W[g].t() for g in order], 1).clone())
            out.append(torch.cat([R[g].t() for g in order], 1).clone())
            if module.rnn_mode == "gru":
                out.append(torch.stack([torch.cat([bW[g] for g in order]), torch.cat([bR[g] for g in order])]))
            else:
                out.append(torch.cat([bW[g] + bR[g] for g in order]))
    return out


@torch.no_grad()
def load_cudnn_rnn_keras_weights(module, weights: Sequence[Any]) -> None:
    """Loads Keras `get_weights()` lists: 3 arrays per pseudo-layer (see `keras_weights`). LSTM / SimpleRNN
    put the Keras bias into b_R and zero b_W (as Keras' own cuDNN path); GRU needs `reset_after=True`
    (bias `[2, 3U]`; reset_after=False applies the reset gate before the matmul, which cuDNN cannot)."""
    _cudnn_rnn(module)
    module._check_linear_input("Keras")
    if module.num_proj:
        raise ValueError("Keras LSTM has no projection (num_proj); cannot convert")
    layers = module._per_pseudo_layer()
    if len(weights) != 3 * len(layers):
        raise ValueError(f"expected {3 * len(layers)} Keras arrays ([kernel, recurrent_kernel, bias] for each of "
                         f"{len(layers)} (layer, direction) pairs), got {len(weights)}")
    G, U = module.num_gates, module.num_units
    order = _KERAS_GATE_ORDER[module.rnn_mode]
    staged = []
    for i, (W, R, _, bW, bR) in enumerate(layers):
        kernel, rec, bias = (_as_tensor(a, module.params) for a in weights[3 * i:3 * i + 3])
        for name, t, rows in (("kernel", kernel, W[0].shape[1]), ("recurrent_kernel", rec, R[0].shape[1])):
            if list(t.shape) != [rows, G * U]:
                raise ValueError(f"Keras {name} of (layer, direction) {i} must have shape [{rows}, {G * U}], "
                                 f"got {list(t.shape)}")
        if module.rnn_mode == "gru":
            if bias.dim() == 1 and bias.numel() == G * U:
                raise ValueError("Keras GRU with reset_after=False (bias [3 * units]) applies the reset gate "
                                 "before the matmul and has no cuDNN equivalent; use reset_after=True, or load it into "
                                 "BlockGRU / GRUBlockCell with load_gru_block_keras_weights")
            if list(bias.shape) != [2, G * U]:
                raise ValueError(f"Keras GRU bias of (layer, direction) {i} must have shape [2, {G * U}] "
                                 f"(reset_after=True), got {list(bias.shape)}")
            b_in, b_rec = bias[0], bias[1]
        else:
            if list(bias.shape) != [G * U]:
                raise ValueError(f"Keras bias of (layer, direction) {i} must have shape [{G * U}], "
                                 f"got {list(bias.shape)}")
            b_in, b_rec = torch.zeros_like(bias), bias
        staged.append((kernel, rec, b_in, b_rec))
    for (W, R, _, bW, bR), (kernel, rec, b_in, b_rec) in zip(layers, staged):
        for k, g in enumerate(order):
            W[g].copy_(kernel[:, k * U:(k + 1) * U].t())
            R[g].copy_(rec[:, k * U:(k + 1) * U].t())
            bW[g].copy_(b_in[k * U:(k + 1) * U])
            bR[g].copy_(b_rec[k * U:(k + 1) * U])

# -- CudnnRNN modules: TF 1.x checkpoints (tf.contrib.cudnn_rnn saveable format) -----------------------------


def _tf_prefix(module, pl: int, scope: str) -> str:
    layer, d = pl // module.num_dirs, pl % module.num_dirs
    if module.num_dirs == 1:
        name = f"rnn/multi_rnn_cell/cell_{layer}/{_TF_CELL_NAME[module.rnn_mode]}"
    else:
        cell = _TF_CELL_NAME[module.rnn_mode]
        name = f"stack_bidirectional_rnn/cell_{layer}/bidirectional_rnn/{'bw' if d else 'fw'}/{cell}"
    return f"{scope}/{name}" if scope else name


def _tf_pseudo_layer(module, W, R, Pm, bW, bR) -> List[Tuple[str, Tensor, str]]:
    """(name, tensor, kind) of one pseudo-layer in TF's saveable format (kind: weight or bias)."""
    if module.rnn_mode == "gru":  # CudnnCompatibleGRUCell: gates = [reset | update], candidate kept apart
        return [("gates/kernel", torch.cat([torch.cat([W[g], R[g]], 1) for g in (0, 1)], 0).t(), "weight"),
                ("candidate/input_projection/kernel", W[2].t(), "weight"),
                ("candidate/hidden_projection/kernel", R[2].t(), "weight"),
                ("gates/bias", torch.cat([bW[0] + bR[0], bW[1] + bR[1]]), "bias"),
                ("candidate/input_projection/bias", bW[2], "bias"),
                ("candidate/hidden_projection/bias", bR[2], "bias")]
    order = [0, 2, 1, 3] if module.rnn_mode == "lstm" else [0]  # LSTM: cuDNN i, f, c, o -> TF i, c, f, o
    out = [("kernel", torch.cat([torch.cat([W[g], R[g]], 1) for g in order], 0).t(), "weight")]
    if Pm is not None:
        out.append(("projection/kernel", Pm.t(), "weight"))
    out.append(("bias", torch.cat([bW[g] + bR[g] for g in order]), "bias"))
    return out


def cudnn_rnn_checkpoint_weights(module, scope: str = "") -> "dict[str, Tensor]":
    """The tensors `tf.contrib.cudnn_rnn`'s saveable (CudnnLSTMSaveable / CudnnGRUSaveable /
    CudnnRNNTanh/ReluSaveable) writes into a TF 1.x checkpoint, by variable name, in its order (all
    weights, then all biases; layer by layer, forward then backward). Names are
    `[scope/]rnn/multi_rnn_cell/cell_{l}/<cell>/...` (unidirectional) or
    `[scope/]stack_bidirectional_rnn/cell_{l}/bidirectional_rnn/{fw,bw}/<cell>/...`, with <cell>
    `cudnn_compatible_lstm_cell` (kernel `[in + O, 4H]` gates i, c, f, o; bias `[4H]`; projection/kernel
    `[H, P]`), `cudnn_compatible_gru_cell` (gates/kernel `[in + H, 2H]` = [reset | update], gates/bias,
    candidate/input_projection/{kernel, bias}, candidate/hidden_projection/{kernel, bias}) or
    `basic_rnn_cell` (kernel `[in + H, H]`, bias). Biases b_W + b_R are saved summed, as TF does."""
    _cudnn_rnn(module)
    module._check_linear_input("TF's canonical cells")
    weights, biases = {}, {}
    with torch.no_grad():
        for pl, layer in enumerate(module._per_pseudo_layer()):
            prefix = _tf_prefix(module, pl, scope)
            for name, t, kind in _tf_pseudo_layer(module, *layer):
                (weights if kind == "weight" else biases)[f"{prefix}/{name}"] = t.clone()
    return {**weights, **biases}


@torch.no_grad()
def load_cudnn_rnn_checkpoint(module, tensors: Any, scope: str = "") -> None:
    """Loads what `cudnn_rnn_checkpoint_weights` describes from a `torchops.tf.load_checkpoint` reader or a
    mapping name -> array (pass the TF layer's scope). As TF's restore, summed biases are split into two
    equal halves (b_W = b_R = bias / 2): the same function."""
    _cudnn_rnn(module)
    module._check_linear_input("TF's canonical cells")
    layers = module._per_pseudo_layer()
    staged = []
    for pl, layer in enumerate(layers):
        prefix = _tf_prefix(module, pl, scope)
        for name, like, _ in _tf_pseudo_layer(module, *layer):
            key = f"{prefix}/{name}"
            t = _as_tensor(_get(tensors, key), like)
            if t.shape != like.shape:
                raise ValueError(f"TF checkpoint tensor {key!r} must have shape {list(like.shape)}, "
                                 f"got {list(t.shape)}")
            staged.append((pl, name, t))
    got = {(pl, name): t for pl, name, t in staged}
    G, H = module.num_gates, module.num_units
    for pl, (W, R, Pm, bW, bR) in enumerate(layers):
        win = W[0].shape[1]
        if module.rnn_mode == "gru":
            k = got[(pl, "gates/kernel")].t()
            for j, g in enumerate((0, 1)):
                W[g].copy_(k[j * H:(j + 1) * H, :win])
                R[g].copy_(k[j * H:(j + 1) * H, win:])
                half = got[(pl, "gates/bias")][j * H:(j + 1) * H] * 0.5
                bW[g].copy_(half)
                bR[g].copy_(half)
            W[2].copy_(got[(pl, "candidate/input_projection/kernel")].t())
            R[2].copy_(got[(pl, "candidate/hidden_projection/kernel")].t())
            bW[2].copy_(got[(pl, "candidate/input_projection/bias")])
            bR[2].copy_(got[(pl, "candidate/hidden_projection/bias")])
            continue
        order = [0, 2, 1, 3] if module.rnn_mode == "lstm" else [0]
        k = got[(pl, "kernel")].t()
        for j, g in enumerate(order):
            W[g].copy_(k[j * H:(j + 1) * H, :win])
            R[g].copy_(k[j * H:(j + 1) * H, win:])
            half = got[(pl, "bias")][j * H:(j + 1) * H] * 0.5
            bW[g].copy_(half)
            bR[g].copy_(half)
        if Pm is not None:
            Pm.copy_(got[(pl, "projection/kernel")].t())


# -- GRUBlockCell / BlockGRU ---------------------------------------------------------------------------------

def _gru_block(module) -> None:
    from ..nn.block_rnn import _GRUParams
    if not isinstance(module, _GRUParams):
        raise TypeError(f"module must be a torchops.nn.GRUBlockCell or BlockGRU, got {type(module).__name__}")


def gru_block_keras_weights(module) -> List[Tensor]:
    """Keras `GRU(reset_after=False)` `get_weights()`: `[kernel [I, 3C], recurrent_kernel [C, 3C], bias [3C]]`,
    gates z, r, h (Keras' z is TF's u)."""
    _gru_block(module)
    i = module.input_size
    with torch.no_grad():
        r, u = module.w_ru.chunk(2, 1)
        k = torch.cat([u, r, module.w_c], 1)
        br, bu = module.b_ru.chunk(2)
        return [k[:i].clone(), k[i:].clone(), torch.cat([bu, br, module.b_c])]


@torch.no_grad()
def load_gru_block_keras_weights(module, weights: Sequence[Any]) -> None:
    """Loads a Keras `GRU(reset_after=False)` layer's `get_weights()` into a GRUBlockCell / BlockGRU (the same
    math: the reset gate scales h before the recurrent matmul). Keras' `reset_after=True` (bias `[2, 3C]`)
    is CudnnGRU's math: load it with `load_cudnn_rnn_keras_weights`."""
    _gru_block(module)
    if len(weights) != 3:
        raise ValueError(f"expected the 3 arrays of a Keras GRU ([kernel, recurrent_kernel, bias]), "
                         f"got {len(weights)}")
    I, C = module.input_size, module.cell_size
    kernel, rec, bias = (_as_tensor(w, module.w_c) for w in weights)
    if bias.dim() == 2:
        raise ValueError(f"Keras GRU bias of shape {list(bias.shape)} is reset_after=True (CudnnGRU's math); "
                         f"GRUBlockCell / BlockGRU take reset_after=False (bias [{3 * C}])")
    _check_shape("Keras GRU kernel", kernel, [I, 3 * C])
    _check_shape("Keras GRU recurrent_kernel", rec, [C, 3 * C])
    _check_shape("Keras GRU bias", bias, [3 * C])
    w = torch.cat([kernel, rec], 0)
    z, r, h = w.chunk(3, 1)
    bz, br, bh = bias.chunk(3)
    module.w_ru.copy_(torch.cat([r, z], 1))
    module.w_c.copy_(h)
    module.b_ru.copy_(torch.cat([br, bz]))
    module.b_c.copy_(bh)


@torch.no_grad()
def load_gru_block_checkpoint(module, tensors: Any, scope: str = "") -> None:
    """Loads TF's GRUBlockCell variables `[scope/]gates/kernel [I+C, 2C]` (columns r, u), `gates/bias [2C]`,
    `candidate/kernel [I+C, C]`, `candidate/bias [C]` into a GRUBlockCell / BlockGRU."""
    _gru_block(module)
    staged = []
    for name, param in (("gates/kernel", module.w_ru), ("gates/bias", module.b_ru),
                        ("candidate/kernel", module.w_c), ("candidate/bias", module.b_c)):
        key = _scoped(scope, name)
        staged.append((param, _check_shape(f"TF checkpoint tensor {key!r}", _as_tensor(_get(tensors, key), param),
                                           param.shape)))
    for param, t in staged:
        param.copy_(t)


# -- LSTMBlockCell / BlockLSTM -------------------------------------------------------------------------------

def _lstm_block(module) -> None:
    from ..nn.block_rnn import _LSTMParams
    if not isinstance(module, _LSTMParams):
        raise TypeError(f"module must be a torchops.nn.LSTMBlockCell or BlockLSTM, got {type(module).__name__}")


def _icfo(module) -> bool:
    """Whether the module's gate blocks are TF's ICFO (LSTMBlockCell, BlockLSTM version 1) rather than IFCO."""
    return getattr(module, "version", 1) == 1


def lstm_block_keras_weights(module) -> List[Tensor]:
    """Keras `LSTM` `get_weights()`: `[kernel [I, 4C], recurrent_kernel [C, 4C], bias [4C]]`, gates i, f, c, o,
    with the module's `forget_bias` folded into the bias (Keras has none)."""
    _lstm_block(module)
    if module.use_peephole:
        raise ValueError("Keras LSTM has no peepholes; cannot convert a module with use_peephole=True")
    with torch.no_grad():
        w, b = module.w.clone(), module.b.clone()
        if _icfo(module):
            b[2 * module.cell_size:3 * module.cell_size] += module.forget_bias
            w, b = _icfo_to_ifco(w), _icfo_to_ifco(b)
        return [w[:module.input_size].clone(), w[module.input_size:].clone(), b]


@torch.no_grad()
def load_lstm_block_keras_weights(module, weights: Sequence[Any]) -> None:
    """Loads a Keras `LSTM` layer's `get_weights()` (gates i, f, c, o; sigmoid recurrent activation) into an
    LSTMBlockCell / BlockLSTM without peepholes. The module's `forget_bias` is subtracted from the forget
    gate's bias, so the function is Keras' for any forget_bias."""
    _lstm_block(module)
    if module.use_peephole:
        raise ValueError("Keras LSTM has no peepholes; load into a module with use_peephole=False")
    if len(weights) != 3:
        raise ValueError(f"expected the 3 arrays of a Keras LSTM ([kernel, recurrent_kernel, bias]), "
                         f"got {len(weights)}")
    I, C = module.input_size, module.cell_size
    kernel, rec, bias = (_as_tensor(w, module.w) for w in weights)
    _check_shape("Keras LSTM kernel", kernel, [I, 4 * C])
    _check_shape("Keras LSTM recurrent_kernel", rec, [C, 4 * C])
    _check_shape("Keras LSTM bias", bias, [4 * C])
    w, b = torch.cat([kernel, rec], 0), bias.clone()
    if _icfo(module):
        w, b = _ifco_to_icfo(w), _ifco_to_icfo(b)
        b[2 * C:3 * C] -= module.forget_bias
    module.w.copy_(w)
    module.b.copy_(b)


@torch.no_grad()
def load_lstm_block_checkpoint(module, tensors: Any, scope: str = "", forget_bias: float = 1.0) -> None:
    """Loads TF's LSTMBlockCell / LSTMBlockFusedCell variables `[scope/]kernel [I+C, 4C]` (gates i, c, f, o),
    `bias [4C]` and, with peepholes, `w_i_diag`, `w_f_diag`, `w_o_diag` `[C]`. Modules with TF's ICFO layout
    (LSTMBlockCell, BlockLSTM(version=1)) take them as they are and must be built with the TF cell's
    `forget_bias`; BlockLSTM(version=2) gets them in IFCO order with `forget_bias` (the TF cell's attribute,
    1.0 by default, not in the checkpoint) folded into the bias."""
    _lstm_block(module)
    C = module.cell_size
    names = [("kernel", module.w), ("bias", module.b)]
    if module.use_peephole:
        names += [("w_i_diag", module.wci), ("w_f_diag", module.wcf), ("w_o_diag", module.wco)]
    got = {}
    for name, param in names:
        key = _scoped(scope, name)
        got[name] = _check_shape(f"TF checkpoint tensor {key!r}", _as_tensor(_get(tensors, key), param), param.shape)
    if not _icfo(module):
        got["bias"] = got["bias"].clone()
        got["bias"][2 * C:3 * C] += float(forget_bias)
        got["kernel"], got["bias"] = _icfo_to_ifco(got["kernel"]), _icfo_to_ifco(got["bias"])
    for name, param in names:
        param.copy_(got[name])


# -- BatchNorm2d / BatchNorm3d -------------------------------------------------------------------------------

def _batch_norm(module) -> None:
    if not isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
        raise TypeError(f"module must be a batch norm module (torchops.nn.BatchNorm2d/3d or torch.nn's), got "
                        f"{type(module).__name__}")
    if module.running_mean is None:
        raise ValueError("module has no running statistics (track_running_stats=False); Keras and TF keep them")


def _store_batch_norm(module, gamma, beta, mean, var) -> None:
    n = module.num_features
    ref = module.running_mean
    staged = []
    for what, t in (("gamma", gamma), ("beta", beta), ("moving_mean", mean), ("moving_variance", var)):
        if t is not None:
            t = _check_shape(what, _as_tensor(t, ref), [n])
        staged.append(t)
    gamma, beta, mean, var = staged
    if not module.affine and ((gamma is not None and not bool((gamma == 1).all()))
                              or (beta is not None and not bool((beta == 0).all()))):
        raise ValueError("module has affine=False but the source has a gamma/beta other than 1/0; build it with "
                         "affine=True")
    with torch.no_grad():
        if module.affine:
            module.weight.copy_(gamma if gamma is not None else torch.ones_like(ref))
            module.bias.copy_(beta if beta is not None else torch.zeros_like(ref))
        module.running_mean.copy_(mean)
        module.running_var.copy_(var)


def load_batch_norm_keras_weights(module, weights: Sequence[Any], center: bool = True, scale: bool = True) -> None:
    """Loads a Keras `BatchNormalization` layer's `get_weights()`: `[gamma] [beta] moving_mean moving_variance`
    (gamma only with `scale=True`, beta only with `center=True`, as the layer was built). A missing gamma is
    1, a missing beta 0. Keras' `epsilon` (1e-3 by default) and momentum are the module's own settings: build
    it with `eps=1e-3, momentum=0.99, moving_statistics="keras"` to continue training as Keras."""
    _batch_norm(module)
    expected = int(center) + int(scale) + 2
    if len(weights) != expected:
        raise ValueError(f"expected {expected} Keras BatchNormalization arrays for center={center}, scale={scale}, "
                         f"got {len(weights)}")
    weights = list(weights)
    gamma = weights.pop(0) if scale else None
    beta = weights.pop(0) if center else None
    _store_batch_norm(module, gamma, beta, weights[0], weights[1])


def load_batch_norm_checkpoint(module, tensors: Any, scope: str = "") -> None:
    """Loads TF 1.x batch norm variables `[scope/]gamma`, `beta`, `moving_mean`, `moving_variance`
    (`tf.compat.v1.layers.batch_normalization`, `tf.contrib.layers.batch_norm`); a gamma or beta that the
    checkpoint lacks (scale=False, the contrib default, or center=False) is 1 or 0."""
    _batch_norm(module)
    found = {}
    for name in ("gamma", "beta"):
        key = _scoped(scope, name)
        found[name] = _get(tensors, key) if key in tensors else None
    _store_batch_norm(module, found["gamma"], found["beta"], _get(tensors, _scoped(scope, "moving_mean")),
                      _get(tensors, _scoped(scope, "moving_variance")))
