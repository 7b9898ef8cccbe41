"""ONNX translation of `fused_batch_norm_v3` (inference): ONNX `BatchNormalization` for the channels-first
layouts, the same affine map as element-wise ops over the last axis for the channels-last ones."""
from onnxscript import opset18 as op

from ._graph import ExportError, empty_like


def fused_batch_norm_v3(x, scale, offset, mean, variance, epsilon=0.0001, exponential_avg_factor=1.0,
                        data_format="NHWC", is_training=True):
    if is_training:
        raise ExportError("fused_batch_norm_v3 with is_training=True (a training-mode torchops.nn.BatchNorm2d/3d) "
                          "normalizes with the batch statistics and updates the running ones; an ONNX export is "
                          "for inference: call model.eval() before exporting")
    if data_format in ("NCHW", "NCDHW"):
        y = op.BatchNormalization(x, op.CastLike(scale, x), op.CastLike(offset, x), op.CastLike(mean, x),
                                  op.CastLike(variance, x), epsilon=epsilon)
    else:
        # y = x * a + (offset - mean * a), a = scale / sqrt(variance + epsilon), computed in the statistics' dtype
        a = op.Div(scale, op.Sqrt(op.Add(variance, op.CastLike(op.Constant(value_float=epsilon), variance))))
        shift = op.Sub(offset, op.Mul(mean, a))
        y = op.Add(op.Mul(x, op.CastLike(a, x)), op.CastLike(shift, x))
    # Inference outputs (as the eager op): batch_mean/variance and reserve spaces 1/2 are the given statistics.
    return y, op.Identity(mean), op.Identity(variance), op.Identity(mean), op.Identity(variance), empty_like(mean)
