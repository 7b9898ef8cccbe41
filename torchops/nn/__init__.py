"""Drop-in `torch.nn` modules backed by torchops ops, one module per family."""
from .fused_batch_norm import BatchNorm2d, BatchNorm3d, convert_batchnorm
from .batching import Batched

__all__ = ["BatchNorm2d", "BatchNorm3d", "convert_batchnorm", "Batched"]
