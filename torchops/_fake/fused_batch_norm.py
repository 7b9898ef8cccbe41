"""Fake kernels of fused_batch_norm_v3 / fused_batch_norm_grad_v3 (mirror csrc/fused_batch_norm/ops.cpp)."""
import math

import torch

_FORMATS = {"NHWC": (4, True), "NCHW": (4, False), "NDHWC": (5, True), "NCDHW": (5, False)}


def channel_dim(data_format: str, rank: int) -> int:
    torch._check(data_format in _FORMATS,
                 lambda: f"data_format must be one of NHWC, NCHW, NDHWC, NCDHW, got '{data_format}'")
    want, last = _FORMATS[data_format]
    torch._check(rank == want, lambda: f"x must be {want}-dimensional for data_format '{data_format}', got rank {rank}")
    return rank - 1 if last else 1


def stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def empty_like_layout(x: torch.Tensor, cdim: int) -> torch.Tensor:
    """The output layout the kernels produce: channels-first data stored channels_last stays so."""
    fmt = torch.contiguous_format
    if cdim == 1:
        cl = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        if not x.is_contiguous() and x.is_contiguous(memory_format=cl):
            fmt = cl
    return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)


_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _check_epsilon(epsilon):
    torch._check_value(math.isfinite(epsilon) and epsilon >= 0,
                       lambda: f"epsilon must be a finite number >= 0, got {epsilon}")


def _check_common(x, vectors, others=()):
    torch._check(x.dim() in (4, 5), lambda: f"input must be 4 or 5-dimensional, got shape {tuple(x.shape)}")
    torch._check(x.dtype in _FLOATS, lambda: f"x must be float32, float64, float16 or bfloat16, got {x.dtype}")
    u = stats_dtype(x)
    for name, t in vectors:
        torch._check(t.dim() == 1, lambda: f"{name} must be 1-dimensional, got shape {tuple(t.shape)}")
        torch._check(t.dtype == u, lambda: f"{name} must have dtype {u}, got {t.dtype}")
    # (a meta tensor beside CPU data dispatches here: refuse, as the real kernels refuse mixed devices)
    for name, t in list(vectors) + list(others):
        torch._check(t.device == x.device, lambda: f"{name} must be on x's device {x.device}, got {t.device}")


@torch.library.register_fake("torchops::fused_batch_norm_v3")
def _fused_batch_norm_v3(x, scale, offset, mean, variance, epsilon=1e-4, exponential_avg_factor=1.0,
                         data_format="NHWC", is_training=True):
    _check_epsilon(epsilon)
    torch._check_value(math.isfinite(exponential_avg_factor),
                       lambda: f"exponential_avg_factor must be finite, got {exponential_avg_factor}")
    _check_common(x, [("scale", scale), ("offset", offset), ("estimated_mean", mean),
                      ("estimated_variance", variance)])
    cdim = channel_dim(data_format, x.dim())
    c = x.shape[cdim]
    torch._check(scale.shape[0] == c, lambda: "scale must have the same number of elements as the channels of x")
    torch._check(offset.shape[0] == c, lambda: "offset must have the same number of elements as the channels of x")
    if not is_training or exponential_avg_factor != 1.0:
        torch._check(mean.shape[0] == c, lambda: "mean must have the same number of elements as the channels of x")
        torch._check(variance.shape[0] == c,
                     lambda: "variance must have the same number of elements as the channels of x")
    u = stats_dtype(x)
    vec = lambda: x.new_empty((c,), dtype=u)  # noqa: E731
    return empty_like_layout(x, cdim), vec(), vec(), vec(), vec(), x.new_empty((0,), dtype=u)


@torch.library.register_fake("torchops::fused_batch_norm_grad_v3")
def _fused_batch_norm_grad_v3(y_backprop, x, scale, reserve_space_1, reserve_space_2, reserve_space_3,
                              epsilon=1e-4, data_format="NHWC", is_training=True):
    _check_epsilon(epsilon)
    _check_common(x, [("scale", scale), ("reserve_space_1", reserve_space_1),
                      ("reserve_space_2", reserve_space_2)],
                  [("y_backprop", y_backprop)])
    torch._check(reserve_space_3.device == x.device or reserve_space_3.device.type == "cpu",
                 lambda: f"reserve_space_3 must be on x's device {x.device} or the CPU, got {reserve_space_3.device}")
    torch._check(y_backprop.dtype == x.dtype, lambda: f"y_backprop must have x's dtype {x.dtype}, got {y_backprop.dtype}")
    torch._check(y_backprop.shape == x.shape, lambda: "x and y_backprop must have same shape")
    cdim = channel_dim(data_format, x.dim())
    c = x.shape[cdim]
    for name, t in (("scale", scale), ("reserve_space_1", reserve_space_1), ("reserve_space_2", reserve_space_2)):
        torch._check(t.shape[0] == c, lambda: f"{name} must have the same number of elements as the channels of x")
    u = stats_dtype(x)
    vec = lambda: x.new_empty((c,), dtype=u)  # noqa: E731
    empty = lambda: x.new_empty((0,), dtype=u)  # noqa: E731
    return empty_like_layout(x, cdim), vec(), vec(), empty(), empty()
