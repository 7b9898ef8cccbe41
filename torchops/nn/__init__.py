"""Drop-in `torch.nn` modules backed by torchops ops, one module per family."""
from .block_rnn import BlockGRU, BlockLSTM, GRUBlockCell, LSTMBlockCell
from .fused_batch_norm import BatchNorm2d, BatchNorm3d, convert_batchnorm
from .batching import Batched
from .cudnn_rnn import CudnnGRU, CudnnLSTM, CudnnRNNRelu, CudnnRNNTanh

__all__ = ["BatchNorm2d", "BatchNorm3d", "convert_batchnorm", "GRUBlockCell", "BlockGRU", "LSTMBlockCell", "BlockLSTM",
           "Batched"]
__all__ += ["CudnnLSTM", "CudnnGRU", "CudnnRNNTanh", "CudnnRNNRelu"]
