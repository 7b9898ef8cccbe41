"""Typed, TorchScript-scriptable wrappers of the accumulator ops, with TF's argument names and order
(`tf.raw_ops.ResourceAccumulatorApplyGradient` etc.). The handle is a
`torch.classes.torchops.ConditionalAccumulator` / `SparseConditionalAccumulator` (the `.handle` of
`torchops.ConditionalAccumulator`). See docs/accumulator.md."""
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["accumulator_apply_gradient", "accumulator_take_gradient", "accumulator_num_accumulated",
           "accumulator_set_global_step", "sparse_accumulator_apply_gradient", "sparse_accumulator_take_gradient"]


def accumulator_apply_gradient(handle: torch.classes.torchops.ConditionalAccumulator, local_step: int,
                               gradient: Tensor) -> None:
    """Adds `gradient` unless `local_step` is older than the accumulator's global step (dropped, counted)."""
    torch.ops.torchops.accumulator_apply_gradient(handle, local_step, gradient)


def accumulator_take_gradient(handle: torch.classes.torchops.ConditionalAccumulator, num_required: int,
                              timeout: Optional[float] = None) -> Tensor:
    """Blocks until `num_required` gradients were accepted; returns their mean (or sum) and resets."""
    return torch.ops.torchops.accumulator_take_gradient(handle, num_required, timeout)


def accumulator_num_accumulated(handle: torch.classes.torchops.ConditionalAccumulator) -> int:
    return torch.ops.torchops.accumulator_num_accumulated(handle)


def accumulator_set_global_step(handle: torch.classes.torchops.ConditionalAccumulator, new_global_step: int) -> None:
    torch.ops.torchops.accumulator_set_global_step(handle, new_global_step)


def sparse_accumulator_apply_gradient(handle: torch.classes.torchops.SparseConditionalAccumulator, local_step: int,
                                      gradient_indices: Tensor, gradient_values: Tensor,
                                      gradient_shape: Optional[Tensor] = None) -> None:
    """`gradient_shape` given <=> TF's `has_known_shape=True`."""
    if gradient_shape is None:
        torch.ops.torchops.sparse_accumulator_apply_gradient(handle, local_step, gradient_indices, gradient_values,
                                                             torch.empty([0], dtype=torch.int64), False)
    else:
        torch.ops.torchops.sparse_accumulator_apply_gradient(handle, local_step, gradient_indices, gradient_values,
                                                             gradient_shape, True)


def sparse_accumulator_take_gradient(handle: torch.classes.torchops.SparseConditionalAccumulator, num_required: int,
                                     timeout: Optional[float] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(indices, values, shape) of the mean (or sum) of the accepted sparse gradients."""
    return torch.ops.torchops.sparse_accumulator_take_gradient(handle, num_required, timeout)
