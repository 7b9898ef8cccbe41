"""The worked examples of docs/porting.md: models made and run by TensorFlow/Keras (tools/tf_port/make_goldens.py),
ported from their files with torchops.tf only, give TensorFlow's outputs (no TensorFlow needed here)."""
import os

import numpy as np
import pytest
import torch

import torchops.tf as ttf
from torchops.nn import BatchNorm2d, BlockGRU, BlockLSTM, CudnnGRU, CudnnLSTM, LSTMBlockCell
from torchops.tf import convert

DATA = os.path.join(os.path.dirname(__file__), "data")
TOL = dict(rtol=1e-5, atol=1e-5)  # float32


def close(got, want, **kw):
    np.testing.assert_allclose(got.detach().numpy(), want, **{**TOL, **kw})


# -- (a) a TF 1.x graph saved with Saver: contrib-style fused batch norm, CudnnLSTM ------------------------------

@pytest.fixture(scope="module")
def tf1():
    return ttf.load_checkpoint(os.path.join(DATA, "tf1_model")), np.load(os.path.join(DATA, "tf1_model.npz"))


def _tf1_port(reader):
    bn = BatchNorm2d(2, eps=1e-3, momentum=0.9, moving_statistics="tf")
    convert.load_batch_norm_checkpoint(bn, reader, scope="BatchNorm")  # center only: no gamma in the file
    lstm = CudnnLSTM(2, 6, 8)
    convert.load_cudnn_rnn_checkpoint(lstm, reader, scope="cudnn_lstm")
    return bn.eval(), lstm.eval()


def test_tf1_model_inference(tf1):
    reader, ref = tf1
    assert "BatchNorm/gamma" not in reader
    bn, lstm = _tf1_port(reader)
    x = torch.from_numpy(ref["x"]).permute(0, 3, 1, 2)  # NHWC -> NCHW
    y = bn(x)
    close(y.permute(0, 2, 3, 1), ref["bn"])
    B, C, H, W = y.shape
    seq = y.permute(2, 0, 3, 1).reshape(H, B, W * C)  # rows as time steps, features (w, c) as TF's reshape
    out, (h, c) = lstm(seq)
    close(out, ref["outputs"])
    for layer in range(2):
        close(h[layer], ref[f"h_n_{layer}"])
        close(c[layer], ref[f"c_n_{layer}"])


def test_tf1_model_training_step_moving_statistics(tf1):
    reader, ref = tf1
    bn, _ = _tf1_port(reader)
    bn.train()
    y = bn(torch.from_numpy(ref["x"]).permute(0, 3, 1, 2))
    close(y.permute(0, 2, 3, 1), ref["train_y"])
    close(bn.running_mean, ref["moving_mean"])
    close(bn.running_var, ref["moving_variance"])  # the raw op's Bessel-corrected update, TF momentum 0.9


def test_tf1_lstm_cell_variables_into_block_lstm(tf1):
    reader, ref = tf1
    scope = "cudnn_lstm/rnn/multi_rnn_cell/cell_0/cudnn_compatible_lstm_cell"
    bn, _ = _tf1_port(reader)
    y = bn(torch.from_numpy(ref["x"]).permute(0, 3, 1, 2))
    seq = y.permute(2, 0, 3, 1).reshape(5, 3, 8)
    for m, kw in ((BlockLSTM(8, 6, version=1, forget_bias=0.0), {}), (BlockLSTM(8, 6), {"forget_bias": 0.0})):
        convert.load_lstm_block_checkpoint(m, reader, scope=scope, **kw)
        _, (h, c) = m(seq)
        close(h[0], ref["h_n_0"])
        close(c[0], ref["c_n_0"])


# -- (b) a Keras model: Conv2D, BatchNormalization, Bidirectional(LSTM), GRU(reset_after=True/False) -------------

class KerasPort(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        with torch.no_grad():
            self.conv.weight.copy_(w["conv"][0].permute(3, 2, 0, 1))  # Keras [kh, kw, in, out]
            self.conv.bias.copy_(w["conv"][1])
        self.bn = BatchNorm2d(4, eps=1e-3, momentum=0.99, moving_statistics="keras")
        convert.load_batch_norm_keras_weights(self.bn, w["bn"])
        self.bilstm = CudnnLSTM(1, 5, 20, direction="bidirectional", time_major=False)
        convert.load_cudnn_rnn_keras_weights(self.bilstm, w["bilstm"])
        self.gru_after = CudnnGRU(1, 4, 10, time_major=False)
        convert.load_cudnn_rnn_keras_weights(self.gru_after, w["gru_after"])
        self.gru_before = BlockGRU(4, 3, batch_first=True)
        convert.load_gru_block_keras_weights(self.gru_before, w["gru_before"])

    def forward(self, x_nhwc):
        y = self.bn(self.conv(x_nhwc.permute(0, 3, 1, 2)))
        y = y.permute(0, 2, 3, 1).reshape(y.size(0), y.size(2), -1)  # Keras Reshape((H, W * C)) on NHWC
        y, _ = self.bilstm(y)
        y, _ = self.gru_after(y)
        _, h = self.gru_before(y)
        return h[0]


@pytest.mark.parametrize("name", ["keras_model.h5", "keras_weights.h5", "keras_model.keras"])
def test_keras_model_inference(name):
    ref = np.load(os.path.join(DATA, "keras_model.npz"))
    model = KerasPort(ttf.load_keras_weights(os.path.join(DATA, name))).eval()
    close(model(torch.from_numpy(ref["x"])), ref["y"])


def test_keras_batch_norm_training_step():
    ref = np.load(os.path.join(DATA, "keras_model.npz"))
    bn = KerasPort(ttf.load_keras_weights(os.path.join(DATA, "keras_model.keras"))).bn.train()
    y = bn(torch.from_numpy(ref["bn_input"]).permute(0, 3, 1, 2))
    close(y.permute(0, 2, 3, 1), ref["bn_train_y"])
    close(bn.running_mean, ref["bn_moving_mean"])
    close(bn.running_var, ref["bn_moving_variance"])  # biased batch variance, momentum 0.99
    unbiased = BatchNorm2d(4, eps=1e-3, momentum=0.99, moving_statistics="tf")
    convert.load_batch_norm_keras_weights(unbiased, ttf.load_keras_weights(os.path.join(DATA, "keras_model.h5"))["bn"])
    unbiased.train()(torch.from_numpy(ref["bn_input"]).permute(0, 3, 1, 2))
    assert not np.allclose(unbiased.running_var.numpy(), ref["bn_moving_variance"], **TOL)  # the option matters


def test_keras_lstm_into_block_lstm_modules():
    """The forward LSTM of the Bidirectional layer, loaded into BlockLSTM (IFCO) and LSTMBlockCell (ICFO, with a
    forget_bias), gives the forward half of the ported model's Bidirectional outputs."""
    ref = np.load(os.path.join(DATA, "keras_model.npz"))
    port = KerasPort(ttf.load_keras_weights(os.path.join(DATA, "keras_model.keras"))).eval()
    with torch.no_grad():
        y = port.bn(port.conv(torch.from_numpy(ref["x"]).permute(0, 3, 1, 2)))
        rows = y.permute(0, 2, 3, 1).reshape(2, 6, 20)
        want, _ = port.bilstm(rows)
    forward = [torch.from_numpy(ref[f"weights/bilstm/{i}"]) for i in range(3)]
    block = BlockLSTM(20, 5, batch_first=True)
    convert.load_lstm_block_keras_weights(block, forward)
    out, _ = block(rows)
    close(out, want[..., :5].numpy())
    cell = LSTMBlockCell(20, 5, forget_bias=1.0)
    convert.load_lstm_block_keras_weights(cell, forward)
    h = c = torch.zeros(2, 5)
    for t in range(6):
        h, c = cell(rows[:, t], (h, c))
    close(h, want[:, -1, :5].numpy())
    for m in (block, cell):
        back = convert.lstm_block_keras_weights(m)
        for a, b in zip(back, forward):
            close(a, b.numpy(), atol=1e-6)


def test_the_porting_guide_examples_run_as_written(monkeypatch):
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "docs", "porting.md"), encoding="utf-8").read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) == 2
    monkeypatch.chdir(root)
    refs = [np.load(os.path.join(DATA, "tf1_model.npz")), np.load(os.path.join(DATA, "keras_model.npz"))]
    for block, ref in zip(blocks, refs):
        scope = {}
        exec(compile(block, "docs/porting.md", "exec"), scope)
        with torch.no_grad():
            out = scope["model"](torch.from_numpy(ref["x"]))
        if isinstance(out, tuple):
            close(out[0], ref["outputs"])
        else:
            close(out, ref["y"])


def test_no_tensorflow_in_this_process():
    import sys
    assert "tensorflow" not in sys.modules and "keras" not in sys.modules and "tf_keras" not in sys.modules
