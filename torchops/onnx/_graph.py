"""Graph-building helpers shared by the translations: constants, masks and ONNX `Loop` nodes.

The translations run inside `torch.onnx.export`'s tracer: every `op.<Name>(...)` call records one standard
ONNX node (domain ""). A `Loop` needs a body graph and one output per loop-carried and scanned value, which
the tracer's `op.Loop` cannot express (it returns one output), so `loop()` records that node itself.
"""
import itertools
from typing import Callable, List, Sequence

import numpy as np
import onnx_ir as ir
import onnxscript
from onnxscript import opset18 as op

_names = itertools.count()


class ExportError(RuntimeError):
    """A torchops op or module that has no ONNX translation in the form given (the message says what to do)."""


def ints(values: Sequence[int]):
    return op.Constant(value_ints=[int(v) for v in values])


def like(array, ref):
    """A constant with `array`'s values in `ref`'s dtype."""
    return op.CastLike(op.Constant(value=ir.tensor(np.asarray(array, dtype=np.float64))), ref)


def empty_like(ref):
    """A `[0]` tensor of `ref`'s dtype (the empty reserve-space outputs)."""
    return op.CastLike(op.ConstantOfShape(ints([0])), ref)


def dim(x, axis: int):
    """`x.shape[axis]` as a 1-D int64 tensor of one element."""
    return op.Shape(x, start=axis, end=axis + 1)


def static_dim(x, axis: int, what: str) -> int:
    d = x.shape[axis]
    if not isinstance(d, int):
        raise ExportError(f"{what} (dimension {axis} of a {len(x.shape)}-D input) must be static for the ONNX "
                          f"export, got the dynamic size {d}")
    return d


def time_mask(lengths, steps, ref):
    """`[T, B, 1]` mask (in `ref`'s dtype) of the steps `t < lengths[b]`, T = `steps` (a 1-element tensor)."""
    t = op.Range(op.Constant(value_int=0), op.Squeeze(steps, ints([0])), op.Constant(value_int=1))
    valid = op.Less(op.Unsqueeze(t, ints([1])), op.Unsqueeze(op.Cast(lengths, to=ir.DataType.INT64), ints([0])))
    return op.CastLike(op.Unsqueeze(valid, ints([2])), ref)


class _Body:
    """Records standard ONNX nodes into a Loop body: `b.MatMul(x, y)` works like `op.MatMul(x, y)` but takes
    only ONNX values (constants are made in the outer graph and used from the body)."""

    def __init__(self):
        self.tape = ir.tape.Tape()

    def __getattr__(self, name: str):
        def record(*inputs, **attrs):
            return self.tape.op(name, list(inputs), attrs or None)
        return record


def loop(trip_count, carried: List, body_fn: Callable, num_scan: int, dtype: ir.DataType) -> List:
    """An ONNX Loop of `trip_count` (0-d int64) iterations. `body_fn(b, t, *carried)` builds one iteration with
    `b` (see `_Body`) from the iteration number `t` (0-d int64) and returns `(new_carried, scanned)`; the Loop
    returns the final carried values (each of `dtype`) followed by the scanned values stacked on a new leading
    axis."""
    n = next(_names)
    b = _Body()
    t = ir.Value(name=f"torchops_loop{n}_t", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    cond = ir.Value(name=f"torchops_loop{n}_cond", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    state = [ir.Value(name=f"torchops_loop{n}_state{i}", type=ir.TensorType(dtype)) for i in range(len(carried))]
    new_state, scanned = body_fn(b, t, *state)
    if len(scanned) != num_scan:
        raise AssertionError(f"loop body returned {len(scanned)} scanned values, expected {num_scan}")
    # A body output must be produced inside the body, hence the Identity nodes.
    outputs = [b.Identity(cond)] + [b.Identity(v) for v in list(new_state) + list(scanned)]
    # Unique names: the exporter names only the main graph's values, and ONNX wants one name per value.
    for k, value in enumerate(v for node in b.tape.nodes for v in node.outputs):
        value.name = f"torchops_loop{n}_v{k}"
    body = ir.Graph([t, cond] + state, outputs, nodes=b.tape.nodes, name=f"torchops_loop{n}_body")
    tracer = onnxscript.evaluator.default()
    true = op.Constant(value=ir.tensor(True))
    node = ir.Node("", "Loop", [trip_count, true] + list(carried), attributes=[ir.AttrGraph("body", body)],
                   num_outputs=len(carried) + num_scan, version=tracer.opset.version)
    tracer.nodes.append(node)
    return list(node.outputs)
