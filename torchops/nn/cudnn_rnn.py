"""cuDNN-style multi-layer RNN modules on the torchops CudnnRNN ops, mirroring TF's
`tf.contrib.cudnn_rnn.CudnnLSTM` / `CudnnGRU` / `CudnnRNNTanh` / `CudnnRNNRelu`.

Each module holds ONE flat parameter, `params`, in the CudnnRNN params-buffer layout (the
layout `cudnn_rnn_params_to_canonical` / `cudnn_rnn_canonical_to_params` use): first the matrices of every
pseudo-layer `pl = layer * num_dirs + dir` (`W_0..W_{G-1}` `[H, in_l]`, `R_0..R_{G-1}` `[H, O]`, then the
LSTM projection `[P, H]`), then the biases of every pseudo-layer (`b_W0..b_W{G-1}`, `b_R0..b_R{G-1}`,
each `[H]`), every tensor flattened row-major. Gate order: lstm i, f, c(g), o; gru r, z, n; rnn one gate.

Converters (exact, see docs/cudnn_rnn_nn.md):

* `from_torch(rnn)` / `to_torch()`: `torch.nn.LSTM` (incl. `proj_size`), `torch.nn.GRU`,
  `torch.nn.RNN` (tanh / relu); stacks, bidirectional, `batch_first` <-> `time_major=False`.
* `canonical_weights()` / `load_canonical_weights(weights, biases)`: TF's canonical lists (what
  `CudnnRNNParamsToCanonical(V2)` returns and `CudnnRNNCanonicalToParams(V2)` takes).
* `keras_weights()` / `load_keras_weights(weights)`: Keras LSTM / GRU (`reset_after=True`) /
  SimpleRNN `[kernel, recurrent_kernel, bias]` per (layer, direction).
* `tf_checkpoint_weights()` / `load_tf_checkpoint_weights(weights)`: the TF 1.x canonical-cell format
  in which `tf.contrib.cudnn_rnn`'s saveable writes checkpoints (CudnnCompatibleLSTMCell / GRUCell /
  BasicRNNCell kernels and biases per (layer, direction)).
  These four are aliases of the functions in `torchops.tf.convert` (see docs/porting.md).
"""
import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .. import _cudnn_rnn_params as _layout

__all__ = ["CudnnLSTM", "CudnnGRU", "CudnnRNNTanh", "CudnnRNNRelu", "canonical_shapes", "cudnn_params_size"]

_GATES = _layout.GATES
_DIRECTIONS = ("unidirectional", "bidirectional")
_INPUT_MODES = ("linear_input", "skip_input", "auto_select")


# ---------------------------------------------------------------------------------------------------------
# params-buffer layout: configuration checks here, the layout itself in torchops/_cudnn_rnn_params.py
# ---------------------------------------------------------------------------------------------------------

_INT32_MAX = 2 ** 31 - 1  # TF passes the sizes as int32 tensors


def _check_int(name: str, value: Any, minimum: int, maximum: int = 2 ** 63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def _check_config(rnn_mode: str, num_layers: int, num_units: int, input_size: int, direction: str,
                  input_mode: str, num_proj: int) -> bool:
    """Validates a configuration; returns whether layer 0 skips its input matrices (skip_input)."""
    if rnn_mode not in _GATES:
        raise ValueError(f"rnn_mode must be one of {sorted(_GATES)}, got {rnn_mode!r}")
    _check_int("num_layers", num_layers, 1, _INT32_MAX)
    _check_int("num_units", num_units, 1, _INT32_MAX)
    _check_int("input_size", input_size, 1, _INT32_MAX)
    _check_int("num_proj", num_proj, 0, _INT32_MAX)
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be one of {list(_DIRECTIONS)}, got {direction!r}")
    if input_mode not in _INPUT_MODES:
        raise ValueError(f"input_mode must be one of {list(_INPUT_MODES)}, got {input_mode!r}")
    if num_proj > 0 and rnn_mode != "lstm":
        raise ValueError(f"num_proj (projection) is only supported for rnn_mode 'lstm', got rnn_mode {rnn_mode!r} "
                         f"with num_proj {num_proj}")
    if num_proj > num_units:
        raise ValueError(f"num_proj must be <= num_units ({num_units}), got {num_proj}")
    if input_mode == "skip_input" and input_size != num_units:
        raise ValueError(f"input_mode 'skip_input' requires input_size == num_units, got input_size {input_size} "
                         f"and num_units {num_units}")
    return input_mode == "skip_input" or (input_mode == "auto_select" and input_size == num_units)


def canonical_shapes(rnn_mode: str, num_layers: int, num_units: int, input_size: int,
                     direction: str = "unidirectional", input_mode: str = "linear_input",
                     num_proj: int = 0) -> Tuple[List[List[int]], List[List[int]]]:
    """The shapes of TF's canonical weights and biases, in params_to_canonical order.

    skip_input: layer 0's input matrices are `[H, 0]` and its input biases `[0]` (present, empty)."""
    skip = _check_config(rnn_mode, num_layers, num_units, input_size, direction, input_mode, num_proj)
    D = 2 if direction == "bidirectional" else 1
    return _layout.canonical_shapes(_GATES[rnn_mode], D, num_layers, num_units, input_size, num_proj, skip)


def cudnn_params_size(rnn_mode: str, num_layers: int, num_units: int, input_size: int,
                      direction: str = "unidirectional", input_mode: str = "linear_input", num_proj: int = 0) -> int:
    """Number of elements of the params buffer; equals `cudnn_rnn_params_size`."""
    skip = _check_config(rnn_mode, num_layers, num_units, input_size, direction, input_mode, num_proj)
    D = 2 if direction == "bidirectional" else 1
    return _layout.params_size(_GATES[rnn_mode], D, num_layers, num_units, input_size, num_proj, skip)


def _split_params(params: Tensor, weight_shapes: List[List[int]], bias_shapes: List[List[int]]):
    """Views of `params` in the canonical order (the inverse of flatten-and-concatenate)."""
    weights, biases, offset = [], [], 0
    for shape, out in [(s, weights) for s in weight_shapes] + [(s, biases) for s in bias_shapes]:
        n = math.prod(shape)
        out.append(params[offset:offset + n].view(shape))
        offset += n
    return weights, biases


def _as_tensor(x: Any, like: Tensor) -> Tensor:
    """Checkpoint arrays (numpy, lists, tensors of any dtype/device) as tensors like `like`."""
    t = x.detach() if isinstance(x, Tensor) else torch.as_tensor(x)
    return t.to(dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------------------

class _CudnnRNN(nn.Module):
    """Shared implementation; use CudnnLSTM / CudnnGRU / CudnnRNNTanh / CudnnRNNRelu."""

    rnn_mode: str = ""
    _torch_class: Any = None
    __jit_unused_properties__ = ["params_size", "num_gates"]

    def __init__(self, num_layers: int, num_units: int, input_size: int, direction: str = "unidirectional",
                 dropout: float = 0.0, seed: int = 0, time_major: bool = True, input_mode: str = "linear_input",
                 num_proj: Optional[int] = None, init: str = "glorot", device=None, dtype=None):
        super().__init__()
        num_proj = 0 if num_proj is None else num_proj
        _check_config(self.rnn_mode, num_layers, num_units, input_size, direction, input_mode, num_proj)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(f"dropout must be a probability in [0, 1], got {dropout!r}")
        _check_int("seed", seed, -(2 ** 63))
        if init not in ("glorot", "torch"):
            raise ValueError(f"init must be 'glorot' (TF/Keras) or 'torch' (torch.nn.LSTM), got {init!r}")
        self.rnn_mode = type(self).rnn_mode  # an instance attribute, so that TorchScript sees it
        self.num_layers = num_layers
        self.num_units = num_units
        self.input_size = input_size
        self.direction = direction
        self.num_dirs = 2 if direction == "bidirectional" else 1
        self.dropout = float(dropout)
        self.seed = seed
        self.time_major = bool(time_major)
        self.input_mode = input_mode
        self.num_proj = num_proj
        self.output_size = num_proj if num_proj > 0 else num_units  # width of h and of each output direction
        self.init = init
        # Training calls made with seed != 0 and dropout > 0: the k-th call uses (seed, seed2 = k), so the mask
        # sequence is reproducible from the seed yet differs between steps (see docs/cudnn_rnn_nn.md).
        self.dropout_step = 0
        size = cudnn_params_size(self.rnn_mode, num_layers, num_units, input_size, direction, input_mode, num_proj)
        if size >= 2 ** 63:
            raise ValueError(f"the params size of this configuration ({size} elements) overflows int64: num_layers "
                             f"{num_layers}, num_units {num_units}, input_size {input_size}")
        self.params = nn.Parameter(torch.empty(size, device=device, dtype=dtype))
        self._weight_shapes, self._bias_shapes = canonical_shapes(self.rnn_mode, num_layers, num_units, input_size,
                                                                  direction, input_mode, num_proj)
        self.reset_parameters()

    # -- construction helpers -------------------------------------------------------------------------------

    @property
    def params_size(self) -> int:
        return self.params.numel()

    @property
    def num_gates(self) -> int:
        return _GATES[self.rnn_mode]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """init='glorot' (default, TF's CudnnRNN layers and Keras): every canonical matrix glorot-uniform over
        its own `[rows, cols]` (limit sqrt(6 / (rows + cols))), biases 0. init='torch': every element
        U(-1/sqrt(H), 1/sqrt(H)), as torch.nn.LSTM/GRU/RNN."""
        weights, biases = self.canonical_weights()
        if self.init == "torch":
            bound = 1.0 / math.sqrt(self.num_units)
            self.params.uniform_(-bound, bound)
            return
        for w in weights:
            if w.numel() > 0:
                a = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))
                w.uniform_(-a, a)
        for b in biases:
            b.zero_()

    def flatten_parameters(self) -> None:
        """No-op, for code written for torch.nn.LSTM: `params` already is one flat buffer."""

    def extra_repr(self) -> str:
        s = f"num_layers={self.num_layers}, num_units={self.num_units}, input_size={self.input_size}"
        if self.direction != "unidirectional":
            s += f", direction={self.direction!r}"
        if self.num_proj:
            s += f", num_proj={self.num_proj}"
        if self.dropout:
            s += f", dropout={self.dropout}, seed={self.seed}"
        if not self.time_major:
            s += ", time_major=False"
        if self.input_mode != "linear_input":
            s += f", input_mode={self.input_mode!r}"
        return s

    # -- forward --------------------------------------------------------------------------------------------

    def _state(self, state: Optional[Tensor], input: Tensor, batch: int, width: int, name: str) -> Tensor:
        """The initial state, [L*D, B, n] (torch's and TF's layer convention, the op's time-major layout)."""
        n = self.num_layers * self.num_dirs
        if state is None:
            return torch.zeros([n, batch, width], dtype=input.dtype, device=input.device)
        if state.dim() != 3 or state.size(0) != n or state.size(1) != batch or state.size(2) != width:
            raise ValueError(f"{name} must have shape [num_layers * num_dirs, batch, {width}] = "
                             f"[{n}, {batch}, {width}], got {list(state.shape)}")
        return state

    def _run(self, input: Tensor, h0: Optional[Tensor], c0: Optional[Tensor],
             sequence_lengths: Optional[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        if input.dim() != 3:
            raise ValueError(f"input must be 3-D ({'[T, B, input_size]' if self.time_major else '[B, T, input_size]'}),"
                             f" got shape {list(input.shape)}")
        if input.size(2) != self.input_size:
            raise ValueError(f"input must have input_size = {self.input_size} features in its last dimension, "
                             f"got shape {list(input.shape)}")
        T = input.size(0) if self.time_major else input.size(1)
        B = input.size(1) if self.time_major else input.size(0)
        h = self._state(h0, input, B, self.output_size, "initial h state")
        if self.rnn_mode == "lstm":
            c = self._state(c0, input, B, self.num_units, "initial c state")
        else:
            c = torch.zeros([], dtype=input.dtype, device=input.device)  # ignored by the op for non-LSTM modes
        if not torch.jit.is_scripting():
            if isinstance(sequence_lengths, (list, tuple)):  # eager convenience, as pack_padded_sequence
                sequence_lengths = torch.tensor(sequence_lengths, dtype=torch.int64)
        if sequence_lengths is None:
            lengths = torch.full([B], T, dtype=torch.int32)
        else:
            if sequence_lengths.dim() != 1 or sequence_lengths.size(0) != B:
                raise ValueError(f"sequence_lengths must be a 1-D tensor of batch size {B}, got shape "
                                 f"{list(sequence_lengths.shape)}")
            if (sequence_lengths.is_floating_point() or sequence_lengths.is_complex()
                    or sequence_lengths.dtype == torch.bool):
                raise ValueError(f"sequence_lengths must hold integers, got dtype {sequence_lengths.dtype}")
            if sequence_lengths.dtype != torch.int32:
                if not torch.jit.is_scripting():
                    if not torch.compiler.is_compiling() and B > 0:
                        # eager: the exact out-of-range value (the op checks int32 lengths itself); O(B)
                        bad = (sequence_lengths < 0) | (sequence_lengths > T)
                        if bool(bad.any()):
                            b = int(bad.nonzero()[0, 0])
                            raise ValueError(f"sequence_lengths[{b}] = {int(sequence_lengths[b])} must be in "
                                             f"[0, max_seq_length = {T}]")
                # out-of-range lengths stay out of range through the narrowing: the op refuses them
                lengths = sequence_lengths.clamp(-1, T + 1).to(torch.int32)
            else:
                lengths = sequence_lengths
        # Dropout only in training; the op's is_training also decides whether it keeps what the backward
        # needs, so eval-mode calls that need gradients still run with is_training=True (and no dropout).
        needs_grad = torch.is_grad_enabled() and (input.requires_grad or self.params.requires_grad
                                                 or h.requires_grad or c.requires_grad)
        dropout = self.dropout if self.training else 0.0
        seed, seed2 = 0, 0
        if self.training and dropout > 0.0 and self.seed != 0 and self.num_layers > 1:
            seed, seed2 = self.seed, self.dropout_step
            self.dropout_step = self.dropout_step + 1
        # Batch-major input runs the op time-major on its transposed view, and the output is the op's transposed
        # back, as torch.nn's batch_first RNNs return it: the op's batch-major output would be one more copy.
        out = torch.ops.torchops.cudnn_rnn_v3(
            input if self.time_major else input.transpose(0, 1), h, c, self.params, lengths,
            rnn_mode=self.rnn_mode, input_mode=self.input_mode, direction=self.direction, dropout=dropout,
            seed=seed, seed2=seed2, num_proj=self.num_proj, is_training=self.training or needs_grad,
            time_major=True)
        output = out[0] if self.time_major else out[0].transpose(0, 1)
        return output, out[1], out[2]

    # -- canonical (TF CudnnRNNParamsToCanonical) -----------------------------------------------------------

    def canonical_weights(self) -> Tuple[List[Tensor], List[Tensor]]:
        """`(weights, biases)` in TF's canonical order (what `CudnnRNNParamsToCanonical(V2)` returns), as
        differentiable views of `params` (write into them under `torch.no_grad()` to edit the buffer)."""
        return _split_params(self.params, self._weight_shapes, self._bias_shapes)

    @torch.no_grad()
    def load_canonical_weights(self, weights: Sequence[Any], biases: Sequence[Any]) -> None:
        """Loads TF canonical lists (`CudnnRNNCanonicalToParams(V2)` order) into `params`. Like TF, only
        element counts are checked, so flattened tensors are accepted; arrays are cast to params' dtype."""
        ws, bs = self.canonical_weights()
        for kind, given, regions in (("weights", weights, ws), ("biases", biases, bs)):
            if len(given) != len(regions):
                raise ValueError(f"expected {len(regions)} canonical {kind} for this configuration, got {len(given)}")
        staged = []  # validate everything before writing anything
        for kind, given, regions in (("weights", weights, ws), ("biases", biases, bs)):
            for i, (src, dst) in enumerate(zip(given, regions)):
                t = _as_tensor(src, dst)
                if t.numel() != dst.numel():
                    raise ValueError(f"canonical {kind}[{i}] must have {dst.numel()} elements (shape "
                                     f"{list(dst.shape)}), got shape {list(t.shape)}")
                staged.append((dst, t.reshape(dst.shape)))
        for dst, t in staged:
            dst.copy_(t)

    # -- per pseudo-layer gate blocks (shared by the converters) ---------------------------------------------

    def _per_pseudo_layer(self) -> List[Tuple[List[Tensor], List[Tensor], Optional[Tensor], List[Tensor], List[Tensor]]]:
        """For each pseudo-layer: (W gates, R gates, projection or None, b_W gates, b_R gates) as views."""
        weights, biases = self.canonical_weights()
        G = self.num_gates
        nw = 2 * G + (1 if self.num_proj > 0 else 0)
        out = []
        for pl in range(self.num_layers * self.num_dirs):
            w = weights[pl * nw:(pl + 1) * nw]
            b = biases[pl * 2 * G:(pl + 1) * 2 * G]
            out.append((w[:G], w[G:2 * G], w[2 * G] if self.num_proj > 0 else None, b[:G], b[G:]))
        return out

    def _check_linear_input(self, what: str) -> None:
        if self.input_mode == "skip_input" or (self.input_mode == "auto_select" and self.input_size == self.num_units):
            raise ValueError(f"{what} has no skip_input mode (layer 0 has no input matrices here); only modules "
                             f"with linear input convert")

    # -- torch.nn.LSTM / GRU / RNN --------------------------------------------------------------------------

    def _torch_kwargs(self) -> dict:
        return {}

    @torch.no_grad()
    def to_torch(self) -> nn.Module:
        """An equivalent `torch.nn.LSTM` / `GRU` / `RNN` (`batch_first = not time_major`; same dropout
        probability, though the dropout masks themselves differ)."""
        self._check_linear_input(f"torch.nn.{self._torch_class.__name__}")
        m = self._torch_class(self.input_size, self.num_units, num_layers=self.num_layers, bias=True,
                              batch_first=not self.time_major, dropout=self.dropout,
                              bidirectional=self.num_dirs == 2, device=self.params.device, dtype=self.params.dtype,
                              **self._torch_kwargs())
        for pl, (W, R, Pm, bW, bR) in enumerate(self._per_pseudo_layer()):
            sfx = f"l{pl // self.num_dirs}" + ("_reverse" if pl % self.num_dirs else "")
            getattr(m, f"weight_ih_{sfx}").copy_(torch.cat(W, 0))
            getattr(m, f"weight_hh_{sfx}").copy_(torch.cat(R, 0))
            getattr(m, f"bias_ih_{sfx}").copy_(torch.cat(bW, 0))
            getattr(m, f"bias_hh_{sfx}").copy_(torch.cat(bR, 0))
            if Pm is not None:
                getattr(m, f"weight_hr_{sfx}").copy_(Pm)
        return m

    @classmethod
    def _from_torch_kwargs(cls, rnn: nn.Module) -> dict:
        return {}

    @classmethod
    @torch.no_grad()
    def from_torch(cls, rnn: nn.Module, seed: int = 0, init: str = "glorot"):
        """The module equivalent to a `torch.nn.LSTM` (-> CudnnLSTM), `GRU` (-> CudnnGRU) or `RNN`
        (tanh -> CudnnRNNTanh, relu -> CudnnRNNRelu); missing biases (`bias=False`) become zeros."""
        if cls._torch_class is None or not isinstance(rnn, cls._torch_class):
            expected = cls._torch_class.__name__ if cls._torch_class is not None else "a subclass"
            raise TypeError(f"{cls.__name__}.from_torch expects a torch.nn.{expected}, got {type(rnn).__name__}")
        ref = rnn.weight_ih_l0
        m = cls(rnn.num_layers, rnn.hidden_size, rnn.input_size,
                direction="bidirectional" if rnn.bidirectional else "unidirectional", dropout=float(rnn.dropout),
                seed=seed, time_major=not rnn.batch_first, init=init, device=ref.device, dtype=ref.dtype,
                **cls._from_torch_kwargs(rnn))
        m.train(rnn.training)
        G = m.num_gates
        for pl, (W, R, Pm, bW, bR) in enumerate(m._per_pseudo_layer()):
            sfx = f"l{pl // m.num_dirs}" + ("_reverse" if pl % m.num_dirs else "")
            for dst, src in ((W, getattr(rnn, f"weight_ih_{sfx}")), (R, getattr(rnn, f"weight_hh_{sfx}"))):
                for d, s in zip(dst, src.chunk(G, 0)):
                    d.copy_(s)
            if Pm is not None:
                Pm.copy_(getattr(rnn, f"weight_hr_{sfx}"))
            for dst, name in ((bW, f"bias_ih_{sfx}"), (bR, f"bias_hh_{sfx}")):
                if rnn.bias:
                    for d, s in zip(dst, getattr(rnn, name).chunk(G, 0)):
                        d.copy_(s)
                else:
                    for d in dst:
                        d.zero_()
        return m

    # -- Keras and TF 1.x checkpoints: the converters live in torchops.tf.convert --------------------------

    def keras_weights(self) -> List[Tensor]:
        """`torchops.tf.convert.cudnn_rnn_keras_weights(self)`: Keras `layer.get_weights()` lists."""
        from ..tf import convert
        return convert.cudnn_rnn_keras_weights(self)

    def load_keras_weights(self, weights: Sequence[Any]) -> None:
        """`torchops.tf.convert.load_cudnn_rnn_keras_weights(self, weights)`."""
        from ..tf import convert
        convert.load_cudnn_rnn_keras_weights(self, weights)

    def tf_checkpoint_weights(self, scope: str = "") -> "dict[str, Tensor]":
        """`torchops.tf.convert.cudnn_rnn_checkpoint_weights(self, scope)`: the TF 1.x checkpoint tensors."""
        from ..tf import convert
        return convert.cudnn_rnn_checkpoint_weights(self, scope)

    def load_tf_checkpoint_weights(self, tensors: Any, scope: str = "") -> None:
        """`torchops.tf.convert.load_cudnn_rnn_checkpoint(self, tensors, scope)`."""
        from ..tf import convert
        convert.load_cudnn_rnn_checkpoint(self, tensors, scope)


class CudnnLSTM(_CudnnRNN):
    """Multi-layer LSTM with cuDNN's math (no peepholes, no forget bias, two bias sets) on the torchops
    `cudnn_rnn_v3` op, like TF's `tf.contrib.cudnn_rnn.CudnnLSTM`; CPU and CUDA.

    `CudnnLSTM(num_layers, num_units, input_size, direction="unidirectional", dropout=0.0, seed=0,
    time_major=True, input_mode="linear_input", num_proj=None, init="glorot", device=None, dtype=None)`

    `forward(input, initial_state=None, sequence_lengths=None) -> (outputs, (h, c))`:
    input `[T, B, input_size]` (`[B, T, input_size]` with time_major=False); initial_state `(h0, c0)` with
    `h0 [L*D, B, O]`, `c0 [L*D, B, num_units]` (O = num_proj or num_units; zeros when None; the same
    layout for both time_major values, as torch.nn.LSTM); sequence_lengths `[B]` integers (unsorted,
    zeros allowed; a Python list also works outside TorchScript): outputs at and past a sequence's length
    are 0 and its final state is taken at its last valid step. outputs `[T, B, D*O]` (`[B, T, D*O]`).
    """

    rnn_mode = "lstm"
    _torch_class = nn.LSTM

    def __init__(self, num_layers: int, num_units: int, input_size: int, direction: str = "unidirectional",
                 dropout: float = 0.0, seed: int = 0, time_major: bool = True, input_mode: str = "linear_input",
                 num_proj: Optional[int] = None, init: str = "glorot", device=None, dtype=None):
        super().__init__(num_layers, num_units, input_size, direction=direction, dropout=dropout, seed=seed,
                         time_major=time_major, input_mode=input_mode, num_proj=num_proj, init=init, device=device,
                         dtype=dtype)

    def forward(self, input: Tensor, initial_state: Optional[Tuple[Tensor, Tensor]] = None,
                sequence_lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        h0: Optional[Tensor] = None
        c0: Optional[Tensor] = None
        if initial_state is not None:
            h0, c0 = initial_state
        output, h, c = self._run(input, h0, c0, sequence_lengths)
        return output, (h, c)

    def _torch_kwargs(self) -> dict:
        return {"proj_size": self.num_proj}

    @classmethod
    def _from_torch_kwargs(cls, rnn: nn.Module) -> dict:
        return {"num_proj": rnn.proj_size or None}


class _CudnnHiddenStateRNN(_CudnnRNN):
    """The modes with one state, h (GRU and the plain RNNs): no projection, `forward -> (outputs, h)`."""

    def __init__(self, num_layers: int, num_units: int, input_size: int, direction: str = "unidirectional",
                 dropout: float = 0.0, seed: int = 0, time_major: bool = True, input_mode: str = "linear_input",
                 init: str = "glorot", device=None, dtype=None):
        super().__init__(num_layers, num_units, input_size, direction=direction, dropout=dropout, seed=seed,
                         time_major=time_major, input_mode=input_mode, init=init, device=device, dtype=dtype)

    def forward(self, input: Tensor, initial_state: Optional[Tensor] = None,
                sequence_lengths: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        output, h, _ = self._run(input, initial_state, None, sequence_lengths)
        return output, h


class CudnnGRU(_CudnnHiddenStateRNN):
    """Multi-layer GRU with cuDNN's math (reset gate applied after the recurrent matmul, "linear before
    reset": n = tanh(W_n x + b_Wn + r * (R_n h + b_Rn)), h' = (1 - z) n + z h; the same as torch.nn.GRU and
    Keras GRU(reset_after=True)), like TF's `tf.contrib.cudnn_rnn.CudnnGRU`.

    `forward(input, initial_state=None, sequence_lengths=None) -> (outputs, h)`; shapes as CudnnLSTM,
    `initial_state` is `h0 [L*D, B, num_units]`.
    """

    rnn_mode = "gru"
    _torch_class = nn.GRU


class _CudnnSimpleRNN(_CudnnHiddenStateRNN):
    _torch_class = nn.RNN
    _nonlinearity = ""

    def _torch_kwargs(self) -> dict:
        return {"nonlinearity": self._nonlinearity}

    @classmethod
    def _from_torch_kwargs(cls, rnn: nn.Module) -> dict:
        if rnn.nonlinearity != cls._nonlinearity:
            raise ValueError(f"{cls.__name__}.from_torch expects torch.nn.RNN(nonlinearity={cls._nonlinearity!r}), "
                             f"got nonlinearity={rnn.nonlinearity!r}")
        return {}


class CudnnRNNTanh(_CudnnSimpleRNN):
    """Multi-layer Elman RNN, h' = tanh(W x + b_W + R h + b_R), like TF's `CudnnRNNTanh` /
    `torch.nn.RNN(nonlinearity="tanh")`. `forward(input, initial_state=None, sequence_lengths=None) ->
    (outputs, h)`; shapes as CudnnGRU."""

    rnn_mode = "rnn_tanh"
    _nonlinearity = "tanh"


class CudnnRNNRelu(_CudnnSimpleRNN):
    """Multi-layer Elman RNN with ReLU, h' = relu(W x + b_W + R h + b_R), like TF's `CudnnRNNRelu` /
    `torch.nn.RNN(nonlinearity="relu")`. `forward` as CudnnRNNTanh."""

    rnn_mode = "rnn_relu"
    _nonlinearity = "relu"
