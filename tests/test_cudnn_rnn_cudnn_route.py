"""CudnnRNN's cuDNN route (csrc/cudnn_rnn/cudnn_route.cpp): its glue (weight list, flat weight buffer, sorting and
packing of variable lengths, rows left out, reserve ownership) runs in CPU CI over a CPU stand-in of cuDNN that
keeps the vendor's contract (the test-only route cudnn_rnn.cpu.cudnn_standin), and on a GPU over cuDNN itself
(cudnn_rnn.cuda.cudnn, skipped without one). Every test asserts which route ran."""
import warnings

import pytest
import torch

import torchops
from torchops import functional as F
from conftest import forced_route
from test_cudnn_rnn import MODES, _train_step, direction, params_of, states, torch_module

ROUTE = {"cpu": "cudnn_rnn.cpu.cudnn_standin", "cuda": "cudnn_rnn.cuda.cudnn"}
LOOPS = {"cpu": "cudnn_rnn.cpu.loops", "cuda": "cudnn_rnn.cuda.loops"}
DEVICES = ["cpu", "cuda"]  # (the "cuda" cases carry the cuda marker and need a GPU: conftest.py)
hits = torchops.backends.hits


def need(device):
    if device == "cuda" and not torchops.built_with_cuda():
        pytest.skip("needs a CUDA build")


class only_route:
    """forced_route(ROUTE[device]) that also asserts the loops never ran inside (a silent fallback fails)."""

    def __init__(self, device):
        self.device, self.inner = device, forced_route(ROUTE[device])

    def __enter__(self):
        self.loops = hits(LOOPS[self.device])
        return self.inner.__enter__()

    def __exit__(self, *exc):
        r = self.inner.__exit__(*exc)
        if exc[0] is None:
            assert hits(LOOPS[self.device]) == self.loops, f"{LOOPS[self.device]} ran instead of {ROUTE[self.device]}"
        return r


def _case(mode, layers, bi, t=6, b=5, i=7, h=8, proj=0):
    m = torch_module(mode, i, h, layers, bi, proj=proj, dtype=torch.float32)
    p = params_of(m).detach()
    x = torch.randn(t, b, i, generator=torch.Generator().manual_seed(3))
    h0, c0 = states(mode, layers, 2 if bi else 1, b, h, proj or h, dtype=torch.float32)
    return x, h0, c0, p


def _close(got, want, tol=2e-4):
    assert len(got) == len(want)
    for u, v in zip(got, want):
        torch.testing.assert_close(u, v, rtol=tol, atol=tol)


def test_standin_route_is_test_only_and_off_by_default():
    r = {r["id"]: r for r in torchops.backends.routes()}["cudnn_rnn.cpu.cudnn_standin"]
    assert not r["default"] and not r["fallback"] and r["verified"] and "test-only" in r["covers"]
    ids = [q["id"] for q in torchops.backends.routes() if (q["family"], q["slot"], q["device"]) ==
           ("cudnn_rnn", "sequence", "cpu")]
    assert ids.index("cudnn_rnn.cpu.cudnn_standin") == len(ids) - 2  # right before the loops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layers,bi", [(1, False), (2, True)])
@pytest.mark.parametrize("varlen", [False, True])
def test_route_matches_the_loops(device, mode, layers, bi, varlen):
    # Forward and backward through the route equal the time loops; variable lengths are packed (unsorted, one
    # empty row, which cuDNN does not run), batch-major data is transposed.
    need(device)
    x, h0, c0, p = _case(mode, layers, bi)
    lens = torch.tensor([3, 6, 0, 6, 1], dtype=torch.int32) if varlen else None
    with only_route(device):
        got = _train_step(mode, bi, device, x, h0, c0, p, lens=lens)
        bm = _train_step(mode, bi, device, x.transpose(0, 1), h0.transpose(0, 1),
                         c0.transpose(0, 1) if mode == "lstm" else c0, p, time_major=False, lens=lens)
    with forced_route(LOOPS[device]):
        want = _train_step(mode, bi, device, x, h0, c0, p, lens=lens)
    _close(got, want)
    for k in (0, 1, 2, 3) + ((5,) if mode == "lstm" else ()):
        bm[k] = bm[k].transpose(0, 1)
    _close(bm, want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_second_backward_from_the_same_reserve_is_exact(device):
    # cuDNN's backward overwrites the reserve it gets: backprop called twice on one reserve_space, and autograd
    # with retain_graph, must give the first gradients again.
    need(device)
    x, h0, c0, p = (v.to(device) for v in _case("lstm", 2, False))
    with only_route(device):
        y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "lstm")
        g = torch.Generator().manual_seed(5)
        dy, dh, dc = (torch.randn(v.shape, generator=g).to(device) for v in (y, hn, cn))
        args = (x, h0, c0, p, y, hn, cn, dy, dh, dc)
        first = F.cudnn_rnn_backprop(*args, res, "lstm")
        second = F.cudnn_rnn_backprop(*args, res, "lstm")
        xs, ps = x.clone().requires_grad_(), p.clone().requires_grad_()
        yo, hno, cno, _ = F.cudnn_rnn(xs, h0, c0, ps, "lstm")
        loss = (yo * dy).sum() + (hno * dh).sum() + (cno * dc).sum()
        g1 = torch.autograd.grad(loss, [xs, ps], retain_graph=True)
        g2 = torch.autograd.grad(loss, [xs, ps])
    _close(second, first, tol=0)
    _close(g2, g1, tol=0)
    _close(g1, [first[0], first[3]], tol=1e-5)
    with forced_route(LOOPS[device]):
        y2, hn2, cn2, res2 = F.cudnn_rnn(x, h0, c0, p, "lstm")
        want = F.cudnn_rnn_backprop(*args, res2, "lstm")
    _close(first, want)


@pytest.mark.parametrize("device", DEVICES)
def test_a_copied_reserve_recomputes_with_the_loops(device):
    # A copy of reserve_space does not carry cuDNN's state: the loops recompute the forward, same gradients.
    need(device)
    x, h0, c0, p = (v.to(device) for v in _case("gru", 1, True))
    with only_route(device):
        y, hn, cn, res = F.cudnn_rnn(x, h0, c0, p, "gru", direction="bidirectional")
        args = (x, h0, c0, p, y, hn, cn, torch.ones_like(y), torch.ones_like(hn), cn)
        want = F.cudnn_rnn_backprop(*args, res, "gru", direction="bidirectional")
    with forced_route(LOOPS[device]):
        got = F.cudnn_rnn_backprop(*args, res.clone(), "gru", direction="bidirectional")
    _close(got[:2] + got[3:], want[:2] + want[3:])


@pytest.mark.parametrize("device", DEVICES)
def test_projection_runs_the_route_below_num_units_and_the_loops_at_num_units(device):
    # cuDNN disables the projection at num_proj == num_units (its weight list then has no slot for it): the
    # route leaves that case to the loops instead of failing; a smaller projection runs on the route.
    need(device)
    x, h0, c0, p = _case("lstm", 2, True, proj=3)
    with only_route(device):
        got = _train_step("lstm", True, device, x, h0, c0, p, proj=3)
    with forced_route(LOOPS[device]):
        want = _train_step("lstm", True, device, x, h0, c0, p, proj=3)
    _close(got, want)

    h = 6
    size = int(F.cudnn_rnn_params_size(1, h, 4, torch.float32, torch.int64, "lstm", num_proj=h))
    p = torch.empty(size).uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(7))
    x = torch.randn(5, 3, 4)
    h0, c0 = states("lstm", 1, 1, 3, h, h, dtype=torch.float32)
    route, loops = hits(ROUTE[device]), hits(LOOPS[device])
    with forced_route(ROUTE[device], check=False):
        got = _train_step("lstm", False, device, x, h0, c0, p, proj=h)
    assert hits(ROUTE[device]) == route and hits(LOOPS[device]) > loops
    with forced_route(LOOPS[device]):
        want = _train_step("lstm", False, device, x, h0, c0, p, proj=h)
    _close(got, want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("is_training", [True, False])
def test_forward_passes_a_flat_weight_buffer(device, is_training, capfd):
    # Without a flat weight buffer, ATen's cuDNN forward warns and copies the weights on every call. (Called from
    # an op's kernel, its TORCH_WARN goes to stderr, not to Python's warnings.)
    need(device)
    x, h0, c0, p = (v.to(device) for v in _case("lstm", 2, True))
    capfd.readouterr()
    with only_route(device), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            F.cudnn_rnn(x, h0, c0, p, "lstm", direction="bidirectional", is_training=is_training)
    err = capfd.readouterr().err
    assert "contiguous chunk" not in err + "".join(str(w.message) for w in caught), err


def test_training_keeps_one_reserve_buffer():
    # The loop-sized reserve_space and cuDNN's reserve share one buffer: what a training forward leaves allocated
    # is its outputs, that buffer, and the copies of cuDNN's outputs and weights its backward reads.
    from torch.profiler import ProfilerActivity, profile

    x, h0, c0, p = _case("lstm", 2, False, t=20, b=8, h=32)
    full = torch.full([x.size(1)], x.size(0), dtype=torch.int32)
    args = (x, h0, c0, p, full, "lstm", "linear_input", "unidirectional", 0.0, 0, 0, 0, True, True)
    with forced_route(ROUTE["cpu"]):
        torch.ops.torchops.cudnn_rnn_v3(*args)  # (warm-up: nothing cached at first use is counted)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            y, hn, cn, res, host = torch.ops.torchops.cudnn_rnn_v3(*args)
    held = max(e.cpu_memory_usage for e in prof.events() if e.name == "torchops::cudnn_rnn_v3")
    outputs = sum(t.untyped_storage().nbytes() for t in (y, hn, cn, res, host))
    state = y.nbytes + hn.nbytes + cn.nbytes + p.nbytes  # cuDNN's outputs and its flat weight buffer
    assert held - outputs <= state + 4096, (held, outputs, state)


@pytest.mark.parametrize("device", ["cuda"])
def test_cuda_lengths_are_copied_to_the_host_once(device):
    # The route packs the lengths the orchestration already copied to the host (no second device-to-host sync).
    need(device)
    from torch.profiler import ProfilerActivity, profile

    x, h0, c0, p = (v.to(device) for v in _case("lstm", 1, False))
    lens = torch.tensor([3, 6, 0, 6, 1], dtype=torch.int32, device=device)
    with only_route(device):
        F.cudnn_rnn_v3(x, h0, c0, p, lens)  # (warm-up: cuDNN's plans)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            F.cudnn_rnn_v3(x, h0, c0, p, lens)
            torch.cuda.synchronize()
    d2h = [e for e in prof.events() if "Memcpy DtoH" in e.name]
    assert len(d2h) == 1, [e.name for e in d2h]
