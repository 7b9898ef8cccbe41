"""GRU / LSTM block modules on the torchops block ops, with parameters stored in TensorFlow's layout so
that TF checkpoints map one-to-one:

=================  ==========================================  ========================================
module             parameters (TF name)                        op
=================  ==========================================  ========================================
GRUBlockCell       w_ru [I+C, 2C], w_c [I+C, C], b_ru, b_c      gru_block_cell (TF GRUBlockCell)
BlockGRU           same as GRUBlockCell                        block_gru (whole sequence, one op)
LSTMBlockCell      w [I+C, 4C] (ICFO), b [4C], wci/wcf/wco      lstm_block_cell (TF LSTMBlockCell)
BlockLSTM          w [I+C, 4C] (ICFO v1 / IFCO v2), b, peeps   block_lstm / block_lstm_v2
=================  ==========================================  ========================================

Rows 0..I-1 of every weight multiply the input, rows I..I+C-1 the recurrent state (TF's
`kernel` = concat([W_x; W_h])). Sequences are time-major `[T, B, I]` unless `batch_first=True`.

Converters: the LSTM modules convert to and from `torch.nn.LSTMCell` / `torch.nn.LSTM` exactly
(`from_torch` / `to_torch`), because the math agrees (PyTorch's gate order i, f, g, o is the IFCO
layout; ICFO is a column permutation; `forget_bias` folds into the bias). The GRU modules have NO
converters: TF's GRU (and these ops) apply the reset gate to h_prev BEFORE the matmul,
c = tanh(W_cx x + W_ch (r * h_prev) + b_c), while `torch.nn.GRUCell` / `torch.nn.GRU` apply it after,
n = tanh(W_in x + b_in + r * (W_hn h_prev + b_hn)); no weight mapping makes the two equal. TF's and
PyTorch's GRUs also swap the roles of u and (1 - u).
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

__all__ = ["GRUBlockCell", "BlockGRU", "LSTMBlockCell", "BlockLSTM"]


def _check_sizes(input_size, cell_size) -> None:
    """Module sizes: ints in TF's int32 range (larger ones cannot be allocated anyway)."""
    for name, v, lo in (("input_size", input_size, 0), ("cell_size", cell_size, 1)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
        if not lo <= v <= 2 ** 31 - 1:
            raise ValueError(f"{name} must be in [{lo}, 2**31 - 1], got {v}")


def _check_input(input: Tensor, rank: int, layout: str) -> None:
    if input.dim() != rank:
        raise ValueError(f"input must be {rank}-D ({layout}), got shape {list(input.shape)}")


def _initial_state(t: Tensor, batch: int, cell: int, name: str) -> Tensor:
    """A sequence module's initial state, `[1, B, C]` or `[B, C]` (as torch.nn.GRU / nn.LSTM take it)."""
    if t.dim() == 3 and t.size(0) == 1:
        t = t.squeeze(0)
    if t.dim() != 2 or t.size(0) != batch or t.size(1) != cell:
        raise ValueError(f"{name} must have shape [1, {batch}, {cell}] or [{batch}, {cell}], got {list(t.shape)}")
    return t


def _glorot_(w: Tensor) -> None:
    fan_in, fan_out = w.shape
    a = math.sqrt(6.0 / (fan_in + fan_out))
    nn.init.uniform_(w, -a, a)


def _icfo_to_ifco(t: Tensor) -> Tensor:
    i, c, f, o = t.chunk(4, dim=-1)
    return torch.cat([i, f, c, o], -1)


def _ifco_to_icfo(t: Tensor) -> Tensor:
    i, f, c, o = t.chunk(4, dim=-1)
    return torch.cat([i, c, f, o], -1)


class _GRUParams(nn.Module):
    def __init__(self, input_size: int, cell_size: int, device=None, dtype=None):
        super().__init__()
        _check_sizes(input_size, cell_size)
        kw = dict(device=device, dtype=dtype)
        self.input_size = input_size
        self.cell_size = cell_size
        self.w_ru = nn.Parameter(torch.empty(input_size + cell_size, 2 * cell_size, **kw))
        self.w_c = nn.Parameter(torch.empty(input_size + cell_size, cell_size, **kw))
        self.b_ru = nn.Parameter(torch.empty(2 * cell_size, **kw))
        self.b_c = nn.Parameter(torch.empty(cell_size, **kw))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """TF's GRUCell defaults: glorot-uniform kernels, b_ru = 1 (gates start open), b_c = 0."""
        with torch.no_grad():
            _glorot_(self.w_ru)
            _glorot_(self.w_c)
            self.b_ru.fill_(1.0)
            self.b_c.zero_()

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.cell_size}"


class GRUBlockCell(_GRUParams):
    """One GRU step with TF's GRUBlockCell math (reset applied before the matmul; see the module doc):
    r, u = σ([x, h] @ w_ru + b_ru) (r = first C columns); c = tanh([x, r * h] @ w_c + b_c);
    h' = u * h + (1 - u) * c. `forward(x [B, I], h [B, C] = zeros) -> h' [B, C]`.

    Not convertible to/from `torch.nn.GRUCell` (PyTorch applies the reset gate after the matmul).
    """

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        _check_input(input, 2, "[B, input_size]")
        if hx is None:
            hx = torch.zeros(input.size(0), self.cell_size, dtype=input.dtype, device=input.device)
        return torch.ops.torchops.gru_block_cell(input, hx, self.w_ru, self.w_c, self.b_ru, self.b_c)[3]


class BlockGRU(_GRUParams):
    """A single-layer GRU over a whole sequence in one op (`block_gru`), with GRUBlockCell's math.

    `forward(x [T, B, I], h0 [1, B, C] or [B, C] = zeros) -> (output [T, B, C], h_n [1, B, C])`, like
    `torch.nn.GRU` (`batch_first=True` takes and returns `[B, T, *]`). Not convertible to/from
    `torch.nn.GRU` (reset gate before vs after the matmul).
    """

    def __init__(self, input_size: int, cell_size: int, batch_first: bool = False, device=None, dtype=None):
        super().__init__(input_size, cell_size, device=device, dtype=dtype)
        self.batch_first = batch_first

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        _check_input(input, 3, "[B, T, input_size]" if self.batch_first else "[T, B, input_size]")
        x = input.transpose(0, 1) if self.batch_first else input
        if hx is None:
            h0 = torch.zeros(x.size(1), self.cell_size, dtype=x.dtype, device=x.device)
        else:
            h0 = _initial_state(hx, x.size(1), self.cell_size, "h0")
        seq = torch.tensor(x.size(0), dtype=torch.int64)
        h = torch.ops.torchops.block_gru(seq, x, h0, self.w_ru, self.w_c, self.b_ru, self.b_c)[3]
        h_n = (h[-1] if x.size(0) > 0 else h0).unsqueeze(0)
        return (h.transpose(0, 1) if self.batch_first else h), h_n


class _LSTMParams(nn.Module):
    def __init__(self, input_size: int, cell_size: int, use_peephole: bool, device=None, dtype=None):
        super().__init__()
        _check_sizes(input_size, cell_size)
        kw = dict(device=device, dtype=dtype)
        self.input_size = input_size
        self.cell_size = cell_size
        self.use_peephole = use_peephole
        self.w = nn.Parameter(torch.empty(input_size + cell_size, 4 * cell_size, **kw))
        self.b = nn.Parameter(torch.empty(4 * cell_size, **kw))
        if use_peephole:
            self.wci = nn.Parameter(torch.empty(cell_size, **kw))
            self.wcf = nn.Parameter(torch.empty(cell_size, **kw))
            self.wco = nn.Parameter(torch.empty(cell_size, **kw))
        else:
            self.register_buffer("wci", torch.zeros(cell_size, **kw), persistent=False)
            self.register_buffer("wcf", torch.zeros(cell_size, **kw), persistent=False)
            self.register_buffer("wco", torch.zeros(cell_size, **kw), persistent=False)

    def _reset(self, forget_block: int, forget_init: float) -> None:
        with torch.no_grad():
            _glorot_(self.w)
            self.b.zero_()
            c = self.cell_size
            self.b[forget_block * c:(forget_block + 1) * c].fill_(forget_init)
            if self.use_peephole:
                for p in (self.wci, self.wcf, self.wco):
                    nn.init.uniform_(p, -0.1, 0.1)

    def _write_torch_weights(self, ifco_w: Tensor, ifco_b: Tensor, weight_ih: Tensor, weight_hh: Tensor,
                             bias_ih: Tensor, bias_hh: Tensor) -> None:
        """Stores IFCO `w` [I + C, 4C] / `b` [4C] into torch's weight_ih / weight_hh / bias_ih (bias_hh = 0)."""
        i = self.input_size
        weight_ih.copy_(ifco_w[:i].t())
        weight_hh.copy_(ifco_w[i:].t())
        bias_ih.copy_(ifco_b)
        bias_hh.zero_()

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.cell_size}, use_peephole={self.use_peephole}"


def _clip_attr(cell_clip: Optional[float]) -> float:
    return -1.0 if cell_clip is None else float(cell_clip)


class LSTMBlockCell(_LSTMParams):
    """One LSTM step with TF's LSTMBlockCell (ICFO gate blocks in `w`/`b`, `forget_bias` added to the
    forget pre-activation, optional peepholes, optional cell clipping; `cell_clip=None` = no clipping,
    as TF 1.15's contrib LSTMBlockCell). `forward(x [B, I], (h, c) = zeros) -> (h', c')` like
    `torch.nn.LSTMCell`. `to_torch()` / `from_torch()` convert exactly to/from `torch.nn.LSTMCell`
    (without peepholes and clipping).
    """

    def __init__(self, input_size: int, cell_size: int, forget_bias: float = 1.0, cell_clip: Optional[float] = None,
                 use_peephole: bool = False, device=None, dtype=None):
        super().__init__(input_size, cell_size, use_peephole, device=device, dtype=dtype)
        self.forget_bias = float(forget_bias)
        self.cell_clip = _clip_attr(cell_clip)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-uniform kernel, zero bias (the forget bias comes from `forget_bias`), as TF."""
        self._reset(2, 0.0)

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
        _check_input(input, 2, "[B, input_size]")
        if hx is None:
            z = torch.zeros(input.size(0), self.cell_size, dtype=input.dtype, device=input.device)
            hx = (z, z)
        if not torch.jit.is_scripting():
            if len(hx) != 2:  # torch.nn.LSTMCell's error for an (h, c, extra) tuple
                raise RuntimeError(f"lstm_cell expects two hidden states (h, c), got a tuple of {len(hx)}")
        h, c = hx
        out = torch.ops.torchops.lstm_block_cell(input, c, h, self.w, self.wci, self.wcf, self.wco, self.b,
                                                 self.forget_bias, self.cell_clip, self.use_peephole)
        return out[6], out[1]

    @torch.no_grad()
    def to_torch(self) -> nn.LSTMCell:
        if self.use_peephole or self.cell_clip > 0:
            raise ValueError("torch.nn.LSTMCell has no peepholes and no cell clipping; cannot convert exactly")
        cell = nn.LSTMCell(self.input_size, self.cell_size, device=self.w.device, dtype=self.w.dtype)
        b = self.b.clone()
        b[2 * self.cell_size:3 * self.cell_size] += self.forget_bias
        self._write_torch_weights(_icfo_to_ifco(self.w), _icfo_to_ifco(b), cell.weight_ih, cell.weight_hh,
                                  cell.bias_ih, cell.bias_hh)
        return cell

    @classmethod
    @torch.no_grad()
    def from_torch(cls, cell: nn.LSTMCell) -> "LSTMBlockCell":
        m = cls(cell.input_size, cell.hidden_size, forget_bias=0.0, cell_clip=None, use_peephole=False,
                device=cell.weight_ih.device, dtype=cell.weight_ih.dtype)
        m.w.copy_(_ifco_to_icfo(torch.cat([cell.weight_ih.t(), cell.weight_hh.t()], 0)))
        bias = torch.zeros_like(m.b)
        if cell.bias:
            bias = cell.bias_ih + cell.bias_hh
        m.b.copy_(_ifco_to_icfo(bias))
        return m


class BlockLSTM(_LSTMParams):
    """A single-layer LSTM over a whole sequence in one op.

    `version=2` (default): TF's BlockLSTMV2 — IFCO gate blocks (Keras / PyTorch order), no forget bias
    attribute (the forget block of `b` starts at 1, like Keras' unit_forget_bias), `cell_clip=None`
    (no clipping). `version=1`: TF's BlockLSTM / contrib LSTMBlockFusedCell — ICFO blocks,
    `forget_bias` (default 1.0) added to the forget pre-activation.
    `forward(x [T, B, I], (h0, c0) each [1, B, C] or [B, C] = zeros) -> (output [T, B, C], (h_n, c_n))`
    like `torch.nn.LSTM(num_layers=1)`. `to_torch()` / `from_torch()` convert exactly to/from
    `torch.nn.LSTM` (single layer, unidirectional, no projections; without peepholes and clipping).
    """

    def __init__(self, input_size: int, cell_size: int, version: int = 2, forget_bias: Optional[float] = None,
                 cell_clip: Optional[float] = None, use_peephole: bool = False, batch_first: bool = False,
                 device=None, dtype=None):
        if version not in (1, 2):
            raise ValueError(f"version must be 1 (BlockLSTM, ICFO) or 2 (BlockLSTMV2, IFCO), got {version}")
        if version == 2 and forget_bias not in (None, 0.0):
            raise ValueError("BlockLSTMV2 (version=2) has no forget_bias; use version=1 or initialise the bias")
        super().__init__(input_size, cell_size, use_peephole, device=device, dtype=dtype)
        self.version = version
        self.forget_bias = 0.0 if version == 2 else (1.0 if forget_bias is None else float(forget_bias))
        self.cell_clip = _clip_attr(cell_clip)
        self.batch_first = batch_first
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.version == 2:
            self._reset(1, 1.0)  # IFCO: forget block 1 initialised to 1 (Keras unit_forget_bias)
        else:
            self._reset(2, 0.0)  # ICFO: forget_bias attribute does the job

    def forward(self, input: Tensor,
                hx: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        _check_input(input, 3, "[B, T, input_size]" if self.batch_first else "[T, B, input_size]")
        x = input.transpose(0, 1) if self.batch_first else input
        B, C = x.size(1), self.cell_size
        if hx is None:
            h0 = torch.zeros(B, C, dtype=x.dtype, device=x.device)
            c0 = h0
        else:
            if not torch.jit.is_scripting():
                if len(hx) != 2:  # torch.nn.LSTM's error for an (h, c, extra) tuple
                    raise RuntimeError(f"lstm expects two hidden states (h0, c0), got a tuple of {len(hx)}")
            h0, c0 = _initial_state(hx[0], B, C, "h0"), _initial_state(hx[1], B, C, "c0")
        seq = torch.tensor(x.size(0), dtype=torch.int64)
        if self.version == 2:
            out = torch.ops.torchops.block_lstm_v2(seq, x, c0, h0, self.w, self.wci, self.wcf, self.wco, self.b,
                                                   self.cell_clip, self.use_peephole)
        else:
            out = torch.ops.torchops.block_lstm(seq, x, c0, h0, self.w, self.wci, self.wcf, self.wco, self.b,
                                                self.forget_bias, self.cell_clip, self.use_peephole)
        h, cs = out[6], out[1]
        if x.size(0) > 0:
            h_n, c_n = h[-1], cs[-1]
        else:
            h_n, c_n = h0, c0
        y = h.transpose(0, 1) if self.batch_first else h
        return y, (h_n.unsqueeze(0), c_n.unsqueeze(0))

    @torch.no_grad()
    def to_torch(self) -> nn.LSTM:
        if self.use_peephole or self.cell_clip > 0:
            raise ValueError("torch.nn.LSTM has no peepholes and no cell clipping; cannot convert exactly")
        lstm = nn.LSTM(self.input_size, self.cell_size, batch_first=self.batch_first, device=self.w.device,
                       dtype=self.w.dtype)
        w, b = self.w, self.b.clone()
        if self.version == 1:
            b[2 * self.cell_size:3 * self.cell_size] += self.forget_bias
            w, b = _icfo_to_ifco(w), _icfo_to_ifco(b)
        self._write_torch_weights(w, b, lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
        return lstm

    @classmethod
    @torch.no_grad()
    def from_torch(cls, lstm: nn.LSTM, version: int = 2) -> "BlockLSTM":
        if lstm.num_layers != 1 or lstm.bidirectional or lstm.proj_size != 0:
            raise ValueError("only single-layer, unidirectional torch.nn.LSTM without projections converts")
        m = cls(lstm.input_size, lstm.hidden_size, version=version, forget_bias=0.0, cell_clip=None,
                batch_first=lstm.batch_first, device=lstm.weight_ih_l0.device, dtype=lstm.weight_ih_l0.dtype)
        w = torch.cat([lstm.weight_ih_l0.t(), lstm.weight_hh_l0.t()], 0)
        b = lstm.bias_ih_l0 + lstm.bias_hh_l0 if lstm.bias else torch.zeros_like(m.b)
        if version == 1:
            w, b = _ifco_to_icfo(w), _ifco_to_icfo(b)
        m.w.copy_(w)
        m.b.copy_(b)
        return m
