"""Port a variable-length sequence model between torch.nn.LSTM and TF's CudnnLSTM layout, and train it.

1. A torch.nn.LSTM tagger (2 layers, bidirectional, projection, batch_first) is converted exactly to
   torchops.nn.CudnnLSTM; on padded variable-length batches it must equal the original run on packed
   sequences.
2. The converted model is trained a few hundred steps on a synthetic task that needs the recurrence in
   both directions (tag each step with "how many 1s are left after me, minus before me").
3. The trained weights go out as TF's canonical lists and as TF 1.x checkpoint tensors (the names
   tf.contrib.cudnn_rnn writes), come back into fresh modules, and back to torch.nn.LSTM: all equal.
4. The model is scripted with TorchScript and checked against eager mode.

`python examples/cudnn_rnn_port.py [--steps N]`
"""
import argparse

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchops


class Tagger(nn.Module):
    def __init__(self, rnn, width):
        super().__init__()
        self.rnn = rnn
        self.head = nn.Linear(width, 1)

    def forward(self, x, lengths):
        y = self.rnn(x, None, lengths)[0]
        return self.head(y).squeeze(-1)


def batch(g, B=64, T=24):
    lengths = torch.randint(1, T + 1, [B], generator=g)
    bits = (torch.rand(B, T, generator=g) < 0.5).float()
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    bits = bits * mask
    after = bits.flip(1).cumsum(1).flip(1) - bits
    before = bits.cumsum(1) - bits
    target = (after - before) / 4.0
    return bits[..., None], lengths, target * mask, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    # 1. exact conversion from torch.nn.LSTM, checked against torch's packed-sequence path
    ref = nn.LSTM(1, 32, num_layers=2, bidirectional=True, proj_size=16, batch_first=True)
    rnn = torchops.nn.CudnnLSTM.from_torch(ref)
    print(rnn)
    x, lengths, target, mask = batch(g)
    y, (h, c) = rnn(x, None, lengths)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    y_ref, (h_ref, c_ref) = ref(packed)
    y_ref = pad_packed_sequence(y_ref, batch_first=True, total_length=x.shape[1])[0]
    diff = max((y - y_ref).abs().max().item(), (h - h_ref).abs().max().item(), (c - c_ref).abs().max().item())
    print(f"torch.nn.LSTM (packed) vs CudnnLSTM (sequence_lengths): max difference {diff:.1e}")
    if diff > 1e-5:
        raise SystemExit("FAILED: conversion differs")

    # 2. train
    model = Tagger(rnn, 2 * rnn.output_size)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for step in range(args.steps):
        x, lengths, target, mask = batch(g)
        loss = (((model(x, lengths) - target) ** 2) * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}")
    if loss.item() > 0.3 * first:
        raise SystemExit("FAILED: the model did not learn")

    # 3. out to TF's formats and back
    weights, biases = rnn.canonical_weights()
    again = torchops.nn.CudnnLSTM(2, 32, 1, direction="bidirectional", num_proj=16, time_major=False)
    again.load_canonical_weights([w.detach().numpy() for w in weights], [b.detach().numpy() for b in biases])
    ckpt = {k: v.numpy() for k, v in rnn.tf_checkpoint_weights(scope="tagger/cudnn_lstm").items()}
    print(f"{len(weights)} canonical weights, {len(biases)} biases; {len(ckpt)} TF checkpoint tensors, e.g. "
          f"{next(iter(ckpt))} {list(next(iter(ckpt.values())).shape)}")
    from_ckpt = torchops.nn.CudnnLSTM(2, 32, 1, direction="bidirectional", num_proj=16, time_major=False)
    from_ckpt.load_tf_checkpoint_weights(ckpt, scope="tagger/cudnn_lstm")
    back = rnn.to_torch()
    x, lengths, _, _ = batch(g)
    with torch.no_grad():
        y = rnn.eval()(x, None, lengths)[0]
        checks = {"canonical": again(x, None, lengths)[0], "TF checkpoint": from_ckpt(x, None, lengths)[0],
                  "torch.nn.LSTM": pad_packed_sequence(back(pack_padded_sequence(
                      x, lengths, batch_first=True, enforce_sorted=False))[0], batch_first=True,
                      total_length=x.shape[1])[0]}
    for name, other in checks.items():
        d = (other - y).abs().max().item()
        print(f"round trip through {name}: max difference {d:.1e}")
        if d > 1e-5:
            raise SystemExit(f"FAILED: {name} round trip differs")

    # 4. TorchScript
    scripted = torch.jit.script(model.eval())
    with torch.no_grad():
        d = (scripted(x, lengths) - model(x, lengths)).abs().max().item()
    print(f"TorchScript vs eager: max difference {d:.1e}")
    if d > 0:
        raise SystemExit("FAILED: scripted model differs")
    print("OK")


if __name__ == "__main__":
    main()
