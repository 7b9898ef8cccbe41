"""`Batched`: run a module once per batch of concurrent calls (batch -> module -> unbatch)."""
import uuid
from typing import List, Optional

import torch
from torch import Tensor


# Which calls share a batch is only known at run time, so the batch holder's branch cannot be traced.
_EXPORT_ERROR = (
    "torchops.nn.Batched cannot be exported (torch.export / AOTInductor): which concurrent calls share a batch, and "
    "so which call runs the wrapped module, is decided at run time by this process's batching queue, which an "
    "exported program cannot hold. Instead export the wrapped module (`batched.module`) and batch the calls of the "
    "loaded program when serving, e.g. torchops.nn.Batched(exported_program.module()) or Batched around a module "
    "that calls an AOTInductor package (see docs/deployment.md)")


class Batched(torch.nn.Module):
    """Wraps `module` so that concurrent `forward` calls (from many Python threads, or many C++
    threads running the scripted model) are concatenated along dim 0, run through `module` once, and
    each call gets back exactly its own rows. Scriptable (`torch.jit.script(Batched(...))`).

    `module` must map `[B, ...] -> [B, ...]` row-wise (row i of the output depends on row i of the
    input only). Gradients flow back per call (CPU tensors), to the inputs and to the module's
    parameters; every call of a batch must then run its backward (each on its own thread if it likes):
    the batch holder's backward waits for the others' gradients. With grad enabled, calls that do not
    hold the batch run `module` on their 0-row batch (as TF does) so that their output joins the graph.
    Calls whose input has 0 rows run `module` directly. Each instance has its own queue unless
    `shared_name` is given. An exception in `module`, or an output that is not row-wise, fails every
    call of the batch (scripted: see docs/batching.md). With grad off, a call that does not hold its
    batch makes a single op call (`_batch_then_unbatch`).
    """

    allowed_batch_sizes: List[int]
    shared_name: str
    unbatch_name: str

    def __init__(self, module: torch.nn.Module, num_batch_threads: int = 1, max_batch_size: int = 32,
                 batch_timeout_micros: int = 1000, allowed_batch_sizes: Optional[List[int]] = None,
                 max_enqueued_batches: int = 10, grad_timeout_micros: int = 60_000_000,
                 unbatch_timeout_micros: int = 60_000_000, container: str = "", shared_name: Optional[str] = None,
                 batching_queue: str = ""):
        super().__init__()
        from ..batching import check_batching_args
        allowed_batch_sizes = check_batching_args(num_batch_threads, max_batch_size, batch_timeout_micros,
                                                  allowed_batch_sizes, max_enqueued_batches, grad_timeout_micros,
                                                  unbatch_timeout_micros)
        self.module = module
        self.num_batch_threads = num_batch_threads
        self.max_batch_size = max_batch_size
        self.batch_timeout_micros = batch_timeout_micros
        self.allowed_batch_sizes: List[int] = list(allowed_batch_sizes or [])
        self.max_enqueued_batches = max_enqueued_batches
        self.grad_timeout_micros = grad_timeout_micros
        self.unbatch_timeout_micros = unbatch_timeout_micros
        self.container = container
        self.shared_name: str = shared_name if shared_name is not None else f"torchops.nn.Batched/{uuid.uuid4().hex}"
        self.batching_queue = batching_queue
        self.unbatch_name: str = self.shared_name + "/unbatch"  # (not rebuilt on every call)

    def extra_repr(self) -> str:
        return (f"num_batch_threads={self.num_batch_threads}, max_batch_size={self.max_batch_size}, "
                f"batch_timeout_micros={self.batch_timeout_micros}, allowed_batch_sizes={self.allowed_batch_sizes}, "
                f"shared_name={self.shared_name!r}")

    @torch.jit.unused
    def _run_module_eager(self, batched: Tensor, index: Tensor) -> Tensor:
        try:
            return self.module(batched)
        except BaseException as e:  # hand the error to every call of the batch, not only this one
            torch.ops.torchops._unbatch_fail(index, f"Batched: the wrapped module failed on the batch: {e!r}",
                                             self.container, self.unbatch_name, self.unbatch_timeout_micros)
            raise

    def forward(self, x: Tensor) -> Tensor:
        if not torch.jit.is_scripting():
            if torch.compiler.is_exporting():
                raise RuntimeError(_EXPORT_ERROR)
        if x.size(0) == 0:
            return self.module(x)
        fast = not torch.is_grad_enabled()
        if not torch.jit.is_scripting():
            fast = fast and not torch.compiler.is_compiling()
        if fast:
            # Inference: a call that does not hold its batch gets its rows from this one op call (batch +
            # unbatch; from Python threads each op call costs a GIL round trip).
            batched, index, id, rows = torch.ops.torchops._batch_then_unbatch(
                [x], self.num_batch_threads, self.max_batch_size, self.batch_timeout_micros, self.grad_timeout_micros,
                self.max_enqueued_batches, self.allowed_batch_sizes, self.container, self.shared_name,
                self.batching_queue, [self.unbatch_name], self.unbatch_timeout_micros)
            if len(rows) > 0:
                return rows[0]
        else:
            batched, index, id = torch.ops.torchops.batch(
                [x], self.num_batch_threads, self.max_batch_size, self.batch_timeout_micros, self.grad_timeout_micros,
                self.max_enqueued_batches, self.allowed_batch_sizes, self.container, self.shared_name,
                self.batching_queue)
        if index.size(0) > 0:  # this call holds the batch: run the module once for everyone
            if torch.jit.is_scripting():
                # TorchScript cannot catch the module's exception and hand it on: if this call does not
                # unbatch the batch, its thread's next batching call (or exit) fails the other calls.
                torch.ops.torchops._arm_unbatch_fail(
                    index, "Batched: the call holding this batch did not deliver the result: the wrapped module "
                    "raised an exception on the batch (in TorchScript only the holding call receives it)",
                    self.container, self.unbatch_name, self.unbatch_timeout_micros)
                y = self.module(batched[0])
            else:
                y = self._run_module_eager(batched[0], index)
            if y.dim() == 0 or y.size(0) != batched[0].size(0):
                # Not row-wise: splitting it would hand out wrong rows (or leave the others waiting).
                msg = (f"Batched: the wrapped module must map [B, ...] -> [B, ...] row-wise, but returned shape "
                       f"{y.shape} for a batch of {batched[0].size(0)} rows")
                torch.ops.torchops._unbatch_fail(index, msg, self.container, self.unbatch_name,
                                                 self.unbatch_timeout_micros)
                raise ValueError(msg)
        elif torch.is_grad_enabled():
            # As TF: run the module on the empty batch, so that this call's output is part of the graph
            # (its backward must deposit its gradient for the holder, e.g. for parameter gradients).
            y = self.module(batched[0])
            if y.dim() == 0 or y.size(0) != 0:
                raise ValueError(f"Batched: the wrapped module must map [B, ...] -> [B, ...] row-wise, but returned "
                                 f"shape {y.shape} for an empty batch")
        else:
            y = batched[0]  # (compiling) placeholder: Unbatch delivers this call's rows of the holder's result
        return torch.ops.torchops.unbatch(y, index, id, self.unbatch_timeout_micros, self.container,
                                          self.unbatch_name)
