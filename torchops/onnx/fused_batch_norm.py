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
    # As the eager op: the math in the statistics' dtype (float32 for float16/bfloat16 inputs), y in x's dtype.
    xs = op.CastLike(x, scale)
    if data_format in ("NCHW", "NCDHW"):
        ys = op.BatchNormalization(xs, scale, offset, mean, variance, epsilon=epsilon)
    else:
        # y = x * a + (offset - mean * a), a = scale / sqrt(variance + epsilon), over the last (channel) axis
        a = op.Div(scale, op.Sqrt(op.Add(variance, op.CastLike(op.Constant(value_float=epsilon), variance))))
        ys = op.Add(op.Mul(xs, a), op.Sub(offset, op.Mul(mean, a)))
    y = op.CastLike(ys, x)
    # Inference outputs (as the eager op): batch_mean/variance and reserve spaces 1/2 are the given statistics.
    return y, op.Identity(mean), op.Identity(variance), op.Identity(mean), op.Identity(variance), empty_like(mean)
