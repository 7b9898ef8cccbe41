"""Fake kernels of the CudnnRNN ops (mirror csrc/cudnn_rnn/ops.cpp): shapes and dtypes only."""
import torch

from .._cudnn_rnn_params import GATES, canonical_shapes, params_size

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_MODES = GATES
_INPUT_MODES = ("linear_input", "skip_input", "auto_select")
_DIRS = {"unidirectional": 1, "bidirectional": 2}
_HEADER_BYTES = 128


def _enums(rnn_mode, input_mode, direction, dropout):
    torch._check(rnn_mode in _MODES, lambda: f"rnn_mode must be one of {list(_MODES)}, got {rnn_mode!r}")
    torch._check(input_mode in _INPUT_MODES, lambda: f"input_mode must be one of {list(_INPUT_MODES)}, got {input_mode!r}")
    torch._check(direction in _DIRS, lambda: f"direction must be one of {list(_DIRS)}, got {direction!r}")
    torch._check(0.0 <= dropout <= 1.0, lambda: f"dropout must be in [0, 1], got {dropout}")
    return _MODES[rnn_mode], _DIRS[direction]


def _need(t, name):
    if t is None:
        raise ValueError(f"{name} must be a tensor, got None")


def _on(t, x, name, cpu_ok=False):
    # (a meta tensor beside CPU data dispatches here: refuse, as the real kernels refuse mixed devices)
    torch._check(t.device == x.device or (cpu_ok and t.device.type == "cpu"),
                 lambda: f"{name} must be on input's device ({x.device}), got {t.device}")


def _like(t, x, name):
    _need(t, name)
    torch._check(t.dtype == x.dtype, lambda: f"{name} must have the same dtype as input ({x.dtype}), got {t.dtype}")
    _on(t, x, name)


def _skip(input_mode, i, h):
    if input_mode == "skip_input":
        torch._check(i == h, lambda: f"input_mode 'skip_input' requires input_size == num_units, got {i} and {h}")
        return True
    return input_mode == "auto_select" and i == h


def layout(g, skip, num_layers, d, h, i, p):
    """(weight shapes, bias shapes, size) of the params buffer."""
    ws, bs = canonical_shapes(g, d, num_layers, h, i, p, skip)
    return ws, bs, params_size(g, d, num_layers, h, i, p, skip)


def _model(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj):
    g, d = _enums(rnn_mode, input_mode, direction, dropout)
    torch._check(num_layers >= 1, lambda: f"num_layers must be >= 1, got {num_layers}")
    torch._check(num_units >= 1, lambda: f"num_units must be >= 1, got {num_units}")
    torch._check(input_size >= 1, lambda: f"input_size must be >= 1, got {input_size}")
    torch._check(num_proj >= 0 and (num_proj == 0 or rnn_mode == "lstm") and num_proj <= num_units,
                 lambda: f"invalid num_proj {num_proj} for rnn_mode {rnn_mode!r} and num_units {num_units}")
    for name, v in (("num_layers", num_layers), ("num_units", num_units), ("input_size", input_size)):
        torch._check(v <= 2 ** 31 - 1, lambda: f"{name} must be <= 2147483647 (int32), got {v}")
    skip = _skip(input_mode, input_size, num_units)
    return layout(g, skip, num_layers, d, num_units, input_size, num_proj)


def _forward_cfg(input, input_h, input_c, params, lens, rnn_mode, input_mode, direction, dropout, num_proj,
                 time_major):
    g, d = _enums(rnn_mode, input_mode, direction, dropout)
    _need(input, "input")
    _like(input_h, input, "input_h")
    # (input_c is ignored without lstm, but its dtype and device take part in dispatch)
    _like(input_c, input, "input_c")
    _like(params, input, "params")
    torch._check(input.dim() == 3, lambda: f"RNN input must be a 3-D vector, got rank {input.dim()}")
    torch._check(input_h.dim() == 3, lambda: f"RNN input_h must be a 3-D vector, got rank {input_h.dim()}")
    torch._check(input.dtype in _FLOATS, lambda: f"input must be a floating point tensor, got {input.dtype}")
    t, b = (input.shape[0], input.shape[1]) if time_major else (input.shape[1], input.shape[0])
    i = input.shape[2]
    num_layers = input_h.shape[0 if time_major else 1] // d
    o = input_h.shape[2]
    want = (d * num_layers, b, o) if time_major else (b, d * num_layers, o)
    torch._check(tuple(input_h.shape) == want,
                 lambda: f"Invalid input_h shape: expected {list(want)}, got {list(input_h.shape)}")
    torch._check(num_layers >= 1, lambda: f"Invalid input_h shape: {list(input_h.shape)}: num_layers must be >= 1")
    if rnn_mode == "lstm":
        torch._check(input_c.dim() == 3, lambda: f"RNN input_c must be a 3-D vector, got rank {input_c.dim()}")
        if num_proj == 0:
            torch._check(input_h.shape == input_c.shape,
                         lambda: "input_h and input_c must have the same shape w/o projection")
        else:
            torch._check(input_h.shape[2] == num_proj and input_h.shape[2] <= input_c.shape[2]
                         and input_h.shape[:2] == input_c.shape[:2],
                         lambda: f"Invalid input_h and input_c w/ projection size: num_proj {num_proj}, "
                                 f"input_h {list(input_h.shape)}, input_c {list(input_c.shape)}")
        h = input_c.shape[2]
        torch._check(input_c.dtype == input.dtype, lambda: "input_c must have the same dtype as input")
    else:
        torch._check(num_proj == 0, lambda: "num_proj > 0 is only supported with rnn_mode 'lstm'")
        h = o
    torch._check(h >= 1, lambda: f"num_units must be >= 1, got {h}")
    skip = _skip(input_mode, i, h)
    size = params_size(g, d, num_layers, h, i, num_proj, skip)
    torch._check(params.dim() == 1, lambda: f"params must be a 1-D tensor, got rank {params.dim()}")
    torch._check(params.shape[0] == size,
                 lambda: f"params has {params.shape[0]} elements, but must have exactly {size} (CudnnRNNParamsSize)")
    if lens is not None:
        torch._check(lens.dim() == 1 and lens.dtype == torch.int32, lambda: "sequence_lengths must be 1-D int32")
        _on(lens, input, "sequence_lengths", cpu_ok=True)
        torch._check(lens.shape[0] == b, lambda: f"sequence_lengths must have batch_size ({b}) entries")
    torch._check(t > 0, lambda: f"max_seq_length must be > 0, got {t}")
    for x, name in ((input_h, "input_h"), (params, "params")):
        torch._check(x.dtype == input.dtype, lambda: f"{name} must have the same dtype as input")
    return dict(g=g, d=d, L=num_layers, h=h, o=(num_proj if num_proj > 0 else h), p=num_proj, t=t, b=b, i=i)


def _reserve_numel(c, rnn_mode, has_mask, dtype):
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    csize = 8 if compute == torch.float64 else 4
    tb = c["t"] * c["b"]
    per = tb * (c["g"] * c["h"] + c["o"])
    if rnn_mode == "lstm":
        per += tb * c["h"] * (2 if c["p"] > 0 else 1)
    if rnn_mode == "gru":
        per += tb * c["h"]
    n = _HEADER_BYTES // csize + c["L"] * c["d"] * per + (c["L"] - 1) * tb * c["d"] * c["o"] * (2 if has_mask else 1)
    return n * (csize // torch.empty([], dtype=dtype).element_size())


def _forward(version, input, input_h, input_c, params, lens, rnn_mode, input_mode, direction, dropout, seed, seed2,
             num_proj, is_training, time_major):
    c = _forward_cfg(input, input_h, input_c, params, lens, rnn_mode, input_mode, direction, dropout, num_proj,
                     time_major)
    t, b = c["t"], c["b"]
    out_shape = (t, b, c["d"] * c["o"]) if time_major else (b, t, c["d"] * c["o"])
    output = input.new_empty(out_shape)
    output_h = input.new_empty(input_h.shape)
    output_c = input.new_empty(input_c.shape) if rnn_mode == "lstm" else input.new_empty(())
    has_mask = is_training and dropout > 0 and c["L"] > 1
    reserve = input.new_empty((_reserve_numel(c, rnn_mode, has_mask, input.dtype) if is_training else 0,))
    outs = (output, output_h, output_c, reserve)
    if version >= 2:
        outs += (input.new_empty((0,), dtype=torch.int8),)
    return outs


@torch.library.register_fake("torchops::cudnn_rnn")
def _cudnn_rnn(input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
               direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
    return _forward(1, input, input_h, input_c, params, None, rnn_mode, input_mode, direction, dropout, seed, seed2, 0,
                    is_training, True)


@torch.library.register_fake("torchops::cudnn_rnn_v2")
def _cudnn_rnn_v2(input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
                  direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
    return _forward(2, input, input_h, input_c, params, None, rnn_mode, input_mode, direction, dropout, seed, seed2, 0,
                    is_training, True)


@torch.library.register_fake("torchops::cudnn_rnn_v3")
def _cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm", input_mode="linear_input",
                  direction="unidirectional", dropout=0.0, seed=0, seed2=0, num_proj=0, is_training=True,
                  time_major=True):
    _need(sequence_lengths, "sequence_lengths")
    return _forward(3, input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode, direction, dropout,
                    seed, seed2, num_proj, is_training, time_major)


def _backward(input, input_h, input_c, params, lens, output, output_h, output_c, output_backprop, output_h_backprop,
              output_c_backprop, reserve_space, rnn_mode, input_mode, direction, dropout, num_proj, time_major,
              host_reserved=None, version=1):
    for t, name in ((output, "output"), (output_h, "output_h"), (output_c, "output_c"),
                    (output_backprop, "output_backprop"), (output_h_backprop, "output_h_backprop"),
                    (output_c_backprop, "output_c_backprop")):
        _like(t, input, name)
    _need(reserve_space, "reserve_space")
    _on(reserve_space, input, "reserve_space")
    if version >= 2:
        _need(host_reserved, "host_reserved")
        _on(host_reserved, input, "host_reserved")
    c = _forward_cfg(input, input_h, input_c, params, lens, rnn_mode, input_mode, direction, dropout, num_proj,
                     time_major)
    out_shape = (c["t"], c["b"], c["d"] * c["o"]) if time_major else (c["b"], c["t"], c["d"] * c["o"])
    checks = [(output, out_shape, "output"), (output_backprop, out_shape, "output_backprop"),
              (output_h, tuple(input_h.shape), "output_h"), (output_h_backprop, tuple(input_h.shape),
                                                             "output_h_backprop")]
    if rnn_mode == "lstm":
        checks += [(output_c, tuple(input_c.shape), "output_c"),
                   (output_c_backprop, tuple(input_c.shape), "output_c_backprop")]
    for tensor, shape, name in checks:
        torch._check(tuple(tensor.shape) == shape,
                     lambda: f"Invalid {name} shape: expected {list(shape)}, got {list(tensor.shape)}")
    torch._check(reserve_space.dim() == 1 and reserve_space.dtype == input.dtype,
                 lambda: "reserve_space must be the 1-D tensor returned by the training forward")
    input_c_backprop = input.new_empty(input_c.shape) if rnn_mode == "lstm" else input.new_empty(())
    return input.new_empty(input.shape), input.new_empty(input_h.shape), input_c_backprop, params.new_empty(params.shape)


@torch.library.register_fake("torchops::cudnn_rnn_backprop")
def _cudnn_rnn_backprop(input, input_h, input_c, params, output, output_h, output_c, output_backprop,
                        output_h_backprop, output_c_backprop, reserve_space, rnn_mode="lstm",
                        input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0):
    return _backward(input, input_h, input_c, params, None, output, output_h, output_c, output_backprop,
                     output_h_backprop, output_c_backprop, reserve_space, rnn_mode, input_mode, direction, dropout, 0,
                     True)


@torch.library.register_fake("torchops::cudnn_rnn_backprop_v2")
def _cudnn_rnn_backprop_v2(input, input_h, input_c, params, output, output_h, output_c, output_backprop,
                           output_h_backprop, output_c_backprop, reserve_space, host_reserved, rnn_mode="lstm",
                           input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0):
    return _backward(input, input_h, input_c, params, None, output, output_h, output_c, output_backprop,
                     output_h_backprop, output_c_backprop, reserve_space, rnn_mode, input_mode, direction, dropout, 0,
                     True, host_reserved, 2)


@torch.library.register_fake("torchops::cudnn_rnn_backprop_v3")
def _cudnn_rnn_backprop_v3(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c,
                           output_backprop, output_h_backprop, output_c_backprop, reserve_space, host_reserved,
                           rnn_mode="lstm", input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0,
                           seed2=0, num_proj=0, time_major=True):
    _need(sequence_lengths, "sequence_lengths")
    return _backward(input, input_h, input_c, params, sequence_lengths, output, output_h, output_c, output_backprop,
                     output_h_backprop, output_c_backprop, reserve_space, rnn_mode, input_mode, direction, dropout,
                     num_proj, time_major, host_reserved, 3)


@torch.library.register_fake("torchops::cudnn_rnn_params_size")
def _params_size(num_layers, num_units, input_size, T=None, S=None, rnn_mode="lstm", input_mode="linear_input",
                 direction="unidirectional", dropout=0.0, seed=0, seed2=0, num_proj=0):
    _model(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj)
    s = torch.int32 if S is None else S
    torch._check(s in (torch.int32, torch.int64), lambda: f"S must be int32 or int64, got {s}")
    return torch.empty((1,), dtype=s)


def _to_canonical(num_layers, num_units, input_size, params, nw, nb, rnn_mode, input_mode, direction, dropout,
                  num_proj):
    ws, bs, size = _model(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj)
    torch._check(len(ws) == nw, lambda: f"Number of params (weights) mismatch. Expected {nw}, got {len(ws)}")
    torch._check(len(bs) == nb, lambda: f"Number of params (biases) mismatch. Expected {nb}, got {len(bs)}")
    torch._check(params.dim() == 1 and params.shape[0] == size,
                 lambda: f"params must be 1-D with exactly {size} elements (CudnnRNNParamsSize), "
                         f"got {list(params.shape)}")
    return [params.new_empty(s) for s in ws], [params.new_empty(s) for s in bs]


@torch.library.register_fake("torchops::cudnn_rnn_params_to_canonical")
def _params_to_canonical(num_layers, num_units, input_size, params, num_params, rnn_mode="lstm",
                         input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0):
    return _to_canonical(num_layers, num_units, input_size, params, num_params, num_params, rnn_mode, input_mode,
                         direction, dropout, 0)


@torch.library.register_fake("torchops::cudnn_rnn_params_to_canonical_v2")
def _params_to_canonical_v2(num_layers, num_units, input_size, params, num_params_weights, num_params_biases,
                            rnn_mode="lstm", input_mode="linear_input", direction="unidirectional", dropout=0.0,
                            seed=0, seed2=0, num_proj=0):
    return _to_canonical(num_layers, num_units, input_size, params, num_params_weights, num_params_biases, rnn_mode,
                         input_mode, direction, dropout, num_proj)


def _to_params(num_layers, num_units, input_size, weights, biases, rnn_mode, input_mode, direction, dropout,
               num_proj):
    ws, bs, size = _model(num_layers, num_units, input_size, rnn_mode, input_mode, direction, dropout, num_proj)
    torch._check(len(weights) == len(ws), lambda: f"Number of params (weights) mismatch. Expected {len(ws)}, "
                                                  f"got {len(weights)}")
    torch._check(len(biases) == len(bs), lambda: f"Number of params (biases) mismatch. Expected {len(bs)}, "
                                                 f"got {len(biases)}")
    for k, (t, s) in enumerate(list(zip(weights, ws)) + list(zip(biases, bs))):
        what = f"weights[{k}]" if k < len(ws) else f"biases[{k - len(ws)}]"
        n = 1
        for v in s:
            n *= v
        torch._check(t.device == weights[0].device, lambda: f"{what} must be on {weights[0].device}, got {t.device}")
        torch._check(t.numel() == n, lambda: f"Params size mismatch. Expected {n}, got {t.numel()} ({what})")
        torch._check(t.dim() == 1 or tuple(t.shape) == tuple(s),
                     lambda: f"Params shape mismatch: {what} must have shape {list(s)} (or be flattened to [{n}]), "
                             f"got {list(t.shape)}")
        torch._check(t.dtype == weights[0].dtype, lambda: "every weight and bias must have the same dtype")
    return weights[0].new_empty((size,))


@torch.library.register_fake("torchops::cudnn_rnn_canonical_to_params")
def _canonical_to_params(num_layers, num_units, input_size, weights, biases, rnn_mode="lstm",
                         input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0):
    return _to_params(num_layers, num_units, input_size, weights, biases, rnn_mode, input_mode, direction, dropout, 0)


@torch.library.register_fake("torchops::cudnn_rnn_canonical_to_params_v2")
def _canonical_to_params_v2(num_layers, num_units, input_size, weights, biases, rnn_mode="lstm",
                            input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0,
                            num_proj=0):
    return _to_params(num_layers, num_units, input_size, weights, biases, rnn_mode, input_mode, direction, dropout,
                      num_proj)
