"""Generator (run with the TensorFlow venv): random cases of TF's block RNN raw ops, written as .npz.

Every case file holds the op family, attributes, the inputs, TF's forward outputs, the gradient-op inputs
(TF's own forward outputs + random upstream gradients) and TF's gradient outputs. check_block_rnn.py runs the
same cases through torchops. Usage: gen_block_rnn.py OUTDIR [--cases N] [--seed S]
"""
import argparse
import os

import numpy as np
import tensorflow as tf

raw = tf.raw_ops

# Small sizes including the degenerate 1s; a few larger ones so that GEMMs and vector loops get long rows.
SIZES = [1, 1, 2, 3, 5, 8, 17, 33, 130]
CLIPS = [3.0, 0.5, 0.0, -1.0]        # 0.5 clips often; 0 and -1 must both mean "no clipping" (TF rule)
FORGET_BIASES = [1.0, 0.0, -0.7, 2.5]
SCALES = [0.3, 1.0, 4.0, 40.0]       # 4 saturates many gates; 40 drives exp() far into over/underflow
# float16 stops at 4: at 40 the peephole terms (|cs_prev * wcf| ~ 3000, half spacing 2) cancel against
# half-rounded pre-activations and neither TF nor torchops has a meaningful digit left.
SCALES_F16 = [0.3, 1.0, 4.0]


def pick_scale(rng, dtype):
    return rng.choice(SCALES_F16 if dtype == np.float16 else SCALES)


def u(rng, shape, scale, dtype):
    return ((rng.random(shape) * 2 - 1) * scale).astype(dtype)


def weight(rng, I, C, ncols, scale, dtype):
    """[I+C, ncols*C]: the x rows scaled by `scale` (saturates gates), the recurrent h rows by at most 1 so
    that multi-step sequences stay contractive (with large recurrent weights rounding differences grow
    ~100x per step and any two float32 implementations diverge chaotically)."""
    k = np.sqrt(I + C)
    return np.concatenate([u(rng, (I, ncols * C), 2.0 * scale / k, dtype),
                           u(rng, (C, ncols * C), 2.0 * min(scale, 1.0) / k, dtype)])


def tensors(rng, dtype, T, B, I, C, scale, ncols):
    d = {
        "x": u(rng, (T, B, I) if T else (B, I), scale, dtype),
        "cs_prev": u(rng, (B, C), 2.0 * scale, dtype),
        "h_prev": u(rng, (B, C), 1.0, dtype),
        "w": weight(rng, I, C, ncols, scale, dtype),
        "b": u(rng, (ncols * C,), scale, dtype),
    }
    return d


def np_out(res):
    return [r.numpy() for r in res]


def gru_case(rng):
    B, I, C = (rng.choice(SIZES) for _ in range(3))
    s = rng.choice(SCALES)
    f = np.float32
    inp = {"x": u(rng, (B, I), s, f), "h_prev": u(rng, (B, C), 1.0, f),
           "w_ru": weight(rng, I, C, 2, s, f), "w_c": weight(rng, I, C, 1, s, f),
           "b_ru": u(rng, (2 * C,), s, f), "b_c": u(rng, (C,), s, f)}
    fwd = np_out(raw.GRUBlockCell(**inp))
    r, uu, c, h = fwd
    ginp = dict(inp, r=r, u=uu, c=c, d_h=u(rng, (B, C), 1.0, f))
    grad = np_out(raw.GRUBlockCellGrad(**ginp))
    return dict(family="gru_cell", dtype="float32", attrs={}, inputs=inp, fwd=fwd, grad_inputs=ginp, grad=grad,
                scale=s)


def lstm_cell_case(rng, dtype):
    B, I, C = (rng.choice(SIZES) for _ in range(3))
    s = pick_scale(rng, dtype)
    d = tensors(rng, dtype, 0, B, I, C, s, 4)
    peep = bool(rng.integers(2))
    inp = {"x": d["x"], "cs_prev": d["cs_prev"], "h_prev": d["h_prev"], "w": d["w"],
           "wci": u(rng, (C,), s, dtype), "wcf": u(rng, (C,), s, dtype), "wco": u(rng, (C,), s, dtype), "b": d["b"]}
    attrs = {"forget_bias": float(rng.choice(FORGET_BIASES)), "cell_clip": float(rng.choice(CLIPS)),
             "use_peephole": peep}
    fwd = np_out(raw.LSTMBlockCell(**inp, **attrs))
    names = ["i", "cs", "f", "o", "ci", "co"]
    ginp = dict(inp, **dict(zip(names, fwd[:6])), cs_grad=u(rng, (B, C), 1.0, dtype), h_grad=u(rng, (B, C), 1.0, dtype))
    grad = np_out(raw.LSTMBlockCellGrad(**ginp, use_peephole=peep))
    return dict(family="lstm_cell", dtype=np.dtype(dtype).name, attrs=attrs, inputs=inp, fwd=fwd, grad_inputs=ginp,
                grad=grad, scale=s)


def block_lstm_case(rng, dtype, v2):
    T = int(rng.choice([1, 1, 2, 3, 6]))
    B, I, C = (rng.choice(SIZES) for _ in range(3))
    s = pick_scale(rng, dtype)
    L = int(rng.choice([T, T, rng.integers(0, T + 1)]))   # = T most often, else any of 0..T
    d = tensors(rng, dtype, T, B, I, C, s, 4)
    peep = bool(rng.integers(2))
    inp = {"seq_len_max": np.array(L, np.int64), "x": d["x"], "cs_prev": d["cs_prev"], "h_prev": d["h_prev"],
           "w": d["w"], "wci": u(rng, (C,), s, dtype), "wcf": u(rng, (C,), s, dtype), "wco": u(rng, (C,), s, dtype),
           "b": d["b"]}
    attrs = {"cell_clip": float(rng.choice(CLIPS)), "use_peephole": peep}
    if not v2:
        attrs["forget_bias"] = float(rng.choice(FORGET_BIASES))
    fwd = np_out((raw.BlockLSTMV2 if v2 else raw.BlockLSTM)(**inp, **attrs))
    names = ["i", "cs", "f", "o", "ci", "co", "h"]
    ginp = dict(inp, **dict(zip(names, fwd)), cs_grad=u(rng, (T, B, C), 1.0, dtype),
                h_grad=u(rng, (T, B, C), 1.0, dtype))
    grad = np_out((raw.BlockLSTMGradV2 if v2 else raw.BlockLSTMGrad)(**ginp, use_peephole=peep))
    return dict(family="block_lstm_v2" if v2 else "block_lstm", dtype=np.dtype(dtype).name, attrs=attrs, inputs=inp,
                fwd=fwd, grad_inputs=ginp, grad=grad, scale=s)


def save(path, case):
    flat = {"family": np.array(case["family"]), "dtype": np.array(case["dtype"]), "scale": np.array(case["scale"]),
            "attr_names": np.array(list(case["attrs"]), dtype=object),
            "attr_values": np.array([float(v) for v in case["attrs"].values()], np.float64),
            "in_names": np.array(list(case["inputs"]), dtype=object),
            "gin_names": np.array(list(case["grad_inputs"]), dtype=object)}
    for k, v in case["inputs"].items():
        flat["in_" + k] = v
    for k, v in case["grad_inputs"].items():
        flat["gin_" + k] = v
    for j, v in enumerate(case["fwd"]):
        flat["fwd_%d" % j] = v
    for j, v in enumerate(case["grad"]):
        flat["grad_%d" % j] = v
    np.savez(path, **flat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--cases", type=int, default=40, help="cases per op family and dtype")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    makers = [("gru_cell", lambda: gru_case(rng))]
    for dt in (np.float32, np.float16):
        makers += [("lstm_cell", lambda dt=dt: lstm_cell_case(rng, dt)),
                   ("block_lstm", lambda dt=dt: block_lstm_case(rng, dt, False)),
                   ("block_lstm_v2", lambda dt=dt: block_lstm_case(rng, dt, True))]
    n = 0
    for name, make in makers:
        for _ in range(a.cases):
            save(os.path.join(a.outdir, "case_%05d.npz" % n), make())
            n += 1
    print("wrote %d cases to %s" % (n, a.outdir))


if __name__ == "__main__":
    main()
