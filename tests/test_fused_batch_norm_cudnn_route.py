"""FusedBatchNorm's cuDNN route (csrc/fused_batch_norm/cudnn_route.cpp): its glue (the channels-first view of
channels-last data, the cases it takes, the contract's statistics from cuDNN's, cuDNN's reserve carried in
reserve_space_3 and handed back to the backward) runs in CPU CI over a CPU stand-in of cuDNN's batch norm that keeps
the vendor's contract (the test-only route fused_batch_norm.cpu.cudnn_standin), and on a GPU over cuDNN itself
(fused_batch_norm.cuda.cudnn, skipped without one). Every test asserts which route ran."""
import pytest
import torch

import torchops
from conftest import forced_route
from test_fused_batch_norm import make_inputs

fbn, fbn_grad = torch.ops.torchops.fused_batch_norm_v3, torch.ops.torchops.fused_batch_norm_grad_v3
ROUTE = {"cpu": "fused_batch_norm.cpu.cudnn_standin", "cuda": "fused_batch_norm.cuda.cudnn"}
INFERENCE = {"cpu": "fused_batch_norm.cpu.cudnn_standin", "cuda": "fused_batch_norm.cuda.cudnn_inference"}
KERNELS = {"cpu": "fused_batch_norm.cpu.kernels", "cuda": "fused_batch_norm.cuda.kernels"}
DEVICES = ["cpu", "cuda"]  # (the "cuda" cases carry the cuda marker and need a GPU: conftest.py)
hits = torchops.backends.hits
# NCHW_CL: NCHW data in channels_last memory. Channels-first planes stay below the 1024 elements at which the
# route leaves training to torchops' kernels.
CASES = [("NHWC", (6, 5, 7, 24)), ("NCHW", (6, 24, 5, 7)), ("NCHW_CL", (6, 24, 5, 7)), ("NDHWC", (3, 4, 5, 6, 8)),
         ("NCDHW", (3, 8, 4, 5, 6))]


def need(device):
    if device == "cuda" and not torchops.built_with_cuda():
        pytest.skip("needs a CUDA build")


def _inputs(fmt, shape, dtype, device, seed=0):
    op_fmt = "NCHW" if fmt == "NCHW_CL" else fmt
    x, scale, offset, mean, var = make_inputs(shape, op_fmt, dtype, device, seed=seed)
    if fmt == "NCHW_CL":
        x = x.contiguous(memory_format=torch.channels_last)
    return [x, scale, offset, mean, var], op_fmt


def _fwd_bwd(inputs, fmt, eaf, dy, training=True):
    x, scale, offset = (t.detach().clone().requires_grad_() for t in inputs[:3])
    out = fbn(x, scale, offset, inputs[3], inputs[4], 1e-3, eaf, fmt, training)
    grads = torch.autograd.grad(out[0], (x, scale, offset), dy)
    return out, list(grads)


class only:
    """forced_route(route) that also asserts torchops' kernels never ran inside (a silent fallback fails)."""

    def __init__(self, route, device):
        self.device, self.inner = device, forced_route(route)

    def __enter__(self):
        self.kernels = hits(KERNELS[self.device])
        return self.inner.__enter__()

    def __exit__(self, *exc):
        r = self.inner.__exit__(*exc)
        if exc[0] is None:
            assert hits(KERNELS[self.device]) == self.kernels, f"{KERNELS[self.device]} ran instead of the route"
        return r


def test_standin_route_is_test_only_and_off_by_default():
    r = next(r for r in torchops.backends.routes() if r["id"] == ROUTE["cpu"])
    assert r["covers"].startswith("test only") and not r["default"] and not r["on"]
    assert not torchops.backends.is_enabled(ROUTE["cpu"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,shape", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("eaf", [1.0, 0.6])
def test_training_route_matches_the_kernels(device, fmt, shape, dtype, eaf):
    need(device)
    inputs, op_fmt = _inputs(fmt, shape, dtype, device, seed=1)
    dy = torch.randn(shape, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    with forced_route(KERNELS[device]):
        want_out, want_grads = _fwd_bwd(inputs, op_fmt, eaf, dy)
    with only(ROUTE[device], device):
        got_out, got_grads = _fwd_bwd(inputs, op_fmt, eaf, dy)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for name, a, b in zip(["y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2"], want_out,
                          got_out):
        torch.testing.assert_close(b, a, atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")
        assert b.dtype == a.dtype and b.shape == a.shape, name
    layout = torch.channels_last if fmt == "NCHW_CL" else torch.contiguous_format
    assert got_out[0].is_contiguous(memory_format=layout) and got_grads[0].is_contiguous(memory_format=layout)
    # reserve_space_3 carries the vendor's reserve as a float32 vector; the kernels keep none.
    assert got_out[5].dtype == torch.float32 and got_out[5].dim() == 1 and got_out[5].numel() > 0
    assert want_out[5].numel() == 0
    for name, a, b in zip(["x", "scale", "offset"], want_grads, got_grads):
        torch.testing.assert_close(b, a, atol=tol * 10, rtol=tol * 10, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,shape", CASES)
def test_inference_route_matches_the_kernels(device, fmt, shape):
    need(device)
    inputs, op_fmt = _inputs(fmt, shape, torch.float32, device, seed=3)
    with forced_route(KERNELS[device]):
        want = fbn(*inputs, 1e-3, 1.0, op_fmt, False)
    with only(INFERENCE[device], device):
        got = fbn(*inputs, 1e-3, 1.0, op_fmt, False)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_statistics_follow_the_op_contract(device):
    # The vendor saves the mean and the inverse std and updates running buffers with the unbiased variance; the
    # route still returns the contract's batch mean, biased variance (reserve_space_1/2) and the unbiased batch
    # variance, blended with the given statistics by exponential_avg_factor as TF does.
    need(device)
    inputs, _ = _inputs("NHWC", (6, 5, 7, 24), torch.float32, device, seed=4)
    flat = inputs[0].double().reshape(-1, 24)
    with only(ROUTE[device], device):
        out = fbn(*inputs, 1e-3, 0.25, "NHWC", True)
    torch.testing.assert_close(out[3].double(), flat.mean(0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[4].double(), flat.var(0, unbiased=False), atol=1e-5, rtol=1e-5)
    want_mean = inputs[3].double() * 0.75 + flat.mean(0) * 0.25
    want_var = inputs[4].double() * 0.75 + flat.var(0, unbiased=True) * 0.25
    torch.testing.assert_close(out[1].double(), want_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[2].double(), want_var, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_op_with_the_reserve_or_without_one(device):
    # With the forward's reserve the grad op runs the vendor's backward; with the kernels' [0] it runs the
    # kernels, which need only reserve_space_1/2; both give the same gradients.
    need(device)
    inputs, _ = _inputs("NHWC", (6, 5, 7, 24), torch.float32, device, seed=5)
    x, scale = inputs[0], inputs[1]
    dy = torch.randn_like(x)
    with forced_route(ROUTE[device]):
        out = fbn(*inputs, 1e-3, 1.0, "NHWC", True)
        kernels = hits(KERNELS[device])
        with_reserve = fbn_grad(dy, x, scale, out[3], out[4], out[5], 1e-3, "NHWC", True)
        assert hits(KERNELS[device]) == kernels
        with_empty = fbn_grad(dy, x, scale, out[3], out[4], torch.empty(0, device=device), 1e-3, "NHWC", True)
        assert hits(KERNELS[device]) == kernels + 1
    for a, b in zip(with_reserve[:3], with_empty[:3]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_standin_refuses_a_reserve_of_another_forward():
    # The stand-in keeps cuDNN's contract that the backward gets its own forward's reserve: one of another batch
    # is refused instead of giving silently wrong gradients.
    a, _ = _inputs("NHWC", (6, 5, 7, 24), torch.float32, "cpu", seed=6)
    b, _ = _inputs("NHWC", (6, 5, 7, 24), torch.float32, "cpu", seed=7)
    with forced_route(ROUTE["cpu"]):
        out_a = fbn(*a, 1e-3, 1.0, "NHWC", True)
        out_b = fbn(*b, 1e-3, 1.0, "NHWC", True)
        with pytest.raises(RuntimeError, match="not the one of the forward"):
            fbn_grad(torch.randn_like(a[0]), a[0], a[1], out_a[3], out_a[4], out_b[5], 1e-3, "NHWC", True)


@pytest.mark.parametrize("device", DEVICES)
def test_cases_the_route_leaves_to_the_kernels(device):
    # float64 and bfloat16, epsilon below cuDNN's minimum, torch.backends.cudnn disabled, channels-first planes
    # of 1024 elements or more in training, and one element per channel: the kernels run, the route does not.
    need(device)
    cases = [("NHWC", (6, 5, 7, 24), torch.float64, 1e-3, True, True),
             ("NHWC", (6, 5, 7, 24), torch.bfloat16, 1e-3, True, True),
             ("NHWC", (6, 5, 7, 24), torch.float32, 1e-6, True, True),
             ("NHWC", (6, 5, 7, 24), torch.float32, 1e-3, False, True),
             ("NCHW", (2, 8, 32, 32), torch.float32, 1e-3, True, True),
             ("NHWC", (1, 1, 1, 8), torch.float32, 1e-3, True, True)]
    for fmt, shape, dtype, eps, cudnn_on, training in cases:
        inputs, op_fmt = _inputs(fmt, shape, dtype, device, seed=8)
        with forced_route(ROUTE[device], check=False), torch.backends.cudnn.flags(enabled=cudnn_on):
            route, kernels = hits(ROUTE[device]), hits(KERNELS[device])
            fbn(*inputs, eps, 1.0, op_fmt, training)
            assert hits(ROUTE[device]) == route, (fmt, shape, dtype, eps, cudnn_on)
            assert hits(KERNELS[device]) == kernels + 1, (fmt, shape, dtype, eps, cudnn_on)


def test_standin_route_through_autograd_and_gradcheck():
    # The route's backward is the grad op's: autograd through it agrees with float64 finite differences of the
    # kernels' float64 forward at float32 tolerance (the route itself runs float32).
    inputs, _ = _inputs("NCHW", (4, 3, 5, 5), torch.float32, "cpu", seed=9)
    x, scale, offset = (t.detach().clone().requires_grad_() for t in inputs[:3])
    with only(ROUTE["cpu"], "cpu"):
        y = fbn(x, scale, offset, inputs[3], inputs[4], 1e-3, 1.0, "NCHW", True)[0]
        (y.square() * torch.linspace(0, 1, y.numel()).view_as(y)).sum().backward()
    xd, sd, od = (t.detach().double().requires_grad_() for t in inputs[:3])
    yd = fbn(xd, sd, od, inputs[3].double(), inputs[4].double(), 1e-3, 1.0, "NCHW", True)[0]
    (yd.square() * torch.linspace(0, 1, yd.numel(), dtype=torch.float64).view_as(yd)).sum().backward()
    for a, b in [(x.grad, xd.grad), (scale.grad, sd.grad), (offset.grad, od.grad)]:
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)
