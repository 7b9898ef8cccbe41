"""`FusedBatchNormV3`: forward = fused_batch_norm_v3, backward = fused_batch_norm_grad_v3."""
import torch


class FusedBatchNormV3(torch.autograd.Function):
    """`FusedBatchNormV3.apply(x, scale, offset, mean, variance, epsilon=1e-4,
    exponential_avg_factor=1.0, data_format="NHWC", is_training=True)` -> the op's six outputs.

    Gradients reach x, scale and offset only. The backward calls the public grad op, whose own
    (C++) autograd makes double backward work.
    """

    @staticmethod
    def forward(ctx, x, scale, offset, mean, variance, epsilon=1e-4, exponential_avg_factor=1.0,
                data_format="NHWC", is_training=True):
        outs = torch.ops.torchops.fused_batch_norm_v3(x, scale, offset, mean, variance, epsilon,
                                                      exponential_avg_factor, data_format, is_training)
        y, batch_mean, batch_var, rs1, rs2, rs3 = outs
        if is_training:
            ctx.save_for_backward(x, scale, rs1, rs2, rs3)
        else:  # inference differentiates with the population statistics given as inputs
            ctx.save_for_backward(x, scale, mean, variance, rs3)
        ctx.epsilon, ctx.data_format, ctx.is_training = epsilon, data_format, is_training
        ctx.mark_non_differentiable(batch_mean, batch_var, rs1, rs2, rs3)
        return outs

    @staticmethod
    def backward(ctx, dy, *unused):
        x, scale, m, v, rs3 = ctx.saved_tensors
        if dy is None:
            dy = torch.zeros_like(x)
        dx, dscale, doffset, _, _ = torch.ops.torchops.fused_batch_norm_grad_v3(
            dy, x, scale, m, v, rs3, ctx.epsilon, ctx.data_format, ctx.is_training)
        return dx, dscale, doffset, None, None, None, None, None, None
