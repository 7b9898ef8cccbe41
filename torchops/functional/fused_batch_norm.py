"""`fused_batch_norm`: the torchops counterpart of `tf.nn.fused_batch_norm`."""
from typing import Optional, Tuple

import torch
from torch import Tensor


def fused_batch_norm(x: Tensor, scale: Tensor, offset: Tensor, mean: Optional[Tensor] = None,
                     variance: Optional[Tensor] = None, epsilon: float = 0.001,
                     exponential_avg_factor: float = 1.0, data_format: str = "NHWC",
                     is_training: bool = True) -> Tuple[Tensor, Tensor, Tensor]:
    """Batch normalization like `tf.nn.fused_batch_norm`: returns `(y, batch_mean, batch_variance)`.

    In training, `batch_mean`/`batch_variance` are the batch statistics (variance unbiased), or their
    exponential running averages with `mean`/`variance` when `exponential_avg_factor != 1`. In
    inference, `mean`/`variance` normalize `x` and are returned as copies. Differentiable w.r.t. `x`,
    `scale` and `offset` (twice). `epsilon` defaults to 0.001 like the TF wrapper (the raw op's 1e-4).
    """
    if not is_training or exponential_avg_factor != 1.0:
        if mean is None or variance is None:
            raise ValueError(
                "Both `mean` and `variance` must be a 1D tensor when `is_training` is False or "
                f"`exponential_avg_factor` != 1.0, got mean={'None' if mean is None else 'Tensor'} and "
                f"variance={'None' if variance is None else 'Tensor'}")
    stats_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    if mean is None:
        mean = torch.empty([0], dtype=stats_dtype, device=x.device)
    if variance is None:
        variance = torch.empty([0], dtype=stats_dtype, device=x.device)
    y, batch_mean, batch_var, _, _, _ = torch.ops.torchops.fused_batch_norm_v3(
        x, scale, offset, mean, variance, epsilon, exponential_avg_factor, data_format, is_training)
    return y, batch_mean, batch_var
