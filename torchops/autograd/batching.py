"""`Batch` and `Unbatch` as Python `torch.autograd.Function`s.

They call the same ops and use the same gradient resources as the C++ autograd (which
`torch.ops.torchops.batch/unbatch` use by default): Batch's backward is an Unbatch of the incoming
gradient with `grad_timeout_micros`; Unbatch's backward is UnbatchGrad, zero-padded to the batched
tensor's rows. Each invocation may run its backward on its own thread.
"""
from typing import Sequence

import torch


def _batch_gradient_name(shared_name: str, batching_queue: str, i: int) -> str:
    return f"{shared_name}/{batching_queue}/batch_gradient_{i}"


class Batch(torch.autograd.Function):
    """`Batch.apply(attrs, *in_tensors)` -> `(*batched_tensors, batch_index, id)`.

    `attrs` is a tuple `(num_batch_threads, max_batch_size, batch_timeout_micros, grad_timeout_micros,
    max_enqueued_batches, allowed_batch_sizes, container, shared_name, batching_queue)` (the op's
    attributes in order); the tensors are separate arguments so that autograd tracks each of them.
    """

    @staticmethod
    def forward(ctx, attrs: Sequence, *in_tensors):
        (nbt, mbs, btm, gtm, meb, allowed, container, shared_name, queue) = attrs
        batched, index, id_ = torch.ops.torchops.batch(list(in_tensors), nbt, mbs, btm, gtm, meb, list(allowed),
                                                       container, shared_name, queue)
        ctx.empty = in_tensors[0].shape[0] == 0
        ctx.shapes = [tuple(t.shape) for t in (in_tensors if ctx.empty else batched)]
        ctx.dtypes = [t.dtype for t in in_tensors]
        ctx.gtm, ctx.container, ctx.shared_name, ctx.queue = gtm, container, shared_name, queue
        ctx.save_for_backward(index, id_)
        ctx.mark_non_differentiable(index, id_)
        return (*batched, index, id_)

    @staticmethod
    def backward(ctx, *grads):
        k = len(ctx.shapes)
        zeros = [torch.zeros(s, dtype=d) for s, d in zip(ctx.shapes, ctx.dtypes)]
        if ctx.empty:
            return (None, *zeros)
        index, id_ = ctx.saved_tensors
        out = []
        for i in range(k):
            g = grads[i] if grads[i] is not None else zeros[i]
            out.append(torch.ops.torchops.unbatch(g, index, id_, ctx.gtm, ctx.container,
                                                  _batch_gradient_name(ctx.shared_name, ctx.queue, i)))
        return (None, *out)


class Unbatch(torch.autograd.Function):
    """`Unbatch.apply(batched_tensor, batch_index, id, timeout_micros, container="", shared_name="")`."""

    @staticmethod
    def forward(ctx, batched_tensor, batch_index, id, timeout_micros, container="", shared_name=""):
        out = torch.ops.torchops.unbatch(batched_tensor, batch_index, id, timeout_micros, container, shared_name)
        ctx.timeout, ctx.container, ctx.shared_name, ctx.out_shape = timeout_micros, container, shared_name, out.shape
        ctx.save_for_backward(batched_tensor, batch_index, id)
        return out

    @staticmethod
    def backward(ctx, grad):
        batched, index, id_ = ctx.saved_tensors
        if grad is None:
            grad = batched.new_zeros(ctx.out_shape)
        r = torch.ops.torchops.unbatch_grad(batched, index, grad, id_, ctx.container,
                                            ctx.shared_name + "/unbatch_gradient", ctx.timeout)
        if batched.numel() == 0:
            r = torch.zeros_like(batched)
        elif r.shape[0] < batched.shape[0]:  # padding rows get zero gradient
            r = torch.cat([r, r.new_zeros((batched.shape[0] - r.shape[0], *r.shape[1:]))])
        return r, None, None, None, None, None
