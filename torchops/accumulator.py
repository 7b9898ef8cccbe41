"""Python front of the ConditionalAccumulator family, mirroring TF's `tf.compat.v1.ConditionalAccumulator`
and `SparseConditionalAccumulator`.

The accumulators are TorchScript custom classes (`torch.classes.torchops.ConditionalAccumulator`,
`torch.classes.torchops.SparseConditionalAccumulator`) whose state lives in C++; the TF-style ops
(`torch.ops.torchops.accumulator_apply_gradient`, ...) take them as their handle. These Python classes
wrap a handle (`.handle`) with TF's method names and argument conversions. See docs/accumulator.md.
"""
import operator
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["ConditionalAccumulator", "SparseConditionalAccumulator", "close_all"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def close_all() -> None:
    """Closes every accumulator of the process (shared and private): blocked takes fail with
    "TakeGrad operation was cancelled", later applies/takes raise, and the shared registry is emptied
    (a later creation under the same name gets a fresh accumulator). Called at interpreter exit."""
    torch.ops.torchops._accumulator_close_all(False)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shape_arg(shape) -> Optional[List[int]]:
    if shape is None:
        return None
    if isinstance(shape, torch.Size):
        return list(shape)
    if _is_int(shape):
        return [shape]
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise TypeError(f"shape must be None, an int or a sequence of ints (None for an unknown dim), got {shape!r}")
    dims = list(shape)
    for d in dims:
        if d is not None and not _is_int(d):
            raise TypeError(f"shape entries must be ints or None, got {d!r} ({type(d).__name__}) in shape {dims!r}")
    return [-1 if d is None else d for d in dims]


def _int_arg(name: str, v) -> int:
    # Integer-like values (numpy integers, 0-d integer tensors) count as ints, as TF's wrapper casts them.
    if isinstance(v, bool) or (isinstance(v, Tensor) and v.dim() != 0):
        raise TypeError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {v!r} ({type(v).__name__})") from None


def _timeout_arg(timeout) -> Optional[float]:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be None or a number of seconds, got {timeout!r} ({type(timeout).__name__})")
    return float(timeout)


def _real_grad(name: str, t: Tensor) -> Tensor:
    # (converting a complex gradient to the accumulator's real dtype would drop its imaginary part)
    if t.is_complex():
        raise TypeError(f"{name} must be a real tensor, got dtype {t.dtype}")
    return t


def _check_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
    if dtype not in _DTYPES:
        raise TypeError(f"dtype must be one of float16, bfloat16, float32, float64, got {dtype}")
    return dtype


def _take(fn, *args):
    try:
        return fn(*args)
    except RuntimeError as e:
        if "TakeGrad timed out" in str(e):
            raise TimeoutError(str(e)) from None
        raise


class _Base:
    _cls = ""

    def _refuse_export(self) -> None:
        # The handle is a live C++ object shared with other threads; tracing would bake in one step's result.
        if torch.compiler.is_exporting():
            raise RuntimeError(
                f"torchops.{type(self).__name__} cannot be exported (torch.export / AOTInductor): its state (the "
                f"gradients accepted so far, the global step, the waiting takers) lives in this process and is shared "
                f"between threads, which an exported program cannot carry. Export the model without it and call it "
                f"around the exported program: apply_grad the gradients the program computes and take_grad in eager "
                f"Python (see docs/deployment.md)")

    def __init__(self, dtype, shape=None, shared_name: Optional[str] = None, reduction_type: str = "MEAN",
                 container: str = "", name: Optional[str] = None):
        self.dtype = _check_dtype(dtype)
        if reduction_type not in ("MEAN", "SUM"):
            raise ValueError(f"reduction_type must be 'MEAN' or 'SUM', got {reduction_type!r}")
        self.name = name
        self.handle = getattr(torch.classes.torchops, self._cls)(dtype, _shape_arg(shape), container,
                                                                 shared_name or "", reduction_type)

    @property
    def shape(self) -> Optional[List[Optional[int]]]:
        """The declared (partial) shape: None for unknown rank; None entries for unknown dims."""
        s = self.handle.shape()
        return None if s is None else [None if d < 0 else d for d in s]

    @property
    def reduction_type(self) -> str:
        return self.handle.reduction_type()

    @property
    def shared_name(self) -> str:
        return self.handle.shared_name()

    @property
    def container(self) -> str:
        return self.handle.container()

    def num_accumulated(self) -> int:
        """Gradients accepted since the last take (stale ones do not count)."""
        return self.handle.num_accumulated()

    def set_global_step(self, new_global_step: int) -> None:
        """Sets the global step; gradients with a smaller local_step are dropped from then on. A lower value
        than the current one is allowed with a warning (as TF)."""
        self._refuse_export()
        self.handle.set_global_step(int(new_global_step))

    def global_step(self) -> int:
        return self.handle.global_step()

    def close(self) -> None:
        """Fails every pending take ("TakeGrad operation was cancelled"); later applies/takes raise.
        Closing a shared accumulator closes it for every sharer."""
        self.handle.close()

    @property
    def closed(self) -> bool:
        return self.handle.closed()

    def stats(self) -> Dict[str, int]:
        """{"applied", "dropped_stale", "takes", "timeouts", "cancelled"}: counts since creation."""
        return dict(self.handle.stats())


class ConditionalAccumulator(_Base):
    """Aggregates dense gradients (TF `ConditionalAccumulator`).

    `apply_grad(grad, local_step)` adds `grad` unless `local_step < global_step` (then it is dropped and
    counted as stale); `take_grad(n)` blocks until at least `n` gradients were accepted, returns their
    mean (or sum) over *all* accepted gradients, resets, and increments the global step. Takers are
    served first come, first served. Gradients may be CPU or CUDA tensors (one device per round).
    """

    _cls = "ConditionalAccumulator"

    def apply_grad(self, grad, local_step: int = 0) -> None:
        self._refuse_export()
        local_step = _int_arg("local_step", local_step)
        if not isinstance(grad, Tensor):
            _real_grad("grad", torch.as_tensor(grad))
            grad = torch.as_tensor(grad, dtype=self.dtype)
        elif grad.dtype != self.dtype:
            grad = _real_grad("grad", grad).to(self.dtype)  # TF converts the gradient to the accumulator dtype
        declared = self.shape
        if declared is not None and (grad.dim() != len(declared) or any(
                d is not None and d != g for d, g in zip(declared, grad.shape))):
            # TF's wrapper checks this when the op is built, so even a stale gradient is refused
            want = "[" + ", ".join("?" if d is None else str(d) for d in declared) + "]"
            raise ValueError(f"Shape mismatch: expected {want}, got {list(grad.shape)} (apply_grad: grad is "
                             f"incompatible with the accumulator's declared shape)")
        self.handle.apply_grad(local_step, grad)

    def take_grad(self, num_required: int, timeout: Optional[float] = None) -> Tensor:
        """Blocks until `num_required` gradients were accepted (or `timeout` seconds pass: TimeoutError,
        state unchanged; or the accumulator is closed: RuntimeError "... was cancelled")."""
        self._refuse_export()
        return _take(self.handle.take_grad, _int_arg("num_required", num_required), _timeout_arg(timeout))


class SparseConditionalAccumulator(_Base):
    """Aggregates sparse (row-indexed) gradients (TF `SparseConditionalAccumulator`).

    A gradient is (indices [nnz], values [nnz, ...], dense shape). MEAN divides each row by the number
    of accepted gradients that contained its index. Unlike TF, indices may be unsorted and duplicates
    within one gradient are summed (counted once); `take_grad` returns unique ascending indices.
    """

    _cls = "SparseConditionalAccumulator"

    def apply_grad(self, grad_indices, grad_values=None, grad_shape=None, local_step: int = 0) -> None:
        """`apply_grad(indices, values, shape=None, local_step=0)`, or `apply_grad(sparse_coo_tensor,
        local_step=...)` (sparse_dim 1: indexed rows)."""
        self._refuse_export()
        local_step = _int_arg("local_step", local_step)
        if isinstance(grad_indices, Tensor) and grad_indices.layout == torch.sparse_coo:
            if grad_values is not None or grad_shape is not None:
                raise ValueError("apply_grad: with a sparse COO gradient pass no grad_values/grad_shape")
            g = grad_indices if grad_indices.dtype == self.dtype else _real_grad("grad", grad_indices).to(self.dtype)
            self.handle.apply_sparse_grad(local_step, g)
            return
        if grad_values is None:
            raise ValueError("apply_grad: grad_values is required with dense grad_indices")
        idx = torch.as_tensor(grad_indices)
        if idx.dtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
            idx = idx.to(torch.int64)
        if isinstance(grad_values, Tensor):
            vals = _real_grad("grad_values", grad_values)
        else:
            _real_grad("grad_values", torch.as_tensor(grad_values))
            vals = torch.as_tensor(grad_values, dtype=self.dtype)
        if vals.dtype != self.dtype:
            vals = vals.to(self.dtype)
        shp = None
        if grad_shape is not None:
            shp = torch.as_tensor(list(grad_shape) if isinstance(grad_shape, torch.Size) else grad_shape,
                                  dtype=torch.int64).reshape(-1)
        self.handle.apply_grad(local_step, idx, vals, shp)

    def apply_indexed_slices_grad(self, grad: Tensor, local_step: int = 0) -> None:
        """A sparse COO gradient (TF: IndexedSlices with its dense_shape)."""
        self.apply_grad(grad, local_step=local_step)

    def take_grad(self, num_required: int, timeout: Optional[float] = None) -> Tuple[Tensor, Tensor, Tensor]:
        """(indices, values, shape); shape[0] is the declared dim 0 (-1 if unknown)."""
        self._refuse_export()
        return _take(self.handle.take_grad, _int_arg("num_required", num_required), _timeout_arg(timeout))

    def take_indexed_slices_grad(self, num_required: int, timeout: Optional[float] = None) -> Tensor:
        """The taken gradient as a sparse COO tensor (sparse_dim 1). An unknown dim 0 becomes max index + 1."""
        indices, values, shape = self.take_grad(num_required, timeout)
        size = shape.tolist()
        if size[0] < 0:
            size[0] = int(indices.max().item()) + 1 if indices.numel() else 0
        return torch.sparse_coo_tensor(indices.unsqueeze(0), values, size, is_coalesced=True)


def _close_at_exit() -> None:
    """Interpreter exit: close everything (no new accumulators), then let released takers get back into
    Python before finalization."""
    try:
        torch.ops.torchops._accumulator_close_all(True)
        deadline = time.monotonic() + 5.0
        while torch.ops.torchops._accumulator_in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.001)
    except Exception:
        pass


try:  # before non-daemon threads are joined, so that threads blocked in a take are released
    threading._register_atexit(_close_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    import atexit

    atexit.register(_close_at_exit)
