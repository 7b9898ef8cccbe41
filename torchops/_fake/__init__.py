"""Fake (meta) kernels for every torchops op, one module per family: shapes, dtypes and strides only,
so that torch.compile and torch.library.opcheck can trace the ops without running them."""
from . import fused_batch_norm  # noqa: F401
from . import block_rnn  # noqa: F401
from . import batching  # noqa: F401
from . import cudnn_rnn  # noqa: F401
from . import accumulator  # noqa: F401
