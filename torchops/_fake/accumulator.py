"""Fake kernels of the accumulator ops (mirror csrc/accumulator/ops.cpp).

The ops take an accumulator handle (a TorchScript custom class). A take's output has the declared
shape with unknown dims as unbacked symbolic sizes (the first accepted gradient fixes them at run
time); its device is not known from the handle, so fake outputs are placed on CPU. An accumulator with
an unknown-rank shape cannot be traced (the rank itself is data-dependent). Sparse takes have an
unbacked number of rows.
"""
import torch

# c10::ScalarType codes of the supported dtypes (a handle reports its dtype as that integer).
_SCALAR_TYPES = {5: torch.float16, 6: torch.float32, 7: torch.float64, 15: torch.bfloat16}


def _dtype(handle):
    d = handle.dtype()
    return d if isinstance(d, torch.dtype) else _SCALAR_TYPES[int(d)]


@torch.library.register_fake("torchops::accumulator_apply_gradient")
def _apply(handle, local_step, gradient):
    return None


@torch.library.register_fake("torchops::accumulator_take_gradient")
def _take(handle, num_required, timeout=None):
    torch._check(num_required > 0, lambda: f"Argument num_required must be positive, but was {num_required}")
    shape = handle.shape()
    if shape is None:
        raise RuntimeError("accumulator_take_gradient: cannot trace a take from an accumulator with an unknown-rank "
                           "shape (declare its shape, -1 for unknown dims)")
    ctx = torch.library.get_ctx()
    size = [ctx.new_dynamic_size() if d < 0 else d for d in shape]
    return torch.empty(size, dtype=_dtype(handle))


@torch.library.register_fake("torchops::sparse_accumulator_apply_gradient")
def _sparse_apply(handle, local_step, gradient_indices, gradient_values, gradient_shape, has_known_shape):
    return None


@torch.library.register_fake("torchops::sparse_accumulator_apply_gradient.sparse_tensor")
def _sparse_apply_coo(handle, local_step, gradient):
    return None


@torch.library.register_fake("torchops::sparse_accumulator_take_gradient")
def _sparse_take(handle, num_required, timeout=None):
    torch._check(num_required > 0, lambda: f"Argument num_required must be positive, but was {num_required}")
    shape = handle.shape()
    if shape is None or len(shape) == 0:
        raise RuntimeError("sparse_accumulator_take_gradient: cannot trace a take from an accumulator whose declared "
                           "shape does not fix the rank of the values")
    ctx = torch.library.get_ctx()
    nnz = ctx.new_dynamic_size()
    rows = [ctx.new_dynamic_size() if d < 0 else d for d in shape[1:]]
    return (torch.empty([nnz], dtype=torch.int64), torch.empty([nnz, *rows], dtype=_dtype(handle)),
            torch.empty([len(shape)], dtype=torch.int64))


@torch.library.register_fake("torchops::_accumulator_add_")
def _add(accum, gradient, copy):
    torch._check(accum.device == gradient.device,
                 lambda: f"_accumulator_add_: accum is on {accum.device} but gradient on {gradient.device}")
    torch._check(not accum.requires_grad,
                 lambda: "_accumulator_add_: accum requires grad; the op writes into it in place")
    torch._check_value(accum.shape == gradient.shape, lambda: f"_accumulator_add_: accum has shape "
                                                              f"{list(accum.shape)} but gradient has shape "
                                                              f"{list(gradient.shape)}")
    return None

# accumulator_num_accumulated / accumulator_set_global_step (and their .sparse overloads),
# _accumulator_close_all and _accumulator_in_flight return no tensors: plain control calls.
