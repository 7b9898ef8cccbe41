"""Checker (run with the torch venv, PYTHONPATH = the worktree): replays gen_block_rnn.py's cases through
torchops and compares with TF's outputs. Prints, per op / output / dtype, the max abs error, the max rel error
and the worst error as a fraction of the tolerance; exits 1 if any exceeds it.

What is compared (deliberate differences: docs/block_rnn.md):
* forward ops: every output, except that for BlockLSTM(V2) at t >= seq_len_max only cs and h are compared
  (TF leaves i, f, o, ci, co uninitialised there; torchops writes zeros).
* gradient ops: fed TF's own forward outputs (and the same random upstream gradients) on both sides; every
  output compared. These are the raw TF kernels (CPU), so the V2 autodiff bug and the GPU
  double-peephole bug are not involved.
* tolerance: float32 rtol = atol = 1e-5; float16 TF's own test tolerance (rtol 8e-3, atol 8e-4).
  An element is within tolerance if |got - ref| <= rtol * |ref| + atol * max(1, max|ref| of that output) (the
  atol term scales with the output's magnitude because gradient sums such as w_grad cancel). "err/tol" is the
  worst |got - tf| / that bound over all cases.
* rounding: with saturating inputs the GEMMs are ill-conditioned (pre-activations are sums of large terms
  that cancel), and TF's kernels round differently from torchops' (Eigen vs MKL summation order; TF's float16
  kernels accumulate the GEMM and round every element-wise op in half, torchops computes in float32).
  TF's own answer can then be farther than the tolerance from the exact one. The checker therefore also
  computes the exact answer for the same inputs (the torchops op in float64; columns "tf vs f64" and
  "ours vs f64", in the same tolerance units) and an output passes if err/tol <= 1, or torchops' worst error
  against the exact answer is within tolerance or of the same size as TF's (at most 2x: both are rounding
  errors of the same ill-conditioned sums, in different orders). That fallback
  is for rounding only: on the well-conditioned float32 cases (input scale <= 1, column "wc err/tol")
  torchops must be within tolerance of TF itself, so a formula shared by torchops' float32 and float64 paths
  cannot hide. (Not applied to float16: TF's half kernels miss their own tolerance against the exact answer
  even there, and torchops' float16 runs the float32 element-wise code after the GEMM.)
"""
import argparse
import glob
import sys

import numpy as np
import torch

import torchops  # noqa: F401

ops = torch.ops.torchops
TOL = {"float32": (1e-5, 1e-5), "float16": (8e-3, 8e-4)}
LSTM_OUT = ["i", "cs", "f", "o", "ci", "co", "h"]
OPS = {  # family -> (forward op, TF name, output names, grad op, TF grad name, grad output names)
    "gru_cell": ("gru_block_cell", "GRUBlockCell", ["r", "u", "c", "h"], "gru_block_cell_grad", "GRUBlockCellGrad",
                 ["d_x", "d_h_prev", "d_c_bar", "d_r_bar_u_bar"]),
    "lstm_cell": ("lstm_block_cell", "LSTMBlockCell", LSTM_OUT, "lstm_block_cell_grad", "LSTMBlockCellGrad",
                  ["cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad"]),
    "block_lstm": ("block_lstm", "BlockLSTM", LSTM_OUT, "block_lstm_grad", "BlockLSTMGrad",
                   ["x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad"]),
    "block_lstm_v2": ("block_lstm_v2", "BlockLSTMV2", LSTM_OUT, "block_lstm_grad_v2", "BlockLSTMGradV2",
                      ["x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad",
                       "b_grad"]),
}


class Stats:
    def __init__(self):
        self.rows = {}

    @staticmethod
    def measure(got, ref, mask, dtype):
        rtol, atol = TOL[dtype]
        g = got.astype(np.float64)[mask]
        r = ref.astype(np.float64)[mask]
        if r.size == 0:
            return 0.0, 0.0, 0.0
        scale = max(1.0, float(np.max(np.abs(r))))
        err = np.abs(g - r)
        err[np.isnan(g) != np.isnan(r)] = np.inf
        err[np.isnan(g) & np.isnan(r)] = 0.0
        frac = float(np.max(err / (rtol * np.abs(r) + atol * scale)))
        rel = float(np.max(err / np.maximum(np.abs(r), atol * scale)))
        return float(np.max(err)), rel, frac

    def add(self, key, got, ref, mask, dtype, case, exact, well_conditioned):
        row = self.rows.setdefault(key, [0.0, 0.0, 0.0, 0, "", 0.0, 0.0, 0.0])
        row[3] += 1
        ab, rel, frac = self.measure(got, ref, mask, dtype)
        if well_conditioned:
            row[7] = max(row[7], frac)
        row[5] = max(row[5], self.measure(ref, exact, mask, dtype)[2])
        row[6] = max(row[6], self.measure(got, exact, mask, dtype)[2])
        if frac > row[2]:
            row[4] = case
        row[0] = max(row[0], ab)
        row[1] = max(row[1], rel)
        row[2] = max(row[2], frac)

    @staticmethod
    def passed(row):
        frac, theirs, ours, wc = row[2], row[5], row[6], row[7]
        return wc <= 1.0 and (frac <= 1.0 or ours <= max(2.0 * theirs, 1.0))


def load(path):
    z = np.load(path, allow_pickle=True)
    c = {k: z[k] for k in z.files}
    c["family"] = str(c["family"])
    c["dtype"] = str(c["dtype"])
    return c


def to_t(a):
    return torch.from_numpy(np.array(a, copy=True))  # (ascontiguousarray would make 0-d arrays 1-d)


COVER = {}


def cover(c, attrs, inp):
    """Counts of the edge cases drawn (printed so that a run shows what it exercised)."""
    x = inp["x"]
    B, I = x.shape[-2], x.shape[-1]
    C = inp["h_prev"].shape[1]
    flags = {"B=1": B == 1, "I=1": I == 1, "C=1": C == 1, "scale>=4 (saturating)": float(c["scale"]) >= 4}
    if x.dim() == 3:
        T, L = x.shape[0], int(inp["seq_len_max"])
        flags.update({"T=1": T == 1, "seq_len_max<T": L < T, "seq_len_max=0": L == 0})
    if "cell_clip" in attrs:
        clip = attrs["cell_clip"]
        flags.update({"peephole": attrs["use_peephole"], "cell_clip<=0 (off)": clip <= 0})
        if clip > 0:
            cs = c["fwd_1"].astype(np.float64)
            flags["clip active"] = bool(np.any(np.abs(cs) >= clip * (1 - 1e-3)))
    for k, v in flags.items():
        COVER[k] = COVER.get(k, 0) + bool(v)


def run_case(c, stats, name):
    fam, dt = c["family"], c["dtype"]
    wc = float(c["scale"]) <= 1.0 and dt == "float32"
    fop, ftf, fnames, gop, gtf, gnames = OPS[fam]
    attrs = {str(k): v for k, v in zip(c["attr_names"], c["attr_values"])}
    if "use_peephole" in attrs:
        attrs["use_peephole"] = bool(attrs["use_peephole"])
    inp = {str(k): to_t(c["in_" + str(k)]) for k in c["in_names"]}
    cover(c, attrs, inp)
    got = [t.numpy() for t in getattr(ops, fop)(**inp, **attrs)]
    exact = [t.numpy() for t in getattr(ops, fop)(**f64(inp), **attrs)]
    for j, n in enumerate(fnames):
        ref = c["fwd_%d" % j]
        mask = np.ones(ref.shape, bool)
        if fam.startswith("block_lstm") and n not in ("cs", "h"):
            mask[int(c["in_seq_len_max"]):] = False   # TF: uninitialised at t >= seq_len_max
        stats.add((ftf, n, dt), got[j], ref, mask, dt, name, exact[j], wc)
    ginp = {str(k): to_t(c["gin_" + str(k)]) for k in c["gin_names"]}
    gattrs = {"use_peephole": attrs["use_peephole"]} if "use_peephole" in attrs else {}
    got = [t.numpy() for t in getattr(ops, gop)(**ginp, **gattrs)]
    exact = [t.numpy() for t in getattr(ops, gop)(**f64(ginp), **gattrs)]
    for j, n in enumerate(gnames):
        ref = c["grad_%d" % j]
        stats.add((gtf, n, dt), got[j], ref, np.ones(ref.shape, bool), dt, name, exact[j], wc)


def f64(d):
    return {k: v.double() if v.is_floating_point() else v for k, v in d.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("indir")
    a = ap.parse_args()
    torch.set_num_threads(1)
    stats = Stats()
    files = sorted(glob.glob(a.indir + "/case_*.npz"))
    np.seterr(invalid="ignore")  # TF's uninitialised gate outputs past seq_len_max may hold NaN patterns
    for f in files:
        run_case(load(f), stats, f.rsplit("/", 1)[-1])
    bad = 0
    print("%-18s %-15s %-8s %5s %10s %10s %8s %10s %10s %11s  %s" % (
        "TF op", "output", "dtype", "cases", "max abs", "max rel", "err/tol", "wc err/tol", "tf vs f64", "ours vs f64",
        "worst case"))
    for (op, n, dt), row in sorted(stats.rows.items()):
        ab, rel, frac, cnt, worst, theirs, ours, wc = row
        ok = stats.passed(row)
        bad += not ok
        print("%-18s %-15s %-8s %5d %10.3g %10.3g %8.3f %10.3f %10.3f %11.3f  %s%s" % (
            op, n, dt, cnt, ab, rel, frac, wc, theirs, ours, worst, "" if ok else "  FAIL"))
    print("edge cases drawn: " + ", ".join("%s %d" % kv for kv in COVER.items()))
    print("%d cases, %d outputs above tolerance" % (len(files), bad))
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
