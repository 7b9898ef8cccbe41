"""One `torch.autograd.Function` per differentiable torchops op, one module per family.

They call the same forward and grad ops as the C++ autograd (which `torch.ops.torchops.*` use by
default) and hold no math of their own; they exist for users who want the documented
forward/backward pair as an explicit Python Function.
"""
from .block_rnn import BlockGRU, BlockLSTM, BlockLSTMV2, GRUBlockCell, LSTMBlockCell
from .fused_batch_norm import FusedBatchNormV3
from .batching import Batch, Unbatch

__all__ = ["FusedBatchNormV3", "GRUBlockCell", "BlockGRU", "LSTMBlockCell", "BlockLSTM", "BlockLSTMV2", "Batch",
           "Unbatch"]
from .cudnn_rnn import CudnnRNNFunction, CudnnRNNV2Function, CudnnRNNV3Function  # noqa: E402

__all__ += ["CudnnRNNFunction", "CudnnRNNV2Function", "CudnnRNNV3Function"]
