"""`torch.autograd.Function`s of the GRU / LSTM block ops. Each forward calls the forward op and each
backward the matching gradient op (the public TF grad op where it expresses the gradient, the internal
`_*_backward` op where gradients also arrive at gate outputs); no math of their own. They compute the
same gradients as the C++ autograd that `torch.ops.torchops.*` use by default. Double backward is not
supported (the grad ops raise "derivative for torchops::... is not implemented")."""
import torch

_ops = torch.ops.torchops


def _none_defined(grads):
    return all(g is None for g in grads)


class GRUBlockCell(torch.autograd.Function):
    """`GRUBlockCell.apply(x, h_prev, w_ru, w_c, b_ru, b_c)` -> (r, u, c, h). Gradients arriving at all
    four outputs are used; returns gradients for all six inputs."""

    @staticmethod
    def forward(ctx, x, h_prev, w_ru, w_c, b_ru, b_c):
        r, u, c, h = _ops.gru_block_cell(x, h_prev, w_ru, w_c, b_ru, b_c)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, h_prev, w_ru, w_c, r, u, c)
        return r, u, c, h

    @staticmethod
    def backward(ctx, d_r, d_u, d_c, d_h):
        if _none_defined((d_r, d_u, d_c, d_h)):
            return None, None, None, None, None, None
        x, h_prev, w_ru, w_c, r, u, c = ctx.saved_tensors
        return _ops._gru_block_cell_backward(x, h_prev, w_ru, w_c, r, u, c, d_r, d_u, d_c, d_h)


class BlockGRU(torch.autograd.Function):
    """`BlockGRU.apply(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c)` -> (r, u, c, h), each [T, B, C];
    backward = block_gru_grad."""

    @staticmethod
    def forward(ctx, seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c):
        outs = _ops.block_gru(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(seq_len_max, x, h_prev, w_ru, w_c, b_ru, b_c, *outs)
        return outs

    @staticmethod
    def backward(ctx, d_r, d_u, d_c, d_h):
        if _none_defined((d_r, d_u, d_c, d_h)):
            return (None,) * 7
        saved = ctx.saved_tensors
        if d_h is None:
            d_h = torch.zeros_like(saved[10])
        grads = _ops.block_gru_grad(*saved, d_h, d_r, d_u, d_c)
        return (None,) + tuple(grads)


class LSTMBlockCell(torch.autograd.Function):
    """`LSTMBlockCell.apply(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0,
    use_peephole=False)` -> (i, cs, f, o, ci, co, h). Gradients of all seven outputs are used
    (straight-through cell clip); returns gradients for the eight tensor inputs."""

    @staticmethod
    def forward(ctx, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False):
        outs = _ops.lstm_block_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip, use_peephole)
        ctx.set_materialize_grads(False)
        ctx.use_peephole = use_peephole
        ctx.save_for_backward(x, cs_prev, h_prev, w, wci, wcf, wco, b, *outs[:6])
        return outs

    @staticmethod
    def backward(ctx, d_i, d_cs, d_f, d_o, d_ci, d_co, d_h):
        if _none_defined((d_i, d_cs, d_f, d_o, d_ci, d_co, d_h)):
            return (None,) * 11
        grads = _ops._lstm_block_cell_backward(*ctx.saved_tensors, d_cs, d_h, d_i, d_f, d_o, d_ci, d_co,
                                               ctx.use_peephole)
        return tuple(grads) + (None, None, None)


def _block_lstm_backward(ctx, grads, v2):
    d_i, d_cs, d_f, d_o, d_ci, d_co, d_h = grads
    if _none_defined(grads):
        return (None,) * 12
    saved = ctx.saved_tensors
    if _none_defined((d_i, d_f, d_o, d_ci, d_co)) and saved[2].shape[1] > 0:  # (TF's grad op rejects C = 0)
        cs_grad = d_cs if d_cs is not None else torch.zeros_like(saved[10])
        h_grad = d_h if d_h is not None else torch.zeros_like(saved[15])
        grad_op = _ops.block_lstm_grad_v2 if v2 else _ops.block_lstm_grad
        out = grad_op(*saved, cs_grad, h_grad, ctx.use_peephole)
    else:
        out = _ops._block_lstm_backward(*saved, d_cs, d_h, d_i, d_f, d_o, d_ci, d_co, ctx.use_peephole, v2)
    return (None,) + tuple(out) + (None, None, None)


class BlockLSTM(torch.autograd.Function):
    """`BlockLSTM.apply(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0,
    cell_clip=3.0, use_peephole=False)` -> (i, cs, f, o, ci, co, h); backward = block_lstm_grad (ICFO)."""

    @staticmethod
    def forward(ctx, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0,
                use_peephole=False):
        outs = _ops.block_lstm(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias, cell_clip,
                               use_peephole)
        ctx.set_materialize_grads(False)
        ctx.use_peephole = use_peephole
        ctx.save_for_backward(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *outs)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        return _block_lstm_backward(ctx, grads, False)


class BlockLSTMV2(torch.autograd.Function):
    """`BlockLSTMV2.apply(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0,
    use_peephole=False)` -> (i, cs, f, o, ci, co, h); backward = block_lstm_grad_v2 (IFCO; TF wires
    the V1 kernel here, which is wrong)."""

    @staticmethod
    def forward(ctx, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0, use_peephole=False):
        outs = _ops.block_lstm_v2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip, use_peephole)
        ctx.set_materialize_grads(False)
        ctx.use_peephole = use_peephole
        ctx.save_for_backward(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, *outs)
        return outs

    @staticmethod
    def backward(ctx, *grads):
        return _block_lstm_backward(ctx, grads, True)[:10] + (None,)
