"""Checker (run with the torch venv, PYTHONPATH = the worktree): replays gen_accumulator.py's scenarios through
torchops (api "raw": torch.classes.torchops.(Sparse)ConditionalAccumulator + the torch.ops.torchops accumulator ops;
api "py": torchops.ConditionalAccumulator / SparseConditionalAccumulator) with the same threads, start delays,
arguments and take timeouts, and compares every step with TF's recorded outcome.

Per step:
* both return: same outputs; num_accumulated by value (TF: an int32 tensor, torchops: an int); take outputs by
  dtype, shape and value: exact (NaN == NaN, -0 == 0), or within the step's absolute tolerance where the generator
  set one (float16 rounds whose values are not all small integers: TF adds in half, torchops in float32).
* both raise (a timed-out take on both sides included): message-only difference (c), printed side by side.
* one raises and the other does not, or the values differ: a mismatch (a), unless the generator tagged the step
  with a difference docs/accumulator.md declares deliberate (b): bfloat16 accumulators (TF has no kernel),
  sparse rounds with unsorted or duplicate indices (torchops sums duplicates and sorts), negative sparse indices
  (torchops raises).
* TF aborted the process (CHECK failure on a gradient of another dtype): listed with torchops' outcome.
Exit status 1 if any (a) was found.
"""
import argparse
import glob
import os
import sys
import time
import warnings

import numpy as np
import torch

import torchops
from torchops.accumulator import close_all

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_accumulator import run_scenario  # noqa: E402
from scenarios import decode_outcomes, load_case, print_deliberate, print_summary, record_difference  # noqa: E402

ops = torch.ops.torchops


def message(e):
    return " ".join(str(e).split("\n")[:3]).strip()[:600]


class TorchSide:
    def __init__(self, case):
        self.case = case
        self.hs = []   # per handle: (handle, Python accumulator, creation error)
        for attrs in [{}] + list(case.get("handles", [])):
            self.hs.append(self._create(dict(case, **attrs)))

    @staticmethod
    def _create(c):
        dense = c["kind"] == "dense"
        try:
            dtype = getattr(torch, c["dtype"])
            if c["api"] == "py":
                shape = None if c["shape"] is None else [None if d == -1 else d for d in c["shape"]]
                cls = torchops.ConditionalAccumulator if dense else torchops.SparseConditionalAccumulator
                return None, cls(dtype, shape=shape, shared_name=c["shared_name"], reduction_type=c["reduction"]), None
            cls = torch.classes.torchops.ConditionalAccumulator if dense else \
                torch.classes.torchops.SparseConditionalAccumulator
            return cls(dtype, c["shape"], "", c["shared_name"], c["reduction"]), None, None
        except Exception as e:  # noqa: BLE001
            return None, None, [type(e).__name__, message(e)]

    @staticmethod
    def tensor(v, arrays):
        t = torch.from_numpy(np.array(arrays[v["$arr"]], copy=True))
        return t.view(torch.bfloat16) if v["dtype"] == "bfloat16" else t

    @staticmethod
    def out(lab, t):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return (lab, "bfloat16", t.view(torch.uint16).numpy().copy())
        a = t.numpy().copy()
        return (lab, str(a.dtype), a)

    def call(self, s, arrays):
        h, acc, err = self.hs[s["args"].get("h", 0)]
        if err is not None:
            return {"err": err}
        try:
            return {"ok": self._call(s, arrays, h, acc)}
        except Exception as e:  # noqa: BLE001
            return {"err": [type(e).__name__, message(e)]}

    def _call(self, s, arrays, h, acc):
        a, op = s["args"], s["op"]
        dense = self.case["kind"] == "dense"
        if op in ("create", "num"):
            n = acc.num_accumulated() if acc else (
                ops.accumulator_num_accumulated(h) if dense else ops.accumulator_num_accumulated.sparse(h))
            return [("num", "int", np.array(n))]
        if op == "set_step":
            if acc:
                acc.set_global_step(a["step"])
            elif dense:
                ops.accumulator_set_global_step(h, a["step"])
            else:
                ops.accumulator_set_global_step.sparse(h, a["step"])
            return []
        if op == "take":
            if acc:
                out = acc.take_grad(a["n"], timeout=a["timeout"])
            elif dense:
                out = ops.accumulator_take_gradient(h, a["n"], a["timeout"])
            else:
                out = ops.sparse_accumulator_take_gradient(h, a["n"], a["timeout"])
            if dense:
                return [self.out("average", out)]
            return [self.out("indices", out[0]), self.out("values", out[1]), self.out("shape", out[2])]
        if op == "apply":
            if dense:
                g = self.tensor(a["grad"], arrays)
                if acc:
                    acc.apply_grad(g, local_step=a["local_step"])
                else:
                    ops.accumulator_apply_gradient(h, a["local_step"], g)
                return []
            idx, vals = self.tensor(a["indices"], arrays), self.tensor(a["values"], arrays)
            shp = None if a["shape"] is None else self.tensor(a["shape"], arrays)
            if acc:
                acc.apply_grad(idx, vals, grad_shape=shp, local_step=a["local_step"])
            else:
                ops.sparse_accumulator_apply_gradient(h, a["local_step"], idx, vals,
                                                      torch.zeros(0, dtype=torch.int64) if shp is None else shp,
                                                      a.get("has_known", shp is not None))
            return []
        raise ValueError(op)


def as_float(dt, a):
    if dt == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def short(a, n=12):
    a = np.asarray(a)
    if a.size <= n:
        return np.array2string(a.reshape(-1) if a.ndim > 1 else a, separator=",").replace("\n", "")
    return "[%s ...]" % ",".join(str(x) for x in a.reshape(-1)[:n])


def compare_ok(t_out, p_out, tol):
    diffs = []
    if [o[0] for o in t_out] != [o[0] for o in p_out]:
        return ["outputs differ: TF %s vs torchops %s" % ([o[0] for o in t_out], [o[0] for o in p_out])]
    for (lab, tdt, ta), (_, pdt, pa) in zip(t_out, p_out):
        if lab == "num":
            if int(ta) != int(pa):
                diffs.append("num_accumulated: TF %d vs torchops %d" % (int(ta), int(pa)))
            continue
        if tdt != pdt or ta.shape != pa.shape:
            diffs.append("%s: TF %s%s=%s vs torchops %s%s=%s" % (lab, tdt, list(ta.shape), short(ta), pdt,
                                                                  list(pa.shape), short(pa)))
            continue
        tf_, pf = as_float(tdt, ta), as_float(pdt, pa)
        if tol > 0 and tf_.dtype.kind == "f":
            ok = np.allclose(tf_.astype(np.float64), pf.astype(np.float64), rtol=0, atol=tol, equal_nan=True)
        else:
            ok = np.array_equal(tf_, pf, equal_nan=tf_.dtype.kind == "f")
        if not ok:
            with np.errstate(invalid="ignore"):
                err = np.nanmax(np.abs(tf_.astype(np.float64) - pf.astype(np.float64)), initial=0.0)
            diffs.append("%s values differ (max abs %.3g, tol %.3g): TF %s vs torchops %s" % (
                lab, err, tol, short(ta, 16), short(pa, 16)))
    return diffs


def describe_outcome(o):
    if "ok" in o:
        return "returns " + ("; ".join("%s %s%s=%s" % (lab, dt, list(np.shape(a)), short(a)) for lab, dt, a in o["ok"])
                             or "nothing")
    if "err" in o:
        return "raises %s: %s" % (o["err"][0], o["err"][1][:400])
    if "crash" in o:
        return "aborted the process"
    return "still blocked after the join timeout (hung)"


def describe_step(s, arrays):
    def one(v):
        if isinstance(v, dict) and "$arr" in v:
            a = arrays[v["$arr"]]
            return "%s%s%s" % (v["dtype"], list(a.shape), ("=" + short(a)) if a.size <= 12 else "")
        return repr(v)
    return "%s[t%d](%s)" % (s["op"], s["thread"], ", ".join("%s=%s" % (k, one(v)) for k, v in s["args"].items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("indir")
    ap.add_argument("--verbose", action="store_true", help="print every message-only difference")
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Attempt to set current_global_step_")
    files = sorted(glob.glob(os.path.join(a.indir, "case_*.npz")))
    summary = {}   # kind -> [cases, steps, same, a, b, c]
    found = {"a": [], "b": [], "c": [], "tf_crash": []}
    t0 = time.time()
    for f in files:
        meta, arrays = load_case(f)
        tf = decode_outcomes(meta["tf"], arrays)
        steps = [s for s in meta["steps"] if s["name"] in tf]   # (an aborted TF run ends the scenario)
        meta = dict(meta, steps=steps)
        side = TorchSide(meta)
        try:
            pt = run_scenario(meta, arrays, side)
        finally:
            close_all()
        kind = "%s/%s/%s" % (meta["kind"], meta["api"], meta["sub"])
        row = summary.setdefault(kind, [0, 0, 0, 0, 0, 0])
        row[0] += 1
        head = "%s [%s %s shape=%s %s]" % (os.path.basename(f), kind, meta["dtype"], meta["shape"], meta["reduction"])
        for s in steps:
            row[1] += 1
            t, p = tf[s["name"]], pt[s["name"]]
            where = head + " " + s["name"]
            call = describe_step(s, arrays)
            if "crash" in t:
                found["tf_crash"].append((where, call, ["torchops: " + describe_outcome(p)], ""))
                continue
            if "ok" in t and "ok" in p:
                d = compare_ok(t["ok"], p["ok"], s["tol"])
                if not d:
                    row[2] += 1
                    continue
                entry = (where, call, ["TF:       " + describe_outcome(t), "torchops: " + describe_outcome(p)] + d,
                         s["deliberate"])
            elif "err" in t and "err" in p:
                row[5] += 1
                found["c"].append((where, call, t["err"], p["err"], s["op"]))
                continue
            elif "hung" in t and "hung" in p:
                row[2] += 1
                continue
            else:
                entry = (where, call, ["TF:       " + describe_outcome(t), "torchops: " + describe_outcome(p)],
                         s["deliberate"])
            record_difference(found, row, entry, s["deliberate"])

    print_summary(summary, 22, "(c) both raise")

    if found["a"]:
        print("\n== (a) MISMATCHES: torchops differs from TF (not declared deliberate) (%d)" % len(found["a"]))
        for where, call, lines, _ in found["a"]:
            print("* %s\n    %s" % (where, call))
            for ln in lines:
                print("    " + ln)
    print_deliberate(found["b"], "docs/accumulator.md")
    if found["tf_crash"]:
        print("\n== TF aborted the process (%d); torchops' outcome" % len(found["tf_crash"]))
        for where, call, lines, _ in found["tf_crash"]:
            print("* %s\n    %s\n    %s" % (where, call, lines[0]))
    groups = {}
    for where, call, te, pe, op in found["c"]:
        key = (op, te[0], te[1][:40], pe[0])
        groups.setdefault(key, []).append((where, call, te, pe))
    if groups:
        print("\n== (c) both raise (%d steps, %d groups); TF | torchops" % (len(found["c"]), len(groups)))
        for key, items in sorted(groups.items()):
            for where, call, te, pe in (items if a.verbose else items[:1]):
                print("* %s x%d: %s\n    TF:       %s: %s\n    torchops: %s: %s" % (
                    where, len(items), call, te[0], te[1][-300:], pe[0], pe[1][:300]))
    print("\n%d scenarios (%.0f s), %d mismatches (a), %d deliberate (b), %d both raise (c), %d TF aborts" % (
        len(files), time.time() - t0, len(found["a"]), len(found["b"]), len(found["c"]), len(found["tf_crash"])))
    return 1 if found["a"] or not files else 0


if __name__ == "__main__":
    sys.exit(main())
