"""ONNX export of models that use torchops ops: every forward op translated to standard ONNX ops (domain
"" only), so any ONNX runtime runs the exported model without torchops. Needs `onnx` and `onnxscript`
(and `onnxruntime` to run the result); see docs/deployment.md.

    import torchops.onnx
    program = torchops.onnx.export(model.eval(), (x,), "model.onnx",
                                   dynamic_shapes=({0: torch.export.Dim("batch")},))

`translation_table()` is the `custom_translation_table` for `torch.onnx.export(..., dynamo=True)` itself.
"""
from typing import Any, Callable, Dict, Optional, Sequence

import torch

try:
    import onnxscript  # noqa: F401
except ImportError as e:  # the translations are onnxscript code
    raise ImportError("torchops.onnx needs the onnx and onnxscript packages (pip install onnx onnxscript; "
                      "onnxruntime to run the exported graph)") from e

from . import block_rnn, cudnn_rnn, fused_batch_norm  # noqa: E402
from ._graph import ExportError  # noqa: E402

__all__ = ["ExportError", "export", "translation_table", "STANDARD_DOMAINS"]

# The ONNX domains of an exported graph: the default operator set ("" / "ai.onnx") only.
STANDARD_DOMAINS = ("", "ai.onnx")

_BATCHING_MESSAGE = (
    "torchops::{op} cannot be exported to ONNX: which concurrent calls share a batch is decided at run time by "
    "this process's batching queue, which an ONNX graph cannot hold. Export the model without batching (the "
    "module inside torchops.nn.Batched: `batched.module`) and serve it with the runtime's own batching (e.g. "
    "an ONNX Runtime or Triton server batching requests)")


def _refuse_batching(op_name: str) -> Callable:
    def translation(*args, **kwargs):
        raise ExportError(_BATCHING_MESSAGE.format(op=op_name))
    return translation


def _refuse_gradient(op_name: str) -> Callable:
    def translation(*args, **kwargs):
        raise ExportError(f"torchops::{op_name} is a gradient op (training); an ONNX export is for inference: "
                          f"export the model in eval() mode under torch.no_grad(), without its backward")
    return translation


_FORWARD = {
    "fused_batch_norm_v3": fused_batch_norm.fused_batch_norm_v3,
    "cudnn_rnn": cudnn_rnn.cudnn_rnn,
    "cudnn_rnn_v2": cudnn_rnn.cudnn_rnn_v2,
    "cudnn_rnn_v3": cudnn_rnn.cudnn_rnn_v3,
    "cudnn_rnn_params_size": cudnn_rnn.cudnn_rnn_params_size,
    "cudnn_rnn_canonical_to_params": cudnn_rnn.cudnn_rnn_canonical_to_params,
    "cudnn_rnn_canonical_to_params_v2": cudnn_rnn.cudnn_rnn_canonical_to_params_v2,
    "gru_block_cell": block_rnn.gru_block_cell,
    "block_gru": block_rnn.block_gru,
    "lstm_block_cell": block_rnn.lstm_block_cell,
    "block_lstm": block_rnn.block_lstm,
    "block_lstm_v2": block_rnn.block_lstm_v2,
}
_BATCHING = ("batch", "unbatch", "unbatch_grad", "_batch_then_unbatch")
_GRADIENTS = ("fused_batch_norm_grad_v3", "gru_block_cell_grad", "block_gru_grad", "lstm_block_cell_grad",
              "block_lstm_grad", "block_lstm_grad_v2", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v2",
              "cudnn_rnn_backprop_v3")


def _refuse_list_outputs(op_name: str) -> Callable:
    def translation(*args, **kwargs):
        raise ExportError(f"torchops::{op_name} returns lists of tensors, which torch.onnx.export cannot take from "
                          f"a translation; split the params buffer outside the exported model (e.g. "
                          f"module.canonical_weights() when loading) and export the inference model")
    return translation


def translation_table() -> Dict[Any, Callable]:
    """`custom_translation_table` for `torch.onnx.export(..., dynamo=True)`: the ONNX translation of every
    torchops forward op, and translations that raise a clear `ExportError` for the batching and gradient ops and
    the params-to-canonical converters (their list outputs)."""
    ops = torch.ops.torchops
    table: Dict[Any, Callable] = {getattr(ops, name).default: fn for name, fn in _FORWARD.items()}
    table.update({getattr(ops, name).default: _refuse_batching(name) for name in _BATCHING})
    table.update({getattr(ops, name).default: _refuse_gradient(name) for name in _GRADIENTS})
    table.update({getattr(ops, name).default: _refuse_list_outputs(name)
                  for name in ("cudnn_rnn_params_to_canonical", "cudnn_rnn_params_to_canonical_v2")})
    return table


def _check_model(model: torch.nn.Module) -> None:
    from ..nn import Batched

    for name, module in model.named_modules():
        if isinstance(module, Batched):
            where = "the model" if name == "" else f"model.{name}"
            raise ExportError(
                f"{where} is a torchops.nn.Batched, which cannot be exported to ONNX: which concurrent calls share "
                f"a batch is decided at run time by this process's batching queue. Export the wrapped module "
                f"(`{'batched' if name == '' else where}.module`) and serve it with the runtime's own batching")


def _check_program(program) -> None:
    refused = {getattr(torch.ops.torchops, name).default: fn for name, fn in
               [(n, _refuse_batching(n)) for n in _BATCHING] + [(n, _refuse_gradient(n)) for n in _GRADIENTS]}
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target in refused:
            refused[node.target]()


def _our_error(e: BaseException) -> Optional[ExportError]:
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ExportError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def export(model: torch.nn.Module, args: Sequence[Any], path: Optional[str] = None, dynamic_shapes=None,
           input_names: Optional[Sequence[str]] = None, **kwargs):
    """`torch.onnx.export(model, args, path, dynamo=True, custom_translation_table=translation_table(), ...)`:
    returns the `torch.onnx.ONNXProgram` (saved to `path` when given). Export an `eval()` model: training-mode
    torchops ops (batch statistics, dropout) raise `ExportError`, as do `torchops.nn.Batched` and the batching
    ops. `dynamic_shapes` is torch.export's (e.g. `({0: torch.export.Dim("batch")},)`); the other keyword
    arguments go to `torch.onnx.export`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_model(model)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    kwargs.setdefault("verbose", False)
    # torch.export first: its errors come as they are, and the refused ops are found before torch.onnx.export
    # (which on a failed capture retries other strategies, some running the model eagerly).
    try:
        program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, strict=False)
        _check_program(program)
        program = torch.onnx.export(program, args, path, dynamo=True, custom_translation_table=translation_table(),
                                    input_names=input_names, **kwargs)
    except Exception as e:
        ours = _our_error(e)
        if ours is not None:
            raise ExportError(str(ours)) from None
        raise
    return program
