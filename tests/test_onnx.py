"""ONNX export (torchops.onnx): every module and raw forward op exported with dynamic batch / time, run in
ONNX Runtime on the CPU at other sizes than the export's, outputs equal to eager; the graphs hold standard
ONNX ops only; the clear errors for training-mode ops, batching and gradient ops."""
import contextlib
import io

import pytest
import torch
from torch import nn
from torch.export import Dim
from torch.utils._pytree import tree_leaves

pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

import torchops  # noqa: E402
import torchops.onnx  # noqa: E402
from torchops.onnx import ExportError  # noqa: E402


def _subgraph_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.g.node:
                yield from _subgraph_nodes(attr.g)


def _export(model, args, dynamic_shapes):
    with contextlib.redirect_stdout(io.StringIO()):  # torch.onnx.export's progress lines
        return torchops.onnx.export(model, args, dynamic_shapes=dynamic_shapes)


def _check(model, args, dynamic_shapes, run_args, expect_ops=(), atol=2e-5, rtol=1e-4):
    """Exports `model` at `args`, runs the ONNX graph in ONNX Runtime at `run_args` and compares with eager."""
    model.eval()
    proto = _export(model, args, dynamic_shapes).model_proto
    nodes = list(_subgraph_nodes(proto.graph))
    assert {n.domain for n in nodes} <= set(torchops.onnx.STANDARD_DOMAINS)
    assert {o.domain for o in proto.opset_import} <= set(torchops.onnx.STANDARD_DOMAINS)
    assert len(proto.functions) == 0
    op_types = {n.op_type for n in nodes}
    assert set(expect_ops) <= op_types, f"expected {expect_ops} in the graph, got {sorted(op_types)}"
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = [a for a in tree_leaves(run_args) if isinstance(a, torch.Tensor)]
    assert len(session.get_inputs()) == len(inputs)
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), inputs)})
    with torch.no_grad():
        want = tree_leaves(model(*run_args))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert tuple(g.shape) == tuple(w.shape)
        torch.testing.assert_close(torch.from_numpy(g), w, atol=atol, rtol=rtol)


def _randomize(model, scale=0.5):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-scale, scale)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.uniform_(-1, 1)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2)
    return model


def _dims():
    return Dim("batch", min=1, max=64), Dim("time", min=1, max=64)


# ---------------------------------------------------------------------------------------------------------
# FusedBatchNorm
# ---------------------------------------------------------------------------------------------------------

def test_batch_norm_2d_module():
    B, _ = _dims()
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), torchops.nn.BatchNorm2d(3), nn.ReLU())
    _randomize(model)
    _check(model, (torch.randn(2, 2, 5, 5),), ({0: B},), (torch.randn(7, 2, 5, 5),))


@pytest.mark.slow
def test_batch_norm_3d_module():
    B, _ = _dims()
    model = _randomize(torchops.nn.BatchNorm3d(3))
    _check(model, (torch.randn(2, 3, 2, 3, 4),), ({0: B},), (torch.randn(5, 3, 2, 3, 4),),
           expect_ops=("BatchNormalization",))


class _RawBatchNorm(nn.Module):
    def __init__(self, c, data_format):
        super().__init__()
        self.data_format = data_format
        self.scale, self.offset = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.randn(c))
        self.register_buffer("mean", torch.randn(c))
        self.register_buffer("var", torch.rand(c) + 0.5)

    def forward(self, x):
        return torch.ops.torchops.fused_batch_norm_v3(x, self.scale, self.offset, self.mean, self.var, 0.001, 1.0,
                                                      self.data_format, False)


@pytest.mark.parametrize("data_format, shape", [
    ("NHWC", (2, 4, 5, 3)), pytest.param("NCHW", (2, 3, 4, 5), marks=pytest.mark.slow),
    ("NDHWC", (2, 2, 3, 4, 3)), pytest.param("NCDHW", (2, 3, 2, 3, 4), marks=pytest.mark.slow)])
def test_fused_batch_norm_v3_op(data_format, shape):
    B, _ = _dims()
    run = (5,) + shape[1:]
    _check(_RawBatchNorm(3, data_format), (torch.randn(shape),), ({0: B},), (torch.randn(run),))


def test_fused_batch_norm_v3_op_float16():
    """float16 input, float32 statistics: the math in float32 as the eager op, the output in float16."""
    B, _ = _dims()
    _check(_RawBatchNorm(3, "NHWC"), (torch.randn(2, 4, 5, 3).half(),), ({0: B},),
           (torch.randn(5, 4, 5, 3).half(),), atol=1e-3, rtol=1e-3)


# ---------------------------------------------------------------------------------------------------------
# Block RNN ops and modules
# ---------------------------------------------------------------------------------------------------------

def test_block_gru_module():
    B, T = _dims()
    model = _randomize(torchops.nn.BlockGRU(4, 5))
    _check(model, (torch.randn(3, 2, 4), torch.randn(1, 2, 5)), ({0: T, 1: B}, {1: B}),
           (torch.randn(6, 4, 4), torch.randn(1, 4, 5)), expect_ops=("GRU",))


@pytest.mark.slow
def test_block_gru_module_batch_first_and_cell():
    B, T = _dims()
    _check(_randomize(torchops.nn.BlockGRU(4, 5, batch_first=True)), (torch.randn(2, 3, 4),), ({0: B, 1: T},),
           (torch.randn(4, 6, 4),), expect_ops=("GRU",))
    _check(_randomize(torchops.nn.GRUBlockCell(4, 5)), (torch.randn(2, 4), torch.randn(2, 5)), ({0: B}, {0: B}),
           (torch.randn(3, 4), torch.randn(3, 5)))


@pytest.mark.parametrize("kwargs", [dict(version=1, forget_bias=0.7, cell_clip=0.6, use_peephole=True),
                                    pytest.param(dict(version=2), marks=pytest.mark.slow)],
                         ids=["v1-clip-peephole", "v2"])
def test_block_lstm_module(kwargs):
    B, T = _dims()
    model = _randomize(torchops.nn.BlockLSTM(4, 5, **kwargs), scale=0.8)
    h0, c0 = torch.randn(1, 2, 5), torch.randn(1, 2, 5)
    _check(model, (torch.randn(3, 2, 4), (h0, c0)), ({0: T, 1: B}, ({1: B}, {1: B})),
           (torch.randn(6, 4, 4), (torch.randn(1, 4, 5), torch.randn(1, 4, 5))), expect_ops=("Loop",))


@pytest.mark.slow
def test_lstm_block_cell_module_and_batch_first():
    B, T = _dims()
    cell = _randomize(torchops.nn.LSTMBlockCell(4, 5, forget_bias=0.5, cell_clip=0.5, use_peephole=True), 0.8)
    _check(cell, (torch.randn(2, 4), (torch.randn(2, 5), torch.randn(2, 5))), ({0: B}, ({0: B}, {0: B})),
           (torch.randn(3, 4), (torch.randn(3, 5), torch.randn(3, 5))))
    model = _randomize(torchops.nn.BlockLSTM(4, 5, version=2, cell_clip=0.5, batch_first=True))
    _check(model, (torch.randn(2, 3, 4),), ({0: B, 1: T},), (torch.randn(4, 6, 4),))


class _RawBlockOp(nn.Module):
    """Calls one block RNN op with its weights as parameters; returns all of the op's outputs."""

    def __init__(self, name, I, C, **attrs):
        super().__init__()
        self.name, self.attrs = name, attrs
        if "gru" in name:
            self.w_ru, self.w_c = nn.Parameter(torch.randn(I + C, 2 * C) * 0.4), nn.Parameter(torch.randn(I + C, C) * 0.4)
            self.b_ru, self.b_c = nn.Parameter(torch.randn(2 * C) * 0.4), nn.Parameter(torch.randn(C) * 0.4)
        else:
            self.w, self.b = nn.Parameter(torch.randn(I + C, 4 * C) * 0.4), nn.Parameter(torch.randn(4 * C) * 0.4)
            self.wci, self.wcf, self.wco = (nn.Parameter(torch.randn(C) * 0.4) for _ in range(3))

    def forward(self, *args):
        op = getattr(torch.ops.torchops, self.name)
        if "gru" in self.name:
            return op(*args, self.w_ru, self.w_c, self.b_ru, self.b_c)
        return op(*args, self.w, self.wci, self.wcf, self.wco, self.b, **self.attrs)


def test_block_rnn_cell_ops():
    B, _ = _dims()
    x, h, c = torch.randn(2, 4), torch.randn(2, 5), torch.randn(2, 5)
    x2, h2, c2 = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5)
    _check(_RawBlockOp("gru_block_cell", 4, 5), (x, h), {"args": ({0: B}, {0: B})}, (x2, h2))
    _check(_RawBlockOp("lstm_block_cell", 4, 5, forget_bias=0.3, cell_clip=0.5, use_peephole=True),
           (x, c, h), {"args": ({0: B}, {0: B}, {0: B})}, (x2, c2, h2))


@pytest.mark.slow
@pytest.mark.parametrize("name, attrs", [
    ("block_gru", {}),
    ("block_lstm", dict(forget_bias=0.4, cell_clip=0.5, use_peephole=True)),
    ("block_lstm_v2", dict(cell_clip=0.0, use_peephole=True)),
])
def test_block_sequence_ops(name, attrs):
    """All outputs at every step, with seq_len_max < T at run time (zeros past it)."""
    B, T = _dims()
    gru = "gru" in name
    args = (torch.tensor(3), torch.randn(3, 2, 4)) + ((torch.randn(2, 5),) if gru else
                                                     (torch.randn(2, 5), torch.randn(2, 5)))
    run = (torch.tensor(4), torch.randn(6, 3, 4)) + ((torch.randn(3, 5),) if gru else
                                                     (torch.randn(3, 5), torch.randn(3, 5)))
    dyn = (None, {0: T, 1: B}) + ({0: B},) * (1 if gru else 2)
    _check(_RawBlockOp(name, 4, 5, **attrs), args, {"args": dyn}, run)


# ---------------------------------------------------------------------------------------------------------
# CudnnRNN ops and modules
# ---------------------------------------------------------------------------------------------------------

def _lengths(*values):
    return torch.tensor(values, dtype=torch.int32)


def test_cudnn_lstm_bidirectional_lengths():
    """2 layers, both directions, unsorted lengths with a zero-length row, given initial states."""
    B, T = _dims()
    model = _randomize(torchops.nn.CudnnLSTM(2, 5, 4, direction="bidirectional"))
    args = (torch.randn(3, 2, 4), (torch.randn(4, 2, 5), torch.randn(4, 2, 5)), _lengths(3, 2))
    run = (torch.randn(6, 4, 4), (torch.randn(4, 4, 5), torch.randn(4, 4, 5)), _lengths(2, 6, 0, 5))
    _check(model, args, ({0: T, 1: B}, ({1: B}, {1: B}), {0: B}), run, expect_ops=("LSTM",))


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["CudnnGRU", "CudnnRNNTanh", "CudnnRNNRelu"])
def test_cudnn_single_state_modules(cls):
    B, T = _dims()
    model = _randomize(getattr(torchops.nn, cls)(2, 5, 4, direction="bidirectional"))
    args = (torch.randn(3, 2, 4), torch.randn(4, 2, 5), _lengths(3, 1))
    run = (torch.randn(6, 4, 4), torch.randn(4, 4, 5), _lengths(6, 0, 3, 1))
    _check(model, args, ({0: T, 1: B}, {1: B}, {0: B}), run, expect_ops=("GRU" if cls == "CudnnGRU" else "RNN",))


@pytest.mark.slow
def test_cudnn_lstm_batch_major_skip_input():
    B, T = _dims()
    model = _randomize(torchops.nn.CudnnLSTM(2, 4, 4, time_major=False, input_mode="skip_input",
                                             direction="bidirectional"))
    args = (torch.randn(2, 3, 4), None, _lengths(3, 2))
    run = (torch.randn(4, 6, 4), None, _lengths(1, 6, 0, 4))
    _check(model, args, ({0: B, 1: T}, None, {0: B}), run, expect_ops=("LSTM",))


@pytest.mark.slow
def test_cudnn_lstm_projection():
    B, T = _dims()
    model = _randomize(torchops.nn.CudnnLSTM(2, 6, 4, direction="bidirectional", num_proj=3))
    args = (torch.randn(3, 2, 4), (torch.randn(4, 2, 3), torch.randn(4, 2, 6)), _lengths(3, 2))
    run = (torch.randn(5, 4, 4), (torch.randn(4, 4, 3), torch.randn(4, 4, 6)), _lengths(2, 5, 0, 4))
    _check(model, args, ({0: T, 1: B}, ({1: B}, {1: B}), {0: B}), run, expect_ops=("Loop",))


class _RawCudnn(nn.Module):
    def __init__(self, name, size, **attrs):
        super().__init__()
        self.name, self.attrs = name, attrs
        self.params = nn.Parameter(torch.randn(size) * 0.3)

    def forward(self, *args):
        x, h, c = args[:3]
        return getattr(torch.ops.torchops, self.name)(x, h, c, self.params, *args[3:], is_training=False,
                                                      **self.attrs)


@pytest.mark.slow
@pytest.mark.parametrize("name, mode", [("cudnn_rnn", "lstm"), ("cudnn_rnn_v2", "gru"), ("cudnn_rnn_v3", "lstm")])
def test_cudnn_rnn_ops(name, mode):
    """The raw ops, every output; v3 with auto_select picking skip_input, batch-major and lengths."""
    B, T = _dims()
    attrs = dict(rnn_mode=mode, direction="bidirectional")
    I, H = (5, 5) if name == "cudnn_rnn_v3" else (4, 5)
    if name == "cudnn_rnn_v3":
        attrs.update(input_mode="auto_select", time_major=False)
    size = int(torch.ops.torchops.cudnn_rnn_params_size(1, H, I, rnn_mode=mode, direction="bidirectional",
                                                        input_mode=attrs.get("input_mode", "linear_input")))
    model = _RawCudnn(name, size, **attrs)
    c_shape = (lambda b: (2, b, H)) if mode == "lstm" else (lambda b: ())
    if name == "cudnn_rnn_v3":
        args = (torch.randn(2, 3, I), torch.randn(2, 2, H), torch.randn(2, 2, H), _lengths(3, 1))
        run = (torch.randn(4, 6, I), torch.randn(4, 2, H), torch.randn(4, 2, H), _lengths(2, 0, 6, 5))
        dyn = ({0: B, 1: T}, {0: B}, {0: B}, {0: B})
    else:
        args = (torch.randn(3, 2, I), torch.randn(2, 2, H), torch.randn(c_shape(2)))
        run = (torch.randn(6, 4, I), torch.randn(2, 4, H), torch.randn(c_shape(4)))
        dyn = ({0: T, 1: B}, {1: B}, {1: B} if mode == "lstm" else None)
    _check(model, args, {"args": dyn}, run, expect_ops=("LSTM" if mode == "lstm" else "GRU",))


class _Converters(nn.Module):
    def forward(self, params):
        # canonical pieces built with torch ops (params_to_canonical's list outputs do not export, see below)
        ws = [params[3 * k:3 * k + 6].reshape(3, 2) for k in range(3)] + [params[k:k + 9].reshape(3, 3)
                                                                          for k in range(3)]
        bs = [params[k:k + 3] * 2 for k in range(6)]
        size = torch.ops.torchops.cudnn_rnn_params_size(1, 3, 2, rnn_mode="gru", S=torch.int64)
        return (torch.ops.torchops.cudnn_rnn_canonical_to_params(1, 3, 2, ws, bs, rnn_mode="gru"), size,
                torch.ops.torchops.cudnn_rnn_canonical_to_params_v2(1, 3, 2, ws, bs, rnn_mode="gru"))


def test_cudnn_rnn_params_size_and_canonical_to_params():
    _check(_Converters(), (torch.randn(63),), None, (torch.randn(63),))


class _ToCanonical(nn.Module):
    def forward(self, params):
        return torch.ops.torchops.cudnn_rnn_params_to_canonical(1, 3, 2, params, 6, rnn_mode="gru")[0][0]


def test_params_to_canonical_is_an_error():
    with pytest.raises(ExportError, match="cudnn_rnn_params_to_canonical returns lists of tensors"):
        _export(_ToCanonical(), (torch.randn(63),), None)


# ---------------------------------------------------------------------------------------------------------
# The clear errors
# ---------------------------------------------------------------------------------------------------------

def test_training_mode_batch_norm_is_an_error():
    model = torchops.nn.BatchNorm2d(3).train()
    with pytest.raises(ExportError, match=r"model\.eval\(\)"):
        _export(model, (torch.randn(2, 3, 4, 4),), None)


def test_training_mode_dropout_is_an_error():
    model = torchops.nn.CudnnLSTM(2, 5, 4, dropout=0.5).train()
    with pytest.raises(ExportError, match=r"dropout=0\.5.*model\.eval\(\)"):
        _export(model, (torch.randn(3, 2, 4),), None)


def test_batched_is_an_error():
    model = nn.Sequential(torchops.nn.Batched(nn.Linear(3, 3), max_batch_size=4, batch_timeout_micros=1000))
    with pytest.raises(ExportError, match=r"model\.0 is a torchops\.nn\.Batched.*model\.0\.module"):
        _export(model, (torch.randn(2, 3),), None)


class _BatchUnbatch(nn.Module):
    def forward(self, x):
        batched, index, id = torch.ops.torchops.batch([x], 1, 4, 1000, 1000, shared_name="onnx_test")
        return torch.ops.torchops.unbatch(batched[0] * 2, index, id, 1000000, shared_name="onnx_test_u")


def test_batching_ops_are_an_error():
    with pytest.raises(ExportError, match=r"torchops::batch cannot be exported to ONNX.*batched\.module"):
        _export(_BatchUnbatch(), (torch.randn(2, 3),), None)


class _Grad(nn.Module):
    def forward(self, dy, x, scale):
        return torch.ops.torchops.fused_batch_norm_grad_v3(dy, x, scale, scale, scale, scale, 0.001, "NHWC", False)


def test_gradient_op_is_an_error():
    with pytest.raises(ExportError, match="fused_batch_norm_grad_v3 is a gradient op"):
        _export(_Grad(), (torch.randn(2, 3, 3, 4), torch.randn(2, 3, 3, 4), torch.rand(4) + 1), None)


def test_translation_table_covers_the_forward_ops():
    table = torchops.onnx.translation_table()
    for name in ("fused_batch_norm_v3", "cudnn_rnn", "cudnn_rnn_v2", "cudnn_rnn_v3", "cudnn_rnn_params_size",
                 "cudnn_rnn_canonical_to_params", "cudnn_rnn_canonical_to_params_v2", "gru_block_cell", "block_gru",
                 "lstm_block_cell", "block_lstm", "block_lstm_v2", "batch", "unbatch"):
        assert getattr(torch.ops.torchops, name).default in table
