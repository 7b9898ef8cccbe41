"""GRU / LSTM block ops vs PyTorch.

* gru_block_cell vs the same equations composed from PyTorch ops (eager autograd), (B, I, C) =
  (64, 256, 256) and (256, 512, 512).
* block_lstm_v2 vs torch.nn.LSTM and block_gru vs torch.nn.GRU, (T, B, I, C) = (50, 32, 128, 256), on a GPU
  also (100, 64, 512, 512) and block_lstm (TF's first version: icfo gate order, forget bias 1, cell clip 3).
"forward" runs with gradients enabled (training forward); "fwd+bwd" adds the backward of out.sum()
to every input and parameter. float32.
* "autocast <dtype>": the modules BlockLSTM (v2) vs torch.nn.LSTM (same weights, from_torch) and BlockGRU vs
  torch.nn.GRU, float32 parameters called under `torch.autocast` (bfloat16 on the CPU, float16 and bfloat16 on
  CUDA), both sides under the same autocast; (T, B, I, C) = (50, 32, 128, 256).
"""
import itertools

import torch

from ._timing import autocast_dtypes, compare_cases, under_autocast

CELL_SHAPES = [(64, 256, 256), (256, 512, 512)]
SEQ_SHAPES = [(50, 32, 128, 256)]
SEQ_SHAPES_CUDA = SEQ_SHAPES + [(100, 64, 512, 512)]


def _p(*shape, device, scale=0.1):
    return (torch.randn(*shape, device=device) * scale).requires_grad_()


def _composed_gru_cell(x, h, w_ru, w_c, b_ru, b_c):
    c_size = h.shape[1]
    ru = torch.sigmoid(torch.cat([x, h], 1) @ w_ru + b_ru)
    r, u = ru[:, :c_size], ru[:, c_size:]
    c = torch.tanh(torch.cat([x, r * h], 1) @ w_c + b_c)
    return r, u, c, u * (h - c) + c


def _fwd_bwd(fn, out_index, params):
    def run():
        out = fn()
        y = out[out_index] if out_index is not None else out
        torch.autograd.grad(y.sum(), params)
    return run


def _cases(device):
    for (b, i, c) in CELL_SHAPES:
        args = [_p(b, i, device=device), _p(b, c, device=device), _p(i + c, 2 * c, device=device),
                _p(i + c, c, device=device), _p(2 * c, device=device), _p(c, device=device)]
        ours = lambda args=args: torch.ops.torchops.gru_block_cell(*args)  # noqa: E731
        native = lambda args=args: _composed_gru_cell(*args)  # noqa: E731
        name = f"gru_block_cell B={b} I={i} C={c}"
        yield name + " forward", ours, native
        yield name + " fwd+bwd", _fwd_bwd(ours, 3, args), _fwd_bwd(native, 3, args)
    for (t, b, i, c) in SEQ_SHAPES_CUDA if device.type == "cuda" else SEQ_SHAPES:
        x, h0, c0 = _p(t, b, i, device=device), _p(b, c, device=device), _p(b, c, device=device)
        lstm = torch.nn.LSTM(i, c).to(device)
        w = torch.cat([lstm.weight_ih_l0.t(), lstm.weight_hh_l0.t()], 0).detach().requires_grad_()
        bias = (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().requires_grad_()
        z = torch.zeros(c, device=device)
        seq = torch.tensor(t, dtype=torch.int64)
        ours = lambda a=(seq, x, c0, h0, w, z, z, z, bias): torch.ops.torchops.block_lstm_v2(*a)  # noqa: E731
        native = lambda m=lstm, x=x, h0=h0, c0=c0: m(x, (h0[None], c0[None]))  # noqa: E731
        name = f"block_lstm_v2 vs nn.LSTM T={t} B={b} I={i} C={c}"
        yield name + " forward", ours, native
        yield name + " fwd+bwd", _fwd_bwd(ours, 6, [x, h0, c0, w, bias]), _fwd_bwd(
            native, 0, [x, h0, c0] + list(lstm.parameters()))
        if device.type == "cuda":
            ours = lambda a=(seq, x, c0, h0, w, z, z, z, bias): torch.ops.torchops.block_lstm(*a)  # noqa: E731
            name = f"block_lstm vs nn.LSTM T={t} B={b} I={i} C={c}"
            yield name + " forward", ours, native
            yield name + " fwd+bwd", _fwd_bwd(ours, 6, [x, h0, c0, w, bias]), _fwd_bwd(
                native, 0, [x, h0, c0] + list(lstm.parameters()))
        gru = torch.nn.GRU(i, c).to(device)
        w_ru, w_c = _p(i + c, 2 * c, device=device), _p(i + c, c, device=device)
        b_ru, b_c = _p(2 * c, device=device), _p(c, device=device)
        ours = lambda a=(seq, x, h0, w_ru, w_c, b_ru, b_c): torch.ops.torchops.block_gru(*a)  # noqa: E731
        native = lambda m=gru, x=x, h0=h0: m(x, h0[None])  # noqa: E731
        name = f"block_gru vs nn.GRU T={t} B={b} I={i} C={c}"
        yield name + " forward", ours, native
        yield name + " fwd+bwd", _fwd_bwd(ours, 3, [x, h0, w_ru, w_c, b_ru, b_c]), _fwd_bwd(
            native, 0, [x, h0] + list(gru.parameters()))


def _autocast_cases(device):
    import torchops

    for (t, b, i, c) in SEQ_SHAPES:
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(i, c).to(device)
        gru = torch.nn.GRU(i, c).to(device)
        pairs = [("BlockLSTM vs nn.LSTM", torchops.nn.BlockLSTM.from_torch(lstm), lstm),
                 ("BlockGRU vs nn.GRU", torchops.nn.BlockGRU(i, c, device=device), gru)]
        x = _p(t, b, i, device=device)
        for dtype in autocast_dtypes(device):
            for label, ours, native in pairs:
                name = f"{label} T={t} B={b} I={i} C={c} autocast {str(dtype).split('.')[-1]}"

                def fwd(m, x=x):
                    return m(x)[0]

                def fwd_bwd(m, x=x):
                    torch.autograd.grad(m(x)[0].float().sum(), [x] + list(m.parameters()))

                yield (name + " forward", under_autocast(lambda m=ours: fwd(m), device, dtype),
                       under_autocast(lambda m=native: fwd(m), device, dtype))
                yield (name + " fwd+bwd", under_autocast(lambda m=ours: fwd_bwd(m), device, dtype),
                       under_autocast(lambda m=native: fwd_bwd(m), device, dtype))


def run(args):
    device = torch.device(args.device)
    return compare_cases(itertools.chain(_cases(device), _autocast_cases(device)), args, device,
                         "block_rnn (float32 and autocast): torchops vs PyTorch (composed ops / nn.LSTM / nn.GRU)")
