"""Bad inputs get a clear error that names the argument, on every op, module and Python front.

Two parts: property tables (per op, every tensor argument mutated in rank, dtype, device (meta), size and
None, plus the op's integer and float attributes out of range or NaN), and one test per case of the
bad-input report these tables grew from (silently accepted inputs, a hang, misleading messages).
"""
import re
import uuid

import pytest
import torch

import torchops
from torchops import nn as tnn
from torchops.functional import cudnn_rnn_params_size

ops = torch.ops.torchops
F64 = torch.float64
ERRORS = (RuntimeError, ValueError, TypeError)
B, I, C, T = 2, 3, 4, 3


def uniq(prefix="bad_inputs"):
    return f"{prefix}/{uuid.uuid4().hex}"


def r(*shape, dtype=F64):
    return torch.rand(*shape, dtype=F64).to(dtype)


# -------------------------------------------------------------------------------------------------------
# valid calls: op name -> (argument names in schema order, builder of a valid argument dict)
# -------------------------------------------------------------------------------------------------------
def gru_cell_args():
    return dict(x=r(B, I), h_prev=r(B, C), w_ru=r(I + C, 2 * C), w_c=r(I + C, C), b_ru=r(2 * C), b_c=r(C))


def gru_cell_grad_args():
    a = gru_cell_args()
    a.update(r=r(B, C), u=r(B, C), c=r(B, C), d_h=r(B, C))
    return a


def block_gru_args():
    a = gru_cell_args()
    a["x"] = r(T, B, I)
    return dict(seq_len_max=torch.tensor(T), **a)


def block_gru_grad_args():
    a = block_gru_args()
    a.update({k: r(T, B, C) for k in ("r", "u", "c", "h", "h_grad")})
    return a


def lstm_cell_args():
    return dict(x=r(B, I), cs_prev=r(B, C), h_prev=r(B, C), w=r(I + C, 4 * C), wci=r(C), wcf=r(C), wco=r(C),
                b=r(4 * C))


def lstm_cell_grad_args():
    a = lstm_cell_args()
    a.update({k: r(B, C) for k in ("i", "cs", "f", "o", "ci", "co", "cs_grad", "h_grad")})
    return a


def block_lstm_args():
    a = lstm_cell_args()
    a["x"] = r(T, B, I)
    return dict(seq_len_max=torch.tensor(T), **a)


def block_lstm_grad_args():
    a = block_lstm_args()
    a.update({k: r(T, B, C) for k in ("i", "cs", "f", "o", "ci", "co", "h", "cs_grad", "h_grad")})
    return a


def fbn_args():
    return dict(x=r(2, 3, 3, C, dtype=torch.float32), scale=r(C, dtype=torch.float32),
                offset=r(C, dtype=torch.float32), mean=r(C, dtype=torch.float32),
                variance=r(C, dtype=torch.float32))


def fbn_grad_args():
    return dict(y_backprop=r(2, 3, 3, C, dtype=torch.float32), x=r(2, 3, 3, C, dtype=torch.float32),
                scale=r(C, dtype=torch.float32), reserve_space_1=r(C, dtype=torch.float32),
                reserve_space_2=r(C, dtype=torch.float32), reserve_space_3=torch.empty(0))


H = 5  # cudnn num_units; input_size I, one layer, lstm
LSTM_SIZE = 4 * H * I + 4 * H * H + 8 * H


def crnn_args():
    return dict(input=r(T, B, I), input_h=r(1, B, H), input_c=r(1, B, H), params=r(LSTM_SIZE))


def crnn_v3_args():
    a = crnn_args()
    a["sequence_lengths"] = torch.tensor([T, 2], dtype=torch.int32)
    return a


def crnn_bwd_args(version):
    a = crnn_v3_args() if version == 3 else crnn_args()
    if version == 3:
        out = ops.cudnn_rnn_v3(**a)
    elif version == 2:
        out = ops.cudnn_rnn_v2(**a)
    else:
        out = ops.cudnn_rnn(**a)
    a.update(output=out[0], output_h=out[1], output_c=out[2], output_backprop=torch.ones_like(out[0]),
             output_h_backprop=torch.ones_like(out[1]), output_c_backprop=torch.ones_like(out[2]),
             reserve_space=out[3])
    if version >= 2:
        a["host_reserved"] = out[4]
    return a


def canonical_args(v2=False):
    ws, bs = ops.cudnn_rnn_params_to_canonical(1, H, I, r(LSTM_SIZE), 8)
    a = dict(num_layers=1, num_units=H, input_size=I, weights=list(ws), biases=list(bs))
    if v2:
        a["num_proj"] = 0
    return a


def call(op, args):
    return getattr(ops, op)(**args)


# Every tensor argument of each op gets every mutation below; (op, arg, mutation) triples listed in
# ALLOWED are inputs the op accepts by design (each with the reason).
OPS = {
    "gru_block_cell": gru_cell_args,
    "gru_block_cell_grad": gru_cell_grad_args,
    "block_gru": block_gru_args,
    "block_gru_grad": block_gru_grad_args,
    "lstm_block_cell": lstm_cell_args,
    "lstm_block_cell_grad": lambda: dict(lstm_cell_grad_args(), use_peephole=False),
    "block_lstm": block_lstm_args,
    "block_lstm_v2": block_lstm_args,
    "block_lstm_grad": lambda: dict(block_lstm_grad_args(), use_peephole=False),
    "block_lstm_grad_v2": lambda: dict(block_lstm_grad_args(), use_peephole=False),
    # the internal backward ops of the autograd formulas (optional gradients may be None)
    "_gru_block_cell_backward": lambda: dict({k: v for k, v in gru_cell_grad_args().items() if k not in
                                              ("b_ru", "b_c", "d_h")}, d_r=None, d_u=None, d_c=None, d_h=r(B, C)),
    "_lstm_block_cell_backward": lambda: dict(lstm_cell_grad_args(), i_grad=None, f_grad=None, o_grad=None,
                                              ci_grad=None, co_grad=None, use_peephole=False),
    "_block_lstm_backward": lambda: dict(block_lstm_grad_args(), i_grad=None, f_grad=None, o_grad=None,
                                         ci_grad=None, co_grad=None, use_peephole=False, ifco=True),
    "fused_batch_norm_v3": fbn_args,
    "fused_batch_norm_grad_v3": fbn_grad_args,
    "cudnn_rnn": crnn_args,
    "cudnn_rnn_v2": crnn_args,
    "cudnn_rnn_v3": crnn_v3_args,
    "cudnn_rnn_backprop": lambda: crnn_bwd_args(1),
    "cudnn_rnn_backprop_v2": lambda: crnn_bwd_args(2),
    "cudnn_rnn_backprop_v3": lambda: crnn_bwd_args(3),
    "cudnn_rnn_params_to_canonical": lambda: dict(num_layers=1, num_units=H, input_size=I, params=r(LSTM_SIZE),
                                                  num_params=8),
    "cudnn_rnn_params_to_canonical_v2": lambda: dict(num_layers=1, num_units=H, input_size=I, params=r(LSTM_SIZE),
                                                     num_params_weights=8, num_params_biases=8),
}

ALLOWED = {
    # optional gradients of the internal backward ops: None means zero
    *{(op, g, "none") for op in ("_lstm_block_cell_backward", "_block_lstm_backward") for g in ("cs_grad", "h_grad")},
    ("_gru_block_cell_backward", "d_h", "none"),
    # reserve_space_3 is an unused placeholder of any shape and dtype
    ("fused_batch_norm_grad_v3", "reserve_space_3", "rank_up"),
    ("fused_batch_norm_grad_v3", "reserve_space_3", "rank_down"),
    ("fused_batch_norm_grad_v3", "reserve_space_3", "dtype"),
    ("fused_batch_norm_grad_v3", "reserve_space_3", "size"),
    # host_reserved is an opaque placeholder the backward does not read (as TF's): only its presence and
    # device are checked
    ("cudnn_rnn_backprop_v2", "host_reserved", "rank_up"),
    ("cudnn_rnn_backprop_v2", "host_reserved", "dtype"),
    ("cudnn_rnn_backprop_v3", "host_reserved", "rank_up"),
    ("cudnn_rnn_backprop_v3", "host_reserved", "dtype"),
    # the only tensor argument on meta is a consistent meta call (shape inference), not a device mix
    ("cudnn_rnn_params_to_canonical", "params", "meta"),
    ("cudnn_rnn_params_to_canonical_v2", "params", "meta"),
    # training with exponential_avg_factor 1 does not read the running statistics (TF: may be empty)
    ("fused_batch_norm_v3", "mean", "size"),
    ("fused_batch_norm_v3", "variance", "size"),
}

# how the message names each argument when it is not the argument's own name
ALIASES = {
    ("fused_batch_norm_v3", "mean"): r"mean",
    ("fused_batch_norm_v3", "variance"): r"variance",
    ("fused_batch_norm_grad_v3", "x"): r"\bx\b|y_backprop",
    ("fused_batch_norm_grad_v3", "y_backprop"): r"y_backprop",
}


# a wrong size of the tensor that defines a dimension is reported as a mismatch of that dimension
SIZE_ALIASES = {
    "x": r"input_size",
    "input": r"input_size",
}
GRU_OPS = ("gru_block_cell", "gru_block_cell_grad", "block_gru", "block_gru_grad")


def expected_name(op, arg, mut):
    name = ALIASES.get((op, arg), rf"\b{re.escape(arg)}(_tensor)?\b")
    if mut == "size" and arg in SIZE_ALIASES:
        name = rf"{name}|{SIZE_ALIASES[arg]}"
    if mut == "size" and op in GRU_OPS and arg == "h_prev":
        name = rf"{name}|cell_size"  # (the GRU ops take cell_size from h_prev)
    if mut == "size" and op == "_gru_block_cell_backward" and arg in ("x", "h_prev"):
        name = rf"{name}|w_ru must have shape"  # (its sizes come from x and h_prev; w_ru is checked against them)
    if mut == "meta":
        # a meta tensor beside CPU tensors runs the fake kernel: it names the device mismatch, so the
        # message may name the reference argument instead
        name = rf"{name}|device|meta"
    return name


def mutations(t):
    out = {"none": None, "meta": t.to("meta"), "rank_up": t.unsqueeze(0)}
    if t.dim() >= 1 and t.numel() > 0:
        out["rank_down"] = t.reshape(-1)[0] if t.dim() == 1 else t.select(0, 0)
        out["size"] = torch.cat([t, t.narrow(-1, 0, 1)], -1)
    out["dtype"] = t.to(torch.float32 if not t.is_floating_point() else torch.int32)
    if t.is_floating_point() and t.dtype != torch.float32:
        out["dtype"] = t.to(torch.int32)
    return out


def tensor_cases():
    for op, build in OPS.items():
        base = build()
        for arg, v in base.items():
            if not isinstance(v, torch.Tensor):
                continue
            for mut in mutations(v):
                if (op, arg, mut) not in ALLOWED:
                    yield op, arg, mut


@pytest.mark.parametrize("op, arg, mut", list(tensor_cases()))
def test_mutated_tensor_argument_is_named(op, arg, mut):
    args = OPS[op]()
    args[arg] = mutations(args[arg])[mut]
    with pytest.raises(ERRORS, match=expected_name(op, arg, mut)):
        call(op, args)


# -------------------------------------------------------------------------------------------------------
# attribute tables: (op builder, overrides, message)
# -------------------------------------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
ATTR_CASES = [
    ("lstm_block_cell", dict(forget_bias=NAN), "forget_bias"),
    ("lstm_block_cell", dict(forget_bias=INF), "forget_bias"),
    ("lstm_block_cell", dict(cell_clip=NAN), "cell_clip"),
    ("block_lstm", dict(forget_bias=NAN), "forget_bias"),
    ("block_lstm", dict(cell_clip=NAN), "cell_clip"),
    ("block_lstm_v2", dict(cell_clip=NAN), "cell_clip"),
    ("block_gru", dict(seq_len_max=torch.tensor(T + 1)), "seq_len_max"),
    ("block_gru", dict(seq_len_max=torch.tensor(-1)), "seq_len_max"),
    ("block_lstm", dict(seq_len_max=torch.tensor(2 ** 40)), "seq_len_max"),
    ("fused_batch_norm_v3", dict(epsilon=-1.0), "epsilon"),
    ("fused_batch_norm_v3", dict(epsilon=NAN), "epsilon"),
    ("fused_batch_norm_v3", dict(epsilon=INF), "epsilon"),
    ("fused_batch_norm_v3", dict(epsilon=-INF), "epsilon"),
    ("fused_batch_norm_v3", dict(exponential_avg_factor=NAN), "exponential_avg_factor"),
    ("fused_batch_norm_v3", dict(data_format="NCHWX"), "data_format"),
    ("fused_batch_norm_grad_v3", dict(epsilon=NAN), "epsilon"),
    ("fused_batch_norm_grad_v3", dict(epsilon=-1.0), "epsilon"),
    ("cudnn_rnn", dict(dropout=NAN), "dropout"),
    ("cudnn_rnn", dict(dropout=-0.5), "dropout"),
    ("cudnn_rnn", dict(rnn_mode="lstmx"), "rnn_mode"),
    ("cudnn_rnn", dict(rnn_mode="rnn_relu"), "params"),
    ("cudnn_rnn", dict(input_mode="x"), "input_mode"),
    ("cudnn_rnn", dict(direction="x"), "direction"),
    ("cudnn_rnn_v3", dict(num_proj=-1), "num_proj"),
    ("cudnn_rnn_v3", dict(num_proj=2 ** 40), "num_proj"),
    ("cudnn_rnn_v3", dict(sequence_lengths=torch.tensor([T + 1, 1], dtype=torch.int32)), "sequence_lengths"),
    ("cudnn_rnn_v3", dict(sequence_lengths=torch.tensor([-1, 1], dtype=torch.int32)), "sequence_lengths"),
    ("cudnn_rnn_v3", dict(sequence_lengths=torch.tensor([2, 1])), "sequence_lengths"),
    ("cudnn_rnn_v3", dict(sequence_lengths=torch.tensor([True, True])), "sequence_lengths"),
    ("cudnn_rnn_backprop_v3", dict(sequence_lengths=torch.tensor([T, 1], dtype=torch.int32)), "sequence_lengths"),
    ("cudnn_rnn_backprop", dict(rnn_mode="gru"), "params|input_c|output_c"),
    ("cudnn_rnn_backprop", dict(dropout=NAN), "dropout"),
    ("cudnn_rnn_params_to_canonical", dict(num_params=2 ** 62), "num_params"),
    ("cudnn_rnn_params_to_canonical", dict(num_params=-8), "num_params"),
    ("cudnn_rnn_params_to_canonical", dict(num_layers=2 ** 31), "num_layers"),
    ("cudnn_rnn_params_to_canonical", dict(num_units=-1), "num_units"),
    ("cudnn_rnn_params_to_canonical", dict(input_size=2), "params"),
    ("cudnn_rnn_params_to_canonical_v2", dict(num_params_biases=9), "num_params_biases"),
]


@pytest.mark.parametrize("op, overrides, match", ATTR_CASES)
def test_bad_attribute_is_named(op, overrides, match):
    args = OPS[op]()
    args.update(overrides)
    with pytest.raises(ERRORS, match=match):
        call(op, args)


PARAMS_SIZE_CASES = [
    (dict(num_layers=0), "num_layers"), (dict(num_layers=-1), "num_layers"), (dict(num_layers=2 ** 31), "num_layers"),
    (dict(num_units=0), "num_units"), (dict(num_units=2 ** 62), "num_units"), (dict(num_units=2 ** 31), "num_units"),
    (dict(input_size=0), "input_size"), (dict(input_size=2 ** 62), "input_size"),
    (dict(num_proj=-1), "num_proj"), (dict(num_proj=H + 1), "num_proj"),
    (dict(dropout=NAN), "dropout"), (dict(T=torch.int32), "T"), (dict(S=torch.float32), "S"),
    (dict(rnn_mode="x"), "rnn_mode"), (dict(direction="x"), "direction"), (dict(input_mode="x"), "input_mode"),
]


@pytest.mark.parametrize("overrides, match", PARAMS_SIZE_CASES)
def test_params_size_bad_argument_is_named(overrides, match):
    args = dict(num_layers=1, num_units=H, input_size=I)
    args.update(overrides)
    with pytest.raises(ERRORS, match=match):
        ops.cudnn_rnn_params_size(**args)


CANONICAL_CASES = [
    (lambda a: a["weights"].__setitem__(0, a["weights"][0].t()), r"weights\[0\]"),
    (lambda a: a["weights"].__setitem__(0, a["weights"][0][None]), r"weights\[0\]"),
    (lambda a: a["weights"].__setitem__(1, a["weights"][1].int()), r"weights\[1\]"),
    (lambda a: a["weights"].__setitem__(2, a["weights"][2].to("meta")), r"weights\[2\]|device|meta"),
    (lambda a: a["weights"].__setitem__(3, a["weights"][3][:, :-1]), r"weights\[3\]"),
    (lambda a: a["biases"].__setitem__(0, a["biases"][0][None]), r"biases\[0\]"),
    (lambda a: a["biases"].__setitem__(7, a["biases"][7][:-1]), r"biases\[7\]"),
    (lambda a: a["biases"].pop(), r"biases"),
    (lambda a: a["weights"].append(a["weights"][0]), r"weights"),
    (lambda a: a.__setitem__("num_layers", 2 ** 31), r"num_layers"),
    (lambda a: a.__setitem__("num_units", 2 ** 62), r"num_units"),
]


@pytest.mark.parametrize("v2", [False, True])
@pytest.mark.parametrize("case", range(len(CANONICAL_CASES)))
def test_canonical_to_params_bad_argument_is_named(case, v2):
    mutate, match = CANONICAL_CASES[case]
    args = canonical_args(v2)
    mutate(args)
    with pytest.raises(ERRORS, match=match):
        getattr(ops, "cudnn_rnn_canonical_to_params_v2" if v2 else "cudnn_rnn_canonical_to_params")(**args)


# -------------------------------------------------------------------------------------------------------
# batching and accumulator ops (a valid call of these blocks or changes shared state, so explicit tables)
# -------------------------------------------------------------------------------------------------------
def batch_call(**kw):
    a = dict(in_tensors=[torch.ones(1, 2)], num_batch_threads=1, max_batch_size=2, batch_timeout_micros=0,
             grad_timeout_micros=0, max_enqueued_batches=10, allowed_batch_sizes=[], shared_name=uniq())
    a.update(kw)
    return ops.batch(**a)


BATCH_CASES = [
    (dict(allowed_batch_sizes=[-1, 2]), "allowed_batch_sizes"),
    (dict(allowed_batch_sizes=[0, 2]), "allowed_batch_sizes"),
    (dict(allowed_batch_sizes=[2, 1]), "allowed_batch_sizes"),
    (dict(allowed_batch_sizes=[1, 3]), "allowed_batch_sizes"),
    (dict(num_batch_threads=0), "num_batch_threads"),
    (dict(num_batch_threads=2 ** 40), "num_batch_threads"),
    (dict(max_batch_size=0), "max_batch_size"),
    (dict(batch_timeout_micros=-1), "batch_timeout_micros"),
    (dict(grad_timeout_micros=-1), "grad_timeout_micros"),
    (dict(max_enqueued_batches=-1), "max_enqueued_batches"),
    (dict(in_tensors=[]), "in_tensors"),
    (dict(in_tensors=[torch.tensor(1.0)]), "at least one dimension"),
    (dict(in_tensors=[torch.ones(1, 2), torch.ones(2, 2)]), "0th-dimension size"),
]


@pytest.mark.parametrize("kw, match", BATCH_CASES)
def test_batch_bad_argument_is_named(kw, match):
    with pytest.raises(ERRORS, match=match):
        batch_call(**kw)


def test_batch_then_unbatch_negative_unbatch_timeout_is_named():
    with pytest.raises(ValueError, match="unbatch_timeout_micros"):
        ops._batch_then_unbatch([torch.ones(1, 2)], 1, 2, 0, 0, 10, [], "", uniq(), "", [uniq()], -2)


UNBATCH_CASES = [
    (dict(batched_tensor=torch.tensor(1.0)), "batched_tensor"),
    (dict(batch_index=torch.zeros(1, 2, dtype=torch.long)), "index tensor|batch_index"),
    (dict(batch_index=torch.zeros(1, 3, 1, dtype=torch.long)), "batch_index"),
    (dict(batch_index=torch.zeros(1, 3)), "batch_index"),
    (dict(batch_index=torch.tensor([[0, 1, 0]])), "batch_index"),
    (dict(batch_index=torch.tensor([[0, 0, 5]])), "split sizes|batched_tensor"),
    (dict(id=torch.tensor([0])), r"\bid\b"),
    (dict(id=torch.tensor(0.0)), r"\bid\b"),
    (dict(timeout_micros=-2), "timeout_micros"),
]


@pytest.mark.parametrize("kw, match", UNBATCH_CASES)
def test_unbatch_bad_argument_is_named(kw, match):
    a = dict(batched_tensor=torch.ones(2, 2), batch_index=torch.tensor([[0, 0, 2]]), id=torch.tensor(0),
             timeout_micros=1000, shared_name=uniq())
    a.update(kw)
    with pytest.raises(ERRORS, match=match):
        ops.unbatch(**a)


UNBATCH_GRAD_CASES = [
    (dict(batch_index=torch.tensor([[0, 5, -7]])), "batch_index"),
    (dict(batch_index=torch.tensor([[0, 0, 3]])), "batch_index"),
    (dict(batch_index=torch.tensor([[0, 1, 0]])), "batch_index"),
    (dict(batch_index=torch.tensor([[[0, 0, 2]]])), "batch_index"),
    (dict(batch_index=torch.tensor([[0, 0, 2.0]])), "batch_index"),
    (dict(batch_index=torch.tensor([[1, 0, 2]])), "batch_index"),
    (dict(grad=torch.ones(4, 2)), r"\bgrad\b"),
    (dict(grad=torch.ones(2)), r"\bgrad\b"),
    (dict(grad=torch.ones(2, 3)), r"\bgrad\b"),
    (dict(grad=torch.tensor(1.0)), r"\bgrad\b"),
    (dict(original_input=torch.ones(1, 2)), "batch_index|original_input"),
    (dict(id=torch.tensor([0])), r"\bid\b"),
    (dict(timeout_micros=-2), "timeout_micros"),
    (dict(grad=None), r"\bgrad\b"),
    (dict(original_input=None), "original_input"),
]


@pytest.mark.parametrize("kw, match", UNBATCH_GRAD_CASES)
def test_unbatch_grad_bad_argument_is_named(kw, match):
    a = dict(original_input=torch.ones(2, 2), batch_index=torch.tensor([[0, 0, 2]]), grad=torch.ones(2, 2),
             id=torch.tensor(0), shared_name=uniq(), timeout_micros=1000)
    a.update(kw)
    with pytest.raises(ERRORS, match=match):
        ops.unbatch_grad(**a)


def test_unbatch_grad_valid_holder_call_still_returns():
    # the table above mutates this call, which on its own succeeds (one invocation holds its batch)
    g = torch.arange(4.0).view(2, 2)
    out = ops.unbatch_grad(torch.ones(2, 2), torch.tensor([[0, 0, 2]]), g, torch.tensor(0), shared_name=uniq())
    assert torch.equal(out, g)


ACCUMULATOR_ADD_CASES = [
    (lambda: (torch.zeros(3, 2), torch.ones(2, 3)), "shape"),
    (lambda: (torch.zeros(3, 2, requires_grad=True), torch.ones(3, 2)), "requires grad"),
    (lambda: (torch.zeros(3, 2), torch.ones(3, 2, dtype=F64)), "accum must be"),
    (lambda: (torch.zeros(3, 2), torch.ones(3, 2).t()), "contiguous"),
    (lambda: (torch.zeros(3, 2), torch.ones(3, 2, device="meta")), "device|meta|CPU"),
    (lambda: (torch.zeros(3, 2), None), "gradient"),
]


@pytest.mark.parametrize("case", range(len(ACCUMULATOR_ADD_CASES)))
def test_accumulator_add_bad_operand_is_named(case):
    make, match = ACCUMULATOR_ADD_CASES[case]
    accum, grad = make()
    before = accum.detach().clone()
    with pytest.raises(ERRORS, match=match):
        ops._accumulator_add_(accum, grad, False)
    assert torch.equal(accum.detach(), before)


ACCUMULATOR_FRONT_CASES = [
    (lambda: torchops.ConditionalAccumulator(torch.float32, shape=[3.0, 2.0]), "shape"),
    (lambda: torchops.ConditionalAccumulator(torch.float32, shape="3"), "shape"),
    (lambda: torchops.ConditionalAccumulator(torch.float32, shape=[True]), "shape"),
    (lambda: torchops.ConditionalAccumulator(torch.complex64), "dtype"),
    (lambda: torchops.ConditionalAccumulator(torch.float32, reduction_type="MAX"), "reduction_type"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).take_grad(1, timeout="1"), "timeout"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).take_grad(1, timeout=-1.0), "timeout"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).take_grad("1"), "num_required"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).take_grad(0), "num_required"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).apply_grad(torch.ones(2, dtype=torch.complex64)),
     "grad"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).apply_grad([1 + 2j]), "grad"),
    (lambda: torchops.ConditionalAccumulator(torch.float32).apply_grad(torch.ones(2), local_step="0"),
     "local_step"),
    (lambda: torchops.ConditionalAccumulator(torch.float32, shape=[2]).apply_grad(torch.ones(3)), "Shape mismatch"),
    (lambda: torchops.SparseConditionalAccumulator(torch.float32).apply_grad(
        torch.tensor([0]), torch.ones(1, 2, dtype=torch.complex64)), "grad_values"),
    (lambda: torchops.SparseConditionalAccumulator(torch.float32).take_grad(1, timeout="x"), "timeout"),
]


@pytest.mark.parametrize("case", range(len(ACCUMULATOR_FRONT_CASES)))
def test_accumulator_front_bad_argument_is_named(case):
    fn, match = ACCUMULATOR_FRONT_CASES[case]
    with pytest.raises(ERRORS, match=match):
        fn()


# -------------------------------------------------------------------------------------------------------
# modules and Python fronts
# -------------------------------------------------------------------------------------------------------
MODULE_CASES = [
    (lambda: tnn.CudnnLSTM(2 ** 31, 4, 3), "num_layers"),
    (lambda: tnn.CudnnLSTM(1, 2 ** 64, 3), "num_units"),
    (lambda: tnn.CudnnGRU(1, 4, 2 ** 40), "input_size"),
    (lambda: tnn.CudnnLSTM(1, 4, 3, num_proj=5), "num_proj"),
    (lambda: tnn.CudnnLSTM(1, 4, 3, dropout=NAN), "dropout"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 3)), "input"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 1, 2)), "input"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 1, 3), (torch.ones(1, 2, 4), torch.ones(1, 1, 4))),
     "initial h state"),
    (lambda: tnn.CudnnGRU(1, 4, 3)(torch.ones(2, 1, 3), torch.ones(1, 1, 4, dtype=F64)), "input_h|dtype"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([2 ** 32 + 2, 1])),
     "sequence_lengths"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([2 ** 62, 1])),
     "sequence_lengths"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([True, True])),
     "sequence_lengths"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([-1, 1])),
     "sequence_lengths"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([1.0, 1.0])),
     "sequence_lengths"),
    (lambda: tnn.CudnnLSTM(1, 4, 3)(torch.ones(2, 2, 3), sequence_lengths=torch.tensor([1, 1, 1])),
     "sequence_lengths"),
    (lambda: tnn.BlockLSTM(3, 4)(torch.ones(3)), "input"),
    (lambda: tnn.BlockLSTM(3, 4)(torch.ones(2, 3)), "input"),
    (lambda: tnn.BlockGRU(3, 4)(torch.ones(3)), "input"),
    (lambda: tnn.LSTMBlockCell(3, 4)(torch.ones(3)), "input"),
    (lambda: tnn.GRUBlockCell(3, 4)(torch.ones(1, 2, 3)), "input"),
    (lambda: tnn.BlockLSTM(3, 2 ** 64), "cell_size"),
    (lambda: tnn.LSTMBlockCell(3, 2 ** 40), "cell_size"),
    (lambda: tnn.GRUBlockCell(-1, 4), "input_size"),
    (lambda: tnn.BlockGRU(3, 0), "cell_size"),
    (lambda: tnn.BlockLSTM(3, 4.0), "cell_size"),
    # (negative eps: torch.nn.BatchNorm2d's own check and message)
    (lambda: tnn.BatchNorm2d(4, eps=-1.0)(torch.ones(2, 4, 2, 2)), "eps must be positive during training"),
    (lambda: tnn.BatchNorm2d(4, eps=NAN)(torch.ones(2, 4, 2, 2)), "epsilon"),
    (lambda: tnn.BatchNorm2d(4, eps=INF).eval()(torch.ones(2, 4, 2, 2)), "epsilon"),
    (lambda: tnn.Batched(torch.nn.Identity(), allowed_batch_sizes=[-1, 32]), "allowed_batch_sizes"),
    (lambda: tnn.Batched(torch.nn.Identity(), allowed_batch_sizes=[0, 32]), "allowed_batch_sizes"),
    (lambda: tnn.Batched(torch.nn.Identity(), unbatch_timeout_micros=-2), "unbatch_timeout_micros"),
    (lambda: tnn.Batched(torch.nn.Identity(), num_batch_threads=0), "num_batch_threads"),
    (lambda: torchops.batching.batch_function(1, 4, 0, allowed_batch_sizes=[0, 4]), "allowed_batch_sizes"),
    (lambda: torchops.batching.batch_function(1, 4, 0, unbatch_timeout_micros=-2), "unbatch_timeout_micros"),
    (lambda: torchops.batching.batch_function(1, "4", 0), "max_batch_size"),
]


@pytest.mark.parametrize("case", range(len(MODULE_CASES)))
def test_module_and_front_bad_argument_is_named(case):
    fn, match = MODULE_CASES[case]
    with pytest.raises(ERRORS, match=match):
        fn()


# -------------------------------------------------------------------------------------------------------
# one test per case of the report
# -------------------------------------------------------------------------------------------------------
def test_case01_params_size_overflow_is_an_error():
    for S in (torch.int32, torch.int64):
        with pytest.raises(ValueError, match="num_units"):
            ops.cudnn_rnn_params_size(1, 2 ** 62, 3, torch.float32, S)
        with pytest.raises(ValueError, match="input_size"):
            ops.cudnn_rnn_params_size(1, 3, 2 ** 62, torch.float32, S)
    # in range but the size overflows int64: checked arithmetic
    with pytest.raises(ValueError, match="overflows int64"):
        ops.cudnn_rnn_params_size(2 ** 31 - 1, 2 ** 31 - 1, 2 ** 31 - 1, torch.float32, torch.int64,
                                  direction="bidirectional")
    # int32 S with a size beyond int32
    with pytest.raises(RuntimeError, match="does not fit in int32"):
        ops.cudnn_rnn_params_size(1, 2 ** 20, 2 ** 20, torch.float32, torch.int32)
    # the closed form agrees with the layout of the converters
    for mode in ("lstm", "gru", "rnn_tanh"):
        for direction in ("unidirectional", "bidirectional"):
            for im in ("linear_input", "skip_input"):
                n = int(ops.cudnn_rnn_params_size(3, 4, 4, torch.float32, torch.int64, mode, im, direction))
                ws, bs = ops.cudnn_rnn_params_to_canonical(3, 4, 4, torch.zeros(n), (8 if mode == "lstm" else 6 if
                                                           mode == "gru" else 2) * 3 * (2 if direction[0] == "b"
                                                                                       else 1), mode, im, direction)
                assert sum(t.numel() for t in ws + bs) == n
                assert cudnn_params_size_py(mode, 3, 4, 4, direction, im) == n


def cudnn_params_size_py(*a):
    from torchops.nn.cudnn_rnn import cudnn_params_size
    return cudnn_params_size(*a)


def test_case02_int64_and_bool_sequence_lengths_are_range_checked():
    torch.manual_seed(0)
    m = tnn.CudnnLSTM(1, 4, 3)
    x = torch.randn(2, 2, 3)
    with pytest.raises(ValueError, match=r"sequence_lengths\[0\] = 4294967298 must be in \[0, max_seq_length = 2\]"):
        m(x, sequence_lengths=torch.tensor([2 ** 32 + 2, 1]))
    with pytest.raises(ValueError, match=r"sequence_lengths\[0\] = 4611686018427387904"):
        m(x, sequence_lengths=torch.tensor([2 ** 62, 1]))
    with pytest.raises(ValueError, match="sequence_lengths must hold integers, got dtype torch.bool"):
        m(x, sequence_lengths=torch.tensor([True, True]))
    # in-range int64 lengths still work, and equal int32 ones
    a = m(x, sequence_lengths=torch.tensor([2, 1]))[0]
    b = m(x, sequence_lengths=torch.tensor([2, 1], dtype=torch.int32))[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("arg", ["input_c", "input_h", "params", "sequence_lengths", "input"])
def test_case03_meta_tensor_beside_cpu_tensors_is_an_error(arg):
    a = crnn_v3_args()
    a[arg] = a[arg].to("meta")
    with pytest.raises(RuntimeError, match="device|meta"):
        ops.cudnn_rnn_v3(**a)


@pytest.mark.parametrize("arg", ["reserve_space", "host_reserved", "output", "output_c_backprop"])
def test_case03_backprop_takes_no_meta_tensor(arg):
    a = crnn_bwd_args(3)
    a[arg] = a[arg].to("meta")
    with pytest.raises(RuntimeError, match=rf"{arg}|device|meta"):
        ops.cudnn_rnn_backprop_v3(**a)


def test_case03_all_meta_still_traces():
    a = {k: v.to("meta") for k, v in crnn_v3_args().items()}
    out = ops.cudnn_rnn_v3(**a)
    assert out[0].shape == (T, B, H) and out[0].device.type == "meta"


def test_case04_backprop_with_other_sequence_lengths_is_an_error():
    a = crnn_bwd_args(3)
    ref = ops.cudnn_rnn_backprop_v3(**a)
    for other in ([2, 2], [T, T], [T, 1], [1, 2]):
        b = dict(a, sequence_lengths=torch.tensor(other, dtype=torch.int32))
        with pytest.raises(RuntimeError, match="sequence_lengths differ"):
            ops.cudnn_rnn_backprop_v3(**b)
    again = ops.cudnn_rnn_backprop_v3(**a)
    assert all(torch.equal(x, y) for x, y in zip(ref, again))
    # V1/V2 backward of a V3 forward with masking: the lengths are not all T
    c = crnn_bwd_args(3)
    with pytest.raises(RuntimeError, match="sequence_lengths differ"):
        ops.cudnn_rnn_backprop(**{k: v for k, v in c.items() if k not in ("sequence_lengths", "host_reserved")})


def test_case05_params_of_another_configuration_is_an_error():
    a = crnn_args()
    with pytest.raises(RuntimeError, match=f"params has {LSTM_SIZE} elements, but must have exactly"):
        ops.cudnn_rnn(**dict(a, input=r(T, B, 2)))
    with pytest.raises(RuntimeError, match="params has .* but must have exactly"):
        ops.cudnn_rnn(**dict(a, rnn_mode="rnn_relu"))
    longer = torch.cat([a["params"], torch.zeros(3)])
    with pytest.raises(RuntimeError, match=f"params has {LSTM_SIZE + 3} elements, but must have exactly {LSTM_SIZE}"):
        ops.cudnn_rnn(**dict(a, params=longer))
    with pytest.raises(RuntimeError, match="but must have exactly"):
        ops.cudnn_rnn_params_to_canonical(1, H, I, longer, 8)


def test_case06_canonical_to_params_checks_every_shape():
    a = canonical_args()
    w0 = a["weights"][0]
    assert w0.shape == (H, I)
    for bad in (w0.t(), w0[None], w0.reshape(I, H)):
        ws = [bad] + a["weights"][1:]
        with pytest.raises(RuntimeError, match=r"Params shape mismatch: weights\[0\] must have shape \[5, 3\]"):
            ops.cudnn_rnn_canonical_to_params(1, H, I, ws, a["biases"])
        with pytest.raises(RuntimeError, match=r"weights\[0\]"):
            ops.cudnn_rnn_canonical_to_params_v2(1, H, I, ws, a["biases"])
    # the canonical shape and its row-major flattening are accepted, and agree
    p = ops.cudnn_rnn_canonical_to_params(1, H, I, a["weights"], a["biases"])
    q = ops.cudnn_rnn_canonical_to_params(1, H, I, [w.reshape(-1) for w in a["weights"]], a["biases"])
    assert torch.equal(p, q)


def test_case07_unbatch_grad_validates_index_and_rows():
    base = dict(original_input=torch.ones(2, 2), batch_index=torch.tensor([[0, 0, 2]]), grad=torch.ones(2, 2),
                id=torch.tensor(0), timeout_micros=1000)
    for kw, match in ((dict(batch_index=torch.tensor([[0, 5, -7]])), r"batch_index row 0 = \[0, 5, -7\]"),
                      (dict(batch_index=torch.tensor([[[0, 0, 2]]])), r"batch_index must have shape \[K, 3\]"),
                      (dict(grad=torch.ones(4, 2)), r"grad of id 0 must have shape \[2, 2\]"),
                      (dict(grad=torch.ones(2)), r"grad of id 0 must have shape \[2, 2\]"),
                      (dict(original_input=torch.ones(1, 2)), "original_input.size.0. = 1")):
        with pytest.raises(ValueError, match=match):
            ops.unbatch_grad(**dict(base, shared_name=uniq(), **kw))


def test_case08_batch_attribute_ranges():
    for allowed in ([-1, 4], [0, 4]):
        with pytest.raises(ValueError, match="allowed_batch_sizes entries must be positive"):
            batch_call(max_batch_size=4, allowed_batch_sizes=allowed)
    with pytest.raises(ValueError, match="unbatch_timeout_micros must be non-negative; was -2"):
        ops._batch_then_unbatch([torch.ones(1, 2)], 1, 2, 0, 0, 10, [], "", uniq(), "", [uniq()], -2)


def test_case09_accumulator_checks():
    with pytest.raises(ValueError, match=r"accum has shape \[3, 2\] but gradient has shape \[2, 3\]"):
        ops._accumulator_add_(torch.zeros(3, 2), torch.ones(2, 3), False)
    leaf = torch.zeros(3, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="accum requires grad"):
        ops._accumulator_add_(leaf, torch.ones(3, 2), False)
    assert not leaf.detach().any()
    with pytest.raises(TypeError, match="timeout must be None or a number of seconds, got '1'"):
        torchops.ConditionalAccumulator(torch.float32).take_grad(1, timeout="1")
    with pytest.raises(TypeError, match=r"shape entries must be ints or None, got 3.0"):
        torchops.ConditionalAccumulator(torch.float32, shape=[3.0, 2.0])
    acc = torchops.ConditionalAccumulator(torch.float32)
    with pytest.raises(TypeError, match="grad must be a real tensor, got dtype torch.complex64"):
        acc.apply_grad(torch.tensor([1 + 2j, 3 + 0j], dtype=torch.complex64))
    assert acc.num_accumulated() == 0
    acc.apply_grad(torch.tensor([1.0, 3.0]))  # a real gradient is still taken
    assert acc.num_accumulated() == 1


@pytest.mark.parametrize("eps", [-1.0, NAN, INF, -INF])
def test_case10_batch_norm_epsilon(eps):
    a = fbn_args()
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        ops.fused_batch_norm_v3(**a, epsilon=eps)
    g = fbn_grad_args()
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        ops.fused_batch_norm_grad_v3(**g, epsilon=eps)
    # the module refuses a negative eps first, with torch.nn.BatchNorm2d's message
    module_msg = "eps must be positive during training" if eps < 0 else "epsilon must be a finite number >= 0"
    with pytest.raises(ValueError, match=module_msg):
        tnn.BatchNorm2d(C, eps=eps)(torch.ones(2, C, 2, 2))
    with pytest.raises(ValueError, match="epsilon"):
        ops.fused_batch_norm_v3(**{k: v.to("meta") for k, v in a.items()}, epsilon=eps)
    # epsilon 0 is a valid choice (TF's CPU kernel takes it)
    y = ops.fused_batch_norm_v3(**a, epsilon=0.0)[0]
    assert torch.isfinite(y).all()


def test_case11_none_for_a_tensor_argument_is_an_error():
    g = block_lstm_grad_args()
    for name in ("cs_grad", "h_grad"):
        with pytest.raises(ValueError, match=f"{name} must be a tensor, got None"):
            ops.block_lstm_grad(**dict(g, **{name: None}), use_peephole=False)
    a = crnn_bwd_args(2)
    with pytest.raises(ValueError, match="host_reserved must be a tensor, got None"):
        ops.cudnn_rnn_backprop_v2(**dict(a, host_reserved=None))
    x, h0, p = r(T, B, I), r(1, B, H), r(3 * H * I + 3 * H * H + 6 * H)
    for c0, match in ((torch.tensor(True), "input_c must have the same dtype as input"),
                      (torch.zeros((), dtype=torch.int64), "input_c must have the same dtype as input"),
                      (torch.zeros((), device="meta"), "input_c|device|meta"),
                      (None, "input_c must be a tensor, got None")):
        with pytest.raises(ERRORS, match=match):
            ops.cudnn_rnn(x, h0, c0, p, "gru")
    # GRU ignores input_c's shape: any float tensor of input's dtype and device
    for c0 in (torch.zeros((), dtype=F64), r(7, 3)):
        assert ops.cudnn_rnn(x, h0, c0, p, "gru")[2].shape == ()


def test_case12_huge_sizes_fail_fast():
    with pytest.raises(ValueError, match="num_layers must be <= 2147483647"):
        tnn.CudnnLSTM(2 ** 31, 4, 3)
    with pytest.raises(ValueError, match="num_units must be <= 2147483647"):
        tnn.CudnnLSTM(1, 2 ** 64, 3)
    with pytest.raises(ValueError, match=r"cell_size must be in \[1, 2\*\*31 - 1\]"):
        tnn.BlockLSTM(3, 2 ** 64)
    with pytest.raises(ValueError, match=r"cell_size must be in"):
        tnn.GRUBlockCell(3, 2 ** 63)
    with pytest.raises(ValueError, match="num_layers must be <= 2147483647"):
        ops.cudnn_rnn_params_to_canonical(2 ** 31, 4, 3, torch.zeros(1), 8 * 2 ** 31)
    with pytest.raises(ValueError, match="num_units"):
        ops.cudnn_rnn_canonical_to_params(1, 2 ** 40, 3, [torch.zeros(1)] * 8, [torch.zeros(1)] * 8)
    with pytest.raises(RuntimeError, match="params has 1 elements, but must have exactly"):
        ops.cudnn_rnn_params_to_canonical(2 ** 20, 2 ** 10, 2 ** 10, torch.zeros(1), 8 * 2 ** 20)
    # the module's params size is computed in closed form (no per-layer list before the allocation)
    assert tnn.CudnnLSTM(3, 4, 3).params.numel() == cudnn_params_size_py("lstm", 3, 4, 3)


def test_case13_messages_name_the_argument():
    a = lstm_cell_args()
    with pytest.raises(RuntimeError, match=r"cs_prev.dims\(1\) != cell_size \(w.dim_size\(1\) / 4\): 5 vs. 4"):
        ops.lstm_block_cell(**dict(a, cs_prev=r(B, C + 1)))
    with pytest.raises(RuntimeError, match=r"h_prev.dims\(1\) != cell_size: 5 vs. 4"):
        ops.lstm_block_cell(**dict(a, h_prev=r(B, C + 1)))
    s = block_lstm_args()
    with pytest.raises(RuntimeError, match=r"cs_prev.dims\(1\) != cell_size"):
        ops.block_lstm(**dict(s, cs_prev=r(B, C + 1)))
    c = crnn_args()
    with pytest.raises(RuntimeError, match=r"RNN input must be a 3-D vector, got rank 4"):
        ops.cudnn_rnn(**dict(c, input=r(T, B, I, 1)))
    bw = crnn_bwd_args(1)
    with pytest.raises(RuntimeError, match=r"Invalid output_c shape: expected \[1, 2, 5\], got \[0, 2, 5\]"):
        ops.cudnn_rnn_backprop(**dict(bw, output_c=r(0, B, H)))
    with pytest.raises(ValueError, match="h_prev must be a tensor, got None"):
        ops.block_lstm_v2(**dict(s, h_prev=None))
    with pytest.raises(ValueError, match=r"input must be 3-D \(\[T, B, input_size\]\), got shape \[3\]"):
        tnn.BlockLSTM(3, 4)(torch.ones(3))
