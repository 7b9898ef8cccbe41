"""CudnnRNN ops vs torch.nn.LSTM / torch.nn.GRU on the same weights, float32.

(T, B, I, H) = (50, 32, 128, 256) and (100, 64, 512, 512), 1 and 2 layers, uni- and bidirectional:
* "inference": forward with is_training=False under no_grad vs the module under no_grad;
* "train fwd+bwd": forward with is_training=True plus the backward of output.sum() to input, states and
  all weights, vs the module's forward + backward;
* "varlen": V3 with sequence_lengths (training fwd+bwd) vs pack_padded_sequence -> module ->
  pad_packed_sequence.
`--quick`: the first shape only, 1 and 2 layers unidirectional plus 1 layer bidirectional.
On CUDA both sides run under the same TF32 setting, FP32 and TF32 (`--precision`).
"""
import torch

from ._timing import compare_cases

SHAPES = [(50, 32, 128, 256), (100, 64, 512, 512)]


def _module(mode, i, h, layers, bi, device):
    cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
    torch.manual_seed(0)
    return cls(i, h, layers, bidirectional=bi).to(device)


def _params(m):
    d = 2 if m.bidirectional else 1
    ws, bs = [], []
    for layer in range(m.num_layers):
        for di in range(d):
            sfx = f"_l{layer}" + ("_reverse" if di else "")
            ws += [getattr(m, "weight_ih" + sfx), getattr(m, "weight_hh" + sfx)]
            bs += [getattr(m, "bias_ih" + sfx), getattr(m, "bias_hh" + sfx)]
    return torch.cat([w.detach().reshape(-1) for w in ws + bs])


def _cases(device, quick):
    ops = torch.ops.torchops
    shapes = SHAPES[:1] if quick else SHAPES
    configs = [(1, False), (2, False), (1, True)] if quick else [(1, False), (2, False), (1, True), (2, True)]
    for mode in ("lstm", "gru"):
        for (t, b, i, h) in shapes:
            for layers, bi in configs:
                d = 2 if bi else 1
                m = _module(mode, i, h, layers, bi, device)
                p = _params(m).requires_grad_()
                x = torch.randn(t, b, i, device=device, requires_grad=True)
                h0 = torch.zeros(layers * d, b, h, device=device, requires_grad=True)
                c0 = torch.zeros(layers * d, b, h, device=device, requires_grad=True)
                cz = c0 if mode == "lstm" else torch.zeros((), device=device)
                dirn = "bidirectional" if bi else "unidirectional"
                state = (h0, c0) if mode == "lstm" else h0
                name = f"{mode} T={t} B={b} I={i} H={h} L={layers} {'bi' if bi else 'uni'}"

                def inf_ours(x=x, h0=h0, cz=cz, p=p, mode=mode, dirn=dirn):
                    with torch.no_grad():
                        return ops.cudnn_rnn(x, h0, cz, p, mode, "linear_input", dirn, 0.0, 0, 0, False)

                def inf_native(m=m, x=x, state=state):
                    with torch.no_grad():
                        return m(x, state)

                yield name + " inference", inf_ours, inf_native
                leaves = [x, h0] + ([c0] if mode == "lstm" else [])

                def train_ours(x=x, h0=h0, cz=cz, p=p, mode=mode, dirn=dirn, leaves=leaves):
                    y = ops.cudnn_rnn(x, h0, cz, p, mode, "linear_input", dirn, 0.0, 0, 0, True)[0]
                    torch.autograd.grad(y.sum(), leaves + [p])

                def train_native(m=m, x=x, state=state, leaves=leaves):
                    y = m(x, state)[0]
                    torch.autograd.grad(y.sum(), leaves + list(m.parameters()))

                yield name + " train fwd+bwd", train_ours, train_native
                if layers == 1:
                    g = torch.Generator().manual_seed(1)
                    lens_cpu = torch.randint(t // 2, t + 1, (b,), generator=g, dtype=torch.int32)
                    lens_cpu[0] = t
                    lens = lens_cpu.to(device)

                    def var_ours(x=x, h0=h0, cz=cz, p=p, mode=mode, dirn=dirn, leaves=leaves, lens=lens):
                        y = ops.cudnn_rnn_v3(x, h0, cz, p, lens, mode, "linear_input", dirn, 0.0, 0, 0, 0, True,
                                             True)[0]
                        torch.autograd.grad(y.sum(), leaves + [p])

                    def var_native(m=m, x=x, state=state, leaves=leaves, lens=lens_cpu):
                        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lens.long(), enforce_sorted=False)
                        y = torch.nn.utils.rnn.pad_packed_sequence(m(packed, state)[0], total_length=x.shape[0])[0]
                        torch.autograd.grad(y.sum(), leaves + list(m.parameters()))

                    yield name + " varlen fwd+bwd", var_ours, var_native


def run(args):
    device = torch.device(args.device)  # on CUDA the driver sets TF32 for both sides (--precision)
    return compare_cases(_cases(device, args.quick), args, device,
                         "cudnn_rnn (float32): torchops vs torch.nn.LSTM / torch.nn.GRU", rounds=3)
