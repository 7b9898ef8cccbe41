import torchops  # noqa: F401

import pytest
import torch
from torch import nn

from torchops.nn import BlockGRU, BlockLSTM, GRUBlockCell, LSTMBlockCell

F64 = torch.float64


def close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def ref_gru_step(x, h, w_ru, w_c, b_ru, b_c):
    C = h.shape[1]
    ru = torch.sigmoid(torch.cat([x, h], 1) @ w_ru + b_ru)
    r, u = ru[:, :C], ru[:, C:]
    c = torch.tanh(torch.cat([x, h * r], 1) @ w_c + b_c)
    return u * h + (1 - u) * c


def test_gru_modules_tf_layout_and_math():
    torch.manual_seed(0)
    cell = GRUBlockCell(3, 4, dtype=F64)
    assert set(cell.state_dict()) == {"w_ru", "w_c", "b_ru", "b_c"}
    assert cell.w_ru.shape == (7, 8) and cell.w_c.shape == (7, 4)
    assert torch.equal(cell.b_ru, torch.ones(8, dtype=F64)) and torch.equal(cell.b_c, torch.zeros(4, dtype=F64))
    x = torch.randn(5, 2, 3, dtype=F64)
    h0 = torch.randn(2, 4, dtype=F64)
    seq = BlockGRU(3, 4, dtype=F64)
    seq.load_state_dict(cell.state_dict())
    out, h_n = seq(x, h0)
    h, hs = h0, []
    for t in range(5):
        h = ref_gru_step(x[t], h, cell.w_ru, cell.w_c, cell.b_ru, cell.b_c)
        hs.append(h)
        close(cell(x[t], hs[-2] if t else h0), h)
    close(out, torch.stack(hs))
    close(h_n, hs[-1][None])
    bf = BlockGRU(3, 4, batch_first=True, dtype=F64)
    bf.load_state_dict(cell.state_dict())
    out_bf, _ = bf(x.transpose(0, 1), h0[None])
    close(out_bf, out.transpose(0, 1))
    # PyTorch's GRU applies the reset gate after the matmul: the math genuinely differs (module doc).
    assert not hasattr(GRUBlockCell, "from_torch") and not hasattr(BlockGRU, "to_torch")


def test_lstm_block_cell_converts_to_and_from_torch():
    torch.manual_seed(1)
    ref = nn.LSTMCell(3, 4, dtype=F64)
    cell = LSTMBlockCell.from_torch(ref)
    x = torch.randn(2, 3, dtype=F64)
    hc = (torch.randn(2, 4, dtype=F64), torch.randn(2, 4, dtype=F64))
    for a, b in zip(cell(x, hc), ref(x, hc)):
        close(a, b)
    mine = LSTMBlockCell(3, 4, forget_bias=1.0, dtype=F64)
    back = mine.to_torch()
    for a, b in zip(mine(x, hc), back(x, hc)):
        close(a, b)
    with pytest.raises(ValueError, match="no peepholes"):
        LSTMBlockCell(3, 4, use_peephole=True).to_torch()


@pytest.mark.parametrize("version", [1, 2])
def test_block_lstm_converts_to_and_from_torch(version):
    torch.manual_seed(2)
    ref = nn.LSTM(3, 4, dtype=F64)
    m = BlockLSTM.from_torch(ref, version=version)
    x = torch.randn(6, 2, 3, dtype=F64, requires_grad=True)
    h0 = torch.randn(1, 2, 4, dtype=F64)
    c0 = torch.randn(1, 2, 4, dtype=F64)
    y, (h_n, c_n) = m(x, (h0, c0))
    y_ref, (h_ref, c_ref) = ref(x, (h0, c0))
    close(y, y_ref)
    close(h_n, h_ref)
    close(c_n, c_ref)
    g = torch.autograd.grad(y.sum() + c_n.sum(), [x, m.w])[0]
    g_ref = torch.autograd.grad(y_ref.sum() + c_ref.sum(), [x, ref.weight_ih_l0])[0]
    close(g, g_ref)
    fresh = BlockLSTM(3, 4, version=version, dtype=F64)
    back = fresh.to_torch()
    close(fresh(x)[0], back(x)[0])


def test_block_lstm_module_options():
    m = BlockLSTM(3, 4, version=1, use_peephole=True, cell_clip=0.5, batch_first=True)
    assert set(m.state_dict()) == {"w", "b", "wci", "wcf", "wco"}
    y, (h, c) = m(torch.randn(2, 5, 3))
    assert y.shape == (2, 5, 4) and h.shape == (1, 2, 4) and c.abs().max() <= 0.5
    assert set(BlockLSTM(3, 4).state_dict()) == {"w", "b"}
    with pytest.raises(ValueError, match="no forget_bias"):
        BlockLSTM(3, 4, version=2, forget_bias=1.0)


def test_sequence_modules_check_the_initial_state_shape():
    # Found by fuzzing: the state was reshaped, so a transposed or flat one was silently scrambled.
    x = torch.randn(4, 2, 3)
    g, m = BlockGRU(3, 5), BlockLSTM(3, 5)
    h = torch.randn(2, 5)
    assert torch.equal(g(x, h)[0], g(x, h[None])[0])
    assert torch.equal(m(x, (h, h))[0], m(x, (h[None], h[None]))[0])
    with pytest.raises(ValueError, match=r"h0 must have shape \[1, 2, 5\] or \[2, 5\], got \[5, 2\]"):
        g(x, torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"c0 must have shape \[1, 2, 5\] or \[2, 5\], got \[10\]"):
        m(x, (h, torch.randn(10)))
    sg, sm = torch.jit.script(g), torch.jit.script(m)  # the modules stay scriptable
    assert torch.equal(sg(x, h)[0], g(x, h)[0]) and torch.equal(sm(x, (h, h))[0], m(x, (h, h))[0])
    with pytest.raises(Exception, match=r"h0 must have shape"):
        sg(x, torch.randn(5, 2))


class _Model(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        rnn = {"gru_cell": GRUBlockCell(3, 8), "gru": BlockGRU(3, 8), "lstm_cell": LSTMBlockCell(3, 8),
               "lstm": BlockLSTM(3, 8, use_peephole=True), "lstm_v1": BlockLSTM(3, 8, version=1, cell_clip=3.0)}
        self.rnn = rnn[kind]
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        if self.kind in ("gru_cell", "lstm_cell"):
            state = None
            for t in range(x.shape[0]):
                state = self.rnn(x[t], state)
            h = state if self.kind == "gru_cell" else state[0]
        else:
            h = self.rnn(x)[0][-1]
        return self.head(h).squeeze(-1)


@pytest.mark.parametrize("kind", ["gru_cell", "gru", "lstm_cell", "lstm", "lstm_v1"])
def test_small_model_trains(kind):
    torch.manual_seed(3)
    x = torch.randn(6, 32, 3)
    y = x[:, :, 0].sum(0) * 0.5 - x[-1, :, 1]  # a function of the whole sequence
    model = _Model(kind)
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_block_lstm_refuses_a_state_tuple_of_three_like_torch():
    x, h = torch.randn(3, 2, 4), torch.zeros(1, 2, 5)
    with pytest.raises(RuntimeError, match="lstm expects two hidden states") as ref:
        nn.LSTM(4, 5)(x, (h, h, h))
    with pytest.raises(RuntimeError, match="lstm expects two hidden states") as ours:
        BlockLSTM(4, 5)(x, (h, h, h))
    assert type(ours.value) is type(ref.value) and "got a tuple of 3" in str(ours.value)
    y, (h_n, c_n) = BlockLSTM(4, 5)(x, (h, h))  # the pair still works
    assert y.shape == (3, 2, 5)


def test_lstm_block_cell_refuses_a_state_tuple_of_three_like_torch():
    x, h = torch.randn(2, 4), torch.zeros(2, 5)
    with pytest.raises(RuntimeError, match="lstm_cell expects two hidden states"):
        nn.LSTMCell(4, 5)(x, (h, h, h))
    with pytest.raises(RuntimeError, match="lstm_cell expects two hidden states"):
        LSTMBlockCell(4, 5)(x, (h, h, h))
