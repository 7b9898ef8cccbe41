"""Typed, TorchScript-scriptable wrappers around torch.ops.torchops.*, one module per family."""
from .fused_batch_norm import fused_batch_norm

__all__ = ["fused_batch_norm"]
