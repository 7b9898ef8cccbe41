"""The CudnnRNN params-buffer layout: its one Python definition.

The C++ ops (`cudnn_rnn_params_size`, the canonical converters) define the same layout for the kernels;
tests/test_cudnn_rnn_nn.py checks that the two agree for every mode, direction, input mode and projection.
The fake kernels (torch.compile, torch.export) and `torchops.nn.cudnn_rnn` use this module.

Layout: for each pseudo-layer (layer-major, then direction) its G input matrices `[H, in]` (`[H, 0]` for
layer 0 under skip_input), G recurrent matrices `[H, O]` and, with a projection, `[P, H]`; then for each
pseudo-layer G input biases `[H]` (`[0]` for layer 0 under skip_input) and G recurrent biases `[H]`.
G is the number of gates, O = P if P > 0 else H, in = input_size for layer 0 and D * O above it.
"""
from typing import List, Tuple

GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}


def canonical_shapes(g: int, d: int, num_layers: int, h: int, i: int, p: int,
                     skip: bool) -> Tuple[List[List[int]], List[List[int]]]:
    """Shapes of the canonical weights and biases, in params order."""
    o = p if p > 0 else h
    weights: List[List[int]] = []
    biases: List[List[int]] = []
    for layer in range(num_layers):
        first_skip = layer == 0 and skip
        width = 0 if first_skip else (i if layer == 0 else d * o)
        for _ in range(d):
            weights += [[h, width] for _ in range(g)] + [[h, o] for _ in range(g)]
            if p > 0:
                weights.append([p, h])
            biases += [[0 if first_skip else h] for _ in range(g)] + [[h] for _ in range(g)]
    return weights, biases


def params_size(g: int, d: int, num_layers: int, h: int, i: int, p: int, skip: bool) -> int:
    """Number of elements of the params buffer: the sum over canonical_shapes, in closed form (O(1) in
    num_layers, so that a huge configuration is sized without building its shape list)."""
    o = p if p > 0 else h
    per_dir = (g * h * (0 if skip else i) + (num_layers - 1) * g * h * d * o
               + num_layers * (g * h * o + p * h) + g * h * (2 * num_layers - (1 if skip else 0)))
    return d * per_dir
