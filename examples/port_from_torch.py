"""Porting example: move an existing PyTorch model onto torchops' fused ops, check it computes the same,
and train it on real data. (The end-to-end main job is `python -m torchops.demo`.)

1. A small conv net on scikit-learn's bundled digits dataset (8x8 handwritten digits, no download)
   is trained twice from the same initialisation: with torch.nn.BatchNorm2d, and converted in place
   by torchops.nn.convert_batchnorm to torchops' FusedBatchNormV3 kernels (channels-last memory).
   Losses and accuracies must agree.
2. The trained torchops model is scripted, saved, reloaded and evaluated (TorchScript path).
3. The raw TF-style op is called the way a TensorFlow port would call it (NHWC, running averages).
4. An LSTM reading each digit row by row: a torch.nn.LSTM converted exactly to torchops.nn.BlockLSTM
   (TF's BlockLSTMV2, one op per sequence), checked equal, then trained.

`python examples/port_from_torch.py [--epochs N]` (needs scikit-learn)
"""
import argparse
import copy
import io
import time
import warnings

import torch
from torch import nn

import torchops


def load_digits():
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0  # [N, 1, 8, 8] in [0, 1]
    y = torch.tensor(data.target, dtype=torch.long)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(y), generator=g)
    split = int(0.8 * len(y))
    return (x[perm[:split]], y[perm[:split]]), (x[perm[split:]], y[perm[split:]])


def make_net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def train(model, train_set, epochs, channels_last, adam=False):
    x, y = train_set
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = (torch.optim.Adam(model.parameters(), lr=1e-2) if adam
           else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    losses = []
    g = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(y), generator=g)
        total = 0.0
        for i in range(0, len(y), 64):
            idx = perm[i:i + 64]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        losses.append(total / len(y))
    return model, losses


@torch.no_grad()
def accuracy(model, test_set):
    model.eval()
    x, y = test_set
    return (model(x).argmax(1) == y).float().mean().item()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=6)
    args = p.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.jit")  # TorchScript is what we demo
    train_set, test_set = load_digits()
    print(f"digits: {len(train_set[1])} train / {len(test_set[1])} test images, torch {torch.__version__}, "
          f"torchops CUDA kernels: {torchops.built_with_cuda()}")

    base = make_net()
    results = {}
    for name in ("torch.nn.BatchNorm2d", "torchops.nn.BatchNorm2d"):
        model = copy.deepcopy(base)
        if name.startswith("torchops"):
            torchops.nn.convert_batchnorm(model)
        t0 = time.perf_counter()
        model, losses = train(model, train_set, args.epochs, channels_last=True)
        elapsed = time.perf_counter() - t0
        results[name] = (model, losses, accuracy(model, test_set), elapsed)
        print(f"{name:26s} loss per epoch {' '.join(f'{v:.4f}' for v in losses)}  test accuracy "
              f"{results[name][2]:.4f}  ({elapsed:.1f} s)")
    (_, l_t, a_t, _), (ours, l_o, a_o, _) = results.values()
    max_diff = max(abs(a - b) for a, b in zip(l_t, l_o))
    print(f"max epoch-loss difference torch vs torchops: {max_diff:.2e}; accuracy {a_t:.4f} vs {a_o:.4f}")
    if max_diff > 1e-3 or abs(a_t - a_o) > 0.01 or a_o < 0.9:
        raise SystemExit("port_from_torch FAILED: torchops BatchNorm does not train like torch's")

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(ours), buf)
    buf.seek(0)
    scripted = torch.jit.load(buf)
    a_s = accuracy(scripted, test_set)
    print(f"TorchScript round trip: test accuracy {a_s:.4f}")
    if abs(a_s - a_o) > 1e-6:
        raise SystemExit("port_from_torch FAILED: scripted model differs")

    # A TF port calls the raw op: NHWC, exponential running averages, reserve spaces for the gradient.
    x = train_set[0][:256].permute(0, 2, 3, 1).contiguous()  # [N, H, W, C=1]
    mean, var = torch.zeros(1), torch.ones(1)
    y, mean, var, rs1, rs2, rs3 = torch.ops.torchops.fused_batch_norm_v3(
        x, torch.ones(1), torch.zeros(1), mean, var, epsilon=0.001, exponential_avg_factor=0.5,
        data_format="NHWC", is_training=True)
    print(f"raw FusedBatchNormV3 (NHWC, eaf=0.5): running mean {mean.item():.4f}, running variance "
          f"{var.item():.4f}, batch mean {rs1.item():.4f}, biased batch variance {rs2.item():.4f}, "
          f"y mean {y.mean().item():.2e}")
    lstm_demo(train_set, test_set, args.epochs)
    print("porting example OK")


class RowLSTM(nn.Module):
    """Reads an 8x8 digit as 8 time steps of 8 pixels."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(64, 10)

    def forward(self, x):
        seq = x.squeeze(1).permute(1, 0, 2)  # [T=8, B, I=8]
        out, _ = self.rnn(seq)
        return self.head(out[-1])


def lstm_demo(train_set, test_set, epochs):
    torch.manual_seed(0)
    reference = RowLSTM(nn.LSTM(8, 64))
    model = copy.deepcopy(reference)
    model.rnn = torchops.nn.BlockLSTM.from_torch(reference.rnn)  # exact conversion, TF BlockLSTMV2 layout
    x = test_set[0][:32]
    diff = (model(x) - reference(x)).abs().max().item()
    print(f"nn.LSTM -> torchops.nn.BlockLSTM conversion: max output difference {diff:.1e}")
    if diff > 1e-5:
        raise SystemExit("port_from_torch FAILED: BlockLSTM conversion differs from nn.LSTM")
    model, losses = train(model, train_set, epochs, channels_last=False, adam=True)
    acc = accuracy(model, test_set)
    print(f"BlockLSTM row reader: loss per epoch {' '.join(f'{v:.4f}' for v in losses)}  test accuracy {acc:.4f}")
    if acc < 0.8:
        raise SystemExit("port_from_torch FAILED: the BlockLSTM model did not learn")


if __name__ == "__main__":
    main()
