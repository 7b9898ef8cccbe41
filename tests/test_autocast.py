"""Mixed precision: every family under torch.autocast, as torch.nn's layers behave there.

The RNN ops cast every floating argument to the autocast dtype (ATen's RNN policy), FusedBatchNorm keeps
`x`'s dtype and float32 statistics (TensorFlow's FusedBatchNormV3 contract, what torch.nn.BatchNorm2d gives
under autocast). References: the same op called outside autocast on explicitly cast inputs (bit-exact), the
same model in float32 (low-precision tolerances) and torch.nn's equivalents under the same autocast. CUDA
variants run when a GPU is present."""
import contextlib
import copy
import pathlib

import pytest
import torch
from torch import nn

import torchops  # noqa: F401
from torchops.nn import (BatchNorm2d, BatchNorm3d, BlockGRU, BlockLSTM, CudnnGRU, CudnnLSTM, CudnnRNNRelu,
                         CudnnRNNTanh, GRUBlockCell, LSTMBlockCell)

from conftest import CUDA, DEVICES, forced_route

ops = torch.ops.torchops
BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
# The CPU has float16 kernels for every torchops op and for Linear; torch.nn.LSTM has none (oneDNN refuses).
LOW = [BF16, F16]
# Relative tolerances of a few-step training run against float32 (bfloat16 keeps 8 mantissa bits).
TOL = {BF16: 5e-2, F16: 1e-2}

RNN_OPS = ["cudnn_rnn", "cudnn_rnn_v2", "cudnn_rnn_v3", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v2",
           "cudnn_rnn_backprop_v3", "gru_block_cell", "gru_block_cell_grad", "_gru_block_cell_backward", "block_gru",
           "block_gru_grad", "lstm_block_cell", "lstm_block_cell_grad", "_lstm_block_cell_backward", "block_lstm",
           "block_lstm_v2", "block_lstm_grad", "block_lstm_grad_v2", "_block_lstm_backward"]
BN_OPS = ["fused_batch_norm_v3", "fused_batch_norm_grad_v3"]


def autocast(device, dtype):
    return torch.autocast(torch.device(device).type, dtype=dtype)


def has_kernel(op, key):
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"torchops::{op}", key)


@pytest.mark.parametrize("op", RNN_OPS + BN_OPS)
def test_every_differentiable_op_has_autocast_kernels(op):
    assert has_kernel(op, "AutocastCPU") and has_kernel(op, "AutocastCUDA")


@pytest.mark.parametrize("op", ["cudnn_rnn_params_size", "cudnn_rnn_canonical_to_params", "batch", "unbatch"])
def test_dtype_agnostic_ops_have_no_autocast_kernel(op):
    # Layout converters and batching keep their inputs' dtypes (autocast falls through).
    assert not has_kernel(op, "AutocastCPU") and not has_kernel(op, "AutocastCUDA")


# ---------------------------------------------------------------------------------------------------------
# Raw ops: under autocast == the op on inputs cast by hand, outside autocast
# ---------------------------------------------------------------------------------------------------------

def _crnn_args(device, mode="lstm", T=4, B=3, I=5, H=6):
    g = torch.Generator().manual_seed(0)
    n = ops.cudnn_rnn_params_size(1, H, I, None, None, mode).item()
    x = torch.randn(T, B, I, generator=g)
    h = torch.randn(1, B, H, generator=g)
    c = torch.randn(1, B, H, generator=g)
    p = torch.randn(n, generator=g) * 0.3
    return [t.to(device) for t in (x, h, c, p)]


def _block_args(device, kind, T=4, B=3, I=5, C=6):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(device)  # noqa: E731
    seq = torch.tensor(T, dtype=torch.int64)
    if kind == "gru_block_cell":
        return [r(B, I), r(B, C), r(I + C, 2 * C), r(I + C, C), r(2 * C), r(C)], {}
    if kind == "block_gru":
        return [seq, r(T, B, I), r(B, C), r(I + C, 2 * C), r(I + C, C), r(2 * C), r(C)], {}
    if kind == "lstm_block_cell":
        return [r(B, I), r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C), r(4 * C)], dict(use_peephole=True)
    return [seq, r(T, B, I), r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C), r(4 * C)], dict(use_peephole=True)


def _cast(args, dtype):
    return [a.to(dtype) if a.is_floating_point() else a for a in args]


def _raw_cases(device):
    x, h, c, p = _crnn_args(device)
    lens = torch.full([3], 4, dtype=torch.int32, device=device)
    yield "cudnn_rnn", [x, h, c, p], {}
    yield "cudnn_rnn_v2", [x, h, c, p], {}
    yield "cudnn_rnn_v3", [x, h, c, p, lens], {}
    for kind in ("gru_block_cell", "block_gru", "lstm_block_cell", "block_lstm", "block_lstm_v2"):
        args, kw = _block_args(device, kind)
        yield kind, args, kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
def test_raw_rnn_ops_run_in_the_autocast_dtype(device, dtype):
    for name, args, kw in _raw_cases(device):
        op = getattr(ops, name)
        with autocast(device, dtype):
            got = op(*args, **kw)
        want = op(*_cast(args, dtype), **kw)
        for i, (a, b) in enumerate(zip(got, want)):
            assert a.dtype == b.dtype == (dtype if b.is_floating_point() else b.dtype), (name, i, a.dtype)
            if not (name.startswith("cudnn_rnn") and i >= 3):  # (reserve spaces: opaque, partly unwritten)
                torch.testing.assert_close(a, b, rtol=0, atol=0, msg=f"{name} output {i}")


@pytest.mark.parametrize("device", DEVICES)
def test_raw_rnn_ops_leave_float64_alone_under_autocast(device):
    # As ATen: float64 is never autocast.
    for name, args, kw in _raw_cases(device):
        args = _cast(args, F64)
        with autocast(device, BF16):
            got = getattr(ops, name)(*args, **kw)
        assert got[0].dtype == F64, name


@pytest.mark.parametrize("device", DEVICES)
def test_raw_rnn_op_gradients_reach_float32_leaves_in_float32(device):
    args, kw = _block_args(device, "block_lstm_v2")
    leaves = [a.requires_grad_() if a.is_floating_point() else a for a in args]
    with autocast(device, BF16):
        out = ops.block_lstm_v2(*leaves, **kw)
    assert out[6].dtype == BF16
    grads = torch.autograd.grad(out[6].float().sum(), [a for a in leaves if a.is_floating_point()])
    assert all(g.dtype == F32 for g in grads)
    # the same as differentiating the op on bfloat16 copies, then casting the gradients up
    copies = [a.detach().to(BF16).requires_grad_() if a.is_floating_point() else a for a in args]
    out_ref = ops.block_lstm_v2(*copies, **kw)
    ref = torch.autograd.grad(out_ref[6].float().sum(), [a for a in copies if a.is_floating_point()])
    for g, r in zip(grads, ref):
        torch.testing.assert_close(g, r.float(), rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_ops_cast_like_their_forward(device):
    args, kw = _block_args(device, "gru_block_cell")
    r, u, c, h = ops.gru_block_cell(*args)
    d_h = torch.ones_like(h)
    with autocast(device, BF16):
        got = ops.gru_block_cell_grad(*args, r, u, c, d_h)
    want = ops.gru_block_cell_grad(*_cast(args + [r, u, c, d_h], BF16))
    for a, b in zip(got, want):
        assert a.dtype == BF16
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_cudnn_rnn_backprop_casts_like_its_forward_and_keeps_reserve_space(device):
    x, h, c, p = _crnn_args(device)
    lens = torch.full([3], 4, dtype=torch.int32, device=device)
    with autocast(device, BF16):
        y, hn, cn, res, host = ops.cudnn_rnn_v3(x, h, c, p, lens)
    assert res.dtype == BF16
    grads = [torch.randn(t.shape, device=device) for t in (y, hn, cn)]
    with autocast(device, BF16):
        got = ops.cudnn_rnn_backprop_v3(x, h, c, p, lens, y, hn, cn, *grads, res, host)
    want = ops.cudnn_rnn_backprop_v3(*_cast([x, h, c, p, lens, y, hn, cn, *grads], BF16), res, host)
    for a, b in zip(got, want):
        assert a.dtype == BF16
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the opaque reserve space is not cast: one from a float32 forward is refused, saying what is expected
    res32 = ops.cudnn_rnn_v3(x, h, c, p, lens)[3]
    with autocast(device, BF16), pytest.raises(RuntimeError, match="reserve_space must be the 1-D BFloat16"):
        ops.cudnn_rnn_backprop_v3(x, h, c, p, lens, y, hn, cn, *grads, res32, host)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("x_dtype", ["low", F32])
def test_raw_fused_batch_norm_keeps_x_dtype_and_float32_statistics(device, dtype, x_dtype):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 4, 3, generator=g).to(device, dtype if x_dtype == "low" else F32)
    # low-precision scale and statistics are promoted to float32 (TF's contract), never cast down
    scale, offset = (torch.rand(3, generator=g) + 0.5).to(device, dtype), torch.randn(3, generator=g).to(device, dtype)
    mean, var = torch.randn(3).to(device), torch.rand(3).to(device) + 0.5
    for training in (True, False):
        with autocast(device, dtype):
            got = ops.fused_batch_norm_v3(x, scale, offset, mean, var, 1e-3, 0.5, "NHWC", training)
        want = ops.fused_batch_norm_v3(x, scale.float(), offset.float(), mean, var, 1e-3, 0.5, "NHWC", training)
        assert got[0].dtype == x.dtype and all(t.dtype == F32 for t in got[1:])
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    y, bm, bv, r1, r2, r3 = want
    dy = torch.randn_like(y)
    with autocast(device, dtype):
        got = ops.fused_batch_norm_grad_v3(dy, x, scale, r1.to(dtype), r2.to(dtype), r3, 1e-3, "NHWC", True)
    want = ops.fused_batch_norm_grad_v3(dy, x, scale.float(), r1.to(dtype).float(), r2.to(dtype).float(), r3, 1e-3,
                                        "NHWC", True)
    assert got[0].dtype == x.dtype and got[1].dtype == F32
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------
# Modules: a few training steps of Linear -> module -> Linear under autocast vs float32
# ---------------------------------------------------------------------------------------------------------

def _rnn_out(m, y):
    out = m(y)
    return out[0] if isinstance(out, tuple) else out


class Net(nn.Module):
    """Linear -> RNN -> Linear, the model of the issue; `cell` modules run over time in a Python loop."""

    def __init__(self, rnn, cell=False, I=6, H=8):
        super().__init__()
        self.inp, self.rnn, self.out, self.cell = nn.Linear(5, I), rnn, nn.Linear(H, 3), cell

    def forward(self, x):
        y = self.inp(x)
        if self.cell:
            h, outs = None, []
            for t in range(y.size(0)):
                h = self.rnn(y[t], h)
                outs.append(h[0] if isinstance(h, tuple) else h)
            z = torch.stack(outs)
        else:
            z = _rnn_out(self.rnn, y)
        self.rnn_dtype = z.dtype
        return self.out(z)


MODULES = {
    "CudnnLSTM": lambda: (CudnnLSTM(1, 8, 6), False),
    "CudnnLSTM-2layer-bi": lambda: (CudnnLSTM(2, 4, 6, direction="bidirectional"), False),
    "CudnnGRU": lambda: (CudnnGRU(1, 8, 6), False),
    "CudnnRNNTanh": lambda: (CudnnRNNTanh(1, 8, 6), False),
    "CudnnRNNRelu": lambda: (CudnnRNNRelu(1, 8, 6), False),
    "BlockLSTM": lambda: (BlockLSTM(6, 8), False),
    "BlockLSTM-v1-peephole": lambda: (BlockLSTM(6, 8, version=1, use_peephole=True, cell_clip=3.0), False),
    "BlockGRU": lambda: (BlockGRU(6, 8), False),
    "LSTMBlockCell": lambda: (LSTMBlockCell(6, 8, use_peephole=True), True),
    "GRUBlockCell": lambda: (GRUBlockCell(6, 8), True),
}


def _train(net, x, target, steps, device, dtype):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with autocast(device, dtype) if dtype is not None else torch.autocast(device, enabled=False):
            loss = nn.functional.mse_loss(net(x).float(), target)
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad.clone() for p in net.parameters()]
        opt.step()
    return losses, grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(MODULES))
def test_module_trains_under_autocast_like_float32(device, dtype, name):
    torch.manual_seed(0)
    rnn, cell = MODULES[name]()
    net = Net(rnn, cell).to(device)
    ref = Net(*MODULES[name]()).to(device)
    ref.load_state_dict(net.state_dict())
    x = torch.randn(7, 4, 5, device=device)
    target = torch.randn(7, 4, 3, device=device)
    losses, grads = _train(net, x, target, 3, device, dtype)
    assert net.rnn_dtype == dtype
    assert all(p.dtype == F32 for p in net.parameters()) and all(g.dtype == F32 for g in grads)
    ref_losses, ref_grads = _train(ref, x, target, 3, device, None)
    assert ref.rnn_dtype == F32
    tol = TOL[dtype]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=tol, atol=tol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=tol * 4, atol=tol * max(1.0, r.abs().max().item()))
    assert losses[-1] < losses[0]


# torchops module -> (torch.nn module, converter) with the same weights
TWINS = {"CudnnLSTM": (lambda: nn.LSTM(6, 8), CudnnLSTM.from_torch),
         "CudnnGRU": (lambda: nn.GRU(6, 8), CudnnGRU.from_torch),
         "CudnnRNNTanh": (lambda: nn.RNN(6, 8), CudnnRNNTanh.from_torch),
         "BlockLSTM": (lambda: nn.LSTM(6, 8), BlockLSTM.from_torch),
         "LSTMBlockCell": (lambda: nn.LSTMCell(6, 8), LSTMBlockCell.from_torch)}


def _torch_twin(name):
    """(torchops module, its torch.nn equivalent with the same weights)."""
    make, convert = TWINS[name]
    ref = make()
    return convert(ref), ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(TWINS))
def test_module_under_autocast_matches_torch_nn_under_autocast(device, name):
    torch.manual_seed(3)
    ours, ref = _torch_twin(name)
    ours, ref = ours.to(device), ref.to(device)
    cell = name == "LSTMBlockCell"
    x = (torch.randn(4, 6, device=device) if cell else torch.randn(5, 4, 6, device=device)).requires_grad_()
    with autocast(device, BF16):
        a = ours(x)
        b = ref(x)
    a, b = (a[0], b[0])
    # torch.nn runs some of these in float32 under CPU autocast (GRU and the cells: not on its list); the
    # values agree to bfloat16 precision either way
    assert a.dtype == BF16
    torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2)
    ga = torch.autograd.grad(a.float().sum(), [x] + list(ours.parameters()))
    gb = torch.autograd.grad(b.float().sum(), [x])
    assert all(g.dtype == F32 for g in ga)
    torch.testing.assert_close(ga[0], gb[0], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("cls,dims", [(BatchNorm2d, 4), (BatchNorm3d, 5)])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("x_low", [False, True])
def test_batchnorm_under_autocast_equals_torch_nn(device, dtype, cls, dims, channels_last, x_low):
    torch.manual_seed(4)
    ours = cls(3).to(device)
    ref = (nn.BatchNorm2d if dims == 4 else nn.BatchNorm3d)(3).to(device)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-1, 1)
    ref.load_state_dict(ours.state_dict())
    shape = (4, 3, 5, 6) if dims == 4 else (2, 3, 4, 5, 3)
    fmt = (torch.channels_last if dims == 4 else torch.channels_last_3d) if channels_last else torch.contiguous_format
    conv = (nn.Conv2d if dims == 4 else nn.Conv3d)(2, 3, 1).to(device)
    for step in range(3):
        x = torch.randn(shape, device=device).to(memory_format=fmt)
        for m in (ours, ref):
            m.train(step < 2)
        with autocast(device, dtype):
            # x_low: the input comes from a convolution (run in the autocast dtype), the usual case
            inp = conv(x[:, :2]) if x_low else x
            a, b = ours(inp), ref(inp)
        assert a.dtype == b.dtype == inp.dtype
        torch.testing.assert_close(a, b, rtol=1e-2 if x_low else 1e-5, atol=1e-2 if x_low else 1e-5)
        assert ours.running_mean.dtype == F32
        torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.running_var, ref.running_var, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# torch.compile, torch.export, TorchScript, opcheck under autocast
# ---------------------------------------------------------------------------------------------------------

COMPILE_CASES = ["CudnnLSTM", "CudnnGRU", "BlockLSTM", "BlockGRU", "LSTMBlockCell", "GRUBlockCell"]


@pytest.mark.parametrize("name", COMPILE_CASES + ["BatchNorm2d"])
def test_compile_fullgraph_under_autocast_matches_eager(name):
    torch._dynamo.reset()
    torch.manual_seed(5)
    if name == "BatchNorm2d":
        net = nn.Sequential(nn.Conv2d(2, 3, 3), BatchNorm2d(3), nn.ReLU())
        x = torch.randn(4, 2, 6, 6)
    else:
        net = Net(*MODULES[name]())
        x = torch.randn(5, 4, 5)
    twin = copy.deepcopy(net)

    def step(m, x):
        with torch.autocast("cpu", dtype=BF16):
            return m(x)

    compiled = torch.compile(lambda x: step(net, x), fullgraph=True, backend="aot_eager")
    for _ in range(2):
        y_c, y_e = compiled(x), step(twin, x)
        assert y_c.dtype == y_e.dtype == BF16
        torch.testing.assert_close(y_c, y_e, rtol=0, atol=0)
        grads_c = torch.autograd.grad(y_c.float().sum(), list(net.parameters()))
        grads_e = torch.autograd.grad(y_e.float().sum(), list(twin.parameters()))
        # The cells reuse the weights at every step; eager and compiled code sum those steps' gradients in a
        # different order and precision (eager autocast caches one cast per weight): bfloat16 tolerance.
        tol = 2e-2 if name.endswith("Cell") else 1e-6
        for a, b in zip(grads_c, grads_e):
            assert a.dtype == F32
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for a, b in zip(net.buffers(), twin.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_compile_under_an_outer_autocast_region():
    torch._dynamo.reset()
    torch.manual_seed(6)
    net = Net(CudnnLSTM(1, 8, 6))
    x = torch.randn(5, 4, 5)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    with torch.autocast("cpu", dtype=BF16):
        y_c = compiled(x)
        y_e = net(x)
    assert y_c.dtype == BF16
    torch.testing.assert_close(y_c, y_e, rtol=0, atol=0)


class AutocastNet(nn.Module):
    """A model that runs its body under autocast (how an exported program keeps mixed precision)."""

    def __init__(self, rnn):
        super().__init__()
        self.net = Net(rnn)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.net(x).float()


@pytest.mark.parametrize("name", ["CudnnLSTM", "BlockLSTM", "BlockGRU"])
def test_export_under_autocast_matches_eager(name):
    torch.manual_seed(7)
    m = AutocastNet(MODULES[name]()[0]).eval()
    x = torch.randn(5, 4, 5)
    ep = torch.export.export(m, (x,))
    torch.testing.assert_close(ep.module()(x), m(x), rtol=0, atol=0)
    x2 = torch.randn(5, 4, 5)
    torch.testing.assert_close(ep.module()(x2), m(x2), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["CudnnLSTM", "BlockLSTM", "BlockGRU", "GRUBlockCell", "LSTMBlockCell"])
def test_scripted_module_under_autocast_matches_eager(name):
    torch.manual_seed(8)
    rnn, cell = MODULES[name]()
    x = torch.randn(4, 6) if cell else torch.randn(5, 4, 6)
    scripted = torch.jit.script(rnn)
    with torch.autocast("cpu", dtype=BF16):
        a, b = _rnn_out(scripted, x), _rnn_out(rnn, x)
    assert a.dtype == BF16
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    ga = torch.autograd.grad(a.float().sum(), list(rnn.parameters()))
    gb = torch.autograd.grad(b.float().sum(), list(rnn.parameters()))
    for u, v in zip(ga, gb):
        assert u.dtype == F32
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def _opcheck_cases():
    for name, args, kw in _raw_cases("cpu"):
        if name.startswith("cudnn_rnn"):
            # inference: a low-precision training reserve space is a float32 buffer seen as bfloat16, whose
            # bit patterns include NaNs that opcheck's comparison refuses (training is compiled in the tests above)
            yield name, args, dict(kw, is_training=False)
        else:
            yield name, [a.requires_grad_() if a.is_floating_point() else a for a in args], kw
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, 4, 5, generator=g).to(BF16)
    yield "fused_batch_norm_v3", [x.requires_grad_(), torch.rand(5, generator=g).to(BF16).requires_grad_(),
                                  torch.randn(5, generator=g).requires_grad_(), torch.zeros(0), torch.zeros(0)], {}


@pytest.mark.parametrize("case", list(range(9)))
def test_opcheck_under_autocast(case):
    name, args, kw = list(_opcheck_cases())[case]
    with torch.autocast("cpu", dtype=BF16):
        torch.library.opcheck(getattr(ops, name).default, tuple(args), kw,
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# ---------------------------------------------------------------------------------------------------------
# The routes of the autocast dtype: oneDNN's bfloat16 LSTM for CudnnRNN (what torch.nn.LSTM runs there)
# ---------------------------------------------------------------------------------------------------------

BF16_ROUTE = "cudnn_rnn.cpu.onednn_bf16"
needs_onednn_bf16 = pytest.mark.skipif(not (torch.backends.mkldnn.is_available()
                                            and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
                                       reason="oneDNN does not run bfloat16 natively on this CPU")


def _crnn_leaves(L, D, T=6, B=4, I=5, H=7, seed=5):
    g = torch.Generator().manual_seed(seed)
    n = ops.cudnn_rnn_params_size(L, H, I, None, None, "lstm", direction="bidirectional" if D == 2 else
                                  "unidirectional").item()
    x = torch.randn(T, B, I, generator=g)
    h, c = torch.randn(L * D, B, H, generator=g), torch.randn(L * D, B, H, generator=g)
    p = torch.randn(n, generator=g) * 0.3
    return [t.requires_grad_() for t in (x, h, c, p)]


def _crnn_step(leaves, D, is_training, route, autocast_dtype):
    """Outputs and (training) gradients of one cudnn_rnn call on float32 leaves, run by `route`."""
    direction = "bidirectional" if D == 2 else "unidirectional"
    g = torch.Generator().manual_seed(6)
    region = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    with forced_route(route), region:
        y, hn, cn, _ = torchops.functional.cudnn_rnn(*leaves, direction=direction, is_training=is_training)
    outs = (y, hn, cn)
    if not is_training:
        return outs, None
    w = [torch.randn(t.shape, generator=g) for t in outs]
    loss = sum((t.float() * wt).sum() for t, wt in zip(outs, w))
    with forced_route(route):  # (the backward runs the forward's route too)
        grads = torch.autograd.grad(loss, leaves)
    return outs, grads


def _close_bf16(a, b, what):
    # bfloat16 keeps 8 mantissa bits: relative to the tensor's scale
    scale = max(1.0, b.abs().max().item())
    torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-2 * scale, msg=what)


@needs_onednn_bf16
@pytest.mark.parametrize("L,D", [(1, 1), (2, 1), (2, 2)])
@pytest.mark.parametrize("is_training", [False, True])
def test_cudnn_lstm_onednn_bf16_route_matches_float32(L, D, is_training):
    leaves = _crnn_leaves(L, D)
    outs, grads = _crnn_step(leaves, D, is_training, BF16_ROUTE, BF16)
    assert all(t.dtype == BF16 for t in outs)
    ref_outs, ref_grads = _crnn_step(leaves, D, is_training, "cudnn_rnn.cpu.loops", None)
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        _close_bf16(a, b, f"output {i}")
    if is_training:
        assert all(gr.dtype == F32 for gr in grads)
        for name, a, b in zip(("x", "h", "c", "params"), grads, ref_grads):
            _close_bf16(a, b, f"d{name}")


@needs_onednn_bf16
def test_cudnn_lstm_onednn_bf16_route_is_torch_nn_lstm_under_autocast():
    # The same oneDNN computation as torch.nn.LSTM under CPU autocast: equal up to the summation order.
    torch.manual_seed(7)
    ref = nn.LSTM(5, 7)
    m = CudnnLSTM.from_torch(ref)
    x = torch.randn(6, 4, 5, requires_grad=True)
    with forced_route(BF16_ROUTE), torch.autocast("cpu", dtype=BF16):
        a = m(x)[0]
        b = ref(x)[0]
    assert a.dtype == b.dtype == BF16
    torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@needs_onednn_bf16
@pytest.mark.parametrize("how", ["route_off", "reserve_copy"])
def test_cudnn_lstm_onednn_bf16_backward_without_its_state_recomputes_with_the_loops(set_routes, how):
    # A reserve that lost oneDNN's state (a copy) or a route switched off after the forward: the loops recompute
    # the forward in float32 and give the same gradients to bfloat16 precision.
    x, h, c, p = [t.detach().to(BF16) for t in _crnn_leaves(1, 1)]
    with forced_route(BF16_ROUTE):
        y, hn, cn, res, host = ops.cudnn_rnn_v2(x, h, c, p, is_training=True)
    grads = [torch.randn(t.shape).to(BF16) for t in (y, hn, cn)]
    with forced_route(BF16_ROUTE):
        want = ops.cudnn_rnn_backprop_v2(x, h, c, p, y, hn, cn, *grads, res, host)
    if how == "route_off":
        set_routes({BF16_ROUTE: False})
    else:
        res = res.clone()
    loops = torchops.backends.hits("cudnn_rnn.cpu.loops")
    got = ops.cudnn_rnn_backprop_v2(x, h, c, p, y, hn, cn, *grads, res, host)
    assert torchops.backends.hits("cudnn_rnn.cpu.loops") == loops + 1
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == BF16
        _close_bf16(a, b, f"gradient {i}")


@needs_onednn_bf16
def test_cudnn_lstm_bf16_outside_the_route_runs_the_loops(set_routes):
    x, h, c, p = [t.detach().to(BF16) for t in _crnn_leaves(1, 1)]
    with forced_route(BF16_ROUTE):
        want = ops.cudnn_rnn(x, h, c, p, is_training=False)[0]
    set_routes({BF16_ROUTE: False})
    loops, ran = torchops.backends.hits("cudnn_rnn.cpu.loops"), torchops.backends.hits(BF16_ROUTE)
    got = ops.cudnn_rnn(x, h, c, p, is_training=False)[0]
    assert torchops.backends.hits("cudnn_rnn.cpu.loops") == loops + 1 and torchops.backends.hits(BF16_ROUTE) == ran
    _close_bf16(got, want, "output")
    # sequence_lengths are not the route's case
    set_routes({BF16_ROUTE: True})
    lens = torch.tensor([6, 3, 6, 1], dtype=torch.int32)
    ops.cudnn_rnn_v3(x, h, c, p, lens, is_training=False)
    assert torchops.backends.hits(BF16_ROUTE) == ran


# The CPU LSTM block ops in bfloat16: the float32 cell route against the float32 op and the dtype's kernels

CELL_ROUTE, DTYPE_CELL = "block_rnn.cpu.float32_cell", "block_rnn.cpu.dtype_cell"


def _block_lstm_leaves(T=7, B=5, I=6, C=8, seed=11):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.5).requires_grad_()  # noqa: E731
    return [r(T, B, I), r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C), r(4 * C)]


def _block_lstm_run(op, leaves, dtype, route, T, **kw):
    """The op's seven outputs and the gradients of a weighted sum of them (h and cs), in `dtype`, under `route`
    (None: the defaults)."""
    g = torch.Generator().manual_seed(12)
    args = [a.to(dtype) for a in leaves]
    with forced_route(route) if route else contextlib.nullcontext():
        outs = op(torch.tensor(T), *args, **kw)
        w_h, w_cs = torch.randn(outs[6].shape, generator=g), torch.randn(outs[1].shape, generator=g)
        loss = (outs[6].float() * w_h).sum() + (outs[1].float() * w_cs).sum()
        grads = torch.autograd.grad(loss, leaves)
    return outs, grads


@pytest.mark.parametrize("version", ["block_lstm", "block_lstm_v2"])
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("seq_len_max", [7, 4])
def test_block_lstm_float32_cell_route_matches_float32(version, peephole, seq_len_max):
    leaves = _block_lstm_leaves()
    op = getattr(ops, version)
    kw = dict(use_peephole=peephole, cell_clip=1.5)
    if version == "block_lstm":
        kw["forget_bias"] = 0.7
    outs, grads = _block_lstm_run(op, leaves, BF16, CELL_ROUTE, seq_len_max, **kw)
    ref_outs, ref_grads = _block_lstm_run(op, leaves, F32, None, seq_len_max, **kw)
    for i, (a, b) in enumerate(zip(outs, ref_outs)):
        assert a.dtype == BF16
        _close_bf16(a, b, f"output {i}")
    for i, (a, b) in enumerate(zip(grads, ref_grads)):
        assert a.dtype == F32
        _close_bf16(a, b, f"gradient {i}")


def test_block_lstm_float32_cell_is_closer_to_float32_than_the_dtype_cell():
    # The cell state carried in float32 between steps: over a long sequence its error stays below the one of a
    # state rounded to bfloat16 at every step.
    leaves = _block_lstm_leaves(T=60, B=8, I=6, C=16, seed=13)
    kw = dict(use_peephole=True, cell_clip=0.0, forget_bias=1.0)
    ref = ops.block_lstm(torch.tensor(60), *leaves, **kw)[1]
    errs = {}
    for route in (CELL_ROUTE, DTYPE_CELL):
        with forced_route(route):
            cs = ops.block_lstm(torch.tensor(60), *[a.detach().to(BF16) for a in leaves], **kw)[1]
        errs[route] = (cs.float() - ref).abs().mean().item()
    assert errs[CELL_ROUTE] < errs[DTYPE_CELL], errs


def test_block_lstm_cell_ops_take_the_float32_cell_route():
    # lstm_block_cell and the TF gradient op (gate gradients given, as TF passes them) on both routes agree
    g = torch.Generator().manual_seed(14)
    B, I, C = 4, 5, 6
    r = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(BF16)  # noqa: E731
    x, cs, h, w, wci, wcf, wco, b = r(B, I), r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C), r(4 * C)
    res = {}
    for route in (CELL_ROUTE, DTYPE_CELL):
        with forced_route(route):
            fw = ops.lstm_block_cell(x, cs, h, w, wci, wcf, wco, b, use_peephole=True)
            grads = ops.lstm_block_cell_grad(x, cs, h, w, wci, wcf, wco, b, *fw[:6], torch.ones_like(cs),
                                             torch.ones_like(h), use_peephole=True)
        res[route] = list(fw) + list(grads)
    for i, (a, b_) in enumerate(zip(res[CELL_ROUTE], res[DTYPE_CELL])):
        _close_bf16(a, b_, f"result {i}")


# The bfloat16 recurrent GEMMs of the CPU loops (BlockLSTM's float32 cell route, BlockGRU): torchops' packed
# vdpbf16ps kernel with float32 output (rnn.cpu.packed_avx512_bf16) against ATen's bfloat16 GEMM and float32

BF16_GEMM, ATEN_BF16 = "rnn.cpu.packed_avx512_bf16", "rnn.cpu.aten_bf16"


def _cpu_runs_bf16_gemm():
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags and torchops.backends.cpu.get_cpu_capability() == "avx512"


needs_bf16_gemm = pytest.mark.skipif(not _cpu_runs_bf16_gemm(),
                                     reason="rnn.cpu.packed_avx512_bf16 needs a CPU with AVX-512 BF16 "
                                            "(avx512_bf16 in /proc/cpuinfo) and the AVX-512 capability in use")

# (T, B, I, C, threads): k = C (forward) odd, n = 4C / 2C / C not a multiple of the 32-column panel, a thread's
# rows (m) not a multiple of the 8-row tile, m = 1, k = 1, the batch split over two threads, and k = 4C = 1040
# (LSTM backward) past one 1024-deep pass.
BF16_GEMM_SHAPES = [(5, 19, 7, 40, 2), (4, 5, 3, 5, 1), (3, 2, 4, 1, 2), (3, 1, 2, 9, 1), (2, 9, 5, 260, 1)]


def _rnn_leaves(kind, T, B, I, C, seed=21):
    # (weights scaled with their fan-in: pre-activations of order 1, as initialised models have)
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=0.5: (torch.randn(*s, generator=g) * scale).requires_grad_()  # noqa: E731
    ws = (I + C) ** -0.5
    if kind == "lstm":
        return [r(T, B, I), r(B, C), r(B, C), r(I + C, 4 * C, scale=ws), r(C), r(C), r(C), r(4 * C)]
    return [r(T, B, I), r(B, C), r(I + C, 2 * C, scale=ws), r(I + C, C, scale=ws), r(2 * C), r(C)]


def _rnn_run(kind, leaves, dtype, routes):
    """block_lstm_v2 (peepholes) or block_gru on `leaves` cast to `dtype` with `routes` forced: the outputs and
    the gradients of a weighted sum of them."""
    g = torch.Generator().manual_seed(22)
    args = [a.to(dtype) for a in leaves]
    T = leaves[0].shape[0]
    with contextlib.ExitStack() as stack:
        for route in routes:
            stack.enter_context(forced_route(route))
        if kind == "lstm":
            outs = ops.block_lstm_v2(torch.tensor(T), *args, use_peephole=True, cell_clip=1.5)
        else:
            outs = ops.block_gru(torch.tensor(T), *args)
        loss = sum((o.float() * torch.randn(o.shape, generator=g)).sum() for o in outs)
        grads = torch.autograd.grad(loss, leaves)
    return list(outs), list(grads)


def _bf16_gemm_routes(kind, gemm_route):
    return [CELL_ROUTE, gemm_route] if kind == "lstm" else [gemm_route]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("T,B,I,C,threads", BF16_GEMM_SHAPES)
def test_bf16_loops_with_aten_gemm_match_float32(kind, T, B, I, C, threads, restore_threads):
    torch.set_num_threads(threads)
    leaves = _rnn_leaves(kind, T, B, I, C)
    hits = torchops.backends.hits(BF16_GEMM)
    outs, grads = _rnn_run(kind, leaves, BF16, _bf16_gemm_routes(kind, ATEN_BF16))
    assert torchops.backends.hits(BF16_GEMM) == hits
    ref_outs, ref_grads = _rnn_run(kind, leaves, F32, [])
    for i, (a, b) in enumerate(zip(outs + grads, ref_outs + ref_grads)):
        _close_bf16(a, b, f"result {i}")


@needs_bf16_gemm
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("T,B,I,C,threads", BF16_GEMM_SHAPES)
def test_bf16_packed_gemm_matches_float32_and_aten(kind, T, B, I, C, threads, restore_threads):
    # The kernel's sums are float32 ones in another order than ATen's: the results agree with ATen's path to
    # bfloat16 rounding (a missing or misplaced term of the packed layout would be off by far more), and with
    # the float32 op within bfloat16 tolerances. BlockGRU rounds each GEMM's float32 sum once, as ATen does, so
    # there the bound is one bfloat16 rounding step of the result; BlockLSTM no longer rounds the pre-activations
    # (ATen's path does), so its results differ from ATen's by bfloat16 rounding through the cell.
    torch.set_num_threads(threads)
    leaves = _rnn_leaves(kind, T, B, I, C)
    hits = torchops.backends.hits(ATEN_BF16)
    outs, grads = _rnn_run(kind, leaves, BF16, _bf16_gemm_routes(kind, BF16_GEMM))
    assert torchops.backends.hits(ATEN_BF16) == hits
    aten_outs, aten_grads = _rnn_run(kind, leaves, BF16, _bf16_gemm_routes(kind, ATEN_BF16))
    ref_outs, ref_grads = _rnn_run(kind, leaves, F32, [])
    for i, (a, b, r) in enumerate(zip(outs + grads, aten_outs + aten_grads, ref_outs + ref_grads)):
        assert a.dtype == b.dtype
        _close_bf16(a, r, f"result {i} against float32")
        if kind == "lstm":
            _close_bf16(a, b, f"result {i} against ATen's bfloat16 GEMM")
        else:
            scale = max(1.0, r.abs().max().item())
            torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=2 ** -7 * scale,
                                       msg=f"result {i} against ATen's bfloat16 GEMM")


@needs_bf16_gemm
def test_bf16_packed_gemm_brings_block_lstm_closer_to_float32():
    # The pre-activations summed in float32 (no rounding of h @ W_h's result to bfloat16 before the cell): over
    # a long sequence the outputs' mean error against float32 drops below ATen's GEMM's.
    leaves = _rnn_leaves("lstm", 40, 8, 6, 32, seed=23)
    ref_outs, ref_grads = _rnn_run("lstm", leaves, F32, [])
    err = {}
    for route in (BF16_GEMM, ATEN_BF16):
        outs, grads = _rnn_run("lstm", leaves, BF16, [CELL_ROUTE, route])
        err[route] = sum((a.float() - b).abs().mean().item() for a, b in zip(outs + grads, ref_outs + ref_grads))
    assert err[BF16_GEMM] < err[ATEN_BF16], err


@needs_bf16_gemm
@pytest.mark.parametrize("version", ["block_lstm", "block_lstm_v2"])
@pytest.mark.parametrize("peephole", [False, True])
@pytest.mark.parametrize("cell_clip", [0.0, -1.0, 0.8])
@pytest.mark.parametrize("C", [1, 16, 37])
@pytest.mark.parametrize("build", ["avx512", "avx2", "default"])
def test_bf16_block_lstm_step_is_float32_math_rounded_once(version, peephole, cell_clip, C, build):
    # The bfloat16 forward's fused step (bias, cell on the float32 sums, each output rounded once): every output is
    # the float32 op's on the same inputs rounded to bfloat16, to half a bfloat16 step and a few float32 ones; the
    # reference runs the float32 op a step at a time with what the bfloat16 op carries (h rounded to bfloat16, the
    # cell state in float32). Pre-activations up to +-60 reach the saturated ends of sigmoid and tanh; C = 1, 16,
    # 37 cover the vector tail; a NaN in one batch row's input stays in that row, as in float32. Each capability
    # build has the step: AVX-512's in intrinsics, the others' the float32 kernel's loop.
    T, B, I = 6, 5, 3
    g = torch.Generator().manual_seed(31)
    leaves = [torch.randn(T, B, I, generator=g) * 8, torch.randn(B, C, generator=g), torch.randn(B, C, generator=g),
              torch.randn(I + C, 4 * C, generator=g) * 3, torch.randn(C, generator=g), torch.randn(C, generator=g),
              torch.randn(C, generator=g), torch.randn(4 * C, generator=g)]
    leaves[0][2, 1, 0] = float("nan")
    args = [a.to(BF16) for a in leaves]
    kw = dict(use_peephole=peephole, cell_clip=cell_clip)
    if version == "block_lstm":
        kw["forget_bias"] = 0.7
    op = getattr(ops, version)
    hits = torchops.backends.hits(BF16_GEMM)
    with forced_route(CELL_ROUTE), forced_route(BF16_GEMM), forced_route(f"block_rnn.cpu.{build}"):
        outs = op(torch.tensor(T), *args, **kw)
    assert torchops.backends.hits(BF16_GEMM) == hits + 1
    x, cs, h = args[0].float(), args[1].float(), args[2]
    steps = []
    for t in range(T):
        step = op(torch.tensor(1), x[t:t + 1], cs, h.float(), *[a.float() for a in args[3:]], **kw)
        cs, h = step[1][0], step[6][0].to(BF16)
        steps.append(step)
    ref = [torch.cat([s_[q] for s_ in steps]) for q in range(7)]
    names = ["i", "cs", "f", "o", "ci", "co", "h"]
    for name, a, r in zip(names, outs, ref):
        assert a.dtype == BF16
        assert torch.equal(a.isnan(), r.isnan()), name
        assert a[:, 1].isnan().any() and not a[:, [0, 2, 3, 4]].isnan().any(), name
        ok = ~r.isnan()
        torch.testing.assert_close(a.float()[ok], r[ok], rtol=2 ** -8, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------------------
# Batching and accumulators: documented behaviour under autocast
# ---------------------------------------------------------------------------------------------------------

def test_accumulator_keeps_its_dtype_under_autocast():
    acc = torchops.ConditionalAccumulator(torch.float32, shape=[3])
    try:
        with torch.autocast("cpu", dtype=BF16):
            g = nn.functional.linear(torch.ones(1, 2), torch.ones(3, 2))[0]  # a bfloat16 result
            assert g.dtype == BF16
            acc.apply_grad(g, local_step=0)  # converted to the accumulator's dtype, as TF does
            out = acc.take_grad(1)
        assert out.dtype == F32
        torch.testing.assert_close(out, torch.full([3], 2.0))
        with torch.autocast("cpu", dtype=BF16), pytest.raises(TypeError, match="gradient dtype mismatch"):
            ops.accumulator_apply_gradient(acc.handle, 0, g)  # the raw op refuses, as without autocast
    finally:
        acc.close()


def test_batch_op_keeps_dtypes_under_autocast():
    x = torch.randn(2, 3)
    with torch.autocast("cpu", dtype=BF16):
        out = ops.batch([x], 1, 4, 0, 0, shared_name="autocast_test")
    assert out[0][0].dtype == F32


# ---------------------------------------------------------------------------------------------------------
# CUDA: float16 with a GradScaler, bfloat16 (skipped without a GPU)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("name", list(MODULES))
def test_cuda_module_trains_with_grad_scaler_in_float16(name):
    torch.manual_seed(10)
    net = Net(*MODULES[name]()).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(7, 4, 5, device="cuda")
    target = torch.randn(7, 4, 3, device="cuda")
    losses = []
    for _ in range(4):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=F16):
            loss = nn.functional.mse_loss(net(x).float(), target)
        assert net.rnn_dtype == F16
        scaler.scale(loss).backward()
        assert all(p.grad.dtype == F32 for p in net.parameters())
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", LOW)
def test_cuda_batchnorm_under_autocast_equals_torch_nn(dtype):
    ours, ref = BatchNorm2d(3).cuda(), nn.BatchNorm2d(3).cuda()
    conv = nn.Conv2d(2, 3, 1).cuda()
    x = torch.randn(4, 2, 5, 6, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        inp = conv(x)
        a, b = ours(inp), ref(inp)
    assert a.dtype == b.dtype == dtype
    torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ours.running_mean, ref.running_mean, rtol=1e-3, atol=1e-3)
