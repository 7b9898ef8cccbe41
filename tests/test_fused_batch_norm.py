"""FusedBatchNormV3 / FusedBatchNormGradV3 against TF's semantics: TF's own
test values, a float64 reference written here, gradients, errors, layouts, dtypes, opcheck, compile."""
import pickle

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck
from torch.profiler import ProfilerActivity, profile

import torchops
from conftest import DEVICES

fbn = torch.ops.torchops.fused_batch_norm_v3
fbn_grad = torch.ops.torchops.fused_batch_norm_grad_v3

FORMATS_4D = ["NHWC", "NCHW"]
FORMATS_5D = ["NDHWC", "NCDHW"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def cdim(fmt, rank):
    return rank - 1 if fmt in ("NHWC", "NDHWC") else 1


def udtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def bshape(fmt, rank):
    s = [1] * rank
    s[cdim(fmt, rank)] = -1
    return s


def to_format(x_last, fmt):
    """Channels-last array -> the layout `fmt` names (channels-first via a transpose)."""
    if fmt in ("NHWC", "NDHWC"):
        return x_last
    perm = [0, x_last.dim() - 1] + list(range(1, x_last.dim() - 1))
    return x_last.permute(perm).contiguous()


def from_format(x, fmt):
    if fmt in ("NHWC", "NDHWC"):
        return x
    perm = [0] + list(range(2, x.dim())) + [1]
    return x.permute(perm).contiguous()


def ref_forward(x, scale, offset, mean, var, eps, eaf, fmt, training):
    """The forward (training and inference formulas) in float64."""
    cd = cdim(fmt, x.dim())
    dims = [d for d in range(x.dim()) if d != cd]
    s = bshape(fmt, x.dim())
    xd = x.double()
    n = x.numel() // max(x.shape[cd], 1)
    if training:
        m = xd.mean(dims)
        v = ((xd - m.view(s)) ** 2).mean(dims)
    else:
        m, v = mean.double(), var.double()
    y = (xd - m.view(s)) * (torch.rsqrt(v + eps) * scale.double()).view(s) + offset.double().view(s)
    if not training:
        return y, mean.double(), var.double()
    adj = n / max(n - 1, 1)
    if eaf == 1.0:
        return y, m, v * adj
    return y, (1 - eaf) * mean.double() + eaf * m, (1 - eaf) * var.double() + eaf * adj * v


def ref_backward(dy, x, scale, mu, var, eps, fmt, training):
    """The gradient (training and freeze formulas) in float64."""
    cd = cdim(fmt, x.dim())
    dims = [d for d in range(x.dim()) if d != cd]
    s = bshape(fmt, x.dim())
    dy, x, scale, mu, var = (t.double() for t in (dy, x, scale, mu, var))
    r = torch.rsqrt(var + eps)
    xc = x - mu.view(s)
    doffset = dy.sum(dims)
    dscale = (dy * xc).sum(dims) * r
    if training:
        dx = (scale * r).view(s) * (dy - dy.mean(dims, keepdim=True)
                                    - xc * (dy * xc).mean(dims, keepdim=True) / (var + eps).view(s))
    else:
        dx = dy * (scale * r).view(s)
    return dx, dscale, doffset


def make_inputs(shape, fmt, dtype=torch.float32, device="cpu", seed=0, stats=True):
    g = torch.Generator().manual_seed(seed)
    c = shape[cdim(fmt, len(shape))]
    u = udtype(dtype)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 1).to(dtype).to(device)
    scale = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(u).to(device)
    offset = torch.randn(c, generator=g, dtype=torch.float64).to(u).to(device)
    mean = torch.randn(c, generator=g, dtype=torch.float64).to(u).to(device) if stats else torch.empty(0, dtype=u, device=device)
    var = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(u).to(device) if stats else torch.empty(0, dtype=u, device=device)
    return x, scale, offset, mean, var


# ---------------------------------------------------------------- TF C++ literal tests

X_LIT = [5.0, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15]
Y_LIT = [-3.86, -3.86, -1.51, -1.51, 0.83, 0.83, 3.17, 3.17, 5.51, 5.51, 7.86, 7.86]


@pytest.mark.parametrize("device", DEVICES)
def test_tf_literal_training(device):
    x = torch.tensor(X_LIT, device=device).view(1, 1, 6, 2)
    v = lambda vals: torch.tensor(vals, device=device)  # noqa: E731
    y, bm, bv, rs1, rs2, rs3 = fbn(x, v([4.0, 4]), v([2.0, 2]), v([]), v([]), 0.001, 1.0, "NHWC", True)
    torch.testing.assert_close(y.flatten().cpu(), torch.tensor(Y_LIT), atol=0.01, rtol=0)
    torch.testing.assert_close(bm.cpu(), torch.tensor([10.0, 10]), atol=0.01, rtol=0)
    torch.testing.assert_close(bv.cpu(), torch.tensor([14.0, 14]), atol=0.01, rtol=0)
    torch.testing.assert_close(rs2.cpu(), torch.full((2,), 35 / 3), atol=1e-4, rtol=0)  # biased


@pytest.mark.parametrize("device", DEVICES)
def test_tf_literal_training_running_mean(device):
    x = torch.tensor(X_LIT, device=device).view(1, 1, 6, 2)
    v = lambda vals: torch.tensor(vals, device=device)  # noqa: E731
    y, bm, bv, *_ = fbn(x, v([4.0, 4]), v([2.0, 2]), v([6.0, 6]), v([16.0, 16]), 0.001, 0.5, "NHWC", True)
    torch.testing.assert_close(y.flatten().cpu(), torch.tensor(Y_LIT), atol=0.01, rtol=0)
    torch.testing.assert_close(bm.cpu(), torch.tensor([8.0, 8]), atol=0.01, rtol=0)
    torch.testing.assert_close(bv.cpu(), torch.tensor([15.0, 15]), atol=0.01, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("eaf", [1.0, 0.5])  # InferenceIgnoreAvgFactor
def test_tf_literal_inference(device, eaf):
    x = torch.tensor(X_LIT, device=device).view(1, 1, 6, 2)
    v = lambda vals: torch.tensor(vals, device=device)  # noqa: E731
    y, *_ = fbn(x, v([4.0, 4]), v([2.0, 2]), v([10.0, 10]), v([11.67, 11.67]), 0.001, eaf, "NHWC", False)
    torch.testing.assert_close(y.flatten().cpu(), torch.tensor(Y_LIT), atol=0.01, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_tf_literal_empty_input(device):
    x = torch.empty(1, 1, 0, 0, device=device)
    e = torch.empty(0, device=device)
    y, bm, bv, rs1, rs2, rs3 = fbn(x, e, e, e, e, 0.001, 1.0, "NHWC", True)
    assert y.shape == (1, 1, 0, 0)
    assert bm.shape == bv.shape == rs1.shape == rs2.shape == rs3.shape == (0,)


@pytest.mark.parametrize("device", DEVICES)
def test_tf_literal_grad_simple(device):
    v = lambda vals: torch.tensor(vals, device=device)  # noqa: E731
    dy = v([2.0, 2, 9, 9, -4, -4, 5, 5, 8, 8, 7, 7]).view(1, 1, 6, 2)
    x = v([1.0, 1, 7, 7, 4, 4, -3, -3, -11, -11, 13, 13]).view(1, 1, 6, 2)
    dx, ds, do, rs4, rs5 = fbn_grad(dy, x, v([4.0, 4]), v([1.833, 1.833]), v([57.472, 57.472]), v([]),
                                    0.001, "NHWC", True)
    want = [-1.34, -1.34, 2.47, 2.47, -4.44, -4.44, 0.17, 0.17, 1.60, 1.60, 1.53, 1.53]
    torch.testing.assert_close(dx.flatten().cpu(), torch.tensor(want), atol=0.01, rtol=0)
    torch.testing.assert_close(ds.cpu(), torch.tensor([-1.6488, -1.6488]), atol=0.01, rtol=0)
    torch.testing.assert_close(do.cpu(), torch.tensor([27.0, 27]), atol=0.01, rtol=0)
    assert rs4.shape == rs5.shape == (0,)


# ---------------------------------------------------------------- TF Python tests

TF_SHAPES = [[1, 1, 6, 1], [1, 1, 6, 2], [1, 2, 1, 6], [27, 131, 127, 6], [0, 131, 127, 6], [1, 1, 1, 1],
             [1, 2, 6, 1, 3]]
Y_ATOL = {torch.float32: 1e-3, torch.float64: 1e-3, torch.float16: 2e-3, torch.bfloat16: 2e-3}
Y_ATOL_TRAIN = {torch.float32: 1e-3, torch.float64: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _np_inputs(shape_last, dtype, fmt, device):
    """TF's test inputs: np.random.seed(1), random_sample in [0, 1), channels-last shape."""
    np.random.seed(1)
    c = shape_last[-1]
    x = torch.from_numpy(np.random.random_sample(shape_last)).to(dtype)
    scale = torch.from_numpy(np.random.random_sample([c])).to(udtype(dtype))
    offset = torch.from_numpy(np.random.random_sample([c])).to(udtype(dtype))
    mean = torch.from_numpy(np.random.random_sample([c])).to(udtype(dtype))
    var = torch.from_numpy(np.random.random_sample([c])).to(udtype(dtype))
    return [t.to(device) for t in (to_format(x, fmt), scale, offset, mean, var)]


def _formats(shape):
    return FORMATS_4D if len(shape) == 4 else FORMATS_5D


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", TF_SHAPES)
@pytest.mark.parametrize("eaf", [1.0, 0.6])
def test_tf_inference_shapes(device, dtype, shape, eaf):
    for fmt in _formats(shape):
        x, scale, offset, mean, var = _np_inputs(shape, dtype, fmt, device)
        y, bm, bv, rs1, rs2, rs3 = fbn(x, scale, offset, mean, var, 0.001, eaf, fmt, False)
        want, _, _ = ref_forward(x.cpu(), scale.cpu(), offset.cpu(), mean.cpu(), var.cpu(), 0.001, eaf, fmt, False)
        assert y.dtype == dtype and y.shape == x.shape
        torch.testing.assert_close(y.double().cpu(), want.to(dtype).double(), atol=Y_ATOL[dtype], rtol=0)
        for out in (bm, rs1):
            torch.testing.assert_close(out, mean, atol=0, rtol=0)
        for out in (bv, rs2):
            torch.testing.assert_close(out, var, atol=0, rtol=0)
        assert rs3.shape == (0,) and rs3.dtype == udtype(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", TF_SHAPES)
@pytest.mark.parametrize("eaf", [1.0, 0.6])
def test_tf_training_shapes(device, dtype, shape, eaf):
    for fmt in _formats(shape):
        x, scale, offset, old_mean, old_var = _np_inputs(shape, dtype, fmt, device)
        if eaf == 1.0:
            old_mean = old_var = torch.empty(0, dtype=udtype(dtype), device=device)
        y, bm, bv, rs1, rs2, rs3 = fbn(x, scale, offset, old_mean, old_var, 0.001, eaf, fmt, True)
        assert y.shape == x.shape and bm.dtype == udtype(dtype)
        if x.numel() == 0:  # empty input: NaN only for eaf == 1; otherwise old statistics pass through
            if eaf == 1.0:
                assert torch.isnan(bm).all() and torch.isnan(bv).all()
            else:
                torch.testing.assert_close(bm, old_mean, atol=0, rtol=0)
                torch.testing.assert_close(bv, old_var, atol=0, rtol=0)
            continue
        wy, wm, wv = ref_forward(x.cpu(), scale.cpu(), offset.cpu(), old_mean.cpu(), old_var.cpu(), 0.001, eaf, fmt, True)
        torch.testing.assert_close(y.double().cpu(), wy.to(dtype).double(), atol=Y_ATOL_TRAIN[dtype], rtol=0)
        torch.testing.assert_close(bm.double().cpu(), wm, atol=1e-3, rtol=0)
        torch.testing.assert_close(bv.double().cpu(), wv, atol=1e-3, rtol=0)
        cd = cdim(fmt, x.dim())
        dims = [d for d in range(x.dim()) if d != cd]
        xd = x.double().cpu()
        torch.testing.assert_close(rs1.double().cpu(), xd.mean(dims), atol=1e-3, rtol=0)
        torch.testing.assert_close(rs2.double().cpu(), xd.var(dims, unbiased=False), atol=1e-3, rtol=0)


def test_5d_batch_norm_followed_by_relu():
    x, scale, offset, mean, var = make_inputs([2, 3, 2, 2, 3], "NCDHW", seed=3)
    y = torch.relu(fbn(x, scale, offset, mean, var, 0.001, 1.0, "NCDHW", False)[0])
    want = torch.relu(ref_forward(x, scale, offset, mean, var, 0.001, 1.0, "NCDHW", False)[0])
    torch.testing.assert_close(y.double(), want, atol=1e-3, rtol=0)


# ---------------------------------------------------------------- accuracy against the reference

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,shape", [("NHWC", (4, 5, 6, 7)), ("NCHW", (4, 7, 5, 6)), ("NDHWC", (2, 3, 4, 5, 6)),
                                       ("NCDHW", (2, 6, 3, 4, 5)), ("NCHW", (3, 300, 1, 1)), ("NHWC", (1, 1, 1, 9))])
@pytest.mark.parametrize("training", [True, False])
def test_forward_backward_match_reference(device, fmt, shape, training):
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float64, device, seed=7)
    eaf = 0.3
    outs = fbn(x, scale, offset, mean, var, 1e-3, eaf, fmt, training)
    want = ref_forward(x.cpu(), scale.cpu(), offset.cpu(), mean.cpu(), var.cpu(), 1e-3, eaf, fmt, training)
    for got, w in zip(outs[:3], want):
        torch.testing.assert_close(got.cpu(), w, atol=1e-10, rtol=1e-10)
    dy = torch.randn(shape, dtype=torch.float64, device=device)
    mu, v = (outs[3], outs[4]) if training else (mean, var)
    got = fbn_grad(dy, x, scale, mu, v, outs[5], 1e-3, fmt, training)
    want = ref_backward(dy.cpu(), x.cpu(), scale.cpu(), mu.cpu(), v.cpu(), 1e-3, fmt, training)
    for g, w in zip(got[:3], want):
        torch.testing.assert_close(g.cpu(), w, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("fmt", FORMATS_4D)
def test_grad_uses_given_statistics_exactly(fmt):
    # arbitrary mu/var inputs give TF's formula (mean(dy*xc), not mean((dy-mean(dy))*xc)).
    x, scale, _, mu, var = make_inputs((3, 4, 5, 6), fmt, torch.float64, seed=11)
    dy = torch.randn_like(x)
    got = fbn_grad(dy, x, scale, mu, var, torch.empty(0, dtype=torch.float64), 1e-3, fmt, True)
    want = ref_backward(dy, x, scale, mu, var, 1e-3, fmt, True)
    for g, w in zip(got[:3], want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,shape", [("NHWC", (8, 9, 10, 16)), ("NCHW", (8, 16, 9, 10))])
def test_low_precision_backward_close_to_float64(dtype, fmt, shape):
    x, scale, offset, _, _ = make_inputs(shape, fmt, dtype, seed=5, stats=False)
    dy = torch.randn(shape).to(dtype)
    _, _, _, rs1, rs2, rs3 = fbn(x, scale, offset, torch.empty(0), torch.empty(0), 1e-3, 1.0, fmt, True)
    dx, ds, do, _, _ = fbn_grad(dy, x, scale, rs1, rs2, rs3, 1e-3, fmt, True)
    wdx, wds, wdo = ref_backward(dy, x, scale, rs1, rs2, 1e-3, fmt, True)
    tol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    assert dx.dtype == dtype and ds.dtype == torch.float32
    torch.testing.assert_close(dx.double(), wdx, atol=tol, rtol=tol)
    torch.testing.assert_close(ds.double(), wds, atol=tol * 50, rtol=1e-3)
    torch.testing.assert_close(do.double(), wdo, atol=tol * 50, rtol=1e-3)


def test_large_channel_statistics_are_accurate():
    # float32 statistics over ~1.6M elements per channel (sums flushed to double) stay accurate.
    x = torch.rand(64, 2, 160, 160) + 1000.0
    s, o = torch.ones(2), torch.zeros(2)
    for fmt, xi in (("NCHW", x), ("NHWC", x.permute(0, 2, 3, 1).contiguous())):
        _, bm, bv, rs1, rs2, _ = fbn(xi, s, o, torch.empty(0), torch.empty(0), 1e-3, 1.0, fmt, True)
        want = x.double().mean([0, 2, 3])
        torch.testing.assert_close(rs1.double(), want, atol=1e-4, rtol=0)
        torch.testing.assert_close(rs2.double(), x.double().var([0, 2, 3], unbiased=False), atol=1e-4, rtol=1e-4)


def test_large_gradient_sums_are_accurate():
    # sum(dy) and sum(dy * (x - mean)) over ~1.6M elements per channel, float32 blocks flushed into double
    # totals: sum(dy * (x - mean)) cancels to ~1/6000 of the sum of its terms' magnitudes here. A plain float32
    # running sum is off by 3.5e-5 (sum(dy)) and 5e-5 (the product sum) relative, beyond both tolerances.
    g = torch.Generator().manual_seed(21)
    x = torch.rand(64, 2, 160, 160, generator=g) + 1000.0
    dy = torch.rand(64, 2, 160, 160, generator=g) + 1.0
    s, o = torch.ones(2), torch.zeros(2)
    for fmt, xi, dyi in (("NCHW", x, dy), ("NHWC", x.permute(0, 2, 3, 1).contiguous(),
                                           dy.permute(0, 2, 3, 1).contiguous())):
        _, _, _, rs1, rs2, rs3 = fbn(xi, s, o, torch.empty(0), torch.empty(0), 1e-3, 1.0, fmt, True)
        _, ds, do, _, _ = fbn_grad(dyi, xi, s, rs1, rs2, rs3, 1e-3, fmt, True)
        want_do = dy.double().sum([0, 2, 3])
        want_ds = (dy.double() * (x.double() - rs1.double()[:, None, None])).sum([0, 2, 3])
        want_ds = want_ds * (rs2.double() + 1e-3).rsqrt()
        torch.testing.assert_close(do.double(), want_do, atol=0, rtol=1e-6)
        torch.testing.assert_close(ds.double(), want_ds, atol=0, rtol=2e-5)


@pytest.mark.parametrize("fmt", ["NCHW", "channels_last"])
def test_large_inference_equals_its_slices(fmt):
    # Float32 inference writes with ordinary stores at every size (the channels-last training forward and
    # backward stream once they touch 32 MB): a 25 MB output, split over the threads at other planes and rows
    # than its 3.2 MB slices (4 images) are, holds the same bits as their concatenation.
    x, scale, offset, mean, var = make_inputs((32, 64, 56, 56), "NCHW", torch.float32, "cpu", seed=14)
    if fmt == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    y = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0]
    parts = [fbn(xs, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0] for xs in x.split(4)]
    assert torch.equal(y, torch.cat(parts))


# ---------------------------------------------------------------- CPU output memory

def _cpu_outputs(x, training):
    _, scale, offset, mean, var = make_inputs(tuple(x.shape), "NCHW", x.dtype, "cpu", seed=15)
    out = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", training)
    mu, v = (out[3], out[4]) if training else (mean, var)
    grads = fbn_grad(torch.randn_like(x), x, scale, mu, v, out[5], 1e-3, "NCHW", training)
    return out, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("training", [True, False])
def test_cpu_outputs_are_aligned_and_usable(dtype, memory_format, training):
    # y and dx are aligned (the kernels' vector loops want it) and in x's memory format; the tensors behave as any
    # other (in-place ops, resize, share_memory_, pickling). The [C] outputs: test_cpu_statistics_outputs_are_ordinary_tensors.
    x = torch.randn(3, 16, 5, 7, dtype=dtype).contiguous(memory_format=memory_format)
    (y, *_), (dx, *_) = _cpu_outputs(x, training)
    for t in (y, dx):
        assert t.data_ptr() % 64 == 0
        assert t.stride() == x.stride()
        want = t.clone()
        assert torch.equal(t.clone().share_memory_(), want)
        assert torch.equal(pickle.loads(pickle.dumps(t)), want)
        t.add_(1)
        expected = want + 1
        torch.testing.assert_close(t, expected)
        n = t.numel()
        t.resize_(2 * n)  # grows the storage through its allocator, keeping the data in memory order
        in_memory_order = expected.new_empty(0).set_(expected.untyped_storage(), 0, (n,), (1,))
        assert torch.equal(t[:n], in_memory_order)


def test_cpu_outputs_take_the_cpu_allocator_when_memory_is_profiled():
    # Outputs come from PyTorch's CPU allocator like every other op's, so the memory profiler accounts for them.
    x, scale, offset, mean, var = make_inputs((4, 8, 16, 16), "NCHW", torch.float32, "cpu", seed=17)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0]
    mem = sum(e.cpu_memory_usage for e in prof.key_averages() if e.key == "torchops::fused_batch_norm_v3")
    assert mem >= y.nbytes, mem
    assert torch.equal(y, fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0])


# ---------------------------------------------------------------- layouts

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("rank", [4, 5])
def test_channels_first_equals_channels_last_on_transposed_data(device, training, rank):
    last, first = ("NHWC", "NCHW") if rank == 4 else ("NDHWC", "NCDHW")
    shape = (3, 4, 5, 6) if rank == 4 else (2, 3, 4, 2, 5)
    x, scale, offset, mean, var = make_inputs(shape, last, torch.float32, device, seed=2)
    dy = torch.randn(shape, device=device)
    a = fbn(x, scale, offset, mean, var, 1e-3, 1.0, last, training)
    b = fbn(to_format(x, first), scale, offset, mean, var, 1e-3, 1.0, first, training)
    torch.testing.assert_close(from_format(b[0], first), a[0], atol=1e-6, rtol=1e-6)
    for i in range(1, 5):
        torch.testing.assert_close(b[i], a[i], atol=1e-6, rtol=1e-6)
    mu, v = (a[3], a[4]) if training else (mean, var)
    ga = fbn_grad(dy, x, scale, mu, v, a[5], 1e-3, last, training)
    gb = fbn_grad(to_format(dy, first), to_format(x, first), scale, mu, v, a[5], 1e-3, first, training)
    torch.testing.assert_close(from_format(gb[0], first), ga[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gb[1], ga[1], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(gb[2], ga[2], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rank", [4, 5])
def test_channels_last_memory_is_read_in_place_and_kept(device, rank):
    fmt = "NCHW" if rank == 4 else "NCDHW"
    mf = torch.channels_last if rank == 4 else torch.channels_last_3d
    shape = (3, 5, 4, 6) if rank == 4 else (2, 5, 3, 4, 2)
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float32, device, seed=4)
    xcl = x.contiguous(memory_format=mf)
    for training in (True, False):
        ref = fbn(x, scale, offset, mean, var, 1e-3, 1.0, fmt, training)
        got = fbn(xcl, scale, offset, mean, var, 1e-3, 1.0, fmt, training)
        assert got[0].is_contiguous(memory_format=mf)
        torch.testing.assert_close(got[0], ref[0], atol=1e-6, rtol=1e-6)
        dy = torch.randn_like(x)
        g_ref = fbn_grad(dy, x, scale, ref[3], ref[4], ref[5], 1e-3, fmt, training)
        g = fbn_grad(dy.contiguous(memory_format=mf), xcl, scale, ref[3], ref[4], ref[5], 1e-3, fmt, training)
        assert g[0].is_contiguous(memory_format=mf)
        for a, b in zip(g[:3], g_ref[:3]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_channels_first_inference_runs_across_planes_bitwise(dtype, threads, restore_threads):
    # CPU channels-first inference runs over the planes as one flat, aligned run; a vector that straddles
    # two planes takes its lanes' coefficients from both. Against the channels-last kernel (per-channel
    # coefficient arrays, no plane boundaries), bit for bit: planes shorter than, equal to and not a
    # multiple of a vector, 14x14 planes, thread chunks that start off alignment (1001 and 2049 channels:
    # more planes than one chunk holds), and an input that starts one element into its storage.
    torch.set_num_threads(threads)
    shapes = [(2, 3, 1, 3), (2, 5, 2, 2), (3, 7, 1, 8), (2, 3, 3, 3), (2, 3, 5, 7), (4, 16, 14, 14),
              (3, 1001, 3, 3), (2, 2049, 1, 9), (1, 2, 1, 40001)]
    for k, shape in enumerate(shapes):
        x, scale, offset, mean, var = make_inputs(shape, "NCHW", dtype, seed=40 + k)
        want = fbn(x.contiguous(memory_format=torch.channels_last), scale, offset, mean, var, 1e-3, 1.0, "NCHW",
                   False)[0]
        assert torch.equal(fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0], want), shape
        shifted = torch.empty(x.numel() + 1, dtype=dtype)[1:].view(shape).copy_(x)
        assert torch.equal(fbn(shifted, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0], want), shape


@pytest.mark.parametrize("fmt,shape", [("NCHW", (2, 3, 14, 14)), ("NCHW", (2, 3, 1, 3)), ("NHWC", (2, 3, 3, 8)),
                                       ("NHWC", (2, 3, 3, 3))])
def test_inference_keeps_signed_zeros(fmt, shape):
    # (x - mean) * alpha + offset with IEEE signed zeros, as TF computes it: x = -0, mean = +0 and offset = -0
    # give -0 (-0 - +0 = -0, * alpha > 0 = -0, + -0 = -0). Coefficients broadcast as 0 + s turned -0 into +0.
    # Every CPU inference loop: channels-first planes of 196 (flat run) and 3 (per plane), channels-last
    # rows of C = 8 and 3.
    c = shape[cdim(fmt, 4)]
    g = torch.Generator().manual_seed(5)
    x = torch.tensor([-0.0, 0.0, -2.5, 1.5])[torch.randint(0, 4, shape, generator=g)]
    mean = torch.tensor([0.0, -0.0]).repeat(c)[:c]
    offset = torch.tensor([-0.0, -0.0, 0.0]).repeat(c)[:c]
    scale, var = torch.full((c,), 2.0), torch.full((c,), 0.25)
    y = fbn(x, scale, offset, mean, var, 1e-3, 1.0, fmt, False)[0]
    shape_c = [1] * 4
    shape_c[cdim(fmt, 4)] = c
    alpha = (scale / torch.sqrt(var + 1e-3)).view(shape_c)
    want = (x - mean.view(shape_c)) * alpha + offset.view(shape_c)
    zeros = want == 0
    assert zeros.any() and torch.signbit(want[zeros]).any() and (~torch.signbit(want[zeros])).any()
    assert torch.equal(y == 0, zeros)
    assert torch.equal(torch.signbit(y[zeros]), torch.signbit(want[zeros]))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_channels_last_inference_pairs_row_halves_bitwise(threads, restore_threads):
    # CPU float32 channels-last inference (C % 8 == 0) walks each thread's rows as two halves together,
    # sharing the coefficient loads. Bit for bit against the channels-first kernel:
    # even and odd row counts per chunk, one row, rows split unevenly over threads, C = 8 and 256, an input
    # that starts one element into its storage (unaligned rows).
    torch.set_num_threads(threads)
    for k, shape in enumerate([(1, 8, 1, 1), (1, 16, 1, 2), (1, 8, 1, 3), (3, 8, 5, 7), (2, 256, 3, 3),
                               (5, 256, 7, 7), (64, 256, 14, 14), (7, 24, 13, 11)]):
        x, scale, offset, mean, var = make_inputs(shape, "NCHW", torch.float32, seed=60 + k)
        want = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0]
        xcl = x.contiguous(memory_format=torch.channels_last)
        assert torch.equal(fbn(xcl, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)[0], want), shape
        n, c, h, w = shape
        shifted = torch.empty(x.numel() + 1)[1:].view(n, h, w, c).copy_(xcl.permute(0, 2, 3, 1))
        got = fbn(shifted, scale, offset, mean, var, 1e-3, 1.0, "NHWC", False)[0]
        assert torch.equal(got.permute(0, 3, 1, 2), want), shape


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("training", [True, False])
def test_channels_last_row_passes_over_thread_chunks(training, threads, restore_threads):
    # The CPU float32 channels-last row passes below the streaming size (C % 8 == 0) take each thread's
    # chunk whole: the training forward's y walks it as two halves together, the backward's dx row by row.
    # Against the float64 reference: chunks of even and odd row counts, one row, 257 and 1001 rows over 2-3
    # threads.
    torch.set_num_threads(threads)
    for k, shape in enumerate([(1, 1, 1, 8), (1, 1, 3, 16), (3, 5, 7, 8), (5, 7, 7, 256), (1, 1, 257, 64),
                               (7, 11, 13, 32)]):  # NHWC
        x, scale, offset, mean, var = make_inputs(shape, "NHWC", torch.float32, seed=70 + k)
        outs = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NHWC", training)
        want = ref_forward(x, scale, offset, mean, var, 1e-3, 1.0, "NHWC", training)
        torch.testing.assert_close(outs[0].double(), want[0], atol=2e-5, rtol=1e-5, msg=lambda m: f"{shape}: {m}")
        dy = torch.randn(shape, generator=torch.Generator().manual_seed(80 + k))
        mu, v = (outs[3], outs[4]) if training else (mean, var)
        got = fbn_grad(dy, x, scale, mu, v, outs[5], 1e-3, "NHWC", training)
        want = ref_backward(dy, x, scale, mu, v, 1e-3, "NHWC", training)
        torch.testing.assert_close(got[0].double(), want[0], atol=2e-5, rtol=1e-5, msg=lambda m: f"{shape}: {m}")


@pytest.mark.parametrize("shape", [(8, 64, 96, 96), (9, 24, 131, 151), (64, 256, 14, 14)])
def test_channels_last_large_outputs_match_channels_first(shape):
    # CPU float32 channels-last row passes write with non-temporal stores once the tensors they touch come to
    # 32 MB (C % 8 == 0): training forward outputs of >= 16 MB (x and y), backward dx of >= 10.7 MB (dy, x and dx; the
    # third shape, 12.8 MB, streams only there). The second shape, C = 24 over 17 MB with rows that are not a
    # multiple of the row block, too. The same values as the channels-first kernels; inference (ordinary
    # stores at every size) rounds identically (bitwise).
    x, scale, offset, mean, var = make_inputs(shape, "NCHW", torch.float32, "cpu", seed=12)
    assert 3 * x.numel() * 4 >= 32 << 20
    xcl = x.contiguous(memory_format=torch.channels_last)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(13))
    for training in (True, False):
        ref = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", training)
        got = fbn(xcl, scale, offset, mean, var, 1e-3, 1.0, "NCHW", training)
        if training:
            torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(got[0], ref[0])
        g_ref = fbn_grad(dy, x, scale, ref[3], ref[4], ref[5], 1e-3, "NCHW", training)
        g = fbn_grad(dy.contiguous(memory_format=torch.channels_last), xcl, scale, ref[3], ref[4], ref[5], 1e-3,
                     "NCHW", training)
        torch.testing.assert_close(g[0], g_ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(g[1:3], g_ref[1:3], atol=1e-2, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    x, scale, offset, mean, var = make_inputs((4, 6, 5, 8), "NHWC", torch.float64, device, seed=9)
    xs = x[:, ::2]  # non-contiguous view
    big = torch.randn(16, dtype=torch.float64, device=device)
    sc, of = scale.repeat_interleave(2)[::2], big[::2]  # strided [8] vectors
    for training in (True, False):
        got = fbn(xs, sc, of, mean, var, 1e-3, 1.0, "NHWC", training)
        want = ref_forward(xs.cpu(), sc.cpu(), of.cpu(), mean.cpu(), var.cpu(), 1e-3, 1.0, "NHWC", training)
        torch.testing.assert_close(got[0].cpu(), want[0], atol=1e-10, rtol=1e-10)
        dy = torch.randn(4, 3, 5, 16, dtype=torch.float64, device=device)[..., ::2]
        mu, v = (got[3], got[4]) if training else (mean, var)
        g = fbn_grad(dy, xs, sc, mu, v, got[5], 1e-3, "NHWC", training)
        w = ref_backward(dy.cpu(), xs.cpu(), sc.cpu(), mu.cpu(), v.cpu(), 1e-3, "NHWC", training)
        for a, b in zip(g[:3], w):
            torch.testing.assert_close(a.cpu(), b, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- decisions

# FusedBatchNormV3 inference y of TensorFlow 2.21.0 (x86-64 CPU wheel, Intel CPU) on the inputs drawn below,
# NHWC: C = 16 (TF's AVX packet path for the scaling factor) then C = 11 (8 packet channels + 3 scalar ones),
# as float32 bit patterns.
_TF_FBN_INFERENCE_BITS = [
    0xbe825d3a, 0xbfe73a19, 0xbfcb4761, 0xbf9e47cc, 0x4004a1df, 0xc05574e5, 0x407a628a, 0x3fdeb93b,
    0xbf8b31c5, 0x40ba0d47, 0xbf8739d4, 0x3f361216, 0xc0366261, 0x3fba3a7a, 0x40f7a904, 0x3fdbe8c8,
    0x3eeaaada, 0xc0675e66, 0xbe25c44c, 0xbfc1890a, 0x4086cbe7, 0xbfb62fe7, 0x3f8f26c0, 0x3dc0cd94,
    0xbf4c626c, 0xc09c9359, 0x400719e9, 0xbefc6f6e, 0x3f9e4884, 0x3f896378, 0xc0ca19b1, 0x3ec64ab0,
    0x3f098f71, 0x3f34df0b, 0xbfa9fd47, 0x3f9cd492, 0x406984ae, 0x402eef7b, 0x4096168d, 0x3f61c6c2,
    0xbdb198a8, 0xc1545126, 0x3fdd169c, 0x3ee026c2, 0x3f801414, 0xbf6d1f0c, 0x40f10e97, 0xbfb3585d,
    0xc07b6f1d, 0x3ffcb820, 0x3fba1e3c, 0xbf0c604f, 0x403f4cbe, 0x4002a8f0, 0x4003c6ab, 0xbde66628,
    0xbe7c24f6, 0x401a4304, 0xbfa3a286, 0xbfb322e6, 0xc021872d, 0x3f268f72, 0x401034f7, 0xbf4bb536,
    0xc111b8ec, 0x3f27e832, 0x3e130a9a, 0xc1466c9f, 0xbfd40aea, 0x4110c934, 0xc0b24dee, 0xc0b5df86,
    0x40154cd9, 0xbf25d539, 0x3eaf5e76, 0x3f0ba427, 0x3fc80ad0, 0xbf631567, 0xc1102f09, 0x3f27e1bf,
    0x40a80fd3, 0xbf5a8019, 0x40baab40, 0xbd334360, 0x3f7edd40, 0xbf341950, 0x3fce7aba, 0x3f11b00a,
    0xbf2404fb, 0x40a1f290, 0xbfaba41b, 0x40e63100, 0x403be7f6, 0xc0b66ad2, 0xbf0829d0, 0xc00e722e,
    0xbfbcdd47,
]


# FusedBatchNormGradV3 (is_training=False) x_backprop of TensorFlow 2.21.0 for the same inputs and
# y_backprop drawn after them, as float32 bit patterns.
_TF_FBN_INFERENCE_GRAD_BITS = [
    0x3fe76ec8, 0xbefc81b7, 0x3f09d88a, 0x3f63fe20, 0x3d40f79e, 0xbf17fdde, 0x400db7c1, 0xbdf2eb33,
    0xbe68c6f1, 0x40277e7c, 0xbc594c7c, 0xbf6e9d59, 0xbfde2b86, 0x3ddd115a, 0xbf02284e, 0x3eca5767,
    0xbf4ea502, 0x3ef05812, 0x3f7c0761, 0xbf573581, 0xbf3f72b1, 0x3fa7f72c, 0x3f506e41, 0xbf27134d,
    0x3e236ddd, 0x40379c59, 0x3d140dc7, 0xbdd6d8da, 0xbff62cb8, 0xbf129210, 0x40160c87, 0xbd81dbb9,
    0xbebe778d, 0x3fc00dd3, 0xbf5139bf, 0xbf70c72d, 0xbed70a5b, 0xbfb959af, 0xbfb6abe5, 0x3edeb411,
    0xbf1e0f0d, 0x409bfa61, 0xbeab3d62, 0xbf3d025a, 0xbf5de415, 0xbf11b85d, 0xbed7ff01, 0xbf165963,
    0x3f96d0c2, 0x3f8a9e2f, 0x3b65446b, 0xbed88184, 0x3ef604c6, 0xbfb4b064, 0x3fd59302, 0xbee33490,
    0xbf41d4f4, 0xc05726a4, 0xbf777313, 0xbf629fed, 0xbf9c52d5, 0x3e83b4e1, 0xbfa2a850, 0xbdea7644,
    0x408e6301, 0xbf48b4df, 0xbe957e1a, 0xc07017da, 0x3f5d29a9, 0x404fd21b, 0xbf59b645, 0xbf0955f9,
    0xbf0d79a3, 0x3f106cb7, 0xbfbb37ab, 0xc0ae84a8, 0xbe88377f, 0xbece2f5c, 0x40ab5a25, 0x3edf9e95,
    0x3eaca3fa, 0x3f5caa83, 0x3fce4edb, 0x3f5624c5, 0x3f7a771d, 0xbf8e8f55, 0x3fcb8cef, 0xbf7cefac,
    0xbdb7ff7f, 0x408e18e2, 0x3f368154, 0x3ff4518f, 0xc01eb924, 0xbf96d86c, 0xbf805d00, 0x3f921e86,
    0xbf90e34d,
]


def _is_intel_x86():
    try:
        with open("/proc/cpuinfo") as f:
            return "GenuineIntel" in f.read(4096)
    except OSError:
        return False


def test_cpu_inference_is_tf_bitwise():
    # Inference forward y and inference gradient x_backprop. The CPU float scaling factor is TF's (RSQRTPS
    # estimate + one Newton step on 8-channel packets, 1/sqrt on the rest) and normalisation rounds like
    # TF's non-FMA Eigen code, so inference equals TF bit for bit on the same CPU. The estimate's low bits
    # are the CPU vendor's: TF's recorded bits are asserted on Intel CPUs; everywhere the outputs must stay
    # within a few ulp of the exact formula.
    got, exact, got_dx, exact_dx = [], [], [], []
    for C, W in ((16, 4), (11, 3)):
        rng = np.random.default_rng(C)

        def u(*shape, lo=-1.0, hi=1.0):
            return torch.from_numpy((lo + (hi - lo) * rng.random(shape)).astype(np.float32))

        x, s, o, m, v = u(1, 1, W, C, lo=-4, hi=4), u(C, lo=0.5, hi=1.5), u(C), u(C), u(C, lo=0.01, hi=3)
        dy = u(1, 1, W, C, lo=-2, hi=2)
        y = fbn(x, s, o, m, v, 1e-3, 1.0, "NHWC", False)[0]
        dx = torch.ops.torchops.fused_batch_norm_grad_v3(dy, x, s, m, v, torch.zeros(0), 1e-3, "NHWC", False)[0]
        got.append(y.reshape(-1))
        got_dx.append(dx.reshape(-1))
        r = 1 / torch.sqrt(v.double() + 1e-3)
        exact.append(((x.double() - m.double()) * r * s.double() + o.double()).reshape(-1))
        exact_dx.append((dy.double() * r * s.double()).reshape(-1))
    for g, e, bits in ((got, exact, _TF_FBN_INFERENCE_BITS), (got_dx, exact_dx, _TF_FBN_INFERENCE_GRAD_BITS)):
        g, e = torch.cat(g), torch.cat(e)
        if _is_intel_x86():
            assert torch.equal(g.view(torch.int32), torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.int32)))
        assert ((g.double() - e).abs() <= 4 * torch.finfo(torch.float32).eps * (e.abs() + 4)).all()


@pytest.mark.parametrize("C", [4, 8, 13, 16, 40, 256])
def test_cpu_inference_scaling_factors_match_the_gradient_per_channel(C):
    # The CPU inference forward computes TF's scaling factors rsqrt(var + eps) * scale four channels at a time,
    # the inference gradient one channel at a time; the same bits either way. With x = 1, mean = 0 and
    # offset = -0 (which keeps a factor of -0), y is the factor itself, and so is x_backprop for dy = 1.
    # Variances where the Newton step gives NaN (var + eps = 0 and inf), NaN, subnormal, tiny and huge ones
    # among random ones, in both the 8-channel packets and the channels past them.
    g = torch.Generator().manual_seed(C)
    var = torch.rand(C, generator=g) * 3
    special = torch.tensor([-1e-3, float("inf"), float("nan"), 1e-42, 1e-30, 3e38, 0.0, 7.5])
    var[: min(C, 8)] = special[: min(C, 8)]
    if C > 9:
        var[-2:] = special[:2]
    scale = torch.rand(C, generator=g) + 0.5
    scale[1::3] *= -1
    zeros = torch.zeros(C)
    x = torch.ones(1, 1, 3, C)
    y = fbn(x, scale, torch.full((C,), -0.0), zeros, var, 1e-3, 1.0, "NHWC", False)[0]
    dx = torch.ops.torchops.fused_batch_norm_grad_v3(torch.ones_like(x), x, scale, zeros, var, torch.zeros(0), 1e-3,
                                                     "NHWC", False)[0]
    assert torch.equal(y.view(torch.int32), dx.view(torch.int32))
    finite = torch.isfinite(var + 1e-3) & (var + 1e-3 > 0)
    exact = scale.double() / torch.sqrt(var.double() + torch.tensor(1e-3, dtype=torch.float32).double())
    rel = ((y[0, 0, 0].double() - exact) / exact).abs()[finite]
    assert (rel <= 4 * torch.finfo(torch.float32).eps).all()


@pytest.mark.parametrize("stats", ["contiguous", "strided", "offset"])
@pytest.mark.parametrize("n", [2, 0])
def test_inference_outputs_are_copies_not_views(stats, n):
    # The CPU copies are a memcpy for contiguous statistics (also at an offset into their storage), clone() else.
    x, scale, offset, mean, var = make_inputs((n, 3, 4, 5), "NCHW")
    if stats == "strided":
        mean, var = torch.stack([mean, -mean], 1)[:, 0], torch.stack([var, var + 1], 1)[:, 0]
        assert not mean.is_contiguous()
    elif stats == "offset":
        mean, var = torch.cat([mean[:1], mean])[1:], torch.cat([var[:1], var])[1:]
        assert mean.storage_offset() == 1
    before = (mean.clone(), var.clone())
    _, bm, bv, rs1, rs2, rs3 = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", False)
    for out, src in ((bm, mean), (rs1, mean), (bv, var), (rs2, var)):
        assert out.shape == (3,) and out.is_contiguous() and not out.requires_grad
        assert torch.equal(out, src) and out.data_ptr() != src.data_ptr()
    for out in (bm, bv, rs1, rs2):
        out.add_(100.0)  # own storage each: neither the inputs nor the other outputs change
    assert torch.equal(mean, before[0]) and torch.equal(var, before[1])
    assert torch.equal(bm, rs1) and torch.equal(bv, rs2) and torch.equal(bm, before[0] + 100.0)
    assert rs3.shape == (0,)


def test_cpu_statistics_outputs_are_ordinary_tensors(tmp_path):
    # The [C] outputs (some filled by memcpy on the CPU) must grow, move to shared memory, pickle and free like
    # any tensor.
    x, scale, offset, mean, var = make_inputs((4, 3, 5, 6), "NHWC")
    train = fbn(x, scale, offset, mean, var, 1e-3, 0.5, "NHWC", True)
    infer = fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NHWC", False)
    grads = fbn_grad(torch.randn_like(x), x, scale, train[3], train[4], train[5], 1e-3, "NHWC", True)
    outs = list(train[1:5]) + list(infer[1:5]) + list(grads[1:3])
    c = x.shape[-1]
    for i, out in enumerate(outs):
        assert out.shape == (c,) and out.dtype == torch.float32 and out.untyped_storage().resizable()
        want = out.clone()
        out.resize_(1000)  # reallocates through the tensor's own allocator and keeps the values
        assert torch.equal(out[:c], want)
        out[c:] = float(i)
        out.share_memory_()
        assert out.is_shared() and torch.equal(out[:c], want) and (out[c:] == i).all()
    torch.save(outs, tmp_path / "stats.pt")
    back = torch.load(tmp_path / "stats.pt")
    assert all(torch.equal(a, b) for a, b in zip(outs, back))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input_three_regimes(device):
    x = torch.empty(0, 3, 4, 5, device=device)
    s = torch.ones(3, device=device)
    m = torch.tensor([1.0, 2, 3], device=device)
    v = torch.tensor([4.0, 5, 6], device=device)
    y, bm, bv, rs1, rs2, rs3 = fbn(x, s, s, torch.empty(0, device=device), torch.empty(0, device=device),
                                   1e-3, 1.0, "NCHW", True)
    assert y.shape == x.shape and torch.isnan(bm).all() and torch.isnan(bv).all()
    assert torch.isnan(rs1).all() and torch.isnan(rs2).all() and bm.shape == (3,)
    y, bm, bv, rs1, rs2, _ = fbn(x, s, s, m, v, 1e-3, 0.5, "NCHW", True)
    assert torch.equal(bm, m) and torch.equal(bv, v) and torch.isnan(rs1).all()
    y, bm, bv, rs1, rs2, _ = fbn(x, s, s, m, v, 1e-3, 1.0, "NCHW", False)
    assert torch.equal(bm, m) and torch.equal(bv, v) and torch.equal(rs1, m) and torch.equal(rs2, v)
    for training in (True, False):
        dx, ds, do, rs4, rs5 = fbn_grad(x, x, s, m, v, torch.empty(0, device=device), 1e-3, "NCHW", training)
        assert dx.shape == x.shape and torch.equal(ds, torch.zeros(3, device=device))
        assert torch.equal(do, torch.zeros(3, device=device)) and rs4.shape == rs5.shape == (0,)


def test_single_element_per_channel():
    x = torch.tensor([[[[3.0, -1.0]]]])  # NHWC [1,1,1,2]: n == 1
    y, bm, bv, rs1, rs2, _ = fbn(x, torch.ones(2), torch.tensor([0.5, -0.5]), torch.empty(0), torch.empty(0),
                                 1e-3, 1.0, "NHWC", True)
    torch.testing.assert_close(y.flatten(), torch.tensor([0.5, -0.5]))
    torch.testing.assert_close(bv, torch.zeros(2))
    torch.testing.assert_close(bm, torch.tensor([3.0, -1.0]))


def test_epsilon_is_not_clamped():
    x, scale, offset, _, _ = make_inputs((2, 3, 4, 5), "NCHW", torch.float64, seed=1)
    x = x * 1e-4  # variance ~1e-9: the epsilon matters
    for eps in (1e-7, 1e-12):
        y = fbn(x, scale, offset, torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64),
                eps, 1.0, "NCHW", True)[0]
        want = ref_forward(x, scale, offset, None, None, eps, 1.0, "NCHW", True)[0]
        torch.testing.assert_close(y, want, atol=1e-9, rtol=1e-9)
    y_small = fbn(x, scale, offset, torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64),
                  1e-7, 1.0, "NCHW", True)[0]
    y_clamped = fbn(x, scale, offset, torch.empty(0, dtype=torch.float64), torch.empty(0, dtype=torch.float64),
                    1.001e-5, 1.0, "NCHW", True)[0]
    assert not torch.allclose(y_small, y_clamped)


@pytest.mark.parametrize("eaf", [0.0, 1.5])
def test_exponential_avg_factor_is_not_range_checked(eaf):
    x, scale, offset, mean, var = make_inputs((2, 3, 4, 5), "NCHW", torch.float64)
    _, bm, bv, *_ = fbn(x, scale, offset, mean, var, 1e-3, eaf, "NCHW", True)
    _, wm, wv = ref_forward(x, scale, offset, mean, var, 1e-3, eaf, "NCHW", True)
    torch.testing.assert_close(bm, wm)
    torch.testing.assert_close(bv, wv)


def test_statistics_outputs_do_not_require_grad():
    x, scale, offset, mean, var = make_inputs((2, 3, 4, 5), "NCHW", torch.float64)
    for t in (x, scale, offset, mean, var):
        t.requires_grad_(True)
    for training in (True, False):
        outs = fbn(x, scale, offset, mean, var, 1e-3, 0.5, "NCHW", training)
        assert outs[0].requires_grad
        assert not any(o.requires_grad for o in outs[1:])
        outs[0].sum().backward()
        assert mean.grad is None and var.grad is None
        assert x.grad is not None and scale.grad is not None and offset.grad is not None


# ---------------------------------------------------------------- gradients

GRAD_CASES = [("NHWC", (2, 3, 2, 3)), ("NCHW", (2, 3, 3, 2)), ("NDHWC", (2, 2, 1, 2, 3)), ("NCDHW", (2, 3, 2, 1, 2)),
              ("NHWC", (1, 1, 1, 2))]


def _fwd_y(fmt, training, eaf=1.0, python_function=False):
    def f(x, scale, offset, mean, var):
        if python_function:
            return torchops.autograd.FusedBatchNormV3.apply(x, scale, offset, mean, var, 1e-3, eaf, fmt, training)[0]
        return fbn(x, scale, offset, mean, var, 1e-3, eaf, fmt, training)[0]
    return f


def _grad_inputs(fmt, shape, device, seed=0):
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float64, device, seed=seed)
    return [x.requires_grad_(), scale.requires_grad_(), offset.requires_grad_(), mean, var]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,shape", GRAD_CASES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("python_function", [False, True])
def test_gradcheck_and_gradgradcheck(device, fmt, shape, training, python_function):
    inputs = _grad_inputs(fmt, shape, device)
    f = _fwd_y(fmt, training, 0.4, python_function)
    assert gradcheck(f, inputs, eps=1e-6, atol=1e-6)
    assert gradgradcheck(f, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
def test_grad_op_inference_gradcheck_directly(fmt):
    x, scale, _, mean, var = make_inputs((2, 3, 2, 3), fmt, torch.float64)
    dy = torch.randn_like(x)
    rs3 = torch.empty(0, dtype=torch.float64)

    def g(dy, x, scale):
        return fbn_grad(dy, x, scale, mean, var, rs3, 1e-3, fmt, False)[:3]
    ins = [dy.requires_grad_(), x.requires_grad_(), scale.requires_grad_()]
    assert gradcheck(g, ins, eps=1e-6, atol=1e-6)
    assert gradgradcheck(g, ins, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("fmt", ["NHWC", "NCDHW"])
def test_grad_op_training_second_order_uses_recomputed_statistics(fmt):
    # bogus reserve spaces give the same second-order gradients as the true batch statistics.
    shape = (2, 3, 2, 3) if len(fmt) == 4 else (2, 3, 2, 1, 2)
    x, scale, _, mean, var = make_inputs(shape, fmt, torch.float64, seed=3)
    _, _, _, rs1, rs2, rs3 = fbn(x, scale, scale, mean, var, 1e-3, 1.0, fmt, True)
    dy = torch.randn_like(x)
    gouts = [torch.randn_like(x), torch.randn(scale.shape, dtype=torch.float64),
             torch.randn(scale.shape, dtype=torch.float64)]
    results = []
    for m, v in ((rs1, rs2), (rs1 + 5.0, rs2 * 3.0)):
        ins = [t.clone().requires_grad_() for t in (dy, x, scale)]
        outs = fbn_grad(ins[0], ins[1], ins[2], m, v, rs3, 1e-3, fmt, True)[:3]
        results.append(torch.autograd.grad(outs, ins, gouts))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def _tf_batch_norm_grad_composite(dy, x, scale, eps, fmt):
    """TF's `_BatchNormGrad` in autograd-able torch ops."""
    cd = cdim(fmt, x.dim())
    dims = [d for d in range(x.dim()) if d != cd]
    s = bshape(fmt, x.dim())
    mean_x = x.mean(dims, keepdim=True)
    var_x = ((x - mean_x.detach()) ** 2).mean(dims, keepdim=True)
    r = torch.rsqrt(var_x + eps)
    xc = x - mean_x
    gx = scale.view(s) * r * (dy - dy.mean(dims, keepdim=True) - xc * (dy * xc).mean(dims, keepdim=True) / (var_x + eps))
    return gx, r.flatten() * (dy * xc).sum(dims), dy.sum(dims)


@pytest.mark.parametrize("fmt,shape", [("NHWC", (2, 3, 4, 5)), ("NCHW", (2, 3, 2, 2)), ("NDHWC", (2, 3, 2, 2, 2)),
                                       ("NCDHW", (2, 3, 2, 2, 2))])
def test_tf_grad_grad_matches_composite(fmt, shape):
    # testBatchNormGradGradConfig*: first- and second-order gradients equal TF's composite.
    x, scale, offset, _, _ = make_inputs(shape, fmt, torch.float64, seed=6)
    dy = torch.randn(shape, dtype=torch.float64)
    e = torch.empty(0, dtype=torch.float64)
    _, _, _, rs1, rs2, rs3 = fbn(x, scale, offset, e, e, 1e-3, 1.0, fmt, True)
    ins = [t.clone().requires_grad_() for t in (dy, x, scale)]
    ours = fbn_grad(ins[0], ins[1], ins[2], rs1, rs2, rs3, 1e-3, fmt, True)[:3]
    ins2 = [t.clone().requires_grad_() for t in (dy, x, scale)]
    ref = _tf_batch_norm_grad_composite(*ins2, 1e-3, fmt)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    gouts = [torch.randn_like(o) for o in ours]
    for a, b in zip(torch.autograd.grad(ours, ins, gouts), torch.autograd.grad(ref, ins2, gouts)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("training", [True, False])
def test_low_precision_gradient_matches_float32_replica(dtype, training):
    # TF's gradient tests take the numeric Jacobian on a float32 replica for f16/bf16.
    x, scale, offset, mean, var = make_inputs((2, 3, 4, 4), "NHWC", dtype, seed=8)
    dy = torch.randn(x.shape).to(dtype)
    outs = []
    for xx in (x, x.float()):
        xi, si, oi = xx.clone().requires_grad_(), scale.clone().requires_grad_(), offset.clone().requires_grad_()
        y = fbn(xi, si, oi, mean, var, 1e-3, 1.0, "NHWC", training)[0]
        outs.append(torch.autograd.grad(y, (xi, si, oi), dy.to(y.dtype)))
    tol_x = 2e-3 if dtype == torch.float16 else 2e-2
    torch.testing.assert_close(outs[0][0].float(), outs[1][0], atol=tol_x * 10, rtol=tol_x)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=0.05, rtol=1e-2)
    torch.testing.assert_close(outs[0][2], outs[1][2], atol=0.05, rtol=1e-2)


def test_python_function_and_cpp_autograd_agree():
    for training in (True, False):
        grads = []
        for py in (False, True):
            ins = _grad_inputs("NCHW", (3, 4, 2, 3), "cpu", seed=12)
            y = _fwd_y("NCHW", training, 0.5, py)(*ins)
            g = torch.autograd.grad((y * y).sum(), ins[:3], create_graph=True)
            gg = torch.autograd.grad(sum(t.sum() for t in g), ins[:3])
            grads.append((y, g, gg))
        for a, b in zip(grads[0], grads[1]):
            for u, v in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
                torch.testing.assert_close(u, v, atol=0, rtol=0)


@pytest.mark.parametrize("training", [True, False])
def test_autograd_only_where_an_input_requires_grad(training):
    # The Autograd kernels skip the autograd Function when nothing can be differentiated: same values, no
    # graph; with any input requiring grad (here only offset) the graph is built as before.
    base = _grad_inputs("NHWC", (2, 3, 2, 4), "cpu", seed=3)
    plain = [t.detach() for t in base]
    outs = fbn(*plain, 1e-3, 0.5, "NHWC", training)
    assert not any(o.requires_grad for o in outs)
    ins = plain[:2] + [plain[2].clone().requires_grad_()] + plain[3:]
    outs_g = fbn(*ins, 1e-3, 0.5, "NHWC", training)
    assert outs_g[0].requires_grad and not any(o.requires_grad for o in outs_g[1:])
    for a, b in zip(outs, outs_g):
        torch.testing.assert_close(a, b.detach(), atol=0, rtol=0, equal_nan=True)
    (d_offset,) = torch.autograd.grad(outs_g[0].sum(), [ins[2]])
    torch.testing.assert_close(d_offset, torch.full_like(d_offset, 2 * 2 * 3))
    dy = torch.randn_like(plain[0])
    g = fbn_grad(dy, plain[0], plain[1], outs[3], outs[4], outs[5], 1e-3, "NHWC", training)
    assert not any(t.requires_grad for t in g)
    dy_g = dy.clone().requires_grad_()
    g2 = fbn_grad(dy_g, plain[0], plain[1], outs[3], outs[4], outs[5], 1e-3, "NHWC", training)
    assert g2[0].requires_grad
    for a, b in zip(g, g2):
        torch.testing.assert_close(a, b.detach(), atol=0, rtol=0)


def test_undefined_output_gradient_is_zero():
    ins = _grad_inputs("NHWC", (2, 2, 2, 3), "cpu")
    outs = fbn(*ins, 1e-3, 1.0, "NHWC", True)
    # only a non-differentiable output is used: no gradient path, and backward must not crash
    (outs[0] * 0).sum().backward()
    assert torch.equal(ins[0].grad, torch.zeros_like(ins[0]))


# ---------------------------------------------------------------- validation (TF's key phrases)

def _ok_inputs():
    return make_inputs((2, 2, 2, 2), "NHWC")


@pytest.mark.parametrize("bad,match", [
    ("scale", "scale must have the same number of elements as the channels of x, got 3 and 2"),
    ("offset", "offset must have the same number of elements as the channels of x, got 3 and 2"),
])
def test_eager_shape_errors_scale_offset(bad, match):
    x, scale, offset, mean, var = _ok_inputs()
    args = dict(scale=scale, offset=offset)
    args[bad] = torch.ones(3)
    with pytest.raises(RuntimeError, match=match):
        fbn(x, args["scale"], args["offset"], mean, var, 1e-3, 1.0, "NHWC", True)


@pytest.mark.parametrize("which", ["mean", "variance"])
@pytest.mark.parametrize("training,eaf,prefix", [(False, 1.0, "When is_training=false"),
                                                 (True, 0.5, "When exponential_avg_factor != 1")])
def test_eager_shape_errors_statistics(which, training, eaf, prefix):
    x, scale, offset, mean, var = _ok_inputs()
    e = torch.empty(0)
    m, v = (e, var) if which == "mean" else (mean, e)
    with pytest.raises(RuntimeError, match=f"{prefix}, {which} must have the same number of elements as the channels of x, got 0 and 2"):
        fbn(x, scale, offset, m, v, 1e-3, eaf, "NHWC", training)


def test_training_ignores_statistics_when_eaf_is_one():
    x, scale, offset, _, _ = _ok_inputs()
    a = fbn(x, scale, offset, torch.ones(7), torch.ones(5), 1e-3, 1.0, "NHWC", True)
    b = fbn(x, scale, offset, torch.empty(0), torch.empty(0), 1e-3, 1.0, "NHWC", True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("args,match", [
    (dict(x=torch.ones(2, 2, 2)), r"input must be 4 or 5-dimensional, got shape \[2, 2, 2\]"),
    (dict(scale=torch.ones(2, 1)), "scale must be 1-dimensional"),
    (dict(offset=torch.ones(1, 2)), "offset must be 1-dimensional"),
    (dict(mean=torch.ones(2, 1)), "estimated_mean must be 1-dimensional"),
    (dict(variance=torch.ones(2, 1)), "estimated_variance must be 1-dimensional"),
    (dict(x=torch.ones(2, 2, 2, 2, 2)), "x must be 4-dimensional for data_format 'NHWC', got rank 5"),
    (dict(fmt="NCDHW"), "x must be 5-dimensional for data_format 'NCDHW', got rank 4"),
    (dict(scale=torch.ones(2, dtype=torch.float64)), "scale must have dtype Float"),
    (dict(x=torch.ones(2, 2, 2, 2, dtype=torch.int32)), "x must be float32, float64, float16 or bfloat16, got Int"),
    (dict(x=torch.ones(2, 2, 2, 2, dtype=torch.float64)), "scale must have dtype Double"),
])
def test_forward_validation(args, match):
    x, scale, offset, mean, var = _ok_inputs()
    a = dict(x=x, scale=scale, offset=offset, mean=mean, variance=var, fmt="NHWC")
    a.update(args)
    with pytest.raises(RuntimeError, match=match):
        fbn(a["x"], a["scale"], a["offset"], a["mean"], a["variance"], 1e-3, 1.0, a["fmt"], False)


def test_bad_data_format_is_value_error():
    x, scale, offset, mean, var = _ok_inputs()
    with pytest.raises(ValueError, match="data_format must be one of NHWC, NCHW, NDHWC, NCDHW, got 'NWHC'"):
        fbn(x, scale, offset, mean, var, 1e-3, 1.0, "NWHC", True)


@pytest.mark.parametrize("args,match", [
    (dict(dy=torch.ones(2, 2, 2, 3)), r"x and y_backprop must have same shape, but x has shape \[2, 2, 2, 2\] "
                                      r"and y_backprop has shape \[2, 2, 2, 3\]"),
    (dict(scale=torch.ones(3)), "scale must have the same number of elements as the channels of x, got 3 and 2"),
    (dict(rs1=torch.ones(3)), "reserve_space_1 must have the same number of elements as the channels of x, got 3 and 2"),
    (dict(rs2=torch.ones(3)), "reserve_space_2 must have the same number of elements as the channels of x, got 3 and 2"),
    (dict(rs1=torch.ones(2, 1)), "saved mean .* must be 1-dimensional"),
    (dict(rs2=torch.ones(2, 1)), "saved variance .* must be 1-dimensional"),
    (dict(dy=torch.ones(2, 2, 2)), "y_backprop: input must be 4 or 5-dimensional"),
    (dict(dy=torch.ones(2, 2, 2, 2, dtype=torch.float64)), "y_backprop must have x's dtype"),
    (dict(fmt="NDHWC"), "x must be 5-dimensional for data_format 'NDHWC'"),
])
def test_grad_validation(args, match):
    x = torch.ones(2, 2, 2, 2)
    a = dict(dy=torch.ones(2, 2, 2, 2), scale=torch.ones(2), rs1=torch.ones(2), rs2=torch.ones(2), fmt="NHWC")
    a.update(args)
    with pytest.raises(RuntimeError, match=match):
        fbn_grad(a["dy"], x, a["scale"], a["rs1"], a["rs2"], torch.ones(5, 5), 1e-3, a["fmt"], True)



def test_mixed_meta_and_cpu_tensors_are_refused():
    # A meta tensor beside CPU data dispatches to the fake kernels, which used to return CPU tensors of
    # uninitialised memory; the fakes also check dtypes like the real kernels (for torch.compile).
    x, v = torch.ones(2, 2, 2, 3), torch.ones(3)
    with pytest.raises(RuntimeError, match="estimated_variance must be on x's device cpu, got meta"):
        torch.ops.torchops.fused_batch_norm_v3(x, v, v, v, v.to("meta"), 1e-3, 1.0, "NHWC", True)
    with pytest.raises(RuntimeError, match="reserve_space_3 must be on x's device cpu or the CPU, got meta"):
        fbn_grad(x, x, v, v, v, torch.ones(1, device="meta"), 1e-3, "NHWC", True)
    m = torch.ones(2, 2, 2, 3, device="meta")
    vm = torch.ones(3, device="meta")
    out = fbn_grad(m, m, vm, vm, vm, torch.ones(1), 1e-3, "NHWC", True)  # a CPU placeholder is fine
    assert out[0].device.type == "meta" and out[0].shape == m.shape
    with pytest.raises(RuntimeError, match="y_backprop must have x's dtype"):
        fbn_grad(m.double(), m, vm, vm, vm, vm, 1e-3, "NHWC", True)
    with pytest.raises(RuntimeError, match="x must be float32, float64, float16 or bfloat16, got torch.int64"):
        torch.ops.torchops.fused_batch_norm_v3(m.long(), vm, vm, vm, vm, 1e-3, 1.0, "NHWC", True)

def test_functional_wrapper_is_tf_nn_fused_batch_norm():
    x, scale, offset, mean, var = make_inputs((2, 3, 4, 5), "NHWC", torch.float64)
    y, m, v = torchops.functional.fused_batch_norm(x, scale, offset)
    want = ref_forward(x, scale, offset, None, None, 1e-3, 1.0, "NHWC", True)  # default epsilon 0.001
    for a, b in zip((y, m, v), want):
        torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="Both `mean` and `variance` must be a 1D tensor"):
        torchops.functional.fused_batch_norm(x, scale, offset, is_training=False)
    with pytest.raises(ValueError, match="Both `mean` and `variance` must be a 1D tensor"):
        torchops.functional.fused_batch_norm(x, scale, offset, mean, None, exponential_avg_factor=0.5)
    scripted = torch.jit.script(torchops.functional.fused_batch_norm)
    torch.testing.assert_close(scripted(x, scale, offset, mean, var, 0.001, 1.0, "NHWC", False)[0],
                               ref_forward(x, scale, offset, mean, var, 1e-3, 1.0, "NHWC", False)[0])


# ---------------------------------------------------------------- opcheck, compile, script

@pytest.mark.parametrize("fmt,shape", [("NHWC", (2, 3, 4, 5)), ("NCHW", (2, 3, 4, 5)), ("NCDHW", (2, 3, 2, 2, 2))])
@pytest.mark.parametrize("training", [True, False])
def test_opcheck(fmt, shape, training):
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float64)
    args = (x.requires_grad_(), scale.requires_grad_(), offset.requires_grad_(), mean, var, 1e-3, 0.5, fmt, training)
    torch.library.opcheck(fbn.default, args)
    _, _, _, rs1, rs2, rs3 = fbn(*args)
    dy = torch.randn(shape, dtype=torch.float64)
    gargs = (dy, x.detach(), scale.detach(), rs1, rs2, rs3, 1e-3, fmt, training)
    torch.library.opcheck(fbn_grad.default, gargs)


def test_opcheck_channels_last():
    x, scale, offset, mean, var = make_inputs((2, 3, 4, 5), "NCHW", torch.float32)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    torch.library.opcheck(fbn.default, (x, scale, offset, mean, var, 1e-3, 1.0, "NCHW", True))


@pytest.mark.parametrize("fmt,training", [("NHWC", True), ("NCHW", False), ("NCHW", True)])
def test_compile_fullgraph_forward_backward_matches_eager(fmt, training):
    torch._dynamo.reset()

    def f(x, scale, offset, mean, var):
        y, bm, bv, _, _, _ = fbn(x, scale, offset, mean, var, 1e-3, 0.5, fmt, training)
        return (y * y).sum(), bm, bv

    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        ins = _grad_inputs(fmt, (2, 3, 4, 5), "cpu", seed=13)
        loss, bm, bv = fn(*ins)
        loss.backward()
        results.append([loss, bm, bv] + [t.grad for t in ins[:3]])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_torchscript_function_forward_backward():
    @torch.jit.script
    def f(x, scale, offset, mean, var):
        return torch.ops.torchops.fused_batch_norm_v3(x, scale, offset, mean, var, 0.001, 1.0, "NCHW", True)[0]

    ins = _grad_inputs("NCHW", (2, 3, 2, 2), "cpu")
    assert "torchops::fused_batch_norm_v3" in str(f.graph)
    assert gradcheck(f, ins, eps=1e-6, atol=1e-6)
    assert gradgradcheck(f, ins, eps=1e-6, atol=1e-5)


# ---------------------------------------------------------------- CPU vs CUDA parity

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt,shape", [("NHWC", (4, 7, 9, 33)), ("NCHW", (4, 33, 7, 9)), ("NCDHW", (2, 5, 3, 4, 6)),
                                       ("NHWC", (1, 1, 1, 1)), ("NCHW", (64, 3, 50, 50))])
@pytest.mark.parametrize("training", [True, False])
def test_cuda_matches_cpu(dtype, fmt, shape, training):
    x, scale, offset, mean, var = make_inputs(shape, fmt, dtype, seed=21)
    dy = torch.randn(shape).to(dtype)
    cpu = fbn(x, scale, offset, mean, var, 1e-3, 0.7, fmt, training)
    gpu = fbn(*(t.cuda() for t in (x, scale, offset, mean, var)), 1e-3, 0.7, fmt, training)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a, atol=tol, rtol=tol, equal_nan=True)
    gcpu = fbn_grad(dy, x, scale, cpu[3], cpu[4], cpu[5], 1e-3, fmt, training)
    ggpu = fbn_grad(dy.cuda(), x.cuda(), scale.cuda(), cpu[3].cuda(), cpu[4].cuda(), cpu[5].cuda(), 1e-3, fmt, training)
    for a, b in zip(gcpu, ggpu):
        torch.testing.assert_close(b.cpu(), a, atol=tol * 10, rtol=tol * 10)


# ---------------------------------------------------------------- CUDA: the cuDNN route and the vectorized inference

CUDNN_CASES = [("NHWC", (8, 7, 9, 32)), ("NCHW", (8, 32, 7, 9)), ("NCHW_CL", (8, 32, 7, 9)),
               ("NDHWC", (4, 3, 5, 6, 16)), ("NCDHW", (4, 16, 3, 5, 6)), ("NCHW", (16, 8, 40, 40))]


def _gpu_inputs(fmt, shape, dtype, seed):
    """CPU inputs, their CUDA copies (NCHW_CL: NCHW data in channels_last memory) and the op's data_format."""
    op_fmt = "NCHW" if fmt == "NCHW_CL" else fmt
    cpu = make_inputs(shape, op_fmt, dtype, seed=seed)
    gpu = [t.cuda() for t in cpu]
    if fmt == "NCHW_CL":
        gpu[0] = gpu[0].contiguous(memory_format=torch.channels_last)
    return cpu, gpu, op_fmt


def _aten_ops(fn):
    """The names of the aten ops fn() runs (the profiler records every dispatched op, C++ calls included)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events()}


def _fwd_bwd(x, scale, offset, mean, var, dy, fmt, eaf, training):
    """The op's outputs (reserve_space_3 left out: its contents are the route's) and the autograd gradients."""
    x, scale, offset = (t.detach().clone().requires_grad_() for t in (x, scale, offset))
    out = fbn(x, scale, offset, mean, var, 1e-3, eaf, fmt, training)
    grads = torch.autograd.grad(out[0], (x, scale, offset), dy)
    return [t.detach() for t in out[:5]], list(grads)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt,shape", CUDNN_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("eaf", [1.0, 0.6])
@pytest.mark.parametrize("route", ["on", "off"])
def test_cuda_cudnn_route_matches_cpu(set_routes, fmt, shape, dtype, eaf, route):
    set_routes({"fused_batch_norm.cuda.cudnn": route == "on"})
    cpu, gpu, op_fmt = _gpu_inputs(fmt, shape, dtype, seed=3)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(4)).to(dtype)
    dy_gpu = dy.cuda()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want_out, want_grads = _fwd_bwd(*cpu, dy, op_fmt, eaf, True)
        got_out, got_grads = _fwd_bwd(*gpu, dy_gpu, op_fmt, eaf, True)
        ops = _aten_ops(lambda: _fwd_bwd(*gpu, dy_gpu, op_fmt, eaf, True))
    for name, a, b in zip(["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"], want_out,
                          got_out):
        torch.testing.assert_close(b.cpu(), a, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")
    layout = torch.channels_last if fmt == "NCHW_CL" else torch.contiguous_format
    assert got_out[0].is_contiguous(memory_format=layout) and got_grads[0].is_contiguous(memory_format=layout)
    for name, a, b in zip(["x", "scale", "offset"], want_grads, got_grads):
        torch.testing.assert_close(b.cpu(), a, atol=tol * 10, rtol=tol * 10, msg=lambda m: f"d{name}: {m}")
    channels_first = fmt in ("NCHW", "NCDHW")
    plane = int(np.prod(shape[2:])) if channels_first else 0
    expect_cudnn = route == "on" and (not channels_first or plane < 1024)
    assert ("aten::cudnn_batch_norm" in ops) == expect_cudnn, sorted(ops)
    assert ("aten::cudnn_batch_norm_backward" in ops) == expect_cudnn, sorted(ops)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt,shape", CUDNN_CASES[:4])
def test_cuda_cudnn_disabled_takes_own_kernels_with_same_results(set_routes, fmt, shape):
    set_routes({"fused_batch_norm.cuda.cudnn": True, "fused_batch_norm.cuda.cudnn_inference": True})
    cpu, gpu, op_fmt = _gpu_inputs(fmt, shape, torch.float32, seed=5)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(6))
    for training in (True, False):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            on_out, on_grads = _fwd_bwd(*gpu, dy.cuda(), op_fmt, 0.6, training)
            on_ops = _aten_ops(lambda: _fwd_bwd(*gpu, dy.cuda(), op_fmt, 0.6, training))
        with torch.backends.cudnn.flags(enabled=False):
            off_out, off_grads = _fwd_bwd(*gpu, dy.cuda(), op_fmt, 0.6, training)
            off_ops = _aten_ops(lambda: _fwd_bwd(*gpu, dy.cuda(), op_fmt, 0.6, training))
        want_out, want_grads = _fwd_bwd(*cpu, dy, op_fmt, 0.6, training)
        assert "aten::cudnn_batch_norm" in on_ops
        assert "aten::cudnn_batch_norm" not in off_ops and "aten::cudnn_batch_norm_backward" not in off_ops
        for a, b, c in zip(want_out + want_grads, on_out + on_grads, off_out + off_grads):
            torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(c.cpu(), a, atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
def test_cuda_cudnn_reserve_spaces_and_grad_op_with_either_reserve(set_routes):
    """The cuDNN forward keeps the contract's reserve_space_1/2 (batch mean, biased variance) and puts cuDNN's
    bytes in a float32 reserve_space_3; the grad op gives the same gradients with that reserve or the own
    kernels' [0] (then it runs its own kernels where cuDNN needs its reserve)."""
    set_routes({"fused_batch_norm.cuda.cudnn": True})
    cpu, gpu, _ = _gpu_inputs("NHWC", (6, 5, 7, 24), torch.float32, seed=7)
    x = gpu[0]
    out = fbn(*gpu, 1e-3, 1.0, "NHWC", True)
    flat = x.double().reshape(-1, 24)
    torch.testing.assert_close(out[3].double(), flat.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[4].double(), flat.var(0, unbiased=False), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[2].double(), flat.var(0, unbiased=True), atol=1e-5, rtol=1e-5)
    assert out[5].dtype == torch.float32 and out[5].dim() == 1
    dy = torch.randn_like(x)
    with_reserve = fbn_grad(dy, x, gpu[1], out[3], out[4], out[5], 1e-3, "NHWC", True)
    with_empty = fbn_grad(dy, x, gpu[1], out[3], out[4], torch.empty(0, device="cuda"), 1e-3, "NHWC", True)
    want = fbn_grad(dy.cpu(), cpu[0], cpu[1], out[3].cpu(), out[4].cpu(), torch.empty(0), 1e-3, "NHWC", True)
    for a, b, c in zip(want[:3], with_reserve[:3], with_empty[:3]):
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(c.cpu(), a, atol=1e-4, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt,shape", [("NCHW", (2, 3, 4, 4))])
def test_cuda_float64_never_cudnn_and_gradcheck(set_routes, fmt, shape):
    set_routes({"fused_batch_norm.cuda.cudnn": True, "fused_batch_norm.cuda.cudnn_inference": True})
    for training in (True, False):
        inputs = _grad_inputs(fmt, shape, "cuda")
        f = _fwd_y(fmt, training, 0.4, False)
        ops = _aten_ops(lambda: torch.autograd.grad(f(*inputs).sum(), inputs[:3]))
        assert not any(o.startswith("aten::cudnn_batch_norm") for o in ops), sorted(ops)
        assert gradcheck(f, inputs, eps=1e-6, atol=1e-6)
        assert gradgradcheck(f, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.parametrize("inference", ["plain", "vectorized", "cudnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,shape,offset", [
    ("NHWC", (4, 5, 6, 32), 0),    # channels-last rows, C % vector width == 0
    ("NHWC", (4, 5, 6, 7), 0),     # C not a multiple of the vector width: plain kernel
    ("NCHW", (4, 7, 6, 8), 0),     # planes of 48
    ("NCHW", (4, 7, 5, 5), 0),     # planes of 25: plain kernel
    ("NCHW", (4, 7, 6, 8), 1),     # x one element past an aligned address: plain kernel
    ("NCHW_CL", (4, 16, 6, 8), 0),
    ("NCDHW", (2, 5, 4, 4, 4), 0),
])
def test_cuda_inference_matches_cpu(set_routes, inference, dtype, fmt, shape, offset):
    set_routes({"fused_batch_norm.cuda.cudnn_inference": inference == "cudnn", "fused_batch_norm.cuda.vectorized": inference == "vectorized"})
    cpu, gpu, op_fmt = _gpu_inputs(fmt, shape, dtype, seed=8)
    if offset:
        buf = torch.empty(gpu[0].numel() + offset, dtype=dtype, device="cuda")
        buf[offset:].copy_(gpu[0].reshape(-1))
        gpu[0] = buf[offset:].view(shape)
        assert gpu[0].data_ptr() % 16 != 0
    want = fbn(*cpu, 1e-3, 1.0, op_fmt, False)
    ops = _aten_ops(lambda: fbn(*gpu, 1e-3, 1.0, op_fmt, False))
    got = fbn(*gpu, 1e-3, 1.0, op_fmt, False)
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for a, b in zip(want[:5], got[:5]):
        torch.testing.assert_close(b.cpu(), a, atol=tol, rtol=tol)
    runs_cudnn = inference == "cudnn" and dtype != torch.bfloat16
    assert ("aten::cudnn_batch_norm" in ops) == runs_cudnn, sorted(ops)


@pytest.mark.cuda
@pytest.mark.parametrize("vectorized", [True, False])
@pytest.mark.parametrize("fmt,shape", [("NHWC", (4, 5, 6, 32)), ("NCHW", (4, 7, 6, 8))])
def test_cuda_normalize_routes_ran(set_routes, vectorized, fmt, shape):
    """The element-wise pass runs the route asked for (the vectorized kernel only where it is on)."""
    set_routes({"fused_batch_norm.cuda.cudnn": False, "fused_batch_norm.cuda.cudnn_inference": False, "fused_batch_norm.cuda.vectorized": vectorized})
    _, gpu, op_fmt = _gpu_inputs(fmt, shape, torch.float32, seed=9)
    ran = "fused_batch_norm.cuda." + ("vectorized" if vectorized else "plain")
    before = torchops.backends.hits(ran)
    for training in (True, False):
        fbn(*gpu, 1e-3, 1.0, op_fmt, training)
    assert torchops.backends.hits(ran) - before == 2


@pytest.mark.cuda
@pytest.mark.parametrize("route", ["on", "off"])
@pytest.mark.parametrize("fmt,shape", [("NHWC", (4, 5, 6, 16)), ("NCHW", (4, 16, 5, 6))])
def test_cuda_opcheck_on_each_route(set_routes, route, fmt, shape):
    """The fake kernels describe what each CUDA route returns (reserve_space_3 included)."""
    set_routes({"fused_batch_norm.cuda.cudnn": route == "on"})
    x, scale, offset, mean, var = make_inputs(shape, fmt, torch.float32, "cuda", seed=14)
    args = (x.requires_grad_(), scale.requires_grad_(), offset.requires_grad_(), mean, var, 1e-3, 0.5, fmt, True)
    torch.library.opcheck(fbn.default, args)
    _, _, _, rs1, rs2, rs3 = fbn(*args)
    gargs = (torch.randn_like(x), x.detach(), scale.detach(), rs1, rs2, rs3, 1e-3, fmt, True)
    torch.library.opcheck(fbn_grad.default, gargs)


@pytest.mark.cuda
def test_cuda_compile_inductor_cudnn_route_matches_eager(set_routes):
    set_routes({"fused_batch_norm.cuda.cudnn": True})
    torch._dynamo.reset()

    def f(x, scale, offset, mean, var):
        y, bm, bv, _, _, _ = fbn(x, scale, offset, mean, var, 1e-3, 0.5, "NHWC", True)
        return (y * y).sum(), bm, bv

    results = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        x, scale, offset, mean, var = make_inputs((4, 5, 6, 16), "NHWC", torch.float32, "cuda", seed=15)
        ins = [x.requires_grad_(), scale.requires_grad_(), offset.requires_grad_(), mean, var]
        loss, bm, bv = fn(*ins)
        loss.backward()
        results.append([loss, bm, bv] + [t.grad for t in ins[:3]])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
