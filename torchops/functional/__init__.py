"""Typed, TorchScript-scriptable wrappers around torch.ops.torchops.*, one module per family."""
from .accumulator import (accumulator_apply_gradient, accumulator_num_accumulated, accumulator_set_global_step,
                          accumulator_take_gradient, sparse_accumulator_apply_gradient,
                          sparse_accumulator_take_gradient)
from .batching import batch, unbatch, unbatch_grad
from .block_rnn import block_gru, block_lstm, block_lstm_v2, gru_block_cell, lstm_block_cell
from .cudnn_rnn import (cudnn_rnn, cudnn_rnn_backprop, cudnn_rnn_backprop_v2, cudnn_rnn_backprop_v3,
                        cudnn_rnn_canonical_to_params, cudnn_rnn_canonical_to_params_v2, cudnn_rnn_params_size,
                        cudnn_rnn_params_to_canonical, cudnn_rnn_params_to_canonical_v2, cudnn_rnn_v2, cudnn_rnn_v3)
from .fused_batch_norm import fused_batch_norm

__all__ = ["fused_batch_norm", "gru_block_cell", "block_gru", "lstm_block_cell", "block_lstm", "block_lstm_v2", "batch",
           "unbatch", "unbatch_grad",
           "cudnn_rnn", "cudnn_rnn_v2", "cudnn_rnn_v3", "cudnn_rnn_backprop", "cudnn_rnn_backprop_v2",
           "cudnn_rnn_backprop_v3", "cudnn_rnn_params_size", "cudnn_rnn_params_to_canonical",
           "cudnn_rnn_params_to_canonical_v2", "cudnn_rnn_canonical_to_params", "cudnn_rnn_canonical_to_params_v2",
           "accumulator_apply_gradient", "accumulator_take_gradient", "accumulator_num_accumulated",
           "accumulator_set_global_step", "sparse_accumulator_apply_gradient", "sparse_accumulator_take_gradient"]
