"""Model: a small conv net on channels-last memory (torchops.nn.BatchNorm2d, i.e. FusedBatchNormV3)
whose feature map is read row by row, as a sequence of 8 time steps, by a recurrent head:
`torchops.nn.CudnnGRU` (--rnn gru), `torchops.nn.CudnnLSTM` (--rnn lstm) or `torchops.nn.BlockLSTM`
(--rnn block-lstm, TF's BlockLSTMV2). Every piece is scriptable (the served model is the TorchScript one)."""
import torch
from torch import Tensor, nn

import torchops

RNN_KINDS = ("gru", "lstm", "block-lstm")
CONV_CHANNELS = 32
HIDDEN = 64


def _cudnn_module(name: str):
    cls = getattr(torchops.nn, name, None)
    if cls is None:
        raise RuntimeError(f"--rnn needs torchops.nn.{name}, which this torchops build does not have (the "
                           f"CudnnRNN modules are not merged yet); use --rnn block-lstm")
    return cls


class CudnnGRUHead(nn.Module):
    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.rnn = _cudnn_module("CudnnGRU")(1, hidden, input_size)  # (num_layers, num_units, input_size)

    def forward(self, seq: Tensor) -> Tensor:
        out, h = self.rnn(seq)
        return out[-1]


class CudnnLSTMHead(nn.Module):
    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.rnn = _cudnn_module("CudnnLSTM")(1, hidden, input_size)

    def forward(self, seq: Tensor) -> Tensor:
        out, hc = self.rnn(seq)
        return out[-1]


class BlockLSTMHead(nn.Module):
    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.rnn = torchops.nn.BlockLSTM(input_size, hidden)

    def forward(self, seq: Tensor) -> Tensor:
        out, hc = self.rnn(seq)
        return out[-1]


HEADS = {"gru": CudnnGRUHead, "lstm": CudnnLSTMHead, "block-lstm": BlockLSTMHead}


class DigitNet(nn.Module):
    """[B, 1, 8, 8] -> logits [B, 10]. Row-wise in eval mode (what torchops.nn.Batched needs)."""

    def __init__(self, rnn: str = "gru"):
        super().__init__()
        if rnn not in HEADS:
            raise ValueError(f"rnn must be one of {RNN_KINDS}, got {rnn!r}")
        c = CONV_CHANNELS
        self.features = nn.Sequential(
            nn.Conv2d(1, c // 2, 3, padding=1), torchops.nn.BatchNorm2d(c // 2), nn.ReLU(),
            nn.Conv2d(c // 2, c, 3, padding=1), torchops.nn.BatchNorm2d(c), nn.ReLU())
        self.head = HEADS[rnn](c * 8, HIDDEN)  # one time step = one image row of c channels x 8 columns
        self.classifier = nn.Linear(HIDDEN, 10)

    def forward(self, x: Tensor) -> Tensor:
        f = self.features(x.contiguous(memory_format=torch.channels_last))  # NHWC memory end to end
        seq = f.permute(2, 0, 3, 1).reshape(f.size(2), f.size(0), f.size(3) * f.size(1))  # [T=rows, B, W*C]
        return self.classifier(self.head(seq))


def build_model(rnn: str = "gru", seed: int = 0, device: str = "cpu") -> DigitNet:
    """A freshly initialised model (fixed seed), parameters in channels-last memory. Top-level, so that
    `functools.partial(build_model, ...)` pickles for worker processes."""
    torch.manual_seed(seed)
    return DigitNet(rnn).to(device=device, memory_format=torch.channels_last)


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, x: Tensor, batch_size: int = 256) -> None:
    """Running statistics recomputed as the exact average over `x` (cumulative average, momentum=None).
    The replicas train on their own shards, so the running statistics of the parameter copy being
    evaluated are set from the whole training set once per evaluation."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.momentum, m.training) for m in bns]
    was_training = model.training
    model.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    for i in range(0, len(x), batch_size):
        model(x[i:i + batch_size])
    for m, (momentum, _) in zip(bns, saved):
        m.momentum = momentum
    model.train(was_training)


@torch.no_grad()
def predict(model, x: Tensor, batch_size: int = 512) -> Tensor:
    """Logits for every row of x, in eval mode."""
    if isinstance(model, nn.Module):
        model.eval()
    return torch.cat([model(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def accuracy(logits: Tensor, y: Tensor) -> float:
    return (logits.argmax(1) == y.to(logits.device)).float().mean().item()
