"""Python front of the batching ops: `batch_function`, `stats`, `list_queues`, `close_all`.

The ops themselves are `torch.ops.torchops.batch / unbatch / unbatch_grad` (typed wrappers in
`torchops.functional`, a scriptable module wrapper in `torchops.nn.Batched`). See docs/batching.md.
"""
import functools
import json
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import torch
from torch import Tensor

__all__ = ["batch_function", "stats", "list_queues", "close_all"]


def check_batching_args(num_batch_threads: Any, max_batch_size: Any, batch_timeout_micros: Any,
                        allowed_batch_sizes: Any, max_enqueued_batches: Any, grad_timeout_micros: Any,
                        unbatch_timeout_micros: Any) -> List[int]:
    """The batching attributes, checked when a front is built (the ops check them again per call);
    returns allowed_batch_sizes as a list."""
    for name, v, lo in (("num_batch_threads", num_batch_threads, 1), ("max_batch_size", max_batch_size, 1),
                        ("batch_timeout_micros", batch_timeout_micros, 0),
                        ("max_enqueued_batches", max_enqueued_batches, 0),
                        ("grad_timeout_micros", grad_timeout_micros, 0),
                        ("unbatch_timeout_micros", unbatch_timeout_micros, 0)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
        if v < lo or v >= 2 ** 63:
            raise ValueError(f"{name} must be in [{lo}, 2**63), got {v}")
    allowed = list(allowed_batch_sizes or [])
    for v in allowed:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"allowed_batch_sizes entries must be ints, got {v!r} in {allowed}")
    if allowed:
        if allowed[0] < 1 or any(b <= a for a, b in zip(allowed, allowed[1:])):
            raise ValueError(f"allowed_batch_sizes entries must be positive and increasing, got {allowed}")
        if allowed[-1] != max_batch_size:
            raise ValueError(f"the last entry of allowed_batch_sizes must equal max_batch_size ({max_batch_size}), "
                             f"got {allowed}")
    return allowed


def close_all() -> None:
    """Closes every batching resource of the process: queued batches are flushed to their callers,
    blocked Unbatch/UnbatchGrad calls raise, worker threads exit, and the registries are emptied (a
    later call creates fresh resources). Called automatically at interpreter exit."""
    torch.ops.torchops._batching_close_all()


def stats(shared_name: str = "", container: str = "", batching_queue: str = "") -> Dict[str, Any]:
    """Statistics of one batching queue, monotonic since the queue was created:

    `tasks`, `batches_formed`, `batches_failed` (batches whose concatenation failed; every task of
    such a batch got the error), `rows` (unpadded rows processed), `padding_rows`,
    `deferred_release` ({"batches": n, "fallbacks": m}: batches whose other calls were released by the
    holder's Unbatch, and how many of those by the fallback deadline instead; see docs/batching.md),
    `batch_size_histogram` ({padded batch size: count}), `rejections` ({"queue_full" |
    "task_too_large" | "invalid_input": count}) and `queue_wait_us` (count, total, mean, max, p50,
    p99 of the time from enqueue to the start of processing; percentiles over the latest 8192 tasks).
    Raises KeyError if no such queue exists.
    """
    s = torch.ops.torchops._batching_stats(container, shared_name, batching_queue)
    if not s:
        raise KeyError(f"no batching queue (container={container!r}, shared_name={shared_name!r}, "
                       f"batching_queue={batching_queue!r}); live queues: {list_queues()}")
    d = json.loads(s)
    d["batch_size_histogram"] = {int(k): v for k, v in d["batch_size_histogram"].items()}
    return d


def list_queues() -> List[tuple]:
    """(container, shared_name, batching_queue) of every live batching queue."""
    return [tuple(q) for q in json.loads(torch.ops.torchops._batching_list_queues())]


def batch_function(num_batch_threads: int, max_batch_size: int, batch_timeout_micros: int,
                   allowed_batch_sizes: Optional[List[int]] = None, max_enqueued_batches: int = 10,
                   grad_timeout_micros: int = 60_000_000, unbatch_timeout_micros: int = 60_000_000,
                   container: str = "", shared_name: Optional[str] = None) -> Callable:
    """Decorator like TF's `batch_function`: concurrent calls of the decorated tensor function are
    batched (concatenated along dim 0), the function runs once per batch, and each call returns
    exactly its own rows of the function's output(s).

    The decorated function takes tensors positionally (all with the same dim 0) and returns a tensor
    or a tuple/list of tensors whose dim 0 is the batch's (row-wise computation). Gradients flow
    back to each caller (CPU tensors). If the function raises on the batch, every call of the batch
    raises. Each decorated function gets its own queue unless `shared_name` is given.
    """
    allowed = check_batching_args(num_batch_threads, max_batch_size, batch_timeout_micros, allowed_batch_sizes,
                                  max_enqueued_batches, grad_timeout_micros, unbatch_timeout_micros)

    def decorator(fn: Callable) -> Callable:
        name = shared_name if shared_name is not None else (
            f"batch_function/{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}/"
            f"{uuid.uuid4().hex}")
        structure: Dict[str, Any] = {}  # "n": number of outputs, "single": returned a bare tensor
        lock = threading.Lock()

        def unbatch_name(k: int) -> str:
            return f"{name}/unbatch_{k}"

        @functools.wraps(fn)
        def wrapper(*args):
            if not args:
                raise ValueError(f"batch_function({fn!r}): expected at least one tensor argument, got none")
            for i, a in enumerate(args):
                if not isinstance(a, Tensor):
                    raise ValueError(f"batch_function({fn!r}): argument {i} must be a Tensor, got {type(a).__name__}")
            if args[0].dim() >= 1 and args[0].shape[0] == 0:
                return fn(*args)
            if "n" in structure and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
                # Inference, output structure known: a call that does not hold its batch gets its rows
                # from this one op call (batch + unbatch; each op call is a GIL round trip).
                batched, index, id_, rows = torch.ops.torchops._batch_then_unbatch(
                    list(args), num_batch_threads, max_batch_size, batch_timeout_micros, grad_timeout_micros,
                    max_enqueued_batches, allowed, container, name, "",
                    [unbatch_name(k) for k in range(structure["n"])], unbatch_timeout_micros)
                if rows:
                    return rows[0] if structure["single"] else tuple(rows)
            else:
                batched, index, id_ = torch.ops.torchops.batch(
                    list(args), num_batch_threads, max_batch_size, batch_timeout_micros, grad_timeout_micros,
                    max_enqueued_batches, allowed, container, name, "")
            holder = index.shape[0] > 0
            if holder:
                try:
                    out = fn(*batched)
                except BaseException as e:
                    msg = f"batch_function: {getattr(fn, '__qualname__', fn)!r} failed on the batch: {e!r}"
                    for k in range(structure.get("n", 1)):
                        torch.ops.torchops._unbatch_fail(index, msg, container, unbatch_name(k), unbatch_timeout_micros)
                    raise
            elif "n" in structure and not torch.is_grad_enabled():
                out = None
            else:  # as TF: run the function on the empty inputs (learns the output structure, and puts
                # this call's outputs into the autograd graph, e.g. of parameters the function uses)
                out = fn(*batched)
            if out is not None:
                single = isinstance(out, Tensor)
                outs = [out] if single else list(out)
                rows = batched[0].shape[0]
                bad = [tuple(o.shape) if isinstance(o, Tensor) else type(o).__name__ for o in outs
                       if not (isinstance(o, Tensor) and o.dim() > 0 and o.shape[0] == rows)]
                if bad:
                    # Not row-wise: splitting would hand out wrong rows (or leave the others waiting).
                    msg = (f"batch_function: {getattr(fn, '__qualname__', fn)!r} must return tensors whose dim 0 is "
                           f"the batch's ({rows} rows), got shape(s) {bad}")
                    for k in range(max(len(outs), structure.get("n", 1)) if holder else 0):
                        torch.ops.torchops._unbatch_fail(index, msg, container, unbatch_name(k), unbatch_timeout_micros)
                    raise ValueError(msg)
                with lock:
                    structure.setdefault("n", len(outs))
                    structure.setdefault("single", single)
                if not holder and not torch.is_grad_enabled():
                    outs = [batched[0]] * len(outs)
            else:
                outs = [batched[0]] * structure["n"]
            results = [torch.ops.torchops.unbatch(o, index, id_, unbatch_timeout_micros, container, unbatch_name(k))
                       for k, o in enumerate(outs)]
            return results[0] if structure["single"] else tuple(results)

        wrapper.shared_name = name  # type: ignore[attr-defined]
        return wrapper

    return decorator


def _close_at_exit() -> None:
    """Interpreter exit: close everything (refusing new calls), then give the released callers a moment
    to get back into Python before finalization (a daemon thread returning from an op while the
    interpreter finalizes would be terminated inside PyTorch's GIL re-acquisition)."""
    try:
        torch.ops.torchops._batching_close_all(True)
        deadline = time.monotonic() + 5.0
        while torch.ops.torchops._batching_in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
    except Exception:
        pass


# Close before the interpreter joins non-daemon threads, so threads blocked in a batching op are
# released (flushed batch or a "closed" error) instead of holding up exit. The C++ library also
# closes everything when it is unloaded.
try:
    threading._register_atexit(_close_at_exit)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    import atexit

    atexit.register(_close_at_exit)
