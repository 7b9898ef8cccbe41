"""Typed, TorchScript-scriptable wrappers of the CudnnRNN ops (TF's CudnnRNN / V2 / V3, their Backprop
ops, CudnnRNNParamsSize and the canonical converters), with TF's argument names and defaults.

The params buffer is one flat tensor in cuDNN's canonical order (docs/cudnn_rnn.md): for every
pseudo-layer (layer0-fwd, layer0-bwd, layer1-fwd, ...) the input matrices W_0..W_{G-1} `[H, in]`, the
recurrent matrices R_0..R_{G-1} `[H, O]` and (lstm with num_proj) the projection `[P, H]`; then for every
pseudo-layer the biases b_W0..b_W{G-1}, b_R0..b_R{G-1} `[H]`. Gate order: lstm i, f, c, o; gru r, z, n.
Time-major `input [T, B, I]`, states `[L*D, B, O]` (V3 with `time_major=False`: `[B, T, I]` and
`[B, L*D, O]`). Everything is differentiable (C++ autograd) when `is_training=True`.
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor

_ops = torch.ops.torchops


def cudnn_rnn(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor, rnn_mode: str = "lstm",
              input_mode: str = "linear_input", direction: str = "unidirectional", dropout: float = 0.0,
              seed: int = 0, seed2: int = 0, is_training: bool = True) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNN: returns `(output, output_h, output_c, reserve_space)`."""
    return _ops.cudnn_rnn(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed, seed2,
                          is_training)


def cudnn_rnn_v2(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor, rnn_mode: str = "lstm",
                 input_mode: str = "linear_input", direction: str = "unidirectional", dropout: float = 0.0,
                 seed: int = 0, seed2: int = 0,
                 is_training: bool = True) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNNV2: returns `(output, output_h, output_c, reserve_space, host_reserved)`."""
    return _ops.cudnn_rnn_v2(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed, seed2,
                             is_training)


def _lengths(input: Tensor, sequence_lengths: Optional[Tensor], time_major: bool) -> Tensor:
    if sequence_lengths is not None:
        return sequence_lengths
    t = input.size(0) if time_major else input.size(1)
    b = input.size(1) if time_major else input.size(0)
    return torch.full([b], t, dtype=torch.int32, device=input.device)


def cudnn_rnn_v3(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor,
                 sequence_lengths: Optional[Tensor] = None, rnn_mode: str = "lstm", input_mode: str = "linear_input",
                 direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0, seed2: int = 0,
                 num_proj: int = 0, is_training: bool = True,
                 time_major: bool = True) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNNV3: variable `sequence_lengths` (int32 `[B]`; None = all full length), `num_proj` (lstm
    projection), `time_major`. Returns `(output, output_h, output_c, reserve_space, host_reserved)`."""
    return _ops.cudnn_rnn_v3(input, input_h, input_c, params, _lengths(input, sequence_lengths, time_major), rnn_mode,
                             input_mode, direction, dropout, seed, seed2, num_proj, is_training, time_major)


def cudnn_rnn_backprop(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor, output: Tensor,
                       output_h: Tensor, output_c: Tensor, output_backprop: Tensor, output_h_backprop: Tensor,
                       output_c_backprop: Tensor, reserve_space: Tensor, rnn_mode: str = "lstm",
                       input_mode: str = "linear_input", direction: str = "unidirectional", dropout: float = 0.0,
                       seed: int = 0, seed2: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNNBackprop: `(input_backprop, input_h_backprop, input_c_backprop, params_backprop)`."""
    return _ops.cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c, output_backprop,
                                   output_h_backprop, output_c_backprop, reserve_space, rnn_mode, input_mode,
                                   direction, dropout, seed, seed2)


def cudnn_rnn_backprop_v2(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor, output: Tensor,
                          output_h: Tensor, output_c: Tensor, output_backprop: Tensor, output_h_backprop: Tensor,
                          output_c_backprop: Tensor, reserve_space: Tensor, host_reserved: Tensor,
                          rnn_mode: str = "lstm", input_mode: str = "linear_input", direction: str = "unidirectional",
                          dropout: float = 0.0, seed: int = 0, seed2: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNNBackpropV2 (host_reserved is ignored)."""
    return _ops.cudnn_rnn_backprop_v2(input, input_h, input_c, params, output, output_h, output_c, output_backprop,
                                      output_h_backprop, output_c_backprop, reserve_space, host_reserved, rnn_mode,
                                      input_mode, direction, dropout, seed, seed2)


def cudnn_rnn_backprop_v3(input: Tensor, input_h: Tensor, input_c: Tensor, params: Tensor, sequence_lengths: Tensor,
                          output: Tensor, output_h: Tensor, output_c: Tensor, output_backprop: Tensor,
                          output_h_backprop: Tensor, output_c_backprop: Tensor, reserve_space: Tensor,
                          host_reserved: Tensor, rnn_mode: str = "lstm", input_mode: str = "linear_input",
                          direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0, seed2: int = 0,
                          num_proj: int = 0, time_major: bool = True) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """TF CudnnRNNBackpropV3."""
    return _ops.cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
                                      output_backprop, output_h_backprop, output_c_backprop, reserve_space,
                                      host_reserved, rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj,
                                      time_major)


def cudnn_rnn_params_size(num_layers: int, num_units: int, input_size: int, T: Optional[torch.dtype] = None,
                          S: Optional[torch.dtype] = None, rnn_mode: str = "lstm", input_mode: str = "linear_input",
                          direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0, seed2: int = 0,
                          num_proj: int = 0) -> Tensor:
    """TF CudnnRNNParamsSize: the params buffer length as a 1-element tensor of dtype S (default int32)."""
    return _ops.cudnn_rnn_params_size(num_layers, num_units, input_size, T, S, rnn_mode, input_mode, direction,
                                      dropout, seed, seed2, num_proj)


def cudnn_rnn_params_to_canonical(num_layers: int, num_units: int, input_size: int, params: Tensor, num_params: int,
                                  rnn_mode: str = "lstm", input_mode: str = "linear_input",
                                  direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0,
                                  seed2: int = 0) -> Tuple[List[Tensor], List[Tensor]]:
    """TF CudnnRNNParamsToCanonical: `(weights, biases)` in canonical order (copies)."""
    return _ops.cudnn_rnn_params_to_canonical(num_layers, num_units, input_size, params, num_params, rnn_mode,
                                              input_mode, direction, dropout, seed, seed2)


def cudnn_rnn_params_to_canonical_v2(num_layers: int, num_units: int, input_size: int, params: Tensor,
                                     num_params_weights: int, num_params_biases: int, rnn_mode: str = "lstm",
                                     input_mode: str = "linear_input", direction: str = "unidirectional",
                                     dropout: float = 0.0, seed: int = 0, seed2: int = 0,
                                     num_proj: int = 0) -> Tuple[List[Tensor], List[Tensor]]:
    """TF CudnnRNNParamsToCanonicalV2 (with the lstm projection matrices)."""
    return _ops.cudnn_rnn_params_to_canonical_v2(num_layers, num_units, input_size, params, num_params_weights,
                                                 num_params_biases, rnn_mode, input_mode, direction, dropout, seed,
                                                 seed2, num_proj)


def cudnn_rnn_canonical_to_params(num_layers: int, num_units: int, input_size: int, weights: List[Tensor],
                                  biases: List[Tensor], rnn_mode: str = "lstm", input_mode: str = "linear_input",
                                  direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0,
                                  seed2: int = 0) -> Tensor:
    """TF CudnnRNNCanonicalToParams: the flat params buffer (each tensor copied flat, row-major)."""
    return _ops.cudnn_rnn_canonical_to_params(num_layers, num_units, input_size, weights, biases, rnn_mode,
                                              input_mode, direction, dropout, seed, seed2)


def cudnn_rnn_canonical_to_params_v2(num_layers: int, num_units: int, input_size: int, weights: List[Tensor],
                                     biases: List[Tensor], rnn_mode: str = "lstm", input_mode: str = "linear_input",
                                     direction: str = "unidirectional", dropout: float = 0.0, seed: int = 0,
                                     seed2: int = 0, num_proj: int = 0) -> Tensor:
    """TF CudnnRNNCanonicalToParamsV2 (with the lstm projection matrices)."""
    return _ops.cudnn_rnn_canonical_to_params_v2(num_layers, num_units, input_size, weights, biases, rnn_mode,
                                                 input_mode, direction, dropout, seed, seed2, num_proj)
