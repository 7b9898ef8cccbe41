"""Typed, TorchScript-scriptable wrappers around torch.ops.torchops.*, one module per family."""
from .fused_batch_norm import fused_batch_norm
from .batching import batch, unbatch, unbatch_grad

__all__ = ["fused_batch_norm", "batch", "unbatch", "unbatch_grad"]
