"""torchops.tf.convert: the loaders' mappings against plain float64 references of Keras' and TF's equations,
their errors (nothing half-loaded), and BatchNorm2d/3d's TF/Keras moving statistics."""
import numpy as np
import pytest
import torch

import torchops.tf as ttf
from torchops.nn import BatchNorm2d, BatchNorm3d, BlockGRU, BlockLSTM, CudnnGRU, CudnnLSTM, GRUBlockCell, \
    LSTMBlockCell, convert_batchnorm
from torchops.tf import convert

D = torch.float64


def _rand(*shape, seed=0):
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(seed))


def keras_gru_reset_before(x, kernel, rec, bias, h):
    """Keras GRU(reset_after=False), one step; gates z, r, h."""
    U = h.size(1)
    xz, xr, xh = (x @ kernel + bias).split(U, 1)
    rz, rr = (h @ rec[:, :2 * U]).split(U, 1)
    z, r = torch.sigmoid(xz + rz), torch.sigmoid(xr + rr)
    hh = torch.tanh(xh + (r * h) @ rec[:, 2 * U:])
    return z * h + (1 - z) * hh


def keras_lstm(x, kernel, rec, bias, h, c):
    i, f, g, o = (x @ kernel + h @ rec + bias).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def test_keras_gru_reset_before_into_block_gru():
    I, U, B, T = 3, 4, 2, 5
    kernel, rec, bias = _rand(I, 3 * U, seed=1), _rand(U, 3 * U, seed=2), _rand(3 * U, seed=3)
    x = _rand(T, B, I, seed=4)
    m = BlockGRU(I, U, dtype=D)
    convert.load_gru_block_keras_weights(m, [kernel.numpy(), rec, bias])
    out, h_n = m(x)
    h = torch.zeros(B, U, dtype=D)
    for t in range(T):
        h = keras_gru_reset_before(x[t], kernel, rec, bias, h)
        torch.testing.assert_close(out[t], h)
    cell = GRUBlockCell(I, U, dtype=D)
    convert.load_gru_block_keras_weights(cell, convert.gru_block_keras_weights(m))
    torch.testing.assert_close(cell(x[0]), out[0])
    for a, b in zip(convert.gru_block_keras_weights(cell), (kernel, rec, bias)):
        torch.testing.assert_close(a, b)


def test_gru_block_checkpoint_names():
    src = GRUBlockCell(3, 2)
    tensors = {"rnn/gru_cell/gates/kernel": src.w_ru.detach().numpy(), "rnn/gru_cell/gates/bias": src.b_ru.detach(),
               "rnn/gru_cell/candidate/kernel": src.w_c.detach(), "rnn/gru_cell/candidate/bias": src.b_c.detach()}
    m = GRUBlockCell(3, 2)
    convert.load_gru_block_checkpoint(m, tensors, scope="rnn/gru_cell")
    x = torch.randn(4, 3)
    torch.testing.assert_close(m(x), src(x))
    with pytest.raises(ttf.NotFoundError, match=r"'rnn/gru/gates/kernel' is missing.*close matches"):
        convert.load_gru_block_checkpoint(m, tensors, scope="rnn/gru")


def test_gru_block_loader_errors_leave_module_unchanged():
    m = BlockGRU(3, 4)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    good = convert.gru_block_keras_weights(BlockGRU(3, 4))
    with pytest.raises(ValueError, match=r"reset_after=True \(CudnnGRU's math\)"):
        convert.load_gru_block_keras_weights(m, [good[0], good[1], torch.zeros(2, 12)])
    with pytest.raises(ValueError, match=r"Keras GRU recurrent_kernel must have shape \[4, 12\], got \[12, 4\]"):
        convert.load_gru_block_keras_weights(m, [good[0], good[1].t(), good[2]])
    with pytest.raises(ValueError, match="expected the 3 arrays"):
        convert.load_gru_block_keras_weights(m, good[:2])
    with pytest.raises(TypeError, match="GRUBlockCell or BlockGRU"):
        convert.load_gru_block_keras_weights(CudnnGRU(1, 4, 3), good)
    with pytest.raises(TypeError, match="CudnnLSTM, CudnnGRU"):
        convert.load_cudnn_rnn_keras_weights(m, good)
    with pytest.raises(TypeError, match="LSTMBlockCell or BlockLSTM"):
        convert.load_lstm_block_checkpoint(m, {})
    with pytest.raises(TypeError, match="batch norm module"):
        convert.load_batch_norm_checkpoint(m, {})
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.parametrize("make", [lambda: BlockLSTM(3, 4, dtype=D), lambda: BlockLSTM(3, 4, version=1, dtype=D),
                                  lambda: BlockLSTM(3, 4, version=1, forget_bias=0.7, dtype=D)])
def test_keras_lstm_into_block_lstm(make):
    I, U, B, T = 3, 4, 2, 5
    kernel, rec, bias = _rand(I, 4 * U, seed=5), _rand(U, 4 * U, seed=6), _rand(4 * U, seed=7)
    x = _rand(T, B, I, seed=8)
    m = make()
    convert.load_lstm_block_keras_weights(m, [kernel, rec, bias])
    out, _ = m(x)
    h = c = torch.zeros(B, U, dtype=D)
    for t in range(T):
        h, c = keras_lstm(x[t], kernel, rec, bias, h, c)
        torch.testing.assert_close(out[t], h)


def test_lstm_block_checkpoint_with_peepholes_and_errors():
    src = LSTMBlockCell(3, 2, use_peephole=True)
    tensors = {"lstm/kernel": src.w.detach(), "lstm/bias": src.b.detach(), "lstm/w_i_diag": src.wci.detach(),
               "lstm/w_f_diag": src.wcf.detach(), "lstm/w_o_diag": src.wco.detach()}
    m = LSTMBlockCell(3, 2, use_peephole=True)
    convert.load_lstm_block_checkpoint(m, tensors, scope="lstm")
    x = torch.randn(4, 3)
    torch.testing.assert_close(m(x), src(x))
    with pytest.raises(ValueError, match="no peepholes"):
        convert.load_lstm_block_keras_weights(m, [torch.zeros(3, 8), torch.zeros(2, 8), torch.zeros(8)])
    tensors["lstm/bias"] = torch.zeros(7)
    before = m.w.detach().clone()
    with pytest.raises(ValueError, match=r"'lstm/bias' must have shape \[8\], got \[7\]"):
        convert.load_lstm_block_checkpoint(m, tensors, scope="lstm")
    assert torch.equal(m.w, before)


def test_cudnn_rnn_loaders_from_a_reader(tmp_path):
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from tf_checkpoint_writer import write_checkpoint
    src = CudnnGRU(2, 3, 4, direction="bidirectional")
    prefix = write_checkpoint(str(tmp_path / "ck"), convert.cudnn_rnn_checkpoint_weights(src, scope="enc"))
    m = CudnnGRU(2, 3, 4, direction="bidirectional")
    m.load_tf_checkpoint_weights(ttf.load_checkpoint(prefix), scope="enc")  # the module alias
    x = torch.randn(5, 2, 4)
    torch.testing.assert_close(m(x)[0], src(x)[0])
    with pytest.raises(KeyError, match=r"is missing; close matches"):
        convert.load_cudnn_rnn_checkpoint(m, ttf.load_checkpoint(prefix), scope="enk")
    with pytest.raises(ValueError, match="reset_after=False"):
        m.load_keras_weights([torch.zeros(4, 9), torch.zeros(3, 9), torch.zeros(9)] * 4)
    lstm = CudnnLSTM(1, 2, 3)
    assert [list(t.shape) for t in lstm.keras_weights()] == [[3, 8], [2, 8], [8]]


@pytest.mark.parametrize("center,scale", [(True, True), (True, False), (False, True), (False, False)])
def test_batch_norm_keras_weights_center_scale(center, scale):
    n = 3
    gamma, beta, mean, var = _rand(n, seed=1), _rand(n, seed=2), _rand(n, seed=3), _rand(n, seed=4).abs()
    weights = ([gamma] if scale else []) + ([beta] if center else []) + [mean, var]
    m = BatchNorm2d(n, eps=1e-3)
    convert.load_batch_norm_keras_weights(m, weights, center=center, scale=scale)
    torch.testing.assert_close(m.weight.double(), gamma if scale else torch.ones(n, dtype=D))
    torch.testing.assert_close(m.bias.double(), beta if center else torch.zeros(n, dtype=D))
    torch.testing.assert_close(m.running_var.double(), var)
    with pytest.raises(ValueError, match=f"expected {len(weights)} Keras BatchNormalization arrays.*"
                                         f"got {len(weights) + 1}"):
        convert.load_batch_norm_keras_weights(m, weights + [var], center=center, scale=scale)


def test_batch_norm_checkpoint_and_errors():
    t = {"bn/beta": np.full(2, 0.5, np.float32), "bn/moving_mean": np.ones(2, np.float32),
         "bn/moving_variance": np.full(2, 4.0, np.float32)}
    m = BatchNorm3d(2)
    convert.load_batch_norm_checkpoint(m, t, scope="bn")
    assert m.weight.tolist() == [1.0, 1.0] and m.bias.tolist() == [0.5, 0.5] and m.running_var.tolist() == [4.0, 4.0]
    plain = BatchNorm2d(2, affine=False)
    with pytest.raises(ValueError, match="affine=False"):
        convert.load_batch_norm_checkpoint(plain, t, scope="bn")
    assert plain.running_mean.tolist() == [0.0, 0.0]
    with pytest.raises(ttf.NotFoundError, match="'bn/moving_mean' is missing"):
        convert.load_batch_norm_checkpoint(plain, {"bn/moving_variance": t["bn/moving_variance"]}, scope="bn")
    with pytest.raises(ValueError, match=r"moving_variance must have shape \[2\], got \[3\]"):
        convert.load_batch_norm_keras_weights(BatchNorm2d(2), [np.ones(2), np.ones(2), np.ones(2), np.ones(3)])
    with pytest.raises(ValueError, match="track_running_stats=False"):
        convert.load_batch_norm_keras_weights(BatchNorm2d(2, track_running_stats=False), [np.ones(2)] * 4)


# -- BatchNorm2d/3d moving_statistics -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["torch", "keras", "tf"])
@pytest.mark.parametrize("cls,shape", [(BatchNorm2d, (4, 3, 5, 2)), (BatchNorm3d, (2, 3, 2, 3, 2))])
def test_moving_statistics_conventions(mode, cls, shape):
    x = _rand(*shape, seed=9)
    momentum = 0.1 if mode == "torch" else 0.99
    m = cls(3, momentum=momentum, moving_statistics=mode, dtype=D)
    m.running_mean.fill_(0.5)
    m.running_var.fill_(2.0)
    for step in range(2):
        y = m(x)
    dims = [0] + list(range(2, x.dim()))
    mean, var_b, var_u = x.mean(dims), x.var(dims, unbiased=False), x.var(dims, unbiased=True)
    keep = 1 - momentum if mode == "torch" else momentum  # weight of the old moving value
    want_mean, want_var = torch.full([3], 0.5, dtype=D), torch.full([3], 2.0, dtype=D)
    for _ in range(2):
        want_mean = keep * want_mean + (1 - keep) * mean
        want_var = keep * want_var + (1 - keep) * (var_b if mode == "keras" else var_u)
    torch.testing.assert_close(m.running_mean, want_mean)
    torch.testing.assert_close(m.running_var, want_var)
    # the output always normalises with the biased batch variance
    bshape = [1, 3] + [1] * (x.dim() - 2)
    torch.testing.assert_close(y, (x - mean.view(bshape)) / torch.sqrt(var_b.view(bshape) + m.eps))


def test_moving_statistics_arguments_and_script():
    with pytest.raises(ValueError, match=r"moving_statistics must be one of \['torch', 'keras', 'tf'\], got 'caffe'"):
        BatchNorm2d(3, moving_statistics="caffe")
    with pytest.raises(ValueError, match="TF's momentum in"):
        BatchNorm2d(3, momentum=None, moving_statistics="keras")
    m = BatchNorm2d(3, momentum=0.99, moving_statistics="keras")
    assert "moving_statistics='keras'" in repr(m)
    s = torch.jit.script(BatchNorm2d(3, momentum=0.99, moving_statistics="keras"))
    x = torch.randn(4, 3, 2, 2)
    torch.testing.assert_close(s(x), m(x))
    torch.testing.assert_close(s.running_var, m.running_var)
    assert not torch.equal(m.running_var, torch.ones(3))
    net = convert_batchnorm(torch.nn.Sequential(torch.nn.BatchNorm2d(3)))
    assert net[0].moving_statistics == "torch" and isinstance(net[0], BatchNorm2d)
    net[0](x)
