"""torchops.nn.CudnnLSTM / CudnnGRU / CudnnRNNTanh / CudnnRNNRelu and their converters.

References: torch.nn.LSTM / GRU / RNN with mapped weights (and torch's packed-sequence path for variable
lengths), a plain-PyTorch cuDNN RNN written here from the documented math (skip_input has no torch
equivalent), and Keras' LSTM / GRU equations written here."""
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchops  # noqa: F401
from torchops.nn import CudnnGRU, CudnnLSTM, CudnnRNNRelu, CudnnRNNTanh
from torchops.nn.cudnn_rnn import canonical_shapes, cudnn_params_size

from conftest import CUDA

F64 = torch.float64
CLASSES = {"lstm": CudnnLSTM, "gru": CudnnGRU, "rnn_tanh": CudnnRNNTanh, "rnn_relu": CudnnRNNRelu}
TORCH = {"lstm": lambda *a, **k: nn.LSTM(*a, **k), "gru": lambda *a, **k: nn.GRU(*a, **k),
         "rnn_tanh": lambda *a, **k: nn.RNN(*a, nonlinearity="tanh", **k),
         "rnn_relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k)}
DIRS = {1: "unidirectional", 2: "bidirectional"}


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def run(m, x, state=None, lengths=None):
    """(outputs, h, c-or-None) of one of our modules."""
    if isinstance(m, CudnnLSTM):
        y, (h, c) = m(x, state, lengths)
        return y, h, c
    y, h = m(x, state, lengths)
    return y, h, None


def torch_run(m, x, state=None):
    y, s = m(x, state)
    return (y, s[0], s[1]) if isinstance(m, nn.LSTM) else (y, s, None)


def grads_as_params(cls, ref, **kw):
    """torch's parameter gradients mapped into our params layout (the converter is linear)."""
    holder = type(ref)(ref.input_size, ref.hidden_size, num_layers=ref.num_layers, bidirectional=ref.bidirectional,
                       dtype=F64, **kw)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            getattr(holder, name).copy_(p.grad)
    return cls.from_torch(holder).params.detach()


# ---------------------------------------------------------------------------------------------------------
# a plain-PyTorch cuDNN RNN (cell equations, layers, directions), on canonical weights
# ---------------------------------------------------------------------------------------------------------

def ref_cell(mode, x, h, c, W, R, Pm, bW, bR, skip):
    def lin(g):
        return x if skip else x @ W[g].t() + bW[g]
    if mode == "lstm":
        i, f, g, o = (lin(k) + h @ R[k].t() + bR[k] for k in range(4))
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h2 = torch.sigmoid(o) * torch.tanh(c2)
        return (h2 @ Pm.t() if Pm is not None else h2), c2
    if mode == "gru":
        r = torch.sigmoid(lin(0) + h @ R[0].t() + bR[0])
        z = torch.sigmoid(lin(1) + h @ R[1].t() + bR[1])
        n = torch.tanh(lin(2) + r * (h @ R[2].t() + bR[2]))
        return (1 - z) * n + z * h, c
    a = lin(0) + h @ R[0].t() + bR[0]
    return (torch.tanh(a) if mode == "rnn_tanh" else torch.relu(a)), c


def ref_forward(m, x, h0, c0, lengths):
    """Time-major reference of module m's math (no dropout); per sequence, per pseudo-layer."""
    T, B, _ = x.shape
    D, L = m.num_dirs, m.num_layers
    skip = m.input_mode == "skip_input" or (m.input_mode == "auto_select" and m.input_size == m.num_units)
    layers = m._per_pseudo_layer()
    outs, hs, cs = [], [None] * (L * D), [None] * (L * D)
    for b in range(B):
        n = int(lengths[b])
        inp = x[:n, b]
        for layer in range(L):
            dir_outs = []
            for d in range(D):
                pl = layer * D + d
                W, R, Pm, bW, bR = layers[pl]
                h, c = h0[pl, b], (c0[pl, b] if c0 is not None else None)
                steps = range(n) if d == 0 else range(n - 1, -1, -1)
                seq = [None] * n
                for t in steps:
                    h, c = ref_cell(m.rnn_mode, inp[t], h, c, W, R, Pm, bW, bR, skip and layer == 0)
                    seq[t] = h
                hs[pl] = (hs[pl] or []) + [h]
                cs[pl] = (cs[pl] or []) + [c]
                dir_outs.append(torch.stack(seq) if n else inp.new_zeros(0, h.shape[0]))
            inp = torch.cat(dir_outs, -1)
        pad = inp.new_zeros(T - n, inp.shape[1])
        outs.append(torch.cat([inp, pad], 0))
    y = torch.stack(outs, 1)
    h = torch.stack([torch.stack(v) for v in hs])
    c = torch.stack([torch.stack(v) for v in cs]) if c0 is not None else None
    return y, h, c


# ---------------------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,size", [
    (("lstm", 1, 2, 3, "unidirectional", "linear_input", 0), 56),
    (("gru", 1, 3, 2, "unidirectional", "linear_input", 0), 63),
    (("rnn_tanh", 1, 4, 5, "unidirectional", "linear_input", 0), 44),
    (("lstm", 2, 4, 5, "bidirectional", "linear_input", 0), 800),
    (("gru", 3, 8, 4, "bidirectional", "linear_input", 0), 3168),
    (("lstm", 2, 6, 10, "bidirectional", "linear_input", 3), 1320),
    (("lstm", 1, 200, 100, "unidirectional", "linear_input", 0), 241600),
    (("gru", 4, 200, 300, "bidirectional", "linear_input", 0), 2769600),
    (("lstm", 3, 143, 143, "bidirectional", "linear_input", 0), 1315600),
    (("gru", 1, 3, 3, "unidirectional", "skip_input", 0), 36),
    (("gru", 1, 3, 3, "unidirectional", "auto_select", 0), 36),
    (("gru", 1, 3, 3, "unidirectional", "linear_input", 0), 72),
])
def test_params_size_table(cfg, size):
    assert cudnn_params_size(*cfg) == size  # the documented size formula
    mode, L, H, I, direction, input_mode, P = cfg
    if H * I < 50000:
        kw = {"num_proj": P} if mode == "lstm" else {}
        m = CLASSES[mode](L, H, I, direction=direction, input_mode=input_mode, **kw)
        assert m.params.shape == (size,) and m.params_size == size


def test_canonical_shapes_spec_example():
    # the documented layout example: lstm, L = 2, bidirectional, H = 6, I = 10, P = 3 -> 36 weights, 32 biases
    w, b = canonical_shapes("lstm", 2, 6, 10, "bidirectional", num_proj=3)
    assert len(w) == 36 and len(b) == 32
    assert w[:9] == [[6, 10]] * 4 + [[6, 3]] * 4 + [[3, 6]]
    assert w[18:27] == [[6, 6]] * 4 + [[6, 3]] * 4 + [[3, 6]]
    assert b == [[6]] * 32
    w, b = canonical_shapes("gru", 2, 3, 3, "bidirectional", input_mode="skip_input")
    assert w[:6] == [[3, 0]] * 3 + [[3, 3]] * 3 and w[12:15] == [[3, 6]] * 3
    assert b[:6] == [[0]] * 3 + [[3]] * 3 and b[6:9] == [[0]] * 3


_LAYOUT_CASES = [(mode, L, H, I, direction, input_mode, P)
                 for mode in ("lstm", "gru", "rnn_tanh", "rnn_relu")
                 for L, H, I in ((1, 3, 5), (3, 4, 4), (2, 5, 2))
                 for direction in ("unidirectional", "bidirectional")
                 for input_mode in ("linear_input", "skip_input", "auto_select")
                 for P in ((0, 2) if mode == "lstm" else (0,))
                 if input_mode != "skip_input" or H == I]


@pytest.mark.parametrize("cfg", _LAYOUT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_python_layout_equals_the_ops(cfg):
    # The one Python definition of the params layout (torchops/_cudnn_rnn_params.py, used by the modules and the
    # fake kernels) must give the C++ ops' size and canonical shapes.
    from torchops import _cudnn_rnn_params as layout
    from torchops._fake.cudnn_rnn import layout as fake_layout
    mode, L, H, I, direction, input_mode, P = cfg
    size = int(torchops.functional.cudnn_rnn_params_size(L, H, I, torch.float32, torch.int64, mode, input_mode,
                                                         direction, num_proj=P).item())
    assert cudnn_params_size(*cfg) == size
    w_py, b_py = canonical_shapes(*cfg)
    assert sum(math.prod(s) for s in w_py + b_py) == size
    params = torch.arange(size, dtype=torch.float32)
    w, b = torchops.functional.cudnn_rnn_params_to_canonical_v2(L, H, I, params, len(w_py), len(b_py), mode,
                                                                 input_mode, direction, num_proj=P)
    assert [list(t.shape) for t in w] == w_py and [list(t.shape) for t in b] == b_py
    # the values are consecutive slices of params in that order, so the offsets agree too
    flat = torch.cat([t.reshape(-1) for t in w + b])
    assert torch.equal(flat, params)
    skip = input_mode == "skip_input" or (input_mode == "auto_select" and H == I)
    D = 2 if direction == "bidirectional" else 1
    assert fake_layout(layout.GATES[mode], skip, L, D, H, I, P) == (w_py, b_py, size)


def test_default_initialisation():
    torch.manual_seed(0)
    m = CudnnLSTM(2, 5, 3, num_proj=2)
    w, b = m.canonical_weights()
    assert all(torch.equal(t, torch.zeros_like(t)) for t in b)
    for t in w:  # glorot-uniform per canonical matrix
        a = math.sqrt(6.0 / (t.shape[0] + t.shape[1]))
        assert t.abs().max() <= a and t.abs().max() > 0.5 * a
    t = CudnnGRU(1, 16, 3, init="torch")
    assert t.params.abs().max() <= 0.25 and t.params.abs().max() > 0.2
    assert CudnnGRU(1, 4, 3, dtype=F64).params.dtype == F64


# ---------------------------------------------------------------------------------------------------------
# converters (no op needed)
# ---------------------------------------------------------------------------------------------------------

def _torch_ref(mode, L, D, P=0, batch_first=False, bias=True, I=4, H=5):
    kw = {"proj_size": P} if P else {}
    return TORCH[mode](I, H, num_layers=L, bidirectional=D == 2, batch_first=batch_first, bias=bias, dtype=F64, **kw)


@pytest.mark.parametrize("mode", list(CLASSES))
@pytest.mark.parametrize("L", [1, 3])
@pytest.mark.parametrize("D", [1, 2])
def test_torch_round_trips_are_exact(mode, L, D):
    torch.manual_seed(4)
    for P in ([0, 2] if mode == "lstm" else [0]):
        for batch_first in (False, True):
            ref = _torch_ref(mode, L, D, P, batch_first)
            m = CLASSES[mode].from_torch(ref)
            assert m.time_major == (not batch_first) and m.num_proj == P and m.num_dirs == D
            back = m.to_torch()
            assert type(back) is type(ref) and back.batch_first == batch_first and back.proj_size == ref.proj_size
            sd, sd_ref = back.state_dict(), ref.state_dict()
            assert sd.keys() == sd_ref.keys()
            for k in sd:
                assert torch.equal(sd[k], sd_ref[k]), k
            again = CLASSES[mode].from_torch(back)
            assert torch.equal(again.params, m.params)
            # canonical lists: pseudo-layer pl holds weight_ih / weight_hh gate blocks, then weight_hr
            w, b = m.canonical_weights()
            G = {"lstm": 4, "gru": 3}.get(mode, 1)
            nw = 2 * G + (1 if P else 0)
            last = f"l{L - 1}" + ("_reverse" if D == 2 else "")
            assert torch.equal(torch.cat(w[-nw:][:G]), getattr(ref, f"weight_ih_{last}"))
            assert torch.equal(torch.cat(w[-nw:][G:2 * G]), getattr(ref, f"weight_hh_{last}"))
            assert torch.equal(torch.cat(b[-2 * G:][G:]), getattr(ref, f"bias_hh_{last}"))
            if P:
                assert torch.equal(w[-1], getattr(ref, f"weight_hr_{last}"))


def test_from_torch_without_bias_and_module_state():
    ref = _torch_ref("gru", 2, 2, bias=False)
    m = CudnnGRU.from_torch(ref.eval())
    assert not m.training
    assert all(torch.equal(t, torch.zeros_like(t)) for t in m.canonical_weights()[1])
    back = m.to_torch()
    assert torch.equal(back.weight_hh_l1_reverse, ref.weight_hh_l1_reverse)
    assert torch.equal(back.bias_ih_l0, torch.zeros(15, dtype=F64))
    drop = CudnnLSTM.from_torch(nn.LSTM(3, 4, 2, dropout=0.25), seed=7)
    assert drop.dropout == 0.25 and drop.seed == 7 and drop.to_torch().dropout == 0.25


def test_canonical_round_trip_is_exact():
    torch.manual_seed(5)
    for mode in CLASSES:
        for direction in DIRS.values():
            kw = {"num_proj": 3} if mode == "lstm" else {}
            m = CLASSES[mode](2, 7, 3, direction=direction, dtype=F64, **kw)
            nn.init.normal_(m.params)
            w, b = m.canonical_weights()
            m2 = CLASSES[mode](2, 7, 3, direction=direction, dtype=F64, **kw)
            m2.load_canonical_weights([t.clone() for t in w], [t.clone() for t in b])
            assert torch.equal(m2.params, m.params)
            # element counts only (TF's converter takes flattened tensors), numpy arrays, other dtypes
            m3 = CLASSES[mode](2, 7, 3, direction=direction, dtype=torch.float32, **kw)
            m3.load_canonical_weights([t.detach().numpy().ravel() for t in w], [t.float() for t in b])
            assert torch.equal(m3.params, m.params.float())
            w3, b3 = m3.canonical_weights()
            assert [list(t.shape) for t in w3] == [list(t.shape) for t in w]
            assert all(torch.equal(x, y.float()) for x, y in zip(w3 + b3, w + b))


def test_canonical_weights_are_views_of_params():
    m = CudnnGRU(1, 3, 2)
    w, b = m.canonical_weights()
    with torch.no_grad():
        b[-1].fill_(7.0)
    assert torch.equal(m.params[-3:], torch.full([3], 7.0))
    (sum(t.sum() for t in w) * 2).backward()  # differentiable: gradient 2 on every weight element
    n = sum(t.numel() for t in w)
    assert torch.equal(m.params.grad, torch.cat([torch.full([n], 2.0), torch.zeros(m.params_size - n)]))


def test_converter_errors():
    with pytest.raises(TypeError, match=r"CudnnLSTM.from_torch expects a torch.nn.LSTM, got GRU"):
        CudnnLSTM.from_torch(nn.GRU(3, 4))
    with pytest.raises(ValueError, match=r"expects torch.nn.RNN\(nonlinearity='relu'\), got nonlinearity='tanh'"):
        CudnnRNNRelu.from_torch(nn.RNN(3, 4))
    with pytest.raises(ValueError, match="skip_input"):
        CudnnGRU(1, 4, 4, input_mode="skip_input").to_torch()
    with pytest.raises(ValueError, match="skip_input"):
        CudnnGRU(1, 4, 4, input_mode="auto_select").keras_weights()
    m = CudnnLSTM(2, 4, 3)
    w, b = m.canonical_weights()
    with pytest.raises(ValueError, match="expected 16 canonical weights for this configuration, got 15"):
        m.load_canonical_weights(w[:-1], b)
    with pytest.raises(ValueError, match="expected 16 canonical biases for this configuration, got 17"):
        m.load_canonical_weights(w, b + b[:1])
    with pytest.raises(ValueError, match=r"canonical weights\[4\] must have 16 elements \(shape \[4, 4\]\), got "
                                         r"shape \[4, 3\]"):
        m.load_canonical_weights(w[:4] + [torch.zeros(4, 3)] + w[5:], b)
    before = m.params.detach().clone()
    with pytest.raises(ValueError, match=r"canonical biases\[15\] must have 4 elements"):
        m.load_canonical_weights([t + 1 for t in w], b[:-1] + [torch.zeros(5)])
    assert torch.equal(m.params, before)  # nothing was written


# ---------------------------------------------------------------------------------------------------------
# constructor and forward errors
# ---------------------------------------------------------------------------------------------------------

def test_constructor_errors():
    with pytest.raises(ValueError, match="num_layers must be >= 1, got 0"):
        CudnnLSTM(0, 4, 3)
    with pytest.raises(ValueError, match="num_units must be >= 1, got -2"):
        CudnnGRU(1, -2, 3)
    with pytest.raises(TypeError, match="input_size must be an int, got float"):
        CudnnGRU(1, 2, 3.0)
    with pytest.raises(ValueError, match=r"direction must be one of \['unidirectional', 'bidirectional'\], got 'bi'"):
        CudnnLSTM(1, 4, 3, direction="bi")
    with pytest.raises(ValueError, match="input_mode must be one of"):
        CudnnLSTM(1, 4, 3, input_mode="skip")
    with pytest.raises(ValueError, match="'skip_input' requires input_size == num_units, got input_size 3 and "
                                         "num_units 4"):
        CudnnRNNTanh(1, 4, 3, input_mode="skip_input")
    with pytest.raises(ValueError, match=r"num_proj must be <= num_units \(4\), got 5"):
        CudnnLSTM(1, 4, 3, num_proj=5)
    with pytest.raises(TypeError):
        CudnnGRU(1, 4, 3, num_proj=2)  # projection is an LSTM-only argument
    with pytest.raises(ValueError, match="only supported for rnn_mode 'lstm'"):
        canonical_shapes("gru", 1, 4, 3, num_proj=2)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\], got 1.5"):
        CudnnLSTM(2, 4, 3, dropout=1.5)
    with pytest.raises(ValueError, match="init must be"):
        CudnnLSTM(2, 4, 3, init="xavier")
    with pytest.raises(ValueError, match="rnn_mode must be one of"):
        cudnn_params_size("lstmp", 1, 2, 3)


def test_forward_errors():
    m = CudnnLSTM(2, 4, 3, direction="bidirectional", num_proj=2, dtype=F64)
    x = torch.randn(5, 2, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"input must be 3-D \(\[T, B, input_size\]\), got shape \[5, 3\]"):
        m(x[:, 0])
    with pytest.raises(ValueError, match=r"input_size = 3 features in its last dimension, got shape \[5, 2, 4\]"):
        m(torch.randn(5, 2, 4, dtype=F64))
    h, c = torch.zeros(4, 2, 2, dtype=F64), torch.zeros(4, 2, 4, dtype=F64)
    with pytest.raises(ValueError, match=r"initial h state must have shape \[num_layers \* num_dirs, batch, 2\] = "
                                         r"\[4, 2, 2\], got \[4, 2, 4\]"):
        m(x, (c, c))
    with pytest.raises(ValueError, match=r"initial c state must have shape .* = \[4, 2, 4\], got \[2, 4, 4\]"):
        m(x, (h, c.transpose(0, 1)))
    with pytest.raises(ValueError, match=r"sequence_lengths must be a 1-D tensor of batch size 2, got shape \[3\]"):
        m(x, (h, c), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="sequence_lengths must hold integers, got dtype torch.float32"):
        m(x, None, torch.tensor([1.0, 2.0]))
    g = CudnnGRU(1, 4, 3, time_major=False)
    with pytest.raises(ValueError, match=r"input must be 3-D \(\[B, T, input_size\]\)"):
        g(torch.randn(3))
    with pytest.raises(ValueError, match=r"initial h state must have shape .* = \[1, 2, 4\], got \[2, 1, 4\]"):
        g(torch.randn(2, 5, 3), torch.zeros(2, 1, 4))  # states stay [L*D, B, n] with time_major=False


# ---------------------------------------------------------------------------------------------------------
# forward and gradients against torch.nn.LSTM / GRU / RNN
# ---------------------------------------------------------------------------------------------------------

def _cases():
    for mode in CLASSES:
        for L in (1, 2, 3):
            for D in (1, 2):
                for P in ([0, 3] if mode == "lstm" else [0]):
                    yield mode, L, D, P


@pytest.mark.parametrize("mode,L,D,P", list(_cases()))
@pytest.mark.parametrize("batch_first", [False, True])
def test_matches_torch_forward_and_gradients(mode, L, D, P, batch_first):
    torch.manual_seed(10 * L + D + P)
    T, B, I, H = 5, 3, 4, 5
    ref = _torch_ref(mode, L, D, P, batch_first, I=I, H=H)
    for p in ref.parameters():  # non-zero biases everywhere, so that b_W / b_R mix-ups show
        nn.init.uniform_(p, -0.6, 0.6)
    m = CLASSES[mode].from_torch(ref)
    O = P or H
    x = torch.randn(B, T, I, dtype=F64) if batch_first else torch.randn(T, B, I, dtype=F64)
    h0 = torch.randn(L * D, B, O, dtype=F64)
    c0 = torch.randn(L * D, B, H, dtype=F64)
    state = (h0, c0) if mode == "lstm" else h0
    xs = [x.clone().requires_grad_() for _ in range(2)]
    ss = [tuple(s.clone().requires_grad_() for s in state) if mode == "lstm" else state.clone().requires_grad_()
          for _ in range(2)]
    y, h, c = run(m, xs[0], ss[0])
    y_ref, h_ref, c_ref = torch_run(ref, xs[1], ss[1])
    assert y.shape == y_ref.shape == ((B, T, D * O) if batch_first else (T, B, D * O))
    close(y, y_ref)
    close(h, h_ref)
    if mode == "lstm":
        close(c, c_ref)
    # a loss touching every output, with distinct weights per element
    wy, wh = torch.randn_like(y), torch.randn_like(h)
    loss = (y * wy).sum() + (h * wh).sum() + (c.sin().sum() if c is not None else 0)
    loss_ref = (y_ref * wy).sum() + (h_ref * wh).sum() + (c_ref.sin().sum() if c_ref is not None else 0)
    loss.backward()
    loss_ref.backward()
    close(xs[0].grad, xs[1].grad)
    for a, b in zip(ss[0] if mode == "lstm" else [ss[0]], ss[1] if mode == "lstm" else [ss[1]]):
        close(a.grad, b.grad)
    kw = {"proj_size": P} if P else {}
    close(m.params.grad, grads_as_params(CLASSES[mode], ref, nonlinearity=ref.nonlinearity, **kw)
          if mode.startswith("rnn") else grads_as_params(CLASSES[mode], ref, **kw))


@pytest.mark.parametrize("mode", list(CLASSES))
@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
def test_variable_lengths_match_torch_packed_sequences(mode, D, batch_first):
    torch.manual_seed(20 + D)
    T, I, H, L = 7, 4, 5, 2
    lengths = torch.tensor([3, 7, 1, 5, 7, 2])  # unsorted
    B = lengths.numel()
    P = 2 if mode == "lstm" else 0
    ref = _torch_ref(mode, L, D, P, batch_first, I=I, H=H)
    m = CLASSES[mode].from_torch(ref)
    O = P or H
    x = torch.randn(B, T, I, dtype=F64) if batch_first else torch.randn(T, B, I, dtype=F64)
    mask = (torch.arange(T)[:, None] < lengths[None, :]).to(F64)[..., None]  # [T, B, 1]
    if batch_first:
        mask = mask.transpose(0, 1)
    x = x * mask  # padded steps hold zeros on both sides (packing drops them anyway)
    h0 = torch.randn(L * D, B, O, dtype=F64)
    c0 = torch.randn(L * D, B, H, dtype=F64)
    state = (h0, c0) if mode == "lstm" else h0
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, h, c = run(m, x1, state, lengths.to(torch.int32))
    packed = pack_padded_sequence(x2, lengths, batch_first=batch_first, enforce_sorted=False)
    y_p, h_ref, c_ref = torch_run(ref, packed, state)
    y_ref, _ = pad_packed_sequence(y_p, batch_first=batch_first, total_length=T)
    close(y, y_ref)
    assert torch.equal(y * (1 - mask), torch.zeros_like(y))  # exactly 0 past each length
    close(h, h_ref)
    if mode == "lstm":
        close(c, c_ref)
    w = torch.randn_like(y)
    ((y * w).sum() + h.sum() + (c.sum() if c is not None else 0)).backward()
    ((y_ref * w).sum() + h_ref.sum() + (c_ref.sum() if c_ref is not None else 0)).backward()
    close(x1.grad, x2.grad)
    assert torch.equal(x1.grad * (1 - mask), torch.zeros_like(x1.grad))
    kw = {"proj_size": P} if P else {}
    if mode.startswith("rnn"):
        kw["nonlinearity"] = ref.nonlinearity
    close(m.params.grad, grads_as_params(CLASSES[mode], ref, **kw))
    # int64 lengths, a Python list, and lengths given as all-T equal the default
    y64 = run(m, x, state, lengths)[0]
    close(y64, y.detach())
    close(run(m, x, state, lengths.tolist())[0], y.detach())
    full = torch.full([B], T)
    close(run(m, x, state, full)[0], run(m, x, state)[0])


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_zero_length_rows_keep_their_initial_state(mode):
    torch.manual_seed(6)
    m = CLASSES[mode](2, 4, 3, direction="bidirectional", dtype=F64)
    x = torch.randn(5, 3, 3, dtype=F64)
    h0 = torch.randn(4, 3, 4, dtype=F64)
    c0 = torch.randn(4, 3, 4, dtype=F64)
    state = (h0, c0) if mode == "lstm" else h0
    lengths = torch.tensor([0, 5, 2])
    y, h, c = run(m, x, state, lengths)
    y_r, h_r, c_r = ref_forward(m, x, h0, c0 if mode == "lstm" else None, lengths)
    close(y, y_r)
    close(h, h_r)
    assert torch.equal(y[:, 0], torch.zeros(5, 8, dtype=F64)) and torch.equal(h[:, 0], h0[:, 0])
    if mode == "lstm":
        close(c, c_r)
        assert torch.equal(c[:, 0], c0[:, 0])


@pytest.mark.parametrize("mode", list(CLASSES))
@pytest.mark.parametrize("input_mode", ["skip_input", "auto_select"])
def test_skip_input_against_reference(mode, input_mode):
    torch.manual_seed(7)
    H = 4
    m = CLASSES[mode](2, H, H, direction="bidirectional", input_mode=input_mode, dtype=F64)
    nn.init.uniform_(m.params, -0.5, 0.5)
    x = torch.randn(4, 2, H, dtype=F64)
    h0 = torch.randn(4, 2, H, dtype=F64)
    c0 = torch.randn(4, 2, H, dtype=F64) if mode == "lstm" else None
    lengths = torch.tensor([4, 3])
    y, h, c = run(m, x, (h0, c0) if mode == "lstm" else h0, lengths)
    y_r, h_r, c_r = ref_forward(m, x, h0, c0, lengths)
    close(y, y_r)
    close(h, h_r)
    if mode == "lstm":
        close(c, c_r)


def test_skip_input_tf_issue_8311_value():
    # TF #8311: gru, all parameters 0, h0 = 0, x = 1 -> h' = (1 - sigmoid(1)) * tanh(1) = 0.2048
    m = CudnnGRU(1, 3, 3, input_mode="skip_input")
    with torch.no_grad():
        m.params.zero_()
    y, h = m(torch.ones(1, 2, 3))
    close(y, torch.full([1, 2, 3], (1 - torch.sigmoid(torch.tensor(1.0))) * math.tanh(1.0)), tol=1e-6)
    assert abs(y[0, 0, 0].item() - 0.2048) < 1e-4


def test_batch_major_equals_time_major():
    torch.manual_seed(8)
    tm = CudnnLSTM(2, 4, 3, direction="bidirectional", num_proj=2, dtype=F64)
    bm = CudnnLSTM(2, 4, 3, direction="bidirectional", num_proj=2, time_major=False, dtype=F64)
    bm.load_state_dict(tm.state_dict())
    x = torch.randn(6, 3, 3, dtype=F64)
    state = (torch.randn(4, 3, 2, dtype=F64), torch.randn(4, 3, 4, dtype=F64))
    lengths = torch.tensor([6, 2, 4])
    y, (h, c) = tm(x, state, lengths)
    y_b, (h_b, c_b) = bm(x.transpose(0, 1), state, lengths)
    close(y_b, y.transpose(0, 1))
    close(h_b, h)  # the same [L*D, B, n] state layout in both
    close(c_b, c)


def test_batch_major_output_is_the_ops_batch_major_output_with_torch_nn_strides():
    # The module runs the op time-major on the transposed input: its output and gradients equal the op's own
    # batch-major call exactly, and the output has the strides torch.nn.LSTM(batch_first=True) gives.
    torch.manual_seed(9)
    m = CudnnLSTM(2, 4, 3, direction="bidirectional", time_major=False)
    x = torch.randn(3, 6, 3, requires_grad=True)
    y, (h, c) = m(x)
    ref = torch.nn.LSTM(3, 4, 2, bidirectional=True, batch_first=True)(x)[0]
    assert y.shape == ref.shape and y.stride() == ref.stride() and not y.is_contiguous()
    x2 = x.detach().clone().requires_grad_()
    z = torch.zeros(3, 4, 4)
    y2, h2, c2 = torch.ops.torchops.cudnn_rnn_v3(x2, z, z, m.params, torch.full([3], 6, dtype=torch.int32),
                                                 direction="bidirectional", time_major=False)[:3]
    assert torch.equal(y, y2) and torch.equal(h, h2.transpose(0, 1)) and torch.equal(c, c2.transpose(0, 1))
    g = torch.randn(y.shape)
    gx, gp = torch.autograd.grad((y * g).sum(), [x, m.params])
    gx2, gp2 = torch.autograd.grad((y2 * g).sum(), [x2, m.params])
    assert torch.equal(gx, gx2) and torch.equal(gp, gp2)


# ---------------------------------------------------------------------------------------------------------
# Keras
# ---------------------------------------------------------------------------------------------------------

def keras_step(mode, x, h, c, kernel, rec, bias):
    """Keras' own equations (LSTM, GRU reset_after=True, SimpleRNN), weights as get_weights() returns them."""
    if mode == "lstm":
        i, f, g, o = (x @ kernel + h @ rec + bias).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if mode == "gru":
        x_z, x_r, x_h = (x @ kernel + bias[0]).chunk(3, -1)
        r_z, r_r, r_h = (h @ rec + bias[1]).chunk(3, -1)
        z, r = torch.sigmoid(x_z + r_z), torch.sigmoid(x_r + r_r)
        return z * h + (1 - z) * torch.tanh(x_h + r * r_h), c
    a = x @ kernel + bias + h @ rec
    return (torch.tanh(a) if mode == "rnn_tanh" else torch.relu(a)), c


@pytest.mark.parametrize("mode", list(CLASSES))
def test_keras_weights_match_keras_equations(mode):
    torch.manual_seed(9)
    T, B, I, U = 5, 2, 3, 4
    G = {"lstm": 4, "gru": 3}.get(mode, 1)
    # a Keras Bidirectional layer's get_weights(): forward [kernel, recurrent_kernel, bias], then backward
    weights = []
    for _ in range(2):
        weights += [np.random.RandomState(len(weights)).uniform(-0.5, 0.5, s) for s in
                    ([I, G * U], [U, G * U], [2, G * U] if mode == "gru" else [G * U])]
    m = CLASSES[mode](1, U, I, direction="bidirectional", dtype=F64)
    m.load_keras_weights(weights)
    x = torch.randn(T, B, I, dtype=F64)
    y, h, c = run(m, x)
    kw = [torch.from_numpy(w) for w in weights]
    for d in range(2):
        hh = cc = torch.zeros(B, U, dtype=F64)
        outs = [None] * T
        for t in (range(T) if d == 0 else range(T - 1, -1, -1)):  # Keras go_backwards layer, re-reversed
            hh, cc = keras_step(mode, x[t], hh, cc, *kw[3 * d:3 * d + 3])
            outs[t] = hh
        close(y[..., d * U:(d + 1) * U], torch.stack(outs))
        close(h[d], hh)
        if mode == "lstm":
            close(c[d], cc)
    # round trip: Keras -> ours -> Keras is exact
    back = m.keras_weights()
    assert len(back) == 6
    for a, b in zip(back, kw):
        assert a.shape == b.shape and torch.equal(a, b)


def test_keras_from_ours_is_the_same_function_and_errors():
    torch.manual_seed(11)
    m = CudnnLSTM(2, 4, 3, dtype=F64)
    nn.init.uniform_(m.params, -0.5, 0.5)
    m2 = CudnnLSTM(2, 4, 3, dtype=F64)
    m2.load_keras_weights(m.keras_weights())  # b_W + b_R folded into one bias: same function
    x = torch.randn(4, 2, 3, dtype=F64)
    close(m2(x)[0], m(x)[0])
    g = CudnnGRU(1, 4, 3)
    k = g.keras_weights()
    assert [list(t.shape) for t in k] == [[3, 12], [4, 12], [2, 12]]
    with pytest.raises(ValueError, match=r"reset_after=False .* use reset_after=True"):
        g.load_keras_weights([k[0], k[1], np.zeros(12)])
    with pytest.raises(ValueError, match=r"expected 3 Keras arrays .* got 6"):
        g.load_keras_weights(k + k)
    with pytest.raises(ValueError, match=r"Keras kernel of \(layer, direction\) 0 must have shape \[3, 12\], got "
                                         r"\[12, 3\]"):
        g.load_keras_weights([k[0].t(), k[1], k[2]])
    with pytest.raises(ValueError, match="no projection"):
        CudnnLSTM(1, 4, 3, num_proj=2).keras_weights()


# ---------------------------------------------------------------------------------------------------------
# training / eval, dropout and seeds
# ---------------------------------------------------------------------------------------------------------

def test_eval_mode_no_dropout_and_gradients_still_work():
    torch.manual_seed(12)
    m = CudnnLSTM(3, 4, 3, dropout=0.5, dtype=F64)
    ref = m.to_torch().eval()
    m.eval()
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    with torch.no_grad():
        y_ng = m(x)[0]
    y = m(x)[0]  # eval + grad: is_training=True without dropout
    close(y, ref(x)[0])
    close(y_ng, y.detach())
    y.sum().backward()
    assert x.grad is not None and m.params.grad is not None
    # dropout 0 and dropout 1 give identical inference (TF's test_inference_with_dropout)
    m1 = CudnnLSTM(3, 4, 3, dropout=1.0, dtype=F64).eval()
    m1.load_state_dict(m.state_dict())
    close(m1(x)[0], y)


def test_dropout_seeds():
    torch.manual_seed(13)
    x = torch.randn(6, 4, 3, dtype=F64)
    a = CudnnGRU(2, 8, 3, dropout=0.5, seed=3, dtype=F64)
    b = CudnnGRU(2, 8, 3, dropout=0.5, seed=3, dtype=F64)
    b.load_state_dict(a.state_dict())
    ya1, ya2 = a(x)[0], a(x)[0]
    yb1, yb2 = b(x)[0], b(x)[0]
    assert torch.equal(ya1, yb1) and torch.equal(ya2, yb2)  # the sequence of masks is reproducible from the seed
    assert not torch.equal(ya1, ya2)  # but successive training steps get fresh masks
    assert a.dropout_step == 2
    b.dropout_step = 0
    assert torch.equal(b(x)[0], ya1)
    no_drop = CudnnGRU(2, 8, 3, dtype=F64)
    no_drop.load_state_dict(a.state_dict())
    assert not torch.equal(ya1, no_drop(x)[0])
    one = CudnnGRU(1, 8, 3, dropout=0.5, seed=3, dtype=F64)  # a single layer has no dropout
    one.load_state_dict(CudnnGRU(1, 8, 3, dtype=F64).state_dict())
    assert torch.equal(one(x)[0], one.eval()(x)[0])
    # seed 0: torch's default generator
    c = CudnnGRU(2, 8, 3, dropout=0.5, dtype=F64)
    c.load_state_dict(a.state_dict())
    torch.manual_seed(1)
    y1 = c(x)[0]
    torch.manual_seed(1)
    assert torch.equal(c(x)[0], y1)
    assert not torch.equal(c(x)[0], y1)


def test_dropout_gradient_uses_the_forward_masks():
    torch.manual_seed(14)
    m = CudnnLSTM(2, 3, 2, dropout=0.5, seed=5, dtype=F64)
    x = torch.randn(3, 2, 2, dtype=F64, requires_grad=True)

    def f(x, params):
        m.dropout_step = 0  # the same masks on every evaluation
        with torch.no_grad():
            m.params.copy_(params)
        return m(x)[0]
    # gradient of the module vs finite differences of the same (fixed-mask) function
    y = f(x, m.params.detach().clone())
    g = torch.randn_like(y)
    gx, = torch.autograd.grad(y, x, g)
    eps = 1e-6
    num = torch.zeros_like(x)
    for i in range(x.numel()):
        d = torch.zeros(x.numel(), dtype=F64)
        d[i] = eps
        d = d.view_as(x)
        p = m.params.detach().clone()
        num.view(-1)[i] = ((f(x + d, p) - f(x - d, p)) * g).sum() / (2 * eps)
    close(gx, num, tol=1e-6)


class _Tagger(nn.Module):
    def __init__(self, rnn, width):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(width, 1)

    def forward(self, x, lengths):
        y = self.rnn(x, None, lengths)[0]
        return self.head(y).squeeze(-1)


@pytest.mark.parametrize("mode", list(CLASSES))
def test_small_model_trains(mode):
    torch.manual_seed(15)
    T, B = 6, 32
    x = torch.randn(T, B, 3)
    lengths = torch.randint(1, T + 1, [B])
    y = x[..., 0].cumsum(0) * 0.3 - x[..., 1]  # a running sum: needs the recurrence
    mask = (torch.arange(T)[:, None] < lengths).float()
    kw = {"num_proj": 6} if mode == "lstm" else {}
    rnn = CLASSES[mode](2, 8, 3, dropout=0.1, seed=1, **kw)
    model = _Tagger(rnn, rnn.output_size)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = (((model(x, lengths) - y) ** 2) * mask).sum() / mask.sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


# ---------------------------------------------------------------------------------------------------------
# TorchScript, dtypes, CUDA
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(CLASSES))
def test_scripted_module_matches_eager_with_gradients(mode):
    torch.manual_seed(16)
    kw = {"num_proj": 3} if mode == "lstm" else {}
    m = CLASSES[mode](2, 4, 3, direction="bidirectional", time_major=False, dtype=F64, **kw)
    s = torch.jit.script(m)
    x = torch.randn(2, 5, 3, dtype=F64, requires_grad=True)
    lengths = torch.tensor([5, 3])
    outs = []
    for mod in (m, s):
        mod.zero_grad()
        y, h, c = run(mod, x, None, lengths) if mod is m else _run_scripted(mod, mode, x, lengths)
        gx, = torch.autograd.grad(y.sum() + h.sum(), x, retain_graph=True)
        (y.sum() + h.sum()).backward()
        outs.append((y, h, c, gx, mod.params.grad.clone()))
    for a, b in zip(*outs):
        if a is not None:
            close(a, b)
    # dropout state advances inside the scripted module too
    d = torch.jit.script(CLASSES[mode](2, 4, 3, dropout=0.5, seed=2, **kw))
    d(torch.randn(5, 2, 3))
    assert d.dropout_step == 1


def _run_scripted(s, mode, x, lengths):
    if mode == "lstm":
        y, (h, c) = s(x, None, lengths)
        return y, h, c
    y, h = s(x, None, lengths)
    return y, h, None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_other_dtypes(dtype):
    torch.manual_seed(17)
    m64 = CudnnLSTM(2, 4, 3, direction="bidirectional", dtype=F64)
    m = CudnnLSTM(2, 4, 3, direction="bidirectional", dtype=dtype)
    with torch.no_grad():
        m.params.copy_(m64.params)
    x = torch.randn(5, 2, 3, dtype=F64)
    y = m(x.to(dtype))[0]
    assert y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    close(y.double(), m64(x.to(dtype).double())[0].detach(), tol=tol)
    y.float().sum().backward()
    assert m.params.grad.dtype == dtype and torch.isfinite(m.params.grad.float()).all()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", list(CLASSES))
def test_cuda_matches_cpu(mode):
    torch.manual_seed(18)
    kw = {"num_proj": 3} if mode == "lstm" else {}
    for time_major in (True, False):
        cpu = CLASSES[mode](2, 5, 4, direction="bidirectional", time_major=time_major, dtype=F64, **kw)
        gpu = CLASSES[mode](2, 5, 4, direction="bidirectional", time_major=time_major, dtype=F64, device="cuda",
                            **kw)
        gpu.load_state_dict(cpu.state_dict())
        x = torch.randn(6, 3, 4, dtype=F64) if time_major else torch.randn(3, 6, 4, dtype=F64)  # T=6, B=3
        lengths = torch.tensor([6, 0, 4])
        outs = []
        for m, dev in ((cpu, "cpu"), (gpu, "cuda")):
            xi = x.detach().to(dev).requires_grad_()  # not x itself: the CUDA pass needs it to stay a leaf
            y, h, c = run(m, xi, None, lengths.to(dev))
            (y.sum() + h.sum()).backward()
            outs.append([t.cpu() for t in (y, h, xi.grad, m.params.grad) + ((c,) if c is not None else ())])
        for a, b in zip(*outs):
            close(a, b, tol=1e-8)
    m = CudnnLSTM.from_torch(nn.LSTM(4, 5, 2, proj_size=2).cuda())
    assert m.params.is_cuda and m.to_torch().weight_hr_l1.is_cuda


# ---------------------------------------------------------------------------------------------------------
# TF 1.x checkpoint format (tf.contrib.cudnn_rnn saveables: CudnnCompatibleLSTMCell / GRUCell, BasicRNNCell)
# ---------------------------------------------------------------------------------------------------------

def tf_cell(mode, x, h, c, t):
    """TF's canonical cells on their own variables `t` (name -> tensor, names relative to the cell)."""
    xh = torch.cat([x, h], -1)
    if mode == "lstm":  # LSTMBlockCell(forget_bias=0): kernel columns i, c, f, o
        i, g, f, o = (xh @ t["kernel"] + t["bias"]).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h @ t["projection/kernel"] if "projection/kernel" in t else h), c
    if mode == "gru":  # CudnnCompatibleGRUCell
        r, u = torch.sigmoid(xh @ t["gates/kernel"] + t["gates/bias"]).chunk(2, -1)
        hi = x @ t["candidate/input_projection/kernel"] + t["candidate/input_projection/bias"]
        hh = r * (h @ t["candidate/hidden_projection/kernel"] + t["candidate/hidden_projection/bias"])
        cand = torch.tanh(hi + hh)
        return u * h + (1 - u) * cand, c
    a = xh @ t["kernel"] + t["bias"]  # BasicRNNCell
    return (torch.tanh(a) if mode == "rnn_tanh" else torch.relu(a)), c


@pytest.mark.parametrize("mode", list(CLASSES))
@pytest.mark.parametrize("D", [1, 2])
def test_tf_checkpoint_format(mode, D):
    torch.manual_seed(19)
    L, H, I, T, B = 2, 4, 3, 5, 2
    P = 2 if mode == "lstm" and D == 2 else 0
    kw = {"num_proj": P} if P else {}
    src = CLASSES[mode](L, H, I, direction=DIRS[D], dtype=F64, **kw)
    nn.init.uniform_(src.params, -0.7, 0.7)
    ckpt = {k: v.numpy() for k, v in src.tf_checkpoint_weights(scope="model/cudnn_" + mode).items()}
    names = list(ckpt)
    n_w = {"lstm": 2 if P else 1, "gru": 3}.get(mode, 1) * L * D
    assert all("kernel" in k for k in names[:n_w]) and all("bias" in k for k in names[n_w:])  # weights, then biases
    cell = {"lstm": "cudnn_compatible_lstm_cell", "gru": "cudnn_compatible_gru_cell"}.get(mode, "basic_rnn_cell")
    first = (f"model/cudnn_{mode}/rnn/multi_rnn_cell/cell_0/{cell}" if D == 1 else
             f"model/cudnn_{mode}/stack_bidirectional_rnn/cell_0/bidirectional_rnn/fw/{cell}")
    assert names[0] == first + ("/gates/kernel" if mode == "gru" else "/kernel")
    m = CLASSES[mode](L, H, I, direction=DIRS[D], dtype=F64, **kw)
    m.load_tf_checkpoint_weights(ckpt, scope="model/cudnn_" + mode)
    again = m.tf_checkpoint_weights(scope="model/cudnn_" + mode)
    assert list(again) == names and all(torch.equal(again[k], torch.from_numpy(ckpt[k])) for k in names)
    # the loaded module computes what TF's canonical cells compute on the checkpoint
    x = torch.randn(T, B, I, dtype=F64)
    y, h, c = run(m, x)
    close(y, run(src, x)[0])
    inp, hs, cs = x, [], []
    for layer in range(L):
        outs = []
        for d in range(D):
            prefix = first.replace("cell_0", f"cell_{layer}").replace("/fw/", "/bw/" if d else "/fw/")
            t = {k[len(prefix) + 1:]: torch.from_numpy(v) for k, v in ckpt.items() if k.startswith(prefix + "/")}
            hh, cc = torch.zeros(B, P or H, dtype=F64), torch.zeros(B, H, dtype=F64)
            seq = [None] * T
            for step in (range(T) if d == 0 else range(T - 1, -1, -1)):
                hh, cc = tf_cell(mode, inp[step], hh, cc, t)
                seq[step] = hh
            outs.append(torch.stack(seq))
            hs.append(hh)
            cs.append(cc)
        inp = torch.cat(outs, -1)
    close(y, inp)
    close(h, torch.stack(hs))
    if mode == "lstm":
        close(c, torch.stack(cs))
    with pytest.raises(KeyError, match="is missing"):
        m.load_tf_checkpoint_weights(ckpt)  # wrong scope
    bad = dict(ckpt)
    bad[names[0]] = ckpt[names[0]].T
    with pytest.raises(ValueError, match=r"TF checkpoint tensor '.*' must have shape"):
        m.load_tf_checkpoint_weights(bad, scope="model/cudnn_" + mode)


# ---------------------------------------------------------------------------------------------------------
# the layout here agrees with the ops' (params_size, params_to_canonical_v2, canonical_to_params_v2)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(CLASSES))
@pytest.mark.parametrize("input_mode", ["linear_input", "skip_input"])
def test_layout_agrees_with_the_ops(mode, input_mode):
    torch.manual_seed(21)
    ops = torch.ops.torchops
    for direction in DIRS.values():
        P = 2 if mode == "lstm" and input_mode == "linear_input" else 0
        kw = {"num_proj": P} if mode == "lstm" else {}
        m = CLASSES[mode](3, 5, 5, direction=direction, input_mode=input_mode, dtype=F64, **kw)
        nn.init.normal_(m.params)
        m.flatten_parameters()  # torch.nn.LSTM compatibility no-op
        attrs = dict(rnn_mode=mode, input_mode=input_mode, direction=direction, num_proj=P)
        assert int(ops.cudnn_rnn_params_size(3, 5, 5, **attrs)[0]) == m.params_size
        w, b = m.canonical_weights()
        w_op, b_op = ops.cudnn_rnn_params_to_canonical_v2(3, 5, 5, m.params.detach(), len(w), len(b), **attrs)
        assert len(w_op) == len(w) and len(b_op) == len(b)
        for x, y in zip(w + b, list(w_op) + list(b_op)):
            assert x.shape == y.shape and torch.equal(x, y)
        assert torch.equal(ops.cudnn_rnn_canonical_to_params_v2(3, 5, 5, [t.detach() for t in w],
                                                                [t.detach() for t in b], **attrs), m.params.detach())


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_torch_compile_fullgraph_matches_eager(mode):
    torch.manual_seed(22)
    kw = {"num_proj": 2} if mode == "lstm" else {}
    m = CLASSES[mode](2, 4, 3, direction="bidirectional", time_major=False, dtype=F64, **kw)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 5, 3, dtype=F64)
    lengths = torch.tensor([5, 3])
    res = []
    for fn in (m, compiled):
        xi = x.clone().requires_grad_()
        m.zero_grad()
        y, h, _ = run(fn, xi, None, lengths) if fn is m else _run_scripted(fn, mode, xi, lengths)
        (y.sum() + h.sum()).backward()
        res.append((y, h, xi.grad, m.params.grad.clone()))
    for a, b in zip(*res):
        close(a, b)
