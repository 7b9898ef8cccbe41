"""CudnnRNN's cuDNN route (csrc/cudnn_rnn/cudnn_route.cpp): its glue (weight list, flat weight buffer, sorting and
packing of variable lengths, rows left out, reserve ownership) runs in CPU CI over a CPU stand-in of cuDNN that
keeps the vendor's contract (the test-only route cudnn_rnn.cpu.cudnn_standin), and on a GPU over cuDNN itself
(cudnn_rnn.cuda.cudnn, skipped without one). Every test asserts which route ran."""
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
