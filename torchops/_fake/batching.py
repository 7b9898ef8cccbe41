"""Fake kernels of batch / unbatch / unbatch_grad (mirror csrc/batching/ops.cpp).

The row counts of every output depend on which other invocations share the batch, so they are
unbacked symbolic sizes (`ctx.new_dynamic_size()`): torch.compile traces these ops as opaque calls
whose outputs have data-dependent dim 0. The ops block and talk to other threads at run time, so a
compiled graph must run them (they are never constant-folded: they have no pure fake-only result).
"""
import torch


def _check_attrs(num_batch_threads, max_batch_size, batch_timeout_micros, max_enqueued_batches,
                 allowed_batch_sizes):
    a = list(allowed_batch_sizes)
    torch._check_value(not a or a[0] >= 1, lambda: f"allowed_batch_sizes entries must be positive; got {a}")
    torch._check(all(a[i] > a[i - 1] for i in range(1, len(a))),
                 lambda: "allowed_batch_sizes entries must be monotonically increasing")
    torch._check(not a or a[-1] == max_batch_size,
                 lambda: "final entry in allowed_batch_sizes must equal max_batch_size")
    torch._check(num_batch_threads >= 1, lambda: f"num_batch_threads must be positive; was {num_batch_threads}")
    torch._check(max_batch_size >= 1, lambda: f"input_batch_size_limit must be positive; was {max_batch_size}")
    torch._check(batch_timeout_micros >= 0,
                 lambda: f"batch_timeout_micros must be non-negative; was {batch_timeout_micros}")
    torch._check(max_enqueued_batches >= 0,
                 lambda: f"max_enqueued_batches must be non-negative; was {max_enqueued_batches}")


@torch.library.register_fake("torchops::batch")
def _batch(in_tensors, num_batch_threads, max_batch_size, batch_timeout_micros, grad_timeout_micros,
           max_enqueued_batches=10, allowed_batch_sizes=(), container="", shared_name="", batching_queue=""):
    _check_attrs(num_batch_threads, max_batch_size, batch_timeout_micros, max_enqueued_batches, allowed_batch_sizes)
    torch._check(len(in_tensors) > 0, lambda: "Batch: in_tensors must contain at least one tensor")
    for t in in_tensors:
        torch._check(t.dim() >= 1, lambda: "Batching input tensors must have at least one dimension.")
    for t in in_tensors:
        torch._check(t.shape[0] == in_tensors[0].shape[0], lambda: (
            "Batching input tensors supplied in a given op invocation must have equal 0th-dimension size."))
    first = in_tensors[0]
    if first.shape[0] == 0:  # empty input: every output is a 1-D [0] tensor
        return ([t.new_empty((0,)) for t in in_tensors], first.new_empty((0,), dtype=torch.int64, device="cpu"),
                first.new_empty((0,), dtype=torch.int64, device="cpu"))
    ctx = torch.library.get_ctx()
    rows = ctx.new_dynamic_size()
    tasks = ctx.new_dynamic_size()
    batched = [t.new_empty((rows, *t.shape[1:])) for t in in_tensors]
    # (batch_index and id are host tensors whatever the inputs' device)
    return (batched, first.new_empty((tasks, 3), dtype=torch.int64, device="cpu"),
            first.new_empty((), dtype=torch.int64, device="cpu"))


@torch.library.register_fake("torchops::unbatch")
def _unbatch(batched_tensor, batch_index, id, timeout_micros, container="", shared_name=""):
    torch._check(batched_tensor.dim() >= 1, lambda: "Unbatch: batched_tensor must have at least one dimension")
    torch._check(batch_index.dim() == 2 and batch_index.shape[1] == 3,
                 lambda: "Wrong shape for index tensor. Expected 1st dimension size to be 3")
    torch._check(id.dim() == 0, lambda: "Input id should be scalar")
    rows = torch.library.get_ctx().new_dynamic_size()
    return batched_tensor.new_empty((rows, *batched_tensor.shape[1:]))


@torch.library.register_fake("torchops::unbatch_grad")
def _unbatch_grad(original_input, batch_index, grad, id, container="", shared_name="", timeout_micros=-1):
    torch._check(id.dim() == 0, lambda: "Expected `id` to be scalar.")
    torch._check(grad.dim() >= 1, lambda: "UnbatchGrad: grad must have at least one dimension")
    rows = torch.library.get_ctx().new_dynamic_size()
    return grad.new_empty((rows, *grad.shape[1:]))


@torch.library.register_fake("torchops::_batch_then_unbatch")
def _batch_then_unbatch(in_tensors, num_batch_threads, max_batch_size, batch_timeout_micros, grad_timeout_micros,
                        max_enqueued_batches, allowed_batch_sizes, container, shared_name, batching_queue,
                        unbatch_names, unbatch_timeout_micros):
    # How many tensors it returns, and their trailing shape (the model's output), are known only at run
    # time; nn.Batched / batch_function never call it while compiling (they use batch and unbatch).
    raise RuntimeError("torchops::_batch_then_unbatch cannot be traced (its outputs depend on the other calls of the "
                       "batch and on the model); use torchops::batch and torchops::unbatch under torch.compile")


# The helper ops _batching_stats/_batching_list_queues/_batching_close_all/_unbatch_fail are
# registered with catch-all (CompositeImplicitAutograd) kernels: they are Python-front plumbing with
# no tensor outputs and are not meant to be traced.
