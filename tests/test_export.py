"""Deployment after TorchScript: torch.export (strict and non-strict, dynamic batch / time /
sequence_lengths) of every family's modules and ops, clear errors for the stateful pieces, AOTInductor
packages run from Python and from a Python-free C++ program, and torch.compile(backend="inductor")
forward + backward."""
import threading

import pytest
import torch
from torch import nn
from torch.export import Dim, export
from torch.utils._pytree import tree_leaves

import torchops
from conftest import build_libtorch_program, run_libtorch_program

STRICT = [pytest.param(False, id="nonstrict"), pytest.param(True, id="strict")]


def _close(got, want, atol=1e-5, rtol=1e-5):
    got, want = tree_leaves(got), tree_leaves(want)
    assert len(got) == len(want) and len(want) > 0
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)


def _seeded(fn):
    torch.manual_seed(0)
    return fn()


# ---------------------------------------------------------------------------------------------------------
# torch.export of the modules: the exported program equals eager at the traced shapes and at others
# ---------------------------------------------------------------------------------------------------------

def _batch(lo=1):
    return Dim("batch", min=lo, max=256)


def _time():
    return Dim("time", min=1, max=256)


class _LSTMOut(nn.Module):
    """CudnnLSTM with an initial state, as a model passes it."""

    def __init__(self, **kw):
        super().__init__()
        self.rnn = torchops.nn.CudnnLSTM(2, 5, 3, **kw)

    def forward(self, x, h0, c0, sequence_lengths):
        return self.rnn(x, (h0, c0), sequence_lengths=sequence_lengths)


def _seq(t, b, i=3):
    return torch.randn(t, b, i)


MODULE_CASES = {
    # name: (module factory, inputs(shape variant 0|1), dynamic_shapes)
    "BatchNorm2d-eval": (lambda: torchops.nn.BatchNorm2d(4).eval(),
                         lambda v: (torch.randn(3 + 4 * v, 4, 5, 5),), ({0: _batch()},)),
    "BatchNorm2d-channels_last": (lambda: torchops.nn.BatchNorm2d(4).eval(),
                                  lambda v: (torch.randn(3 + 4 * v, 4, 5, 5).contiguous(
                                      memory_format=torch.channels_last),), ({0: _batch()},)),
    "BatchNorm3d-eval": (lambda: torchops.nn.BatchNorm3d(2).eval(),
                         lambda v: (torch.randn(2 + v, 2, 3, 4, 2),), ({0: _batch()},)),
    "CudnnGRU": (lambda: torchops.nn.CudnnGRU(2, 5, 3).eval(),
                 lambda v: (_seq(6 + 3 * v, 3 + 2 * v),), ({0: _time(), 1: _batch()},)),
    "CudnnRNNTanh-bidirectional": (lambda: torchops.nn.CudnnRNNTanh(1, 4, 3, direction="bidirectional").eval(),
                                   lambda v: (_seq(5 + v, 2 + 3 * v),), ({0: _time(), 1: _batch()},)),
    "CudnnRNNRelu-batch_major": (lambda: torchops.nn.CudnnRNNRelu(1, 4, 3, time_major=False).eval(),
                                 lambda v: (_seq(2 + 3 * v, 5 + v),), ({0: _batch(), 1: _time()},)),
    "CudnnLSTM-state-sequence_lengths": (
        lambda: _LSTMOut(num_proj=4).eval(),
        lambda v: (_seq(7 + 2 * v, 3 + 2 * v), torch.randn(2, 3 + 2 * v, 4), torch.randn(2, 3 + 2 * v, 5),
                   torch.tensor([7, 2, 5, 9, 1][:3 + 2 * v]) if v else torch.tensor([7, 2, 5])),
        ({0: _time(), 1: _batch()}, {1: _batch()}, {1: _batch()}, {0: _batch()})),
    "BlockLSTM-v2": (lambda: torchops.nn.BlockLSTM(3, 4).eval(),
                     lambda v: (_seq(6 + 3 * v, 3 + 2 * v),), ({0: _time(), 1: _batch()},)),
    "BlockLSTM-v1-peephole-clip": (lambda: torchops.nn.BlockLSTM(3, 4, version=1, use_peephole=True,
                                                                 cell_clip=0.5, batch_first=True).eval(),
                                   lambda v: (_seq(3 + 2 * v, 6 + 3 * v),), ({0: _batch(), 1: _time()},)),
    "BlockGRU": (lambda: torchops.nn.BlockGRU(3, 4).eval(),
                 lambda v: (_seq(6 + 3 * v, 3 + 2 * v),), ({0: _time(), 1: _batch()},)),
    "LSTMBlockCell": (lambda: torchops.nn.LSTMBlockCell(3, 4, use_peephole=True).eval(),
                      lambda v: (torch.randn(3 + 4 * v, 3),), ({0: _batch()},)),
    "GRUBlockCell": (lambda: torchops.nn.GRUBlockCell(3, 4).eval(),
                     lambda v: (torch.randn(3 + 4 * v, 3),), ({0: _batch()},)),
}


def _export_and_check(m, inputs, dynamic_shapes, strict, atol=1e-5):
    ep = export(m, inputs(0), dynamic_shapes=dynamic_shapes, strict=strict)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any(t.startswith("torchops.") for t in targets), targets  # the op itself, not a decomposition
    run = ep.module()
    for v in (0, 1):
        args = inputs(v)
        with torch.no_grad():
            _close(run(*args), m(*args), atol=atol, rtol=atol)
    return ep


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("case", list(MODULE_CASES))
def test_module_exports_with_dynamic_shapes(case, strict):
    factory, inputs, dyn = MODULE_CASES[case]
    m = _seeded(factory)
    if isinstance(m, (torchops.nn.BatchNorm2d, torchops.nn.BatchNorm3d)):
        with torch.no_grad():  # non-trivial statistics, so that eval mode is told apart from batch statistics
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    ep = _export_and_check(m, lambda v: _seeded(lambda: inputs(v)), dyn, strict)
    # the exported program is dynamic, not specialised to the example: nothing was burnt in as a constant
    ph = [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
    assert any(not isinstance(s, int) for s in ph[0].meta["val"].shape)


@pytest.mark.parametrize("strict", STRICT)
def test_batchnorm_training_export_updates_running_statistics_like_eager(strict):
    eager = _seeded(lambda: torchops.nn.BatchNorm2d(3))
    m = _seeded(lambda: torchops.nn.BatchNorm2d(3))
    x = _seeded(lambda: torch.randn(4, 3, 5, 5))
    ep = export(m, (x,), dynamic_shapes=({0: _batch(2)},), strict=strict)
    run = ep.module()
    for b in (4, 7):
        xb = torch.randn(b, 3, 5, 5) * 2 + 1
        _close(run(xb), eager(xb))
    _close(run.running_mean, eager.running_mean)
    _close(run.running_var, eager.running_var)
    assert int(run.num_batches_tracked) == int(eager.num_batches_tracked) == 2


@pytest.mark.parametrize("strict", STRICT)
def test_exported_rnn_backprops_like_eager(strict):
    """The exported program's ATen graph keeps the ops' autograd: training steps can run through it."""
    m = _seeded(lambda: torchops.nn.CudnnLSTM(1, 4, 3))
    cell = _seeded(lambda: torchops.nn.BlockLSTM(4, 3))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = m, cell

        def forward(self, x):
            return self.b(self.a(x)[0])[0]

    net = Net()
    x = _seeded(lambda: torch.randn(5, 2, 3))
    ep = export(net, (x,), dynamic_shapes=({0: _time(), 1: _batch()},), strict=strict)
    run = ep.module()
    for fn in (net, run):
        for p in net.parameters():
            p.grad = None
        xi = x.clone().requires_grad_()
        fn(xi).pow(2).sum().backward()
        if fn is net:
            want = [xi.grad] + [p.grad.clone() for p in net.parameters()]
        else:
            got = [xi.grad] + [dict(run.named_parameters())[n].grad for n, _ in net.named_parameters()]
    _close(got, want)


# ---------------------------------------------------------------------------------------------------------
# torch.export of the ops themselves (forward and TF's explicit gradient ops)
# ---------------------------------------------------------------------------------------------------------

class _FusedBatchNormOps(nn.Module):
    def forward(self, x, scale, offset):
        e = torch.empty([0])
        y, _, _, r1, r2, r3 = torch.ops.torchops.fused_batch_norm_v3(x, scale, offset, e, e, 0.001, 1.0, "NHWC", True)
        dx, dscale, doffset, _, _ = torch.ops.torchops.fused_batch_norm_grad_v3(y, x, scale, r1, r2, r3, 0.001,
                                                                               "NHWC", True)
        return y, dx, dscale, doffset


class _CudnnRNNOps(nn.Module):
    def forward(self, x, h, c, params, lengths):
        out, hn, cn, rs, hr = torch.ops.torchops.cudnn_rnn_v3(x, h, c, params, lengths, rnn_mode="lstm",
                                                             is_training=True)
        grads = torch.ops.torchops.cudnn_rnn_backprop_v3(x, h, c, params, lengths, out, hn, cn, torch.ones_like(out),
                                                        torch.zeros_like(hn), torch.zeros_like(cn), rs, hr,
                                                        rnn_mode="lstm")
        return (out, hn, cn) + tuple(grads)


class _BlockOps(nn.Module):
    def forward(self, x, h0, c0, w, wci, wcf, wco, b, w_ru, w_c, b_ru, b_c):
        seq = torch.tensor(x.size(0), dtype=torch.int64)
        fw = torch.ops.torchops.block_lstm_v2(seq, x, c0, h0, w, wci, wcf, wco, b, 0.0, True)
        bw = torch.ops.torchops.block_lstm_grad_v2(seq, x, c0, h0, w, wci, wcf, wco, b, *fw, fw[1], fw[6], True)
        r, u, c, h = torch.ops.torchops.gru_block_cell(x[0], h0, w_ru, w_c, b_ru, b_c)
        gw = torch.ops.torchops.gru_block_cell_grad(x[0], h0, w_ru, w_c, b_ru, b_c, r, u, c, h)
        lc = torch.ops.torchops.lstm_block_cell(x[0], c0, h0, w, wci, wcf, wco, b, 1.0, -1.0, True)
        return tuple(fw) + tuple(bw) + (h,) + tuple(gw) + tuple(lc)


def _fbn_inputs(v):
    return (torch.randn(2 + 3 * v, 4, 3, 5), torch.rand(5) + 0.5, torch.randn(5))


def _cudnn_inputs(v):
    T, B, I, H = 4 + 2 * v, 3 + 2 * v, 3, 4
    n = torchops.nn.cudnn_rnn.cudnn_params_size("lstm", 1, H, I)
    lengths = torch.tensor([4, 1, 3] if not v else [6, 2, 6, 5, 3], dtype=torch.int32)
    return (torch.randn(T, B, I), torch.randn(1, B, H), torch.randn(1, B, H), torch.randn(n) * 0.3, lengths)


def _block_inputs(v):
    T, B, I, C = 4 + 2 * v, 3 + 2 * v, 3, 4
    return (torch.randn(T, B, I), torch.randn(B, C), torch.randn(B, C), torch.randn(I + C, 4 * C) * 0.3,
            torch.randn(C) * 0.1, torch.randn(C) * 0.1, torch.randn(C) * 0.1, torch.randn(4 * C) * 0.1,
            torch.randn(I + C, 2 * C) * 0.3, torch.randn(I + C, C) * 0.3, torch.randn(2 * C) * 0.1, torch.randn(C))


OP_CASES = {
    "fused_batch_norm": (_FusedBatchNormOps, _fbn_inputs, ({0: _batch(2)}, None, None)),
    "cudnn_rnn": (_CudnnRNNOps, _cudnn_inputs, ({0: _time(), 1: _batch()}, {1: _batch()}, {1: _batch()}, None,
                                                {0: _batch()})),
    "block_rnn": (_BlockOps, _block_inputs, ({0: _time(), 1: _batch()}, {0: _batch()}, {0: _batch()}) + (None,) * 9),
}


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("case", list(OP_CASES))
def test_ops_export_with_dynamic_shapes(case, strict):
    cls, inputs, dyn = OP_CASES[case]
    _export_and_check(cls(), lambda v: _seeded(lambda: inputs(v)), dyn, strict, atol=1e-4)


# ---------------------------------------------------------------------------------------------------------
# the stateful pieces
# ---------------------------------------------------------------------------------------------------------

class _Affine(nn.Module):
    def forward(self, x):
        return 3.0 * x + 1.0


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_batched_refuses_export_and_says_what_to_do(strict, grad):
    m = torchops.nn.Batched(_Affine(), 1, 8, 1000)
    with torch.set_grad_enabled(grad), pytest.raises(Exception) as e:
        export(m, (torch.randn(4, 3),), dynamic_shapes=({0: _batch()},), strict=strict)
    msg = str(e.value)
    assert "torchops.nn.Batched cannot be exported" in msg, msg
    assert "export the wrapped module" in msg
    # the module still works eagerly afterwards
    with torch.no_grad():
        _close(m(torch.ones(2, 3)), torch.full((2, 3), 4.0))


def test_batched_serves_an_exported_program():
    """What the error suggests: export the model, then batch the calls of the loaded program."""
    inner = _seeded(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh()))
    ep = export(inner, (torch.randn(4, 3),), dynamic_shapes=({0: _batch()},))
    served = torchops.nn.Batched(ep.module(), num_batch_threads=1, max_batch_size=8, batch_timeout_micros=20000)
    x = torch.randn(16, 3)
    out = [None] * 16

    def client(i):
        with torch.no_grad():
            out[i] = served(x[i:i + 1])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with torch.no_grad():
        _close(torch.cat(out), inner(x))
    assert torchops.batching.stats(served.shared_name)["batches_formed"] >= 2


class _RawBatching(nn.Module):
    """TF's graph pattern: batch -> model -> unbatch, with no branch on which call holds the batch."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        batched, index, id = torch.ops.torchops.batch([x], 1, 8, 20000, 60_000_000, 10, [], "", self.name)
        y = self.lin(batched[0])  # 0 rows for the calls that do not hold the batch
        return torch.ops.torchops.unbatch(y, index, id, 60_000_000, "", self.name + "/unbatch")


@pytest.mark.parametrize("strict", STRICT)
def test_raw_batch_unbatch_ops_export_and_batch_concurrent_calls(strict):
    m = _seeded(lambda: _RawBatching(f"test_export/raw/{strict}"))
    ep = export(m, (torch.randn(2, 3),), dynamic_shapes=({0: _batch()},), strict=strict)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"torchops.batch.default", "torchops.unbatch.default"} <= targets
    run = ep.module()
    x = torch.randn(12, 3)
    out = [None] * 6

    def client(i):
        with torch.no_grad():
            out[i] = run(x[2 * i:2 * i + 2])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with torch.no_grad():
        _close(torch.cat(out), m.lin(x))
    assert torchops.batching.stats(m.name)["tasks"] == 6


@pytest.mark.parametrize("strict", STRICT)
def test_raw_accumulator_ops_do_not_export(strict):
    handle = torch.classes.torchops.ConditionalAccumulator(torch.float32, [3], "", "", "MEAN")

    class Step(nn.Module):
        def __init__(self):
            super().__init__()
            self.handle = handle

        def forward(self, g):
            torch.ops.torchops.accumulator_apply_gradient(self.handle, 0, g)
            return torch.ops.torchops.accumulator_take_gradient(self.handle, 1)

    # torch's own refusal (its wording differs between torch versions); what matters is that export fails
    # before the op runs, leaving the accumulator untouched
    with pytest.raises(Exception):
        export(Step(), (torch.randn(3),), strict=strict)
    assert handle.num_accumulated() == 0
    handle.close()


class _AccumulateStep(nn.Module):
    def __init__(self, acc):
        super().__init__()
        self.acc = acc

    def forward(self, g):
        self.acc.apply_grad(g, 0)
        return self.acc.take_grad(1)


@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_accumulators_refuse_export_and_say_why(strict, sparse):
    if sparse:
        acc = torchops.SparseConditionalAccumulator(torch.float32, [4, 3])

        class Step(nn.Module):
            def forward(self, values):
                acc.apply_grad(torch.tensor([0, 2]), values, [4, 3])
                return acc.take_grad(1)[1]
        m, x = Step(), torch.randn(2, 3)
    else:
        acc = torchops.ConditionalAccumulator(torch.float32, [3])
        m, x = _AccumulateStep(acc), torch.randn(3)
    with pytest.raises(Exception) as e:
        export(m, (x,), strict=strict)
    msg = str(e.value)
    assert f"torchops.{type(acc).__name__} cannot be exported" in msg, msg
    assert "call it around the exported program" in msg

    class SetStep(nn.Module):
        def forward(self, x):
            acc.set_global_step(5)
            return x + 1

    with pytest.raises(Exception, match=f"torchops.{type(acc).__name__} cannot be exported"):
        export(SetStep(), (x,), strict=strict)
    assert acc.global_step() == 0
    # nothing was applied while tracing, and the accumulator still works eagerly
    assert acc.num_accumulated() == 0
    m(x)
    assert acc.global_step() == 1
    acc.close()


# ---------------------------------------------------------------------------------------------------------
# torch.compile(backend="inductor"): forward and backward equal eager
# ---------------------------------------------------------------------------------------------------------

class _ConvNet(nn.Module):
    """fused_batch_norm (training, channels-last) + CudnnGRU + BlockLSTM."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = torchops.nn.BatchNorm2d(4)
        self.gru = torchops.nn.CudnnGRU(1, 5, 4 * 3)
        self.lstm = torchops.nn.BlockLSTM(5, 6)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        f = torch.relu(self.bn(self.conv(x)))  # [B, 4, H, W]
        seq = f.permute(2, 0, 1, 3).flatten(2)  # [T = H, B, 4 * W]
        s, _ = self.gru(seq)
        s, _ = self.lstm(s)
        return self.fc(s[-1])


class _CellNet(nn.Module):
    """CudnnLSTM (projection) + BlockGRU + GRUBlockCell + LSTMBlockCell."""

    def __init__(self):
        super().__init__()
        self.lstm = torchops.nn.CudnnLSTM(1, 5, 3, num_proj=4)
        self.gru = torchops.nn.BlockGRU(4, 4)
        self.gcell = torchops.nn.GRUBlockCell(4, 4)
        self.lcell = torchops.nn.LSTMBlockCell(4, 4, use_peephole=True)

    def forward(self, x, lengths):
        s, _ = self.lstm(x, sequence_lengths=lengths)
        s, h = self.gru(s)
        g = self.gcell(s[-1], h[0])
        return self.lcell(g)[0]


def _train_step(m, inputs):
    for p in m.parameters():
        p.grad = None
    args = [a.clone().requires_grad_() if a.is_floating_point() else a for a in inputs]
    y = m(*args)
    y.pow(2).sum().backward()
    return [y, args[0].grad] + [p.grad for p in m.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("net", ["conv", "cells"])
def test_inductor_compile_forward_backward_matches_eager(net):
    torch._dynamo.reset()
    if net == "conv":
        m = _seeded(_ConvNet).to(memory_format=torch.channels_last)
        batches = [(_seeded(lambda: torch.randn(4, 2, 5, 3)),), (torch.randn(6, 2, 5, 3),)]
    else:
        m = _seeded(_CellNet)
        batches = [(_seeded(lambda: torch.randn(5, 3, 3)), torch.tensor([5, 2, 4])),
                   (torch.randn(7, 4, 3), torch.tensor([7, 7, 1, 3]))]
    compiled = torch.compile(m, backend="inductor", fullgraph=True)
    ref = _seeded(type(m))
    if net == "conv":
        ref = ref.to(memory_format=torch.channels_last)
    ref.load_state_dict(m.state_dict())
    for inputs in batches:
        _close(_train_step(compiled, inputs), _train_step(ref, inputs), atol=1e-4, rtol=1e-4)
    if net == "conv":  # the training-mode statistics went through the compiled graph too
        _close(m.bn.running_var, ref.bn.running_var)


# ---------------------------------------------------------------------------------------------------------
# AOTInductor: one package (BatchNorm + CudnnGRU + BlockLSTM), from Python and from a C++ program
# ---------------------------------------------------------------------------------------------------------

AOTI_SHAPE = (2, 5, 3)  # C, H, W
AOTI_BATCHES = (1, 3, 8)


def _aoti_model(device):
    m = _seeded(_ConvNet)
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.2, 0.2)
        m.bn.running_var.uniform_(0.5, 1.5)
    return m.eval().to(device)


def _aoti_input(b, device="cpu"):
    # the C++ program builds the same: linspace(-2, 2, B*C*H*W).reshape(B, C, H, W).sin()
    n = b * AOTI_SHAPE[0] * AOTI_SHAPE[1] * AOTI_SHAPE[2]
    return torch.linspace(-2.0, 2.0, n).reshape(b, *AOTI_SHAPE).sin().to(device)


def _aoti_package(tmp_path_factory, device):
    m = _aoti_model(device)
    ep = export(m, (_aoti_input(3, device),), dynamic_shapes=({0: Dim("batch", min=1, max=1024)},))
    path = str(tmp_path_factory.mktemp(f"aoti_{device}") / "net.pt2")
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    return m, path


@pytest.fixture(scope="module")
def aoti_cpu(tmp_path_factory):
    return _aoti_package(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def aoti_cuda(tmp_path_factory):
    return _aoti_package(tmp_path_factory, "cuda")


def _check_python_package(model, path, device):
    loaded = torch._inductor.aoti_load_package(path)
    for b in AOTI_BATCHES:
        x = _aoti_input(b, device)
        with torch.no_grad():
            _close(loaded(x), model(x), atol=1e-5, rtol=1e-5)


def _parse_cpp(stdout):
    values = {}
    for line in stdout.splitlines():
        if line.startswith("value "):
            _, b, k, j, v = line.split()
            values.setdefault((int(b), int(k)), []).append(float(v))
    return values


def _check_cpp_package(model, path, device):
    exe = build_libtorch_program("run_aoti_package", "run_aoti_package.cpp")
    out = run_libtorch_program(exe, torchops.library_path, path, device, *AOTI_SHAPE, *AOTI_BATCHES)
    assert out.returncode == 0, out.stdout + out.stderr
    got = _parse_cpp(out.stdout)
    assert sorted(got) == [(b, 0) for b in AOTI_BATCHES]
    for b in AOTI_BATCHES:
        with torch.no_grad():
            want = model(_aoti_input(b, device)).double().cpu().reshape(-1)
        torch.testing.assert_close(torch.tensor(got[(b, 0)], dtype=torch.float64), want, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_aoti_package_runs_in_python(aoti_cpu):
    _check_python_package(*aoti_cpu, "cpu")


@pytest.mark.slow
def test_aoti_package_runs_in_cpp_program_without_python(aoti_cpu):
    _check_cpp_package(*aoti_cpu, "cpu")


@pytest.mark.slow
@pytest.mark.cuda
def test_aoti_package_runs_in_python_cuda(aoti_cuda):
    _check_python_package(*aoti_cuda, "cuda")


@pytest.mark.slow
@pytest.mark.cuda
def test_aoti_package_runs_in_cpp_program_without_python_cuda(aoti_cuda):
    _check_cpp_package(*aoti_cuda, "cuda")


# ---------------------------------------------------------------------------------------------------------
# CUDA: the same export / compile paths on a GPU
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("case", ["BatchNorm2d-channels_last", "CudnnGRU", "CudnnLSTM-state-sequence_lengths",
                                  "BlockLSTM-v2", "GRUBlockCell"])
def test_module_exports_with_dynamic_shapes_cuda(case, strict):
    factory, inputs, dyn = MODULE_CASES[case]
    m = _seeded(factory).cuda()

    def cuda_inputs(v):
        args = _seeded(lambda: inputs(v))
        # sequence_lengths stay where the modules take them from (any device)
        return tuple(a.cuda() if a.is_floating_point() else a for a in args)

    _export_and_check(m, cuda_inputs, dyn, strict, atol=1e-4)


@pytest.mark.slow
@pytest.mark.cuda
def test_inductor_compile_forward_backward_matches_eager_cuda():
    torch._dynamo.reset()
    m = _seeded(_ConvNet).cuda()
    ref = _seeded(_ConvNet).cuda()
    compiled = torch.compile(m, backend="inductor", fullgraph=True)
    for b in (4, 6):
        x = _seeded(lambda: torch.randn(b, 2, 5, 3)).cuda()
        _close(_train_step(compiled, (x,)), _train_step(ref, (x,)), atol=1e-4, rtol=1e-4)

