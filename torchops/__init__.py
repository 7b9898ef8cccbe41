"""torchops: TensorFlow's fused training ops as first-class PyTorch operators.

Every op is a dispatcher op, `torch.ops.torchops.<name>`, with CPU (and, in CUDA builds, CUDA) kernels
and autograd registered in C++. This package adds typed wrappers (`torchops.functional`), Python
`torch.autograd.Function`s (`torchops.autograd`), fake kernels for `torch.compile` and drop-in
`torch.nn` modules (`torchops.nn`).
"""
from . import _loader

library_path = _loader.load()

from . import _fake  # noqa: E402,F401  (registers fake kernels)
from . import backends  # noqa: E402,F401
from . import autograd, functional, nn  # noqa: E402,F401
from . import batching  # noqa: E402,F401
from . import accumulator, optim  # noqa: E402,F401
from .accumulator import ConditionalAccumulator, SparseConditionalAccumulator  # noqa: E402,F401

__version__ = "0.1.0"


def built_with_cuda() -> bool:
    """Whether the loaded library contains CUDA kernels."""
    import torch

    return torch._C._dispatch_has_kernel_for_dispatch_key("torchops::fused_batch_norm_v3", "CUDA")
