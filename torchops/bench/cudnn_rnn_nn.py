"""torchops.nn.CudnnLSTM / CudnnGRU modules vs torch.nn.LSTM / torch.nn.GRU (same weights via from_torch),
float32, batch-major (`time_major=False` / `batch_first=True`, the common torch layout), module calls end to
end:
* "inference": eval mode under no_grad;
* "train fwd+bwd": training mode, forward plus backward of output.sum() to the input and all parameters;
* "varlen fwd+bwd": `sequence_lengths` vs pack_padded_sequence -> module -> pad_packed_sequence;
* "module overhead": the module vs a direct `cudnn_rnn_v3` call on the same tensors (a tiny shape, where
  the wrapper's cost shows; ratio = module / op).
* "autocast <dtype> inference / train fwd+bwd": the same, float32 modules called under `torch.autocast`
  (bfloat16 on the CPU, float16 and bfloat16 on CUDA), 1 layer, both sides under the same autocast.
The op-level figures (every op against torch, both shapes of the issue) are in the `cudnn_rnn` family.
`--quick`: one shape, 1 layer.
"""
import torch

from ._timing import autocast_dtypes, compare_cases, under_autocast

SHAPES = [(50, 32, 128, 256)]


def _cases(device, quick):
    import torchops

    configs = [(1, False)] if quick else [(1, False), (2, True)]
    for mode in ("lstm", "gru"):
        torch_cls = torch.nn.LSTM if mode == "lstm" else torch.nn.GRU
        ours_cls = torchops.nn.CudnnLSTM if mode == "lstm" else torchops.nn.CudnnGRU
        for (t, b, i, h) in SHAPES:
            for layers, bi in configs:
                torch.manual_seed(0)
                ref = torch_cls(i, h, layers, bidirectional=bi, batch_first=True).to(device)
                m = ours_cls.from_torch(ref)
                x = torch.randn(b, t, i, device=device, requires_grad=True)
                name = f"{mode} T={t} B={b} I={i} H={h} L={layers} {'bi' if bi else 'uni'}"

                def inf_ours(m=m, x=x):
                    m.eval()
                    with torch.no_grad():
                        return m(x)

                def inf_native(ref=ref, x=x):
                    ref.eval()
                    with torch.no_grad():
                        return ref(x)

                yield name + " inference", inf_ours, inf_native

                def train_ours(m=m, x=x):
                    m.train()
                    y = m(x)[0]
                    torch.autograd.grad(y.sum(), [x, m.params])

                def train_native(ref=ref, x=x):
                    ref.train()
                    y = ref(x)[0]
                    torch.autograd.grad(y.sum(), [x] + list(ref.parameters()))

                yield name + " train fwd+bwd", train_ours, train_native
                g = torch.Generator().manual_seed(1)
                lens = torch.randint(t // 2, t + 1, (b,), generator=g)
                lens[0] = t

                def var_ours(m=m, x=x, lens=lens):
                    m.train()
                    y = m(x, None, lens)[0]
                    torch.autograd.grad(y.sum(), [x, m.params])

                def var_native(ref=ref, x=x, lens=lens):
                    ref.train()
                    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
                    y = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True, total_length=t)[0]
                    torch.autograd.grad(y.sum(), [x] + list(ref.parameters()))

                yield name + " varlen fwd+bwd", var_ours, var_native
        yield from _autocast_cases(device, mode, torch_cls, ours_cls)
        # wrapper overhead: the module vs the op it calls, on a tiny problem
        torch.manual_seed(0)
        m = ours_cls(1, 16, 8, time_major=False, device=device).eval()
        x = torch.randn(4, 5, 8, device=device)
        h0 = torch.zeros(1, 4, 16, device=device)
        c0 = h0 if mode == "lstm" else torch.zeros((), device=device)
        full = torch.full([4], 5, dtype=torch.int32)

        def mod_call(m=m, x=x):
            with torch.no_grad():
                return m(x)

        def op_call(m=m, x=x, h0=h0, c0=c0, full=full, mode=mode):
            with torch.no_grad():
                return torch.ops.torchops.cudnn_rnn_v3(x, h0.transpose(0, 1), c0.transpose(0, 1) if mode == "lstm"
                                                       else c0, m.params, full, mode, "linear_input",
                                                       "unidirectional", 0.0, 0, 0, 0, False, False)

        yield f"{mode} T=5 B=4 I=8 H=16 module overhead (module / op)", mod_call, op_call


def _autocast_cases(device, mode, torch_cls, ours_cls):
    for (t, b, i, h) in SHAPES:
        torch.manual_seed(0)
        ref = torch_cls(i, h, batch_first=True).to(device)
        m = ours_cls.from_torch(ref)
        x = torch.randn(b, t, i, device=device, requires_grad=True)
        for dtype in autocast_dtypes(device):
            name = f"{mode} T={t} B={b} I={i} H={h} L=1 uni autocast {str(dtype).split('.')[-1]}"

            def inf(mod, x=x):
                mod.eval()
                with torch.no_grad():
                    return mod(x)

            def train(mod, params, x=x):
                mod.train()
                y = mod(x)[0]
                torch.autograd.grad(y.float().sum(), [x] + params)

            yield (name + " inference", under_autocast(lambda m=m: inf(m), device, dtype),
                   under_autocast(lambda ref=ref: inf(ref), device, dtype))
            yield (name + " train fwd+bwd", under_autocast(lambda m=m: train(m, [m.params]), device, dtype),
                   under_autocast(lambda ref=ref: train(ref, list(ref.parameters())), device, dtype))


def run(args):
    device = torch.device(args.device)  # on CUDA the driver sets TF32 for both sides (--precision)
    return compare_cases(_cases(device, args.quick), args, device,
                         "cudnn_rnn_nn (float32 and autocast, batch-major): torchops.nn modules vs torch.nn.LSTM / torch.nn.GRU", rounds=3)
