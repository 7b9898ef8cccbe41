"""CudnnRNN ops: params size and layout, converters, forward and
backward against torch.nn.LSTM / GRU / RNN with mapped weights, variable lengths, skip_input, dropout,
layouts, dtypes, every validation error, opcheck / torch.compile / TorchScript, CUDA parity (with a GPU)."""
import pytest
import torch

import torchops  # noqa: F401
from torchops import functional as F
from torchops.autograd import CudnnRNNFunction, CudnnRNNV2Function, CudnnRNNV3Function
from conftest import forced_route

ops = torch.ops.torchops
G = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}
MODES = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
CUDA = torch.cuda.is_available() and torchops.built_with_cuda()


# ------------------------------------------------------------------------------------------ helpers
def torch_module(mode, i, h, layers, bi, proj=0, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    if mode == "lstm":
        m = torch.nn.LSTM(i, h, layers, bidirectional=bi, proj_size=proj)
    elif mode == "gru":
        m = torch.nn.GRU(i, h, layers, bidirectional=bi)
    else:
        m = torch.nn.RNN(i, h, layers, nonlinearity=mode[4:], bidirectional=bi)
    with torch.no_grad():
        for p in m.parameters():
            p.uniform_(-0.6, 0.6)
    return m.to(dtype)


def params_of(m):
    """The torchops params buffer of a torch RNN module (torch's and cuDNN's gate orders coincide)."""
    d = 2 if m.bidirectional else 1
    ws, bs = [], []
    for layer in range(m.num_layers):
        for di in range(d):
            sfx = f"_l{layer}" + ("_reverse" if di else "")
            ws += [getattr(m, "weight_ih" + sfx), getattr(m, "weight_hh" + sfx)]
            if getattr(m, "proj_size", 0) > 0:
                ws.append(getattr(m, "weight_hr" + sfx))
            bs += [getattr(m, "bias_ih" + sfx), getattr(m, "bias_hh" + sfx)]
    return torch.cat([w.reshape(-1) for w in ws + bs])


def grads_of(m):
    """The gradient of params_of(m) from the module parameters' .grad."""
    d = 2 if m.bidirectional else 1
    ws, bs = [], []
    for layer in range(m.num_layers):
        for di in range(d):
            sfx = f"_l{layer}" + ("_reverse" if di else "")
            ws += [getattr(m, "weight_ih" + sfx).grad, getattr(m, "weight_hh" + sfx).grad]
            if getattr(m, "proj_size", 0) > 0:
                ws.append(getattr(m, "weight_hr" + sfx).grad)
            bs += [getattr(m, "bias_ih" + sfx).grad, getattr(m, "bias_hh" + sfx).grad]
    return torch.cat([w.reshape(-1) for w in ws + bs])


def states(mode, layers, d, b, h, o, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    h0 = torch.randn(layers * d, b, o, generator=g, dtype=dtype) * 0.5
    c0 = torch.randn(layers * d, b, h, generator=g, dtype=dtype) * 0.5 if mode == "lstm" else torch.zeros([], dtype=dtype)
    return h0, c0


def run_torch(m, mode, x, h0, c0):
    if mode == "lstm":
        y, (hn, cn) = m(x, (h0, c0))
        return y, hn, cn
    y, hn = m(x, h0)
    return y, hn, None


def direction(bi):
    return "bidirectional" if bi else "unidirectional"


# ------------------------------------------------------------------------------------------ params size
SIZE_TABLE = [
    (("lstm", 1, 2, 3, False, 0, "linear_input"), 56),
    (("gru", 1, 3, 2, False, 0, "linear_input"), 63),
    (("rnn_tanh", 1, 4, 5, False, 0, "linear_input"), 44),
    (("lstm", 2, 4, 5, True, 0, "linear_input"), 800),
    (("gru", 3, 8, 4, True, 0, "linear_input"), 3168),
    (("lstm", 2, 6, 10, True, 3, "linear_input"), 1320),
    (("lstm", 1, 200, 100, False, 0, "linear_input"), 241600),
    (("gru", 4, 200, 300, True, 0, "linear_input"), 2769600),
    (("lstm", 3, 143, 143, True, 0, "linear_input"), 1315600),
    (("gru", 1, 3, 3, False, 0, "skip_input"), 36),
    (("gru", 1, 3, 3, False, 0, "linear_input"), 72),
    (("gru", 1, 3, 3, False, 0, "auto_select"), 36),
]


@pytest.mark.parametrize("cfg,size", SIZE_TABLE)
def test_params_size_table(cfg, size):
    mode, layers, h, i, bi, proj, im = cfg
    for s in (None, torch.int32, torch.int64):
        out = F.cudnn_rnn_params_size(layers, h, i, torch.float32, s, mode, im, direction(bi), num_proj=proj)
        assert out.shape == (1,)
        assert out.dtype == (s or torch.int32)
        assert out.item() == size


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("lhi", [(4, 200, 200), (4, 200, 300), (1, 100, 200), (3, 200, 400)])
def test_params_size_equals_torch_parameter_count(mode, bi, lhi):
    layers, h, i = lhi
    m = torch_module(mode, i, h, layers, bi, dtype=torch.float32)
    n = sum(p.numel() for p in m.parameters())
    for dt in (torch.float16, torch.float32, torch.float64):
        assert F.cudnn_rnn_params_size(layers, h, i, dt, None, mode, "linear_input", direction(bi)).item() == n


def test_params_size_torch_projection_count():
    m = torch.nn.LSTM(10, 6, 2, bidirectional=True, proj_size=3)
    assert F.cudnn_rnn_params_size(2, 6, 10, direction="bidirectional", num_proj=3).item() == sum(
        p.numel() for p in m.parameters()) == 1320


def test_params_size_errors():
    with pytest.raises(RuntimeError, match="num_layers must be >= 1"):
        F.cudnn_rnn_params_size(0, 4, 4)
    with pytest.raises(RuntimeError, match="num_units must be >= 1"):
        F.cudnn_rnn_params_size(1, 0, 4)
    with pytest.raises(RuntimeError, match="num_proj > 0 is only supported with rnn_mode 'lstm'"):
        F.cudnn_rnn_params_size(1, 4, 4, rnn_mode="gru", num_proj=2)
    with pytest.raises(RuntimeError, match="num_proj must be <= num_units"):
        F.cudnn_rnn_params_size(1, 4, 4, num_proj=5)
    with pytest.raises(RuntimeError, match="requires input_size == num_units"):
        F.cudnn_rnn_params_size(1, 4, 5, input_mode="skip_input")
    with pytest.raises(RuntimeError, match="rnn_mode must be one of"):
        F.cudnn_rnn_params_size(1, 4, 5, rnn_mode="LSTM")
    with pytest.raises(RuntimeError, match="S must be int32 or int64"):
        F.cudnn_rnn_params_size(1, 4, 5, S=torch.float32)


# ------------------------------------------------------------------------------------------ converters
def n_canonical(mode, layers, bi, proj=0):
    d = 2 if bi else 1
    return layers * d * (2 * G[mode] + (1 if proj else 0)), layers * d * 2 * G[mode]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_canonical_round_trip(mode, bi, dtype):
    layers, h, i = 2, 7, 3
    size = F.cudnn_rnn_params_size(layers, h, i, rnn_mode=mode, direction=direction(bi)).item()
    params = torch.randn(size).to(dtype)
    nw, nb = n_canonical(mode, layers, bi)
    assert nw == nb
    ws, bs = F.cudnn_rnn_params_to_canonical(layers, h, i, params, nw, mode, direction=direction(bi))
    assert len(ws) == nw and len(bs) == nb
    g = G[mode]
    for pl in range(layers * (2 if bi else 1)):
        width = i if pl < (2 if bi else 1) else (2 if bi else 1) * h
        for k in range(g):
            assert ws[pl * 2 * g + k].shape == (h, width)
            assert ws[pl * 2 * g + g + k].shape == (h, h)
    assert all(b.shape == (h,) for b in bs)
    assert all(t.dtype == dtype for t in ws + bs)
    # buffer = concat(flatten(weights) + biases)
    assert torch.equal(torch.cat([w.reshape(-1) for w in ws] + bs), params)
    back = F.cudnn_rnn_canonical_to_params(layers, h, i, ws, bs, mode, direction=direction(bi))
    assert torch.equal(back, params)
    # V2 with num_proj = 0 works (TF bug not copied) and agrees with V1
    ws2, bs2 = F.cudnn_rnn_params_to_canonical_v2(layers, h, i, params, nw, nb, mode, direction=direction(bi))
    assert all(torch.equal(a, b) for a, b in zip(ws + bs, ws2 + bs2))
    back2 = F.cudnn_rnn_canonical_to_params_v2(layers, h, i, ws2, bs2, mode, direction=direction(bi))
    assert torch.equal(back2, params)
    # flattened (row-major) weights are accepted besides the canonical shapes
    back3 = F.cudnn_rnn_canonical_to_params(layers, h, i, [w.reshape(-1) for w in ws], bs, mode,
                                            direction=direction(bi))
    assert torch.equal(back3, params)


def test_canonical_projection_shapes():
    # the documented layout example: lstm, L = 2, bidirectional, H = 6, I = 10, P = 3
    params = torch.randn(1320, dtype=torch.float64)
    ws, bs = F.cudnn_rnn_params_to_canonical_v2(2, 6, 10, params, 36, 32, "lstm", direction="bidirectional",
                                                num_proj=3)
    assert len(ws) == 36 and len(bs) == 32
    assert [tuple(w.shape) for w in ws[:9]] == [(6, 10)] * 4 + [(6, 3)] * 4 + [(3, 6)]
    assert [tuple(w.shape) for w in ws[18:27]] == [(6, 6)] * 4 + [(6, 3)] * 4 + [(3, 6)]
    assert all(tuple(b.shape) == (6,) for b in bs)
    back = F.cudnn_rnn_canonical_to_params_v2(2, 6, 10, ws, bs, "lstm", direction="bidirectional", num_proj=3)
    assert torch.equal(back, params)
    # torch.nn.LSTM(proj_size) mapping matches the canonical split
    m = torch_module("lstm", 10, 6, 2, True, proj=3)
    p = params_of(m)
    ws, _ = F.cudnn_rnn_params_to_canonical_v2(2, 6, 10, p, 36, 32, "lstm", direction="bidirectional", num_proj=3)
    assert torch.equal(ws[8], m.weight_hr_l0)
    assert torch.equal(torch.cat(ws[27:31]), m.weight_ih_l1_reverse)


def test_canonical_skip_input_zero_element_regions():
    params = torch.arange(36, dtype=torch.float32)
    ws, bs = F.cudnn_rnn_params_to_canonical(1, 3, 3, params, 6, "gru", "skip_input")
    assert [tuple(w.shape) for w in ws] == [(3, 0)] * 3 + [(3, 3)] * 3
    assert [tuple(b.shape) for b in bs] == [(0,)] * 3 + [(3,)] * 3
    assert torch.equal(F.cudnn_rnn_canonical_to_params(1, 3, 3, ws, bs, "gru", "skip_input"), params)


def test_converter_errors():
    params = torch.randn(56)
    with pytest.raises(RuntimeError, match="mismatch"):
        F.cudnn_rnn_params_to_canonical(1, 2, 3, params, 6)
    with pytest.raises(RuntimeError, match="params has 55 elements"):
        F.cudnn_rnn_params_to_canonical(1, 2, 3, params[:55], 8)
    with pytest.raises(RuntimeError, match="not an even number with no projection"):
        F.cudnn_rnn_params_to_canonical_v2(1, 2, 3, params, 9, 8)
    with pytest.raises(RuntimeError, match="not an odd number with projection"):
        F.cudnn_rnn_params_to_canonical_v2(1, 2, 3, torch.randn(100), 8, 8, num_proj=1)
    with pytest.raises(RuntimeError, match="not a multiple of num_layers"):
        F.cudnn_rnn_params_to_canonical_v2(2, 2, 3, torch.randn(1000), 9, 8)
    with pytest.raises(RuntimeError, match="num_layers must be >= 1"):
        F.cudnn_rnn_params_to_canonical(0, 2, 3, params, 8)
    ws, bs = F.cudnn_rnn_params_to_canonical(1, 2, 3, params, 8)
    with pytest.raises(RuntimeError, match=r"Number of params \(weights\) mismatch. Expected 8, got 7"):
        F.cudnn_rnn_canonical_to_params(1, 2, 3, ws[:7], bs)
    with pytest.raises(RuntimeError, match=r"Number of params \(biases\) mismatch"):
        F.cudnn_rnn_canonical_to_params(1, 2, 3, ws, bs[:7])
    with pytest.raises(RuntimeError, match="Params size mismatch. Expected 6, got 5"):
        F.cudnn_rnn_canonical_to_params(1, 2, 3, [ws[0].reshape(-1)[:5]] + ws[1:], bs)
    with pytest.raises(RuntimeError, match="Params size mismatch. Expected 2, got 3"):
        F.cudnn_rnn_canonical_to_params(1, 2, 3, ws, [torch.zeros(3)] + bs[1:])
    with pytest.raises(RuntimeError, match="must have dtype"):
        F.cudnn_rnn_canonical_to_params(1, 2, 3, ws, [bs[0].double()] + bs[1:])


def test_converters_are_differentiable():
    params = torch.randn(56, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: F.cudnn_rnn_params_to_canonical(1, 2, 3, p, 8)[0][2], (params,))
    ws, bs = F.cudnn_rnn_params_to_canonical(1, 2, 3, params.detach(), 8)
    ws = [w.requires_grad_() for w in ws]
    assert torch.autograd.gradcheck(lambda *w: F.cudnn_rnn_canonical_to_params(1, 2, 3, list(w), bs), tuple(ws))


# ------------------------------------------------------------------------------------------ forward vs torch
def ours(x, h0, c0, params, mode, bi, proj=0, time_major=True, lens=None, is_training=True, dropout=0.0,
         seed=0, seed2=0, input_mode="linear_input"):
    return F.cudnn_rnn_v3(x, h0, c0, params, lens, mode, input_mode, direction(bi), dropout, seed, seed2, proj,
                          is_training, time_major)


CASES = [(mode, layers, bi) for mode in MODES for layers in (1, 2, 3) for bi in (False, True)]


@pytest.mark.parametrize("mode,layers,bi", CASES)
def test_forward_matches_torch(mode, layers, bi):
    t, b, i, h = 5, 3, 4, 6
    d = 2 if bi else 1
    m = torch_module(mode, i, h, layers, bi)
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, d, b, h, h)
    p = params_of(m).detach()
    with torch.no_grad():
        y_ref, hn_ref, cn_ref = run_torch(m, mode, x, h0, c0)
    for fn in ("v1", "v2", "v3"):
        for is_training in (True, False):
            if fn == "v1":
                y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, mode, direction=direction(bi), is_training=is_training)
            elif fn == "v2":
                y, hn, cn, res, host = F.cudnn_rnn_v2(x, h0, c0, p, mode, direction=direction(bi),
                                                      is_training=is_training)
                assert host.dtype == torch.int8 and host.shape == (0,)
            else:
                y, hn, cn, res, host = ours(x, h0, c0, p, mode, bi, is_training=is_training)
                assert host.dtype == torch.int8 and host.shape == (0,)
            torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(hn, hn_ref, rtol=1e-10, atol=1e-12)
            if mode == "lstm":
                torch.testing.assert_close(cn, cn_ref, rtol=1e-10, atol=1e-12)
            else:
                assert cn.shape == () and cn.item() == 0
            assert res.dim() == 1 and res.dtype == x.dtype
            assert (res.numel() > 0) == is_training


@pytest.mark.parametrize("layers,bi", [(1, False), (2, True), (3, False)])
def test_forward_projection_matches_torch(layers, bi):
    t, b, i, h, pr = 6, 4, 5, 7, 3
    d = 2 if bi else 1
    m = torch_module("lstm", i, h, layers, bi, proj=pr)
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states("lstm", layers, d, b, h, pr)
    with torch.no_grad():
        y_ref, (hn_ref, cn_ref) = m(x, (h0, c0))
    y, hn, cn, _, _ = ours(x, h0, c0, params_of(m).detach(), "lstm", bi, proj=pr)
    assert y.shape == (t, b, d * pr) and hn.shape == (layers * d, b, pr) and cn.shape == (layers * d, b, h)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(hn, hn_ref)
    torch.testing.assert_close(cn, cn_ref)


@pytest.mark.parametrize("mode", MODES)
def test_batch_major_equals_time_major_transposed(mode):
    t, b, i, h, layers, bi = 5, 3, 4, 6, 2, True
    m = torch_module(mode, i, h, layers, bi)
    p = params_of(m).detach()
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, 2, b, h, h)
    lens = torch.tensor([5, 2, 4], dtype=torch.int32)
    y, hn, cn, _, _ = ours(x, h0, c0, p, mode, bi, lens=lens)
    c0_bm = c0.transpose(0, 1) if mode == "lstm" else c0
    yb, hb, cb, _, _ = ours(x.transpose(0, 1), h0.transpose(0, 1), c0_bm, p, mode, bi, lens=lens, time_major=False)
    assert yb.shape == (b, t, 2 * h) and hb.shape == (b, 2 * layers, h)
    torch.testing.assert_close(yb, y.transpose(0, 1))
    torch.testing.assert_close(hb, hn.transpose(0, 1))
    if mode == "lstm":
        torch.testing.assert_close(cb, cn.transpose(0, 1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("layers", [1, 2])
def test_variable_lengths_match_each_sequence_alone(mode, bi, layers):
    t, b, i, h = 6, 5, 3, 4
    d = 2 if bi else 1
    m = torch_module(mode, i, h, layers, bi)
    p = params_of(m).detach()
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, d, b, h, h)
    lens = torch.tensor([6, 2, 0, 5, 1], dtype=torch.int32)  # unsorted, with a zero length
    y, hn, cn, _, _ = ours(x, h0, c0, p, mode, bi, lens=lens)
    for k in range(b):
        n = int(lens[k])
        assert torch.all(y[n:, k] == 0)
        if n == 0:
            torch.testing.assert_close(hn[:, k], h0[:, k], rtol=0, atol=0)
            if mode == "lstm":
                torch.testing.assert_close(cn[:, k], c0[:, k], rtol=0, atol=0)
            continue
        with torch.no_grad():
            yr, hr, cr = run_torch(m, mode, x[:n, k:k + 1], h0[:, k:k + 1].contiguous(),
                                   c0[:, k:k + 1].contiguous() if mode == "lstm" else None)
        torch.testing.assert_close(y[:n, k], yr[:, 0])
        torch.testing.assert_close(hn[:, k], hr[:, 0])
        if mode == "lstm":
            torch.testing.assert_close(cn[:, k], cr[:, 0])


def test_full_lengths_v3_equals_v1():
    m = torch_module("gru", 3, 4, 2, True)
    p = params_of(m).detach()
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    h0, c0 = states("gru", 2, 2, 2, 4, 4)
    a = F.cudnn_rnn(x, h0, c0, p, "gru", direction="bidirectional")
    bb = ours(x, h0, c0, p, "gru", True, lens=torch.tensor([4, 4], dtype=torch.int32))
    for u, v in zip(a[:3], bb[:3]):
        assert torch.equal(u, v)


def test_skip_input_tf_issue_8311():
    # gru, all parameters 0, h0 = 0, x = 1 -> h' = (1 - sigmoid(1)) * tanh(1) = 0.2048
    size = F.cudnn_rnn_params_size(1, 3, 3, rnn_mode="gru", input_mode="skip_input").item()
    p = torch.zeros(size, dtype=torch.float64)
    x = torch.ones(1, 1, 3, dtype=torch.float64)
    h0 = torch.zeros(1, 1, 3, dtype=torch.float64)
    for im in ("skip_input", "auto_select"):
        y = F.cudnn_rnn(x, h0, h0, p, "gru", im)[0]
        expected = (1 - torch.sigmoid(torch.tensor(1.0, dtype=torch.float64))) * torch.tanh(
            torch.tensor(1.0, dtype=torch.float64))
        torch.testing.assert_close(y, torch.full_like(y, expected.item()))
        assert abs(y[0, 0, 0].item() - 0.2048) < 1e-4


def skip_reference(x, h0, c0, ws, bs, mode, h):
    """Single-layer unidirectional reference with skip_input: x replaces W_g x + b_Wg."""
    g = G[mode]
    R = ws[g:2 * g]
    bR = bs[g:2 * g]
    hs, cs = h0[0], (c0[0] if mode == "lstm" else None)
    out = []
    for t in range(x.shape[0]):
        xt = x[t]
        rh = [hs @ R[k].t() + bR[k] for k in range(g)]
        if mode == "lstm":
            i_, f_, c_, o_ = (xt + rh[0]).sigmoid(), (xt + rh[1]).sigmoid(), (xt + rh[2]).tanh(), (xt + rh[3]).sigmoid()
            cs = f_ * cs + i_ * c_
            hs = o_ * cs.tanh()
        elif mode == "gru":
            r = (xt + rh[0]).sigmoid()
            z = (xt + rh[1]).sigmoid()
            n = (xt + r * rh[2]).tanh()
            hs = (1 - z) * n + z * hs
        else:
            pre = xt + rh[0]
            hs = pre.relu() if mode == "rnn_relu" else pre.tanh()
        out.append(hs)
    return torch.stack(out), hs, cs


@pytest.mark.parametrize("mode", MODES)
def test_skip_input_matches_reference(mode):
    t, b, h = 4, 3, 5
    size = F.cudnn_rnn_params_size(1, h, h, rnn_mode=mode, input_mode="skip_input").item()
    p = torch.randn(size, dtype=torch.float64) * 0.5
    nw = 2 * G[mode]
    ws, bs = F.cudnn_rnn_params_to_canonical(1, h, h, p, nw, mode, "skip_input")
    x = torch.randn(t, b, h, dtype=torch.float64)
    h0, c0 = states(mode, 1, 1, b, h, h)
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, mode, "skip_input")
    yr, hr, cr = skip_reference(x, h0, c0, ws, bs, mode, h)
    torch.testing.assert_close(y, yr)
    torch.testing.assert_close(hn[0], hr)
    if mode == "lstm":
        torch.testing.assert_close(cn[0], cr)
    # gradients of skip_input against the reference's autograd
    xs = x.clone().requires_grad_()
    ps = p.clone().requires_grad_()
    y, hn, cn, _ = ops.cudnn_rnn(xs, h0, c0, ps, mode, "skip_input")
    (y.sin().sum() + hn.sum()).backward()
    xr = x.clone().requires_grad_()
    pr = p.clone().requires_grad_()
    wsr, bsr = F.cudnn_rnn_params_to_canonical(1, h, h, pr, nw, mode, "skip_input")
    yr, hr, _ = skip_reference(xr, h0, c0, wsr, bsr, mode, h)
    (yr.sin().sum() + hr.sum()).backward()
    torch.testing.assert_close(xs.grad, xr.grad)
    torch.testing.assert_close(ps.grad, pr.grad)


def test_params_longer_than_params_size_is_an_error():
    # A longer buffer belongs to another configuration (its weights would be read with this layout): an
    # exact size is required (TF hands cuDNN the size cuDNN computes and never compares it).
    m = torch_module("lstm", 3, 4, 1, False)
    p = params_of(m).detach()
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    h0, c0 = states("lstm", 1, 1, 2, 4, 4)
    with pytest.raises(RuntimeError, match=f"params has {p.numel() + 7} elements, but must have exactly {p.numel()}"):
        ops.cudnn_rnn(x, h0, c0, torch.cat([p, torch.randn(7, dtype=torch.float64)]))
    y = ops.cudnn_rnn(x, h0, c0, p)[0]
    torch.testing.assert_close(y, m(x, (h0, c0))[0].detach())


# ------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("mode,layers,bi", [c for c in CASES if c[1] < 3] + [("lstm", 3, True)])
def test_gradients_match_torch(mode, layers, bi):
    t, b, i, h = 4, 3, 4, 5
    d = 2 if bi else 1
    m = torch_module(mode, i, h, layers, bi)
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, d, b, h, h)
    wy = torch.randn(t, b, d * h, dtype=torch.float64)
    wh = torch.randn(layers * d, b, h, dtype=torch.float64)
    # reference
    xr, h0r = x.clone().requires_grad_(), h0.clone().requires_grad_()
    c0r = c0.clone().requires_grad_() if mode == "lstm" else None
    y, hn, cn = run_torch(m, mode, xr, h0r, c0r)
    loss = (y * wy).sum() + (hn * wh).sum() + (cn.sum() * 0.7 if mode == "lstm" else 0)
    loss.backward()
    # ours
    p = params_of(m).detach().requires_grad_()
    xo, h0o = x.clone().requires_grad_(), h0.clone().requires_grad_()
    c0o = c0.clone().requires_grad_() if mode == "lstm" else c0
    y, hn, cn, _ = ops.cudnn_rnn(xo, h0o, c0o, p, mode, "linear_input", direction(bi))
    loss = (y * wy).sum() + (hn * wh).sum() + (cn.sum() * 0.7 if mode == "lstm" else 0)
    loss.backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(h0o.grad, h0r.grad)
    if mode == "lstm":
        torch.testing.assert_close(c0o.grad, c0r.grad)
    torch.testing.assert_close(p.grad, grads_of(m))


@pytest.mark.parametrize("bi", [False, True])
def test_projection_gradients_match_torch(bi):
    t, b, i, h, pr, layers = 4, 3, 4, 5, 2, 2
    d = 2 if bi else 1
    m = torch_module("lstm", i, h, layers, bi, proj=pr)
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states("lstm", layers, d, b, h, pr)
    xr, h0r, c0r = (v.clone().requires_grad_() for v in (x, h0, c0))
    y, (hn, cn) = m(xr, (h0r, c0r))
    (y.sin().sum() + hn.sum() * 0.3 + cn.sum() * 0.7).backward()
    p = params_of(m).detach().requires_grad_()
    xo, h0o, c0o = (v.clone().requires_grad_() for v in (x, h0, c0))
    y, hn, cn, _, _ = ops.cudnn_rnn_v3(xo, h0o, c0o, p, torch.full([b], t, dtype=torch.int32), "lstm",
                                       "linear_input", direction(bi), 0.0, 0, 0, pr)
    (y.sin().sum() + hn.sum() * 0.3 + cn.sum() * 0.7).backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    torch.testing.assert_close(h0o.grad, h0r.grad)
    torch.testing.assert_close(c0o.grad, c0r.grad)
    torch.testing.assert_close(p.grad, grads_of(m))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bi", [False, True])
def test_variable_length_gradients_match_each_sequence_alone(mode, bi):
    t, b, i, h, layers = 5, 4, 3, 4, 2
    d = 2 if bi else 1
    m = torch_module(mode, i, h, layers, bi)
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, d, b, h, h)
    lens = torch.tensor([5, 0, 3, 1], dtype=torch.int32)
    wy = torch.randn(t, b, d * h, dtype=torch.float64)
    wh = torch.randn(layers * d, b, h, dtype=torch.float64)
    p = params_of(m).detach().requires_grad_()
    xo, h0o = x.clone().requires_grad_(), h0.clone().requires_grad_()
    c0o = c0.clone().requires_grad_() if mode == "lstm" else c0
    y, hn, cn, _, _ = ours(xo, h0o, c0o, p, mode, bi, lens=lens)
    loss = (y * wy).sum() + (hn * wh).sum() + (cn.sum() if mode == "lstm" else 0)
    loss.backward()
    # reference: each sequence alone (padded output gradients have no effect)
    xr, h0r = x.clone().requires_grad_(), h0.clone().requires_grad_()
    c0r = c0.clone().requires_grad_() if mode == "lstm" else None
    total = 0
    for k in range(b):
        n = int(lens[k])
        if n == 0:
            total = total + (h0r[:, k] * wh[:, k]).sum() + (c0r[:, k].sum() if mode == "lstm" else 0)
            continue
        yr, hr, cr = run_torch(m, mode, xr[:n, k:k + 1], h0r[:, k:k + 1], c0r[:, k:k + 1] if mode == "lstm" else None)
        total = total + (yr[:, 0] * wy[:n, k]).sum() + (hr[:, 0] * wh[:, k]).sum() + (
            cr.sum() if mode == "lstm" else 0)
    total.backward()
    torch.testing.assert_close(xo.grad, xr.grad)
    assert torch.all(xo.grad[3:, 2] == 0) and torch.all(xo.grad[:, 1] == 0)
    torch.testing.assert_close(h0o.grad, h0r.grad)
    if mode == "lstm":
        torch.testing.assert_close(c0o.grad, c0r.grad)
    torch.testing.assert_close(p.grad, grads_of(m))


@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.slow) if m in ("lstm", "gru") else m for m in MODES])
@pytest.mark.parametrize("time_major", [True, False])
def test_gradcheck_v3(mode, time_major):
    t, b, i, h, layers = 3, 2, 2, 3, 2
    size = F.cudnn_rnn_params_size(layers, h, i, rnn_mode=mode, direction="bidirectional").item()
    g = torch.Generator().manual_seed(3)
    p = (torch.randn(size, generator=g, dtype=torch.float64) * 0.5).requires_grad_()
    x = torch.randn(t, b, i, generator=g, dtype=torch.float64)
    h0, c0 = states(mode, layers, 2, b, h, h)
    if not time_major:
        x, h0 = x.transpose(0, 1).contiguous(), h0.transpose(0, 1).contiguous()
        if mode == "lstm":
            c0 = c0.transpose(0, 1).contiguous()
    x.requires_grad_()
    h0.requires_grad_()
    if mode == "lstm":
        c0.requires_grad_()
    lens = torch.tensor([3, 1], dtype=torch.int32)

    def fn(x, h0, c0, p):
        y, hn, cn, _, _ = ops.cudnn_rnn_v3(x, h0, c0, p, lens, mode, "linear_input", "bidirectional", 0.0, 0, 0, 0,
                                           True, time_major)
        return (y, hn, cn) if mode == "lstm" else (y, hn)

    assert torch.autograd.gradcheck(fn, (x, h0, c0, p))


@pytest.mark.slow
def test_gradcheck_projection_v3():
    t, b, i, h, pr = 3, 2, 2, 3, 2
    size = F.cudnn_rnn_params_size(2, h, i, direction="bidirectional", num_proj=pr).item()
    p = (torch.randn(size, dtype=torch.float64) * 0.5).requires_grad_()
    x = torch.randn(t, b, i, dtype=torch.float64, requires_grad=True)
    h0, c0 = states("lstm", 2, 2, b, h, pr)
    h0.requires_grad_()
    c0.requires_grad_()
    lens = torch.tensor([2, 3], dtype=torch.int32)
    fn = lambda x, h0, c0, p: ops.cudnn_rnn_v3(x, h0, c0, p, lens, "lstm", "linear_input", "bidirectional",  # noqa
                                               0.0, 0, 0, pr)[:3]
    assert torch.autograd.gradcheck(fn, (x, h0, c0, p))


def test_inference_forward_then_backward_is_a_clear_error():
    m = torch_module("lstm", 3, 4, 1, False)
    p = params_of(m).detach().requires_grad_()
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    h0, c0 = states("lstm", 1, 1, 2, 4, 4)
    for name, fn in (("CudnnRNN", lambda: ops.cudnn_rnn(x, h0, c0, p, is_training=False)),
                     ("CudnnRNNV2", lambda: ops.cudnn_rnn_v2(x, h0, c0, p, is_training=False)),
                     ("CudnnRNNV3", lambda: F.cudnn_rnn_v3(x, h0, c0, p, is_training=False)),
                     ("CudnnRNN", lambda: CudnnRNNFunction.apply(x, h0, c0, p, "lstm", "linear_input",
                                                                 "unidirectional", 0.0, 0, 0, False)),
                     ("CudnnRNNV2", lambda: CudnnRNNV2Function.apply(x, h0, c0, p, "lstm", "linear_input",
                                                                     "unidirectional", 0.0, 0, 0, False))):
        y = fn()[0]
        with pytest.raises(RuntimeError, match=f"To use {name} in gradients, is_training must be set to True"):
            y.sum().backward()


def test_backprop_op_rejects_empty_or_foreign_reserve():
    m = torch_module("gru", 3, 4, 1, False)
    p = params_of(m).detach()
    x = torch.randn(3, 2, 3, dtype=torch.float64)
    h0, c0 = states("gru", 1, 1, 2, 4, 4)
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "gru", is_training=False)
    args = (x, h0, c0, p, y, hn, cn, torch.ones_like(y), torch.zeros_like(hn), cn)
    with pytest.raises(RuntimeError, match="reserve_space is empty: the forward ran with is_training=False"):
        F.cudnn_rnn_backprop(*args, res, "gru")
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "gru")
    with pytest.raises(RuntimeError, match="reserve_space does not match this configuration"):
        F.cudnn_rnn_backprop(*args, torch.randn(res.numel(), dtype=res.dtype), "gru")
    other = F.cudnn_rnn(x[:2], h0, c0, p, "gru")[3]
    with pytest.raises(RuntimeError, match="reserve_space does not match this configuration"):
        F.cudnn_rnn_backprop(*args, other, "gru")
    with pytest.raises(RuntimeError, match="Invalid output_backprop shape"):
        F.cudnn_rnn_backprop(x, h0, c0, p, y, hn, cn, y[:2], hn, cn, res, "gru")
    with pytest.raises(RuntimeError, match="Invalid output_h shape"):
        F.cudnn_rnn_backprop(x, h0, c0, p, y, hn[:, :1], cn, y, hn, cn, res, "gru")
    dx, dh, dc, dp = F.cudnn_rnn_backprop(*args, res, "gru")
    assert dx.shape == x.shape and dh.shape == h0.shape and dc.shape == () and dp.shape == p.shape


def test_python_autograd_functions_match_cpp():
    m = torch_module("lstm", 3, 4, 2, True)
    x = torch.randn(4, 2, 3, dtype=torch.float64)
    h0, c0 = states("lstm", 2, 2, 2, 4, 4)
    lens = torch.tensor([4, 2], dtype=torch.int32)
    results = []
    for which in ("cpp", "v1", "v2", "v3"):
        p = params_of(m).detach().requires_grad_()
        xs, hs, cs = (v.clone().requires_grad_() for v in (x, h0, c0))
        attrs = ("lstm", "linear_input", "bidirectional", 0.0, 0, 0)
        if which == "cpp":
            out = ops.cudnn_rnn_v3(xs, hs, cs, p, lens, *attrs)
        elif which == "v1":
            out = CudnnRNNFunction.apply(xs, hs, cs, p, *attrs)
        elif which == "v2":
            out = CudnnRNNV2Function.apply(xs, hs, cs, p, *attrs)
        else:
            out = CudnnRNNV3Function.apply(xs, hs, cs, p, lens, *attrs)
        (out[0].sin().sum() + out[1].sum() + out[2].cos().sum()).backward()
        results.append((which, out[0].detach(), xs.grad, hs.grad, cs.grad, p.grad))
    full = [r for r in results if r[0] in ("v1", "v2")]
    var = [r for r in results if r[0] in ("cpp", "v3")]
    for group in (full, var):
        for a, b in zip(group[0][1:], group[1][1:]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    # check the cpp path against the python path for full lengths too
    p = params_of(m).detach().requires_grad_()
    out = ops.cudnn_rnn(x, h0, c0, p, "lstm", "linear_input", "bidirectional")
    (out[0].sin().sum() + out[1].sum() + out[2].cos().sum()).backward()
    torch.testing.assert_close(p.grad, full[0][5], rtol=0, atol=0)


def test_double_backward_is_a_clear_error():
    m = torch_module("gru", 3, 4, 1, False)
    p = params_of(m).detach().requires_grad_()
    x = torch.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    h0, c0 = states("gru", 1, 1, 2, 4, 4)
    y = ops.cudnn_rnn(x, h0, c0, p, "gru")[0]
    (gx,) = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="not implemented"):
        gx.sum().backward()


# ------------------------------------------------------------------------------------------ dropout
def dropout_setup(layers=2, mode="rnn_relu", h=5, dtype=torch.float64):
    m = torch_module(mode, 4, h, layers, False, dtype=dtype)
    p = params_of(m).detach()
    x = torch.randn(6, 3, 4, dtype=dtype)
    h0, c0 = states(mode, layers, 1, 3, h, h, dtype=dtype)
    return m, p, x, h0, c0


def test_dropout_zero_is_identity_and_inference_ignores_dropout():
    m, p, x, h0, c0 = dropout_setup(mode="lstm")
    ref = F.cudnn_rnn(x, h0, c0, p, "lstm")[0]
    torch.testing.assert_close(F.cudnn_rnn(x, h0, c0, p, "lstm", dropout=0.0, seed=3, seed2=4)[0], ref, rtol=0, atol=0)
    for q in (0.3, 1.0):
        y = F.cudnn_rnn(x, h0, c0, p, "lstm", dropout=q, seed=1, seed2=2, is_training=False)[0]
        torch.testing.assert_close(y, ref, rtol=0, atol=0)


def test_dropout_all_ones_model_tf_style():
    # 2-layer relu rnn with all-ones weights (torch test_RNN_dropout): layer-1 output 10 per unit, so the
    # output is a multiple of 10 / (1 - p); p = 1 gives zeros into layer 2; hy[0] is never dropped.
    layers, h = 2, 1000
    size = F.cudnn_rnn_params_size(layers, h, 10, rnn_mode="rnn_relu").item()
    p = torch.ones(size, dtype=torch.float64)
    ws, bs = F.cudnn_rnn_params_to_canonical(layers, h, 10, p, 4, "rnn_relu")
    p = F.cudnn_rnn_canonical_to_params(layers, h, 10, ws, [torch.zeros_like(b) for b in bs], "rnn_relu")
    x = torch.ones(1, 1, 10, dtype=torch.float64)
    h0 = torch.zeros(layers, 1, h, dtype=torch.float64)
    for q in (0.0, 0.276, 0.731, 1.0):
        y, hy, _, _ = F.cudnn_rnn(x, h0, h0, p, "rnn_relu", dropout=q, seed=7, seed2=1)
        assert torch.all(hy[0] == 10)
        torch.testing.assert_close(hy[1], y[0])
        if q == 0:
            assert torch.all(y == 10000)
        elif q == 1:
            assert torch.all(y == 0) and torch.isfinite(y).all()
        else:
            units = y[0, 0, 0] / (10 / (1 - q))
            assert abs(units - round(units.item())) < 1e-6
            assert 0 < units < 1000  # some but not all units of layer 1 dropped
        y_eval = F.cudnn_rnn(x, h0, h0, p, "rnn_relu", dropout=q, seed=7, seed2=1, is_training=False)[0]
        assert torch.all(y_eval == 10000)


def test_dropout_seeded_masks_are_reproducible():
    m, p, x, h0, c0 = dropout_setup()
    a = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5, seed=3, seed2=9)
    b = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5, seed=3, seed2=9)
    c = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5, seed=3, seed2=10)
    assert torch.equal(a[0], b[0]) and torch.equal(a[3], b[3])
    assert not torch.equal(a[0], c[0])
    # seeds (0, 0): torch's default generator -> successive calls differ, torch.manual_seed reproduces
    torch.manual_seed(5)
    d1 = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5)[0]
    d2 = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5)[0]
    torch.manual_seed(5)
    d3 = F.cudnn_rnn(x, h0, c0, p, "rnn_relu", dropout=0.5)[0]
    assert not torch.equal(d1, d2) and torch.equal(d1, d3)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_gradcheck_reuses_masks(mode):
    layers, h = 3, 3
    size = F.cudnn_rnn_params_size(layers, h, 2, rnn_mode=mode, direction="bidirectional").item()
    p = (torch.randn(size, dtype=torch.float64) * 0.5).requires_grad_()
    x = torch.randn(3, 2, 2, dtype=torch.float64, requires_grad=True)
    h0, c0 = states(mode, layers, 2, 2, h, h)
    fn = lambda x, p: ops.cudnn_rnn(x, h0, c0, p, mode, "linear_input", "bidirectional", 0.5, 11, 12)[:2]  # noqa
    assert torch.autograd.gradcheck(fn, (x, p))


def test_dropout_masks_reused_in_backward():
    # The backprop op takes the masks from reserve_space (its own dropout/seed attrs do not matter).
    m, p, x, h0, c0 = dropout_setup(layers=3, mode="gru")
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "gru", dropout=0.5, seed=1, seed2=2)
    g = (x, h0, c0, p, y, hn, cn, torch.ones_like(y), torch.zeros_like(hn), cn, res)
    a = F.cudnn_rnn_backprop(*g, "gru", dropout=0.5, seed=1, seed2=2)
    b = F.cudnn_rnn_backprop(*g, "gru", dropout=0.9, seed=8, seed2=8)
    for u, v in zip(a, b):
        assert torch.equal(u, v)
    no_drop = F.cudnn_rnn_backprop(x, h0, c0, p, *F.cudnn_rnn(x, h0, c0, p, "gru")[:3], torch.ones_like(y),
                                   torch.zeros_like(hn), cn, F.cudnn_rnn(x, h0, c0, p, "gru")[3], "gru")
    assert not torch.equal(a[3], no_drop[3])


# ------------------------------------------------------------------------------------------ dtypes
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_low_precision_dtypes(dtype, mode):
    t, b, i, h, layers = 5, 3, 4, 6, 2
    m = torch_module(mode, i, h, layers, True)
    p64 = params_of(m).detach()
    x = torch.randn(t, b, i, dtype=torch.float64)
    h0, c0 = states(mode, layers, 2, b, h, h)
    lens = torch.tensor([5, 3, 1], dtype=torch.int32)
    y64, hn64, _, _, _ = ours(x, h0, c0, p64, mode, True, lens=lens)
    cast = [v.to(dtype).requires_grad_() for v in (x, h0, p64)]
    c0c = c0.to(dtype)
    y, hn, cn, res, _ = ours(cast[0], cast[1], c0c, cast[2], mode, True, lens=lens)
    assert y.dtype == dtype and hn.dtype == dtype and res.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(y.double(), y64, rtol=tol, atol=tol)
    torch.testing.assert_close(hn.double(), hn64, rtol=tol, atol=tol)
    y.float().sum().backward()
    xr, pr = x.clone().requires_grad_(), p64.clone().requires_grad_()
    ours(xr, h0, c0, pr, mode, True, lens=lens)[0].sum().backward()
    gtol = {torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(cast[0].grad.double(), xr.grad, rtol=gtol, atol=gtol)
    torch.testing.assert_close(cast[2].grad.double(), pr.grad, rtol=gtol, atol=gtol * 5)


@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("time_major", [True, False])
def test_float32_lstm_inference_matches_training_forward(bi, time_major):
    # CPU float32 lstm inference runs oneDNN's fused LSTM (when available); training runs torchops' own loop.
    m = torch_module("lstm", 5, 8, 2, bi, dtype=torch.float32)
    p = params_of(m).detach()
    x = torch.randn(6, 3, 5)
    h0, c0 = states("lstm", 2, 2 if bi else 1, 3, 8, 8, dtype=torch.float32)
    if not time_major:
        x, h0, c0 = x.transpose(0, 1), h0.transpose(0, 1), c0.transpose(0, 1)
    inf = ours(x, h0, c0, p, "lstm", bi, time_major=time_major, is_training=False)
    train = ours(x, h0, c0, p, "lstm", bi, time_major=time_major, is_training=True)
    assert inf[3].shape == (0,)
    for a, b in zip(inf[:3], train[:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        y_ref = m(x if time_major else x.transpose(0, 1), (h0 if time_major else h0.transpose(0, 1).contiguous(),
                                                           c0 if time_major else c0.transpose(0, 1).contiguous()))[0]
    torch.testing.assert_close(inf[0], y_ref if time_major else y_ref.transpose(0, 1), rtol=1e-5, atol=1e-5)


def _lstm_training_case(layers, bi, t=5, b=3, i=4, h=6, seed=2):
    torch.manual_seed(seed)
    d = 2 if bi else 1
    m = torch_module("lstm", i, h, layers, bi, dtype=torch.float32)
    x = torch.randn(t, b, i)
    h0, c0 = states("lstm", layers, d, b, h, h, dtype=torch.float32)
    weights = torch.randn(t, b, d * h), torch.randn(layers * d, b, h), torch.randn(layers * d, b, h)
    return m, x, h0, c0, weights


def _lstm_training_vs_torch(layers, bi, **sizes):
    """(torchops, torch.nn.LSTM) pairs of outputs and gradients of one float32 training step, same weights."""
    m, x, h0, c0, (wy, wh, wc) = _lstm_training_case(layers, bi, **sizes)
    xr, h0r, c0r = (v.clone().requires_grad_() for v in (x, h0, c0))
    y, (hn, cn) = m(xr, (h0r, c0r))
    ((y * wy).sum() + (hn * wh).sum() + (cn * wc).sum()).backward()
    p = params_of(m).detach().requires_grad_()
    xo, h0o, c0o = (v.clone().requires_grad_() for v in (x, h0, c0))
    yo, hno, cno, res = ops.cudnn_rnn(xo, h0o, c0o, p, "lstm", "linear_input", direction(bi))
    ((yo * wy).sum() + (hno * wh).sum() + (cno * wc).sum()).backward()
    pairs = [(yo, y), (hno, hn), (cno, cn), (xo.grad, xr.grad), (h0o.grad, h0r.grad), (c0o.grad, c0r.grad)]
    return pairs, (p.grad, grads_of(m))


@pytest.mark.parametrize("layers,bi", [(1, False), (2, False), (1, True), (3, True)])
def test_float32_lstm_training_matches_torch(layers, bi):
    # CPU float32 lstm training (oneDNN's forward and backward) against torch.nn.LSTM on the same weights.
    pairs, params_grads = _lstm_training_vs_torch(layers, bi)
    for a, e in pairs + [params_grads]:
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
@pytest.mark.parametrize("layers,bi", [(1, False), (2, False), (2, True)])
def test_float32_lstm_training_runs_onednn(layers, bi):
    # float32 lstm trains through the same oneDNN primitives as torch.nn.LSTM: the same bits, forward and
    # backward (the time loops round differently).
    pairs, params_grads = _lstm_training_vs_torch(layers, bi, t=7, b=5, i=9, h=16)
    for a, e in pairs:
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    torch.testing.assert_close(*params_grads, rtol=1e-6, atol=1e-6)  # (the two biases' sum order differs)


@pytest.mark.parametrize("layers,bi", [(2, False), (1, False), (2, True)])
def test_float32_lstm_backprop_from_a_copied_reserve(layers, bi):
    # A copy of reserve_space (which does not carry oneDNN's workspace) gives the same gradients, computed
    # again by the time loops; so does the original used twice, and one whose forward outputs were changed.
    m, x, h0, c0, _ = _lstm_training_case(layers, bi)
    p = params_of(m).detach()
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "lstm", direction=direction(bi))
    dy, dh, dc = torch.randn_like(y), torch.randn_like(hn), torch.randn_like(cn)
    args = (x, h0, c0, p, y, hn, cn, dy, dh, dc)
    want = F.cudnn_rnn_backprop(*args, res, "lstm", direction=direction(bi))
    twice = F.cudnn_rnn_backprop(*args, res, "lstm", direction=direction(bi))
    for a, e in zip(twice, want):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    copy = res.clone()
    del res
    got = F.cudnn_rnn_backprop(*args, copy, "lstm", direction=direction(bi))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    y2, hn2, cn2, res2 = F.cudnn_rnn(x, h0, c0, p, "lstm", direction=direction(bi))
    y2.mul_(2), hn2.zero_(), cn2.zero_()  # outputs changed in place do not change the gradients
    again = F.cudnn_rnn_backprop(*args, res2, "lstm", direction=direction(bi))
    for a, e in zip(again, want):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="reserve_space does not match this configuration"):
        F.cudnn_rnn_backprop(*args, torch.randn(copy.numel()), "lstm", direction=direction(bi))
    bad = copy.clone()
    bad.view(torch.int64)[10] = 1  # a library reserve that claims dropout masks
    with pytest.raises(RuntimeError, match="reserve_space does not match this configuration"):
        F.cudnn_rnn_backprop(*args, bad, "lstm", direction=direction(bi))


def test_float32_lstm_training_batch_major_and_dropout():
    # Batch-major V3 input and dropout between layers (which keeps the time loops) train as time-major float64.
    m, x, h0, c0, _ = _lstm_training_case(2, False)
    p = params_of(m).detach()
    xb = x.transpose(0, 1).contiguous().requires_grad_()
    pb = p.clone().requires_grad_()
    h0b, c0b = h0.transpose(0, 1).contiguous(), c0.transpose(0, 1).contiguous()  # batch-major states
    yb, hb, cb, _, _ = F.cudnn_rnn_v3(xb, h0b, c0b, pb, None, "lstm", time_major=False)
    (yb.square().sum() + hb.sum() + cb.sum()).backward()
    x64, p64 = x.double().requires_grad_(), p.double().requires_grad_()
    y64, h64, c64, _ = F.cudnn_rnn(x64, h0.double(), c0.double(), p64, "lstm")
    (y64.square().sum() + h64.sum() + c64.sum()).backward()
    torch.testing.assert_close(yb.transpose(0, 1), y64.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad.transpose(0, 1), x64.grad.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pb.grad, p64.grad.float(), rtol=1e-4, atol=1e-5)
    pd = p.clone().requires_grad_()
    yd, hd, cd, _ = F.cudnn_rnn(x, h0, c0, pd, "lstm", dropout=0.5, seed=3, seed2=4)
    (yd.sum() + hd.sum() + cd.sum()).backward()
    assert torch.isfinite(pd.grad).all() and pd.grad.abs().sum() > 0
    yd2, _, _, _ = F.cudnn_rnn(x, h0, c0, p, "lstm", dropout=0.5, seed=3, seed2=4)
    torch.testing.assert_close(yd2, yd.detach(), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ validation
def valid(mode="lstm", t=3, b=2, i=4, h=5, layers=1, bi=False):
    d = 2 if bi else 1
    size = F.cudnn_rnn_params_size(layers, h, i, rnn_mode=mode, direction=direction(bi)).item()
    x = torch.randn(t, b, i)
    h0 = torch.zeros(layers * d, b, h)
    c0 = torch.zeros(layers * d, b, h) if mode == "lstm" else torch.zeros([])
    return x, h0, c0, torch.randn(size)


def test_validation_errors():
    x, h0, c0, p = valid()
    cases = [
        (lambda: ops.cudnn_rnn(x[0], h0, c0, p), "RNN input must be a 3-D vector."),
        (lambda: ops.cudnn_rnn(x, h0[0], c0, p), "RNN input_h must be a 3-D vector."),
        (lambda: ops.cudnn_rnn(x, h0[:, :1], c0, p), "Invalid input_h shape"),
        (lambda: ops.cudnn_rnn(x, torch.zeros(1, 2, 5), c0, p, direction="bidirectional"), "Invalid input_h shape"),
        (lambda: ops.cudnn_rnn(x, torch.zeros(0, 2, 5), c0, p), "num_layers"),
        (lambda: ops.cudnn_rnn(x, h0, c0[0], p), "RNN input_c must be a 3-D vector"),
        (lambda: ops.cudnn_rnn(x, h0, torch.zeros(1, 2, 6), p), "input_h and input_c must have the same shape"),
        (lambda: ops.cudnn_rnn_v3(x, h0, c0, p, torch.full([2], 3, dtype=torch.int32), num_proj=2),
         "Invalid input_h and input_c w/ projection size"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p, input_mode="skip_input"), "requires input_size == num_units"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p[:-1]), "params has"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p[None]), "params must be a 1-D tensor"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p.double()), "params must have the same dtype as input"),
        (lambda: ops.cudnn_rnn(x, h0.double(), c0, p), "input_h must have the same dtype as input"),
        (lambda: ops.cudnn_rnn(x.int(), h0, c0, p), "input must be float32"),
        (lambda: ops.cudnn_rnn(x[:0], h0, c0, p), "max_seq_length must be > 0"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p, rnn_mode="lstmx"), "rnn_mode must be one of"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p, input_mode="x"), "input_mode must be one of"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p, direction="x"), "direction must be"),
        (lambda: ops.cudnn_rnn(x, h0, c0, p, dropout=1.5), r"dropout must be in \[0, 1\]"),
        (lambda: ops.cudnn_rnn_v3(x, h0, c0, p, torch.full([3], 3, dtype=torch.int32)),
         r"sequence_lengths must have batch_size \(2\) entries, got 3"),
        (lambda: ops.cudnn_rnn_v3(x, h0, c0, p, torch.tensor([3, -1], dtype=torch.int32)),
         r"sequence_lengths\[1\] = -1 must be in \[0, max_seq_length = 3\]"),
        (lambda: ops.cudnn_rnn_v3(x, h0, c0, p, torch.tensor([4, 1], dtype=torch.int32)),
         r"sequence_lengths\[0\] = 4 must be in"),
        (lambda: ops.cudnn_rnn_v3(x, h0, c0, p, torch.tensor([3, 1])), "sequence_lengths must be a 1-D int32"),
        (lambda: ops.cudnn_rnn(x, torch.zeros(1, 2, 5), torch.zeros(()), p[:100], rnn_mode="gru"), "params has"),
    ]
    for fn, msg in cases:
        with pytest.raises(RuntimeError, match=msg):
            fn()


def test_non_lstm_input_c_is_ignored():
    x, h0, _, p = valid("gru")
    for c0 in (torch.zeros([]), torch.randn(7, 3)):
        y, hn, cn, res = ops.cudnn_rnn(x, h0, c0, p, "gru")
        assert cn.shape == () and cn.item() == 0
    # its values and shape are ignored, but not its dtype (nor its device)
    with pytest.raises(RuntimeError, match="input_c must have the same dtype as input"):
        ops.cudnn_rnn(x, h0, torch.zeros(1, dtype=torch.int64), p, "gru")


def test_non_contiguous_inputs():
    m = torch_module("lstm", 4, 5, 2, True)
    p = params_of(m).detach()
    x = torch.randn(4, 3, 8, dtype=torch.float64)[:, :, ::2]
    h0, c0 = states("lstm", 2, 2, 3, 5, 5)
    h0n = h0.transpose(1, 2).contiguous().transpose(1, 2)
    p2 = torch.stack([p, p], 1)[:, 0]
    a = ops.cudnn_rnn(x, h0n, c0, p2, "lstm", direction="bidirectional")
    b = ops.cudnn_rnn(x.contiguous(), h0, c0, p, "lstm", direction="bidirectional")
    for u, v in zip(a[:3], b[:3]):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def test_empty_batch():
    x, h0, c0, p = valid(b=0)
    y, hn, cn, res = ops.cudnn_rnn(x, h0, c0, p)
    assert y.shape == (3, 0, 5) and hn.shape == (1, 0, 5)
    xr = x.clone().requires_grad_()
    pr = p.clone().requires_grad_()
    ops.cudnn_rnn(xr, h0, c0, pr)[0].sum().backward()
    assert torch.all(pr.grad == 0)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_zero_input_size(mode):
    # input_size 0: W regions are [H, 0]; equals input_size 1 with x = 0
    h, layers = 4, 2
    x0 = torch.zeros(3, 2, 0, dtype=torch.float64)
    h0, c0 = states(mode, layers, 2, 2, h, h)
    p1 = torch.randn(F.cudnn_rnn_params_size(layers, h, 1, rnn_mode=mode, direction="bidirectional").item(),
                     dtype=torch.float64)
    n = 2 * G[mode] * 2 * layers
    ws, bs = F.cudnn_rnn_params_to_canonical(layers, h, 1, p1, n, mode, direction="bidirectional")
    g = G[mode]
    ws0 = [w[:, :0] if k % (2 * g) < g and k < 4 * g else w for k, w in enumerate(ws)]
    p0 = torch.cat([w.reshape(-1) for w in ws0] + bs).requires_grad_()
    for is_training in (True, False):
        y0 = ops.cudnn_rnn(x0, h0, c0, p0, mode, "linear_input", "bidirectional", 0.0, 0, 0, is_training)
        y1 = ops.cudnn_rnn(torch.zeros(3, 2, 1, dtype=torch.float64), h0, c0, p1, mode, "linear_input",
                           "bidirectional", 0.0, 0, 0, is_training)
        for a, b in zip(y0[:3], y1[:3]):
            torch.testing.assert_close(a, b)
    out = ops.cudnn_rnn(x0, h0, c0, p0, mode, "linear_input", "bidirectional")
    out[0].sum().backward()
    assert p0.grad.shape == p0.shape and torch.isfinite(p0.grad).all()


# ------------------------------------------------------------------------------------------ opcheck / compile
def _opcheck_cases():
    m = torch_module("lstm", 3, 4, 2, True, dtype=torch.float32)
    p = params_of(m).detach().requires_grad_()
    x = torch.randn(4, 2, 3, requires_grad=True)
    h0, c0 = states("lstm", 2, 2, 2, 4, 4, dtype=torch.float32)
    lens = torch.tensor([4, 2], dtype=torch.int32)
    attrs = ("lstm", "linear_input", "bidirectional", 0.0, 0, 0)
    return m, p, x, h0, c0, lens, attrs


def test_opcheck_forward_ops():
    _, p, x, h0, c0, lens, attrs = _opcheck_cases()
    torch.library.opcheck(ops.cudnn_rnn.default, (x, h0, c0, p, *attrs, True))
    torch.library.opcheck(ops.cudnn_rnn_v2.default, (x, h0, c0, p, *attrs, True))
    torch.library.opcheck(ops.cudnn_rnn_v3.default, (x, h0, c0, p, lens, *attrs, 0, True, True))
    torch.library.opcheck(ops.cudnn_rnn_v3.default, (x.detach().transpose(0, 1).contiguous(), h0.transpose(0, 1),
                                                     c0.transpose(0, 1), p, lens, *attrs, 0, True, False))
    # non-contiguous input and states, gru (input_c ignored)
    xg = torch.randn(2, 3, 4).permute(2, 0, 1)
    hg = torch.randn(1, 4, 2).transpose(1, 2)
    pg = torch.randn(F.cudnn_rnn_params_size(1, 4, 3, rnn_mode="gru").item(), requires_grad=True)
    torch.library.opcheck(ops.cudnn_rnn.default, (xg, hg, torch.zeros(()), pg, "gru", "linear_input",
                                                  "unidirectional", 0.0, 0, 0, True))


def test_opcheck_backprop_and_converter_ops():
    _, p, x, h0, c0, lens, attrs = _opcheck_cases()
    x, p = x.detach(), p.detach()
    y, hn, cn, res, host = ops.cudnn_rnn_v3(x, h0, c0, p, lens, *attrs)
    grads = (torch.randn_like(y), torch.randn_like(hn), torch.randn_like(cn))
    torch.library.opcheck(ops.cudnn_rnn_backprop_v3.default,
                          (x, h0, c0, p, lens, y, hn, cn, *grads, res, host, *attrs, 0, True))
    y, hn, cn, res = ops.cudnn_rnn(x, h0, c0, p, *attrs)
    torch.library.opcheck(ops.cudnn_rnn_backprop.default, (x, h0, c0, p, y, hn, cn, *grads, res, *attrs))
    y, hn, cn, res, host = ops.cudnn_rnn_v2(x, h0, c0, p, *attrs)
    torch.library.opcheck(ops.cudnn_rnn_backprop_v2.default, (x, h0, c0, p, y, hn, cn, *grads, res, host, *attrs))
    torch.library.opcheck(ops.cudnn_rnn_params_size.default, (2, 4, 3, torch.float32, torch.int64, *attrs, 0))
    pg = p.clone().requires_grad_()
    torch.library.opcheck(ops.cudnn_rnn_params_to_canonical.default, (2, 4, 3, pg, 32, *attrs))
    torch.library.opcheck(ops.cudnn_rnn_params_to_canonical_v2.default, (2, 4, 3, pg, 32, 32, *attrs, 0))
    ws, bs = F.cudnn_rnn_params_to_canonical(2, 4, 3, p, 32, *attrs)
    ws = [w.requires_grad_() for w in ws]
    torch.library.opcheck(ops.cudnn_rnn_canonical_to_params.default, (2, 4, 3, ws, bs, *attrs))
    torch.library.opcheck(ops.cudnn_rnn_canonical_to_params_v2.default, (2, 4, 3, ws, bs, *attrs, 0))


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_torch_compile_fullgraph(mode):
    torch._dynamo.reset()
    m = torch_module(mode, 3, 4, 2, True, dtype=torch.float32)
    x = torch.randn(4, 2, 3)
    h0, c0 = states(mode, 2, 2, 2, 4, 4, dtype=torch.float32)
    lens = torch.tensor([4, 3], dtype=torch.int32)

    def fn(x, h0, c0, p, lens):
        y, hn, cn, _, _ = ops.cudnn_rnn_v3(x, h0, c0, p, lens, mode, "linear_input", "bidirectional", 0.0, 0, 0, 0,
                                           True, True)
        return y.sum() + hn.sum() * 2

    results = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        p = params_of(m).detach().requires_grad_()
        xs = x.clone().requires_grad_()
        out = f(xs, h0, c0, p, lens)
        out.backward()
        results.append((out.detach(), xs.grad, p.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_torchscript_functional():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(params_of(torch_module("gru", 3, 4, 1, True, dtype=torch.float32)).detach())

        def forward(self, x, h0, lens: torch.Tensor):
            y, hn, cn, _, _ = F.cudnn_rnn_v3(x, h0, h0, self.p, lens, "gru", "linear_input", "bidirectional")
            n = F.cudnn_rnn_params_size(1, 4, 3, None, None, "gru", "linear_input", "bidirectional")
            return y.sum() + hn.sum() + n.float().sum() * 0

    net = Net()
    scripted = torch.jit.script(net)
    x = torch.randn(4, 2, 3)
    h0 = torch.randn(2, 2, 4)
    lens = torch.tensor([4, 1], dtype=torch.int32)
    a = net(x, h0, lens)
    a.backward()
    g = net.p.grad.clone()
    net.p.grad = None
    b = scripted(x, h0, lens)
    b.backward()
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(g, scripted.p.grad)


# ------------------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bi", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cuda_matches_cpu(mode, bi, dtype):
    t, b, i, h, layers = 5, 4, 3, 6, 2
    m = torch_module(mode, i, h, layers, bi)
    p = params_of(m).detach().to(dtype)
    x = torch.randn(t, b, i, dtype=dtype)
    h0, c0 = states(mode, layers, 2 if bi else 1, b, h, h, dtype=dtype)
    lens = torch.tensor([5, 2, 0, 4], dtype=torch.int32)
    tol = {torch.float32: 1e-4, torch.float64: 1e-10, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for time_major in (True, False):
        xx = x if time_major else x.transpose(0, 1).contiguous()
        hh = h0 if time_major else h0.transpose(0, 1).contiguous()
        cc = c0 if time_major or mode != "lstm" else c0.transpose(0, 1).contiguous()
        outs = []
        for dev in ("cpu", "cuda"):
            # detach first: on the CPU pass .to() returns the shared input itself, which must stay a leaf
            xs = xx.detach().to(dev).requires_grad_()
            ps = p.detach().to(dev).requires_grad_()
            hs = hh.detach().to(dev).requires_grad_()
            y, hn, cn, _, _ = ops.cudnn_rnn_v3(xs, hs, cc.to(dev), ps, lens.to(dev), mode, "linear_input",
                                               direction(bi), 0.0, 0, 0, 0, True, time_major)
            (y.double().sin().sum() + hn.double().sum()).backward()  # the loss in float64 on both devices
            outs.append([v.detach().cpu().double() for v in (y, hn, xs.grad, hs.grad, ps.grad)])
        for u, v in zip(*outs):
            torch.testing.assert_close(u, v, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
def test_cuda_projection_skip_and_dropout():
    m = torch_module("lstm", 4, 6, 2, True, proj=3)
    p = params_of(m).detach()
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    h0, c0 = states("lstm", 2, 2, 3, 6, 3)
    lens = torch.tensor([5, 1, 3], dtype=torch.int32)
    cpu = ours(x, h0, c0, p, "lstm", True, proj=3, lens=lens, dropout=0.4, seed=2, seed2=3)
    gpu = ours(x.cuda(), h0.cuda(), c0.cuda(), p.cuda(), "lstm", True, proj=3, lens=lens.cuda(), dropout=0.4, seed=2,
               seed2=3)
    for u, v in zip(cpu[:3], gpu[:3]):
        torch.testing.assert_close(u, v.cpu())


def _train_step(mode, bi, dev, x, h0, c0, p, time_major=True, proj=0, lens=None):
    """Forward (training) + backward of a fixed loss; returns outputs and input/state/params gradients."""
    xs, hs, ps = (v.detach().to(dev).requires_grad_() for v in (x, h0, p))
    cs = c0.detach().to(dev).requires_grad_() if mode == "lstm" else c0.to(dev)
    lens = None if lens is None else lens.to(dev)
    y, hn, cn, res, _ = F.cudnn_rnn_v3(xs, hs, cs, ps, lens, mode, direction=direction(bi), num_proj=proj,
                                       time_major=time_major)
    loss = y.double().sin().sum() + hn.double().square().sum()
    if mode == "lstm":
        loss = loss + cn.double().sum()
    loss.backward()
    grads = [xs.grad, hs.grad, ps.grad] + ([cs.grad] if mode == "lstm" else [])
    return [v.detach().cpu().double() for v in [y, hn] + grads]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bi", [(1, False), (2, True)])
@pytest.mark.parametrize("varlen", [False, True])
def test_cuda_cudnn_route_matches_loops_and_cpu(mode, layers, bi, varlen):
    # float32 without skip input runs cuDNN on the GPU where its route is on (variable lengths packed: unsorted,
    # one empty); with it off the time loops run. Both equal the CPU, batch- and time-major.
    t, b, i, h = 6, 5, 7, 8
    m = torch_module(mode, i, h, layers, bi, dtype=torch.float32)
    p = params_of(m).detach()
    x = torch.randn(t, b, i)
    h0, c0 = states(mode, layers, 2 if bi else 1, b, h, h, dtype=torch.float32)
    lens = torch.tensor([3, 6, 0, 6, 1], dtype=torch.int32) if varlen else None
    cpu = _train_step(mode, bi, "cpu", x, h0, c0, p, lens=lens)
    with forced_route("cudnn_rnn.cuda.cudnn"):
        route = _train_step(mode, bi, "cuda", x, h0, c0, p, lens=lens)
        bm = _train_step(mode, bi, "cuda", x.transpose(0, 1), h0.transpose(0, 1), c0.transpose(0, 1)
                         if mode == "lstm" else c0, p, time_major=False, lens=lens)
    with forced_route("cudnn_rnn.cuda.loops"):
        loops = _train_step(mode, bi, "cuda", x, h0, c0, p, lens=lens)
    bm[0], bm[1], bm[2], bm[3] = bm[0].transpose(0, 1), bm[1].transpose(0, 1), bm[2].transpose(0, 1), bm[3].transpose(0, 1)
    if mode == "lstm":
        bm[5] = bm[5].transpose(0, 1)
    for got in (route, loops, bm):
        for u, v in zip(got, cpu):
            torch.testing.assert_close(u, v, rtol=2e-4, atol=2e-4)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_cuda_cudnn_route_matches_torch_modules(mode):
    # The same cuDNN kernels as torch.nn.LSTM / GRU on the GPU.
    m, x, h0, c0, _ = _lstm_training_case(2, True) if mode == "lstm" else (None,) * 5
    if mode == "gru":
        m = torch_module("gru", 4, 6, 2, True, dtype=torch.float32)
        x = torch.randn(5, 3, 4)
        h0, c0 = states("gru", 2, 2, 3, 6, 6, dtype=torch.float32)
    m = m.cuda()
    xr, h0r = x.cuda().requires_grad_(), h0.cuda().requires_grad_()
    y, hn, cn = run_torch(m, mode, xr, h0r, c0.cuda() if mode == "lstm" else None)
    (y.sin().sum() + hn.sum() + (cn.sum() if cn is not None else 0)).backward()
    p = params_of(m).detach().requires_grad_()
    xo, h0o = x.cuda().requires_grad_(), h0.cuda().requires_grad_()
    with forced_route("cudnn_rnn.cuda.cudnn"):
        yo, hno, cno, _ = ops.cudnn_rnn(xo, h0o, c0.cuda(), p, mode, "linear_input", "bidirectional")
        (yo.sin().sum() + hno.sum() + (cno.sum() if mode == "lstm" else 0)).backward()
    for a, e in [(yo, y), (hno, hn), (xo.grad, xr.grad), (h0o.grad, h0r.grad), (p.grad, grads_of(m))]:
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
def test_cuda_cudnn_backprop_from_a_copied_reserve(set_routes):
    # cuDNN's state lives with the returned reserve_space: a copy gives the same gradients (the time loops
    # recompute the forward), and the original can be used twice.
    set_routes({"cudnn_rnn.cuda.cudnn": True})
    m, x, h0, c0, _ = _lstm_training_case(2, False)
    p = params_of(m).detach().cuda()
    x, h0, c0 = x.cuda(), h0.cuda(), c0.cuda()
    y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "lstm")
    dy, dh, dc = torch.randn_like(y), torch.randn_like(hn), torch.randn_like(cn)
    args = (x, h0, c0, p, y, hn, cn, dy, dh, dc)
    want = F.cudnn_rnn_backprop(*args, res, "lstm")
    twice = F.cudnn_rnn_backprop(*args, res, "lstm")
    for a, e in zip(twice, want):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    got = F.cudnn_rnn_backprop(*args, res.clone(), "lstm")
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    y.mul_(2)  # outputs changed in place do not change the gradients
    again = F.cudnn_rnn_backprop(*args, res, "lstm")
    for a, e in zip(again, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU and a CUDA build")
@pytest.mark.parametrize("bi", [False, True])
def test_cuda_cudnn_projection_and_disabled_cudnn(bi):
    # lstm with a projection runs cuDNN too; torch.backends.cudnn.flags(enabled=False) takes the time loops.
    # Both equal the CPU.
    m = torch_module("lstm", 4, 6, 2, bi, proj=3, dtype=torch.float32)
    p = params_of(m).detach()
    x = torch.randn(5, 3, 4)
    h0, c0 = states("lstm", 2, 2 if bi else 1, 3, 6, 3, dtype=torch.float32)
    cpu = _train_step("lstm", bi, "cpu", x, h0, c0, p, proj=3)
    with forced_route("cudnn_rnn.cuda.cudnn"):
        route = _train_step("lstm", bi, "cuda", x, h0, c0, p, proj=3)
        with torch.backends.cudnn.flags(enabled=False):
            before = torchops.backends.hits("cudnn_rnn.cuda.loops")
            loops = _train_step("lstm", bi, "cuda", x, h0, c0, p, proj=3)
            assert torchops.backends.hits("cudnn_rnn.cuda.loops") > before
    for got in (route, loops):
        for u, v in zip(got, cpu):
            torch.testing.assert_close(u, v, rtol=2e-4, atol=2e-4)
