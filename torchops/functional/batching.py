"""Typed, TorchScript-scriptable wrappers of the batching ops (`torch.ops.torchops.batch`, `unbatch`,
`unbatch_grad`), with TF's argument names and defaults. See docs/batching.md."""
from typing import List, Optional, Tuple

import torch
from torch import Tensor


def batch(in_tensors: List[Tensor], num_batch_threads: int, max_batch_size: int, batch_timeout_micros: int,
          grad_timeout_micros: int, max_enqueued_batches: int = 10, allowed_batch_sizes: Optional[List[int]] = None,
          container: str = "", shared_name: str = "", batching_queue: str = "") -> Tuple[List[Tensor], Tensor, Tensor]:
    """`tf.raw_ops.Batch`: concatenates concurrent invocations along dim 0.

    Blocks until this invocation's batch is processed. The last invocation of a batch receives the
    batched (and padded) tensors and a `[K, 3]` `batch_index` (`[id, start, end)` rows); the others
    receive empty tensors and a `[0, 3]` index. Every invocation receives its own int64 scalar `id`.
    """
    allowed: List[int] = [] if allowed_batch_sizes is None else allowed_batch_sizes
    return torch.ops.torchops.batch(in_tensors, num_batch_threads, max_batch_size, batch_timeout_micros,
                                    grad_timeout_micros, max_enqueued_batches, allowed, container,
                                    shared_name, batching_queue)


def unbatch(batched_tensor: Tensor, batch_index: Tensor, id: Tensor, timeout_micros: int, container: str = "",
            shared_name: str = "") -> Tensor:
    """`tf.raw_ops.Unbatch`: returns this invocation's rows of the batch holder's `batched_tensor`.

    Raises "Batched data did not arrive within timeout window." after `timeout_micros`.
    """
    return torch.ops.torchops.unbatch(batched_tensor, batch_index, id, timeout_micros, container, shared_name)


def unbatch_grad(original_input: Tensor, batch_index: Tensor, grad: Tensor, id: Tensor, container: str = "",
                 shared_name: str = "", timeout_micros: int = -1) -> Tensor:
    """`tf.raw_ops.UnbatchGrad`: gathers every invocation's `grad` into the batch holder's gradient
    (N rows, no padding); non-holders get an empty tensor. `timeout_micros=-1` waits forever (TF)."""
    return torch.ops.torchops.unbatch_grad(original_input, batch_index, grad, id, container, shared_name,
                                           timeout_micros)
