"""Typed, TorchScript-scriptable wrappers of the GRU / LSTM block ops.

Weights are in TF's layout: rows `0..I-1` multiply x, rows `I..I+C-1` the state; GRU `w_ru [I+C, 2C]`
(r = first half of the columns, u = second half), `w_c [I+C, C]`; LSTM `w [I+C, 4C]` with gate blocks
ICFO (`lstm_block_cell`, `block_lstm`) or IFCO (`block_lstm_v2`). Sequences are time-major `[T, B, I]`.
`seq_len_max=None` runs all T steps; steps `t >= seq_len_max` produce zeros (all outputs).
Everything is differentiable (C++ autograd), including gradients arriving at gate outputs.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def _seq_len(x: Tensor, seq_len_max: Optional[int]) -> Tensor:
    n = x.size(0) if seq_len_max is None else seq_len_max
    return torch.tensor(n, dtype=torch.int64)


def _peep(t: Optional[Tensor], like: Tensor, c: int) -> Tensor:
    if t is None:
        return torch.zeros([c], dtype=like.dtype, device=like.device)
    return t


def gru_block_cell(x: Tensor, h_prev: Tensor, w_ru: Tensor, w_c: Tensor, b_ru: Tensor,
                   b_c: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """One GRU step like TF's GRUBlockCell: returns `(r, u, c, h)`, each `[B, C]`.

    r = σ(xh @ w_ru[:, :C] + b_ru[:C]); u = σ(xh @ w_ru[:, C:] + b_ru[C:]) with xh = [x, h_prev];
    c = tanh([x, r ⊙ h_prev] @ w_c + b_c) (reset applied BEFORE the matmul); h = u ⊙ h_prev + (1 - u) ⊙ c.
    """
    r, u, c, h = torch.ops.torchops.gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
    return r, u, c, h


def block_gru(x: Tensor, h_prev: Tensor, w_ru: Tensor, w_c: Tensor, b_ru: Tensor, b_c: Tensor,
              seq_len_max: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The GRUBlockCell recurrence over `x [T, B, I]` in one op: returns `(r, u, c, h)`, each `[T, B, C]`."""
    r, u, c, h = torch.ops.torchops.block_gru(_seq_len(x, seq_len_max), x, h_prev, w_ru, w_c, b_ru, b_c)
    return r, u, c, h


def lstm_block_cell(x: Tensor, cs_prev: Tensor, h_prev: Tensor, w: Tensor, b: Tensor,
                    wci: Optional[Tensor] = None, wcf: Optional[Tensor] = None, wco: Optional[Tensor] = None,
                    forget_bias: float = 1.0, cell_clip: float = 3.0,
                    use_peephole: bool = False) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One LSTM step like TF's LSTMBlockCell (ICFO gates): returns `(i, cs, f, o, ci, co, h)`.

    Peephole weights default to zeros. `cell_clip <= 0` disables clipping (TF's op default is 3.0).
    """
    c = cs_prev.size(-1)
    return torch.ops.torchops.lstm_block_cell(x, cs_prev, h_prev, w, _peep(wci, x, c), _peep(wcf, x, c),
                                              _peep(wco, x, c), b, forget_bias, cell_clip, use_peephole)


def block_lstm(x: Tensor, cs_prev: Tensor, h_prev: Tensor, w: Tensor, b: Tensor,
               wci: Optional[Tensor] = None, wcf: Optional[Tensor] = None, wco: Optional[Tensor] = None,
               forget_bias: float = 1.0, cell_clip: float = 3.0, use_peephole: bool = False,
               seq_len_max: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """TF's BlockLSTM (ICFO gates, forget_bias, cell_clip 3.0) over `x [T, B, I]`: `(i, cs, f, o, ci, co, h)`."""
    c = cs_prev.size(-1)
    return torch.ops.torchops.block_lstm(_seq_len(x, seq_len_max), x, cs_prev, h_prev, w, _peep(wci, x, c),
                                         _peep(wcf, x, c), _peep(wco, x, c), b, forget_bias, cell_clip, use_peephole)


def block_lstm_v2(x: Tensor, cs_prev: Tensor, h_prev: Tensor, w: Tensor, b: Tensor,
                  wci: Optional[Tensor] = None, wcf: Optional[Tensor] = None, wco: Optional[Tensor] = None,
                  cell_clip: float = 0.0, use_peephole: bool = False,
                  seq_len_max: Optional[int] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """TF's BlockLSTMV2 (IFCO gates = Keras order, no forget bias, no clipping by default)."""
    c = cs_prev.size(-1)
    return torch.ops.torchops.block_lstm_v2(_seq_len(x, seq_len_max), x, cs_prev, h_prev, w, _peep(wci, x, c),
                                            _peep(wcf, x, c), _peep(wco, x, c), b, cell_clip, use_peephole)
