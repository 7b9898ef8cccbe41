"""BatchNorm2d / BatchNorm3d on fused_batch_norm_v3.

They subclass torch.nn.BatchNorm2d/3d, so the constructor, attributes, state_dict keys, `isinstance`
checks and checkpoint loading are exactly torch's; only `forward` runs the fused op. Channels-last
inputs go to the kernel as they are stored (no layout copies) and the output keeps their layout.
"""
from typing import Optional

import torch
from torch import Tensor, nn


def _stats_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


_MOVING_STATISTICS = ("torch", "keras", "tf")


class _FusedBatchNorm(nn.modules.batchnorm._BatchNorm):
    moving_statistics: str

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, moving_statistics: str = "torch"):
        if moving_statistics not in _MOVING_STATISTICS:
            raise ValueError(f"moving_statistics must be one of {list(_MOVING_STATISTICS)}, got {moving_statistics!r}")
        if moving_statistics != "torch" and (momentum is None or not 0.0 <= momentum <= 1.0):
            raise ValueError(f"momentum must be TF's momentum in [0, 1] with moving_statistics={moving_statistics!r}, "
                             f"got {momentum!r}")
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.moving_statistics = moving_statistics

    def extra_repr(self) -> str:
        s = super().extra_repr()
        return s if self.moving_statistics == "torch" else f"{s}, moving_statistics={self.moving_statistics!r}"

    def _as_stats(self, t: Optional[Tensor], fill: float, x: Tensor) -> Tensor:
        dtype = _stats_dtype(x)
        if t is None:
            return torch.full([self.num_features], fill, dtype=dtype, device=x.device)
        return t.to(dtype)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        # Same bookkeeping as torch.nn.modules.batchnorm._BatchNorm.forward.
        eaf = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            if self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:  # cumulative moving average
                    eaf = 1.0 / float(self.num_batches_tracked)
                else:
                    eaf = self.momentum
        if self.moving_statistics != "torch" and self.momentum is not None:
            eaf = 1.0 - self.momentum  # TF's convention: moving = momentum * moving + (1 - momentum) * batch
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        running_mean = self.running_mean if not self.training or self.track_running_stats else None
        running_var = self.running_var if not self.training or self.track_running_stats else None
        if bn_training:
            size = input.shape[0]  # values per channel (as torch's _verify_batch_size; no division by C)
            for d in input.shape[2:]:
                size *= d
            if size == 1:
                raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.shape}")
        # torch.nn.functional.batch_norm's checks and messages, in its order
        if bn_training and self.eps <= 0.0:
            raise ValueError(f"batch_norm eps must be positive during training, but got {self.eps}")
        elif self.eps < 0.0:
            raise ValueError(f"batch_norm eps must be non-negative, but got {self.eps}")

        scale = self._as_stats(self.weight, 1.0, input)
        offset = self._as_stats(self.bias, 0.0, input)
        update = bn_training and running_mean is not None and running_var is not None
        # Keras keeps the biased batch variance: it adds the op's Bessel correction to the moving variance going
        # in and removes it from the updated one coming out, as its fused BatchNormalization does.
        bessel = 1.0
        if update and self.moving_statistics == "keras" and input.numel() > input.size(1):
            n = input.numel() // input.size(1)
            bessel = n / (n - 1)
        if bn_training and not update:
            stats_dtype = _stats_dtype(input)
            mean = torch.empty([0], dtype=stats_dtype, device=input.device)
            var = torch.empty([0], dtype=stats_dtype, device=input.device)
            eaf = 1.0
        else:
            assert running_mean is not None and running_var is not None
            mean = running_mean.to(_stats_dtype(input))
            var = running_var.to(_stats_dtype(input))
            if bessel != 1.0:
                var = var * bessel
        y, batch_mean, batch_var, _, _, _ = torch.ops.torchops.fused_batch_norm_v3(
            input, scale, offset, mean, var, self.eps, eaf, "NCHW" if input.dim() == 4 else "NCDHW", bn_training)
        # An empty batch leaves the running statistics as they are (torch does; the op would give the NaN
        # statistics of an empty set when eaf == 1, i.e. momentum=None on the first batch or momentum=1).
        if update and input.numel() > 0:
            assert running_mean is not None and running_var is not None
            with torch.no_grad():
                running_mean.copy_(batch_mean)
                running_var.copy_(batch_var / bessel if bessel != 1.0 else batch_var)
        return y


class BatchNorm2d(_FusedBatchNorm, nn.BatchNorm2d):
    """Drop-in `torch.nn.BatchNorm2d` (N, C, H, W) running torchops' fused kernels.

    `moving_statistics` picks how training updates the running statistics: "torch" (default, torch.nn's:
    `running = (1 - momentum) * running + momentum * batch`, unbiased variance), "keras" (Keras'
    BatchNormalization: `moving = momentum * moving + (1 - momentum) * batch` with the biased batch variance;
    Keras' defaults are `momentum=0.99, eps=1e-3`) or "tf" (the raw FusedBatchNormV3 op and
    `tf.contrib.layers.batch_norm`: TF's momentum convention, Bessel-corrected variance)."""


class BatchNorm3d(_FusedBatchNorm, nn.BatchNorm3d):
    """Drop-in `torch.nn.BatchNorm3d` (N, C, D, H, W) running torchops' fused kernels; `moving_statistics` as
    BatchNorm2d."""


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every `nn.BatchNorm2d`/`nn.BatchNorm3d` inside `module` (in place) by its torchops
    twin, keeping parameters, buffers, device, dtype and train/eval mode. Returns `module`, or the
    replacement when `module` itself is a batch norm."""

    def swap(m: nn.Module) -> nn.Module:
        if type(m) is nn.BatchNorm2d:
            m.__class__ = BatchNorm2d  # same object: parameters, buffers, hooks and optimizer state stay
            m.moving_statistics = "torch"
        elif type(m) is nn.BatchNorm3d:
            m.__class__ = BatchNorm3d
            m.moving_statistics = "torch"
        return m

    for name, child in list(module.named_children()):
        module._modules[name] = convert_batchnorm(child)
    return swap(module)
