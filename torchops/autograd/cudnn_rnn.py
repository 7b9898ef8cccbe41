"""`torch.autograd.Function`s of the CudnnRNN forward ops. Each forward calls the forward op and each
backward the matching Backprop op with the forward's inputs and outputs (TF's cudnn_rnn_grad.py); no math
of their own. They compute the same gradients as the C++ autograd that `torch.ops.torchops.*` use by
default. Double backward is not supported (the Backprop ops raise "derivative for torchops::... is not
implemented")."""
import torch

_ops = torch.ops.torchops


def _zeros_if_none(g, like):
    return torch.zeros_like(like) if g is None else g


def _check_training(ctx, name):
    if not ctx.is_training:
        raise RuntimeError(f"To use {name} in gradients, is_training must be set to True.")


class CudnnRNNFunction(torch.autograd.Function):
    """`CudnnRNNFunction.apply(input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
    direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True)` -> (output, output_h,
    output_c, reserve_space); backward = cudnn_rnn_backprop."""

    @staticmethod
    def forward(ctx, input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
                direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
        outs = _ops.cudnn_rnn(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed, seed2,
                              is_training)
        ctx.attrs = (rnn_mode, input_mode, direction, dropout, seed, seed2)
        ctx.is_training = is_training
        ctx.save_for_backward(input, input_h, input_c, params, *outs)
        ctx.mark_non_differentiable(outs[3])
        return outs

    @staticmethod
    def backward(ctx, d_output, d_output_h, d_output_c, _d_reserve):
        _check_training(ctx, "CudnnRNN")
        input, input_h, input_c, params, output, output_h, output_c, reserve = ctx.saved_tensors
        dx, dh, dc, dp = _ops.cudnn_rnn_backprop(
            input, input_h, input_c, params, output, output_h, output_c, _zeros_if_none(d_output, output),
            _zeros_if_none(d_output_h, output_h), _zeros_if_none(d_output_c, output_c), reserve, *ctx.attrs)
        return (dx, dh, dc if ctx.attrs[0] == "lstm" else None, dp) + (None,) * 7


class CudnnRNNV2Function(torch.autograd.Function):
    """`CudnnRNNV2Function.apply(...)` (arguments as CudnnRNNFunction) -> (output, output_h, output_c,
    reserve_space, host_reserved); backward = cudnn_rnn_backprop_v2."""

    @staticmethod
    def forward(ctx, input, input_h, input_c, params, rnn_mode="lstm", input_mode="linear_input",
                direction="unidirectional", dropout=0.0, seed=0, seed2=0, is_training=True):
        outs = _ops.cudnn_rnn_v2(input, input_h, input_c, params, rnn_mode, input_mode, direction, dropout, seed,
                                 seed2, is_training)
        ctx.attrs = (rnn_mode, input_mode, direction, dropout, seed, seed2)
        ctx.is_training = is_training
        ctx.save_for_backward(input, input_h, input_c, params, *outs)
        ctx.mark_non_differentiable(outs[3], outs[4])
        return outs

    @staticmethod
    def backward(ctx, d_output, d_output_h, d_output_c, _d_reserve, _d_host):
        _check_training(ctx, "CudnnRNNV2")
        input, input_h, input_c, params, output, output_h, output_c, reserve, host = ctx.saved_tensors
        dx, dh, dc, dp = _ops.cudnn_rnn_backprop_v2(
            input, input_h, input_c, params, output, output_h, output_c, _zeros_if_none(d_output, output),
            _zeros_if_none(d_output_h, output_h), _zeros_if_none(d_output_c, output_c), reserve, host, *ctx.attrs)
        return (dx, dh, dc if ctx.attrs[0] == "lstm" else None, dp) + (None,) * 7


class CudnnRNNV3Function(torch.autograd.Function):
    """`CudnnRNNV3Function.apply(input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm",
    input_mode="linear_input", direction="unidirectional", dropout=0.0, seed=0, seed2=0, num_proj=0,
    is_training=True, time_major=True)` -> (output, output_h, output_c, reserve_space, host_reserved);
    backward = cudnn_rnn_backprop_v3 (no gradient for sequence_lengths)."""

    @staticmethod
    def forward(ctx, input, input_h, input_c, params, sequence_lengths, rnn_mode="lstm", input_mode="linear_input",
                direction="unidirectional", dropout=0.0, seed=0, seed2=0, num_proj=0, is_training=True,
                time_major=True):
        outs = _ops.cudnn_rnn_v3(input, input_h, input_c, params, sequence_lengths, rnn_mode, input_mode, direction,
                                 dropout, seed, seed2, num_proj, is_training, time_major)
        ctx.attrs = (rnn_mode, input_mode, direction, dropout, seed, seed2, num_proj, time_major)
        ctx.is_training = is_training
        ctx.save_for_backward(input, input_h, input_c, params, sequence_lengths, *outs)
        ctx.mark_non_differentiable(outs[3], outs[4])
        return outs

    @staticmethod
    def backward(ctx, d_output, d_output_h, d_output_c, _d_reserve, _d_host):
        _check_training(ctx, "CudnnRNNV3")
        input, input_h, input_c, params, lens, output, output_h, output_c, reserve, host = ctx.saved_tensors
        dx, dh, dc, dp = _ops.cudnn_rnn_backprop_v3(
            input, input_h, input_c, params, lens, output, output_h, output_c, _zeros_if_none(d_output, output),
            _zeros_if_none(d_output_h, output_h), _zeros_if_none(d_output_c, output_c), reserve, host, *ctx.attrs)
        return (dx, dh, dc if ctx.attrs[0] == "lstm" else None, dp, None) + (None,) * 9
