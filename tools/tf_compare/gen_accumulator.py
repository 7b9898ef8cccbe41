"""Generator (run with the TensorFlow venv): random, deterministic scenarios of TF's ConditionalAccumulator /
SparseConditionalAccumulator ops (graph mode, one tf.Graph + Session per scenario), written as .npz.
Usage: gen_accumulator.py OUTDIR [--cases N] [--seed S]

A scenario creates one accumulator (dense or sparse; dtype, declared partial shape, MEAN / SUM) and runs a list of
steps against it: create, apply (fresh / stale / future local steps, good and bad gradients), take (num_required
0 / negative / at most what is there / more than is there with a short timeout), num_accumulated and
set_global_step (also backwards). Two APIs: "raw" (TF's raw ops: the ref-typed ConditionalAccumulator /
SparseConditionalAccumulator and their Accumulator* ops; torchops: the torch.ops.torchops ops on the custom-class
handle) and "py" (tf.compat.v1.ConditionalAccumulator / SparseConditionalAccumulator, which build the Resource*
ops for dense; torchops.ConditionalAccumulator / SparseConditionalAccumulator).

Sequential scenarios are drawn step by step against the live TF accumulator (a hidden num_accumulated after each
step), so takes ask for what is really there or, on purpose, for more (then both sides time out: TF through
RunOptions.timeout_in_ms, which cancels the take; torchops through its timeout). "block" scenarios run takes on
other threads that complete only when the main thread's later applies arrive (head-of-line blocking with two
takers). Every TF take has a timeout, so nothing blocks forever.

Per step the file records TF's outcome: outputs, or the error (type + message). Steps on which torchops differs by
a choice docs/accumulator.md declares deliberate carry that note ("deliberate"); float16 takes whose values are not
all small integers carry an absolute tolerance ("tol": TF adds in half, torchops in float32).

This module has no TensorFlow import at module level: check_accumulator.py imports its scenario runner.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np

from scenarios import encode_outcomes

FLOATS = ["float16", "float32", "float64"]
OTHER_DTYPES = ["bfloat16", "int32", "int64", "complex64", "complex128", "uint8", "int8", "int16", "bool"]
TAKE_TIMEOUT = 10.0     # seconds: a take that must complete
BLOCK_TIMEOUT = 0.08    # seconds: a take that must time out (not enough gradients)
I64_MAX = 2 ** 63 - 1
D_BF16 = "dtypes: + bfloat16 (TF has no bfloat16 kernel)"
D_NEG = "sparse negative indices: error (TF: unchecked)"
D_UNSORTED = "sparse unsorted / duplicate indices: any order, duplicates summed and counted once"
D_F16 = "half accumulates in float32 (TF: in half)"
D_PYCONV = ("SparseConditionalAccumulator.apply_grad converts values to the accumulator dtype (TF's wrapper does "
            "not: Signature mismatch, or an abort)")
D_SHARED = "shared accumulator with another shape / reduction type: error at creation (TF: not checked)"


# ------------------------------------------------------------------------------------------------------------
# scenario format

class Case:
    def __init__(self, idx, kind, api, sub, dtype, shape, reduction):
        self.idx, self.kind, self.api, self.sub = idx, kind, api, sub
        self.dtype, self.shape, self.reduction = dtype, shape, reduction
        self.steps, self.arrays, self.delays = [], {}, {}
        self.handles = []          # further handles on the same shared_name: [{"shape", "reduction"}]
        self.cur_h = 0             # the handle the next step uses
        self.deliberate_all = ""

    def arr(self, a, dtype):
        key = "arr%d" % len(self.arrays)
        if dtype == "bfloat16":   # stored as its bit pattern (integer-valued float32 are exact in bfloat16)
            a = (np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32) >> 16).astype(np.uint16)
        self.arrays[key] = np.asarray(a)
        return {"$arr": key, "dtype": dtype}

    def step(self, op, thread=0, deliberate="", tol=0.0, **args):
        if self.handles and "h" not in args:
            args["h"] = self.cur_h
        s = {"name": "s%02d_%s" % (len(self.steps), op), "op": op, "thread": thread, "args": args,
             "deliberate": deliberate or self.deliberate_all, "tol": float(tol)}
        self.steps.append(s)
        return s

    def to_json(self):
        return {"idx": self.idx, "kind": self.kind, "api": self.api, "sub": self.sub, "dtype": self.dtype,
                "shape": self.shape, "reduction": self.reduction, "steps": self.steps, "delays": self.delays,
                "handles": self.handles, "shared_name": "tfcmp_acc_%05d" % self.idx}


def save_case(path, case, outcomes):
    out = dict(case.arrays)
    meta = case.to_json()
    meta["tf"] = encode_outcomes(outcomes, out)
    out["meta"] = np.array(json.dumps(meta))
    np.savez(path, **out)


def run_scenario(case, arrays, side):
    """Replays a scenario's steps on `side` (TFSide or the checker's TorchSide): the create step first, then every
    thread (thread t starts delays[t] seconds after the create step) runs its steps in order. Returns
    {step name: {"ok": [(label, dtype, array)]} | {"err": [type, message]} | {"hung": True}}."""
    steps = case["steps"]
    results, lock = {}, threading.Lock()
    results[steps[0]["name"]] = side.call(steps[0], arrays)
    threads = sorted({s["thread"] for s in steps[1:]})

    def work(t):
        time.sleep(float(case["delays"].get(str(t), 0.0)))
        for s in (s for s in steps[1:] if s["thread"] == t):
            o = side.call(s, arrays)
            with lock:
                results[s["name"]] = o

    ths = [threading.Thread(target=work, args=(t,), daemon=True) for t in threads]
    for th in ths:
        th.start()
    for th in ths:
        th.join(TAKE_TIMEOUT * 3)
    with lock:
        for s in steps:
            results.setdefault(s["name"], {"hung": True})
        return dict(results)


# ------------------------------------------------------------------------------------------------------------
# TensorFlow side

class TFSide:
    """One accumulator in its own tf.Graph + Session; each step builds its op(s) on first use and runs them."""

    def __init__(self, case):
        import tensorflow as tf
        self.tf, self.tf1 = tf, tf.compat.v1
        self.case = case
        self.graph = tf.Graph()
        self.hs, self.accs, self.errs = [], [], []   # per handle (0: the scenario's accumulator)
        self.built = threading.Lock()
        with self.graph.as_default():
            for attrs in [{}] + list(case.get("handles", [])):
                try:
                    h, acc = self._create(dict(case, **attrs))
                    err = None
                except Exception as e:  # noqa: BLE001
                    h, acc, err = None, None, [type(e).__name__, message(e)]
                self.hs.append(h)
                self.accs.append(acc)
                self.errs.append(err)
        self.create_err = self.errs[0]
        self.acc, self.handle = self.accs[0], self.hs[0]
        self.sess = self.tf1.Session(graph=self.graph, config=self.tf1.ConfigProto(
            inter_op_parallelism_threads=4, intra_op_parallelism_threads=1))
        self.hidden_num = None

    def _dt(self, name):
        return getattr(self.tf, name)

    def _create(self, c):
        tf = self.tf
        shape = None if c["shape"] is None else [None if d == -1 else d for d in c["shape"]]
        kw = dict(dtype=self._dt(c["dtype"]), shape=tf.TensorShape(shape), shared_name=c["shared_name"],
                  reduction_type=c["reduction"])
        if c["api"] == "py":
            cls = tf.compat.v1.ConditionalAccumulator if c["kind"] == "dense" else \
                tf.compat.v1.SparseConditionalAccumulator
            acc = cls(**kw)
            return acc.accumulator_ref, acc
        op = tf.raw_ops.ConditionalAccumulator if c["kind"] == "dense" else tf.raw_ops.SparseConditionalAccumulator
        return op(**kw), None

    def const(self, v, arrays):
        tf = self.tf
        a = arrays[v["$arr"]]
        if v["dtype"] == "bfloat16":
            return tf.bitcast(tf.constant(a, tf.uint16), tf.bfloat16)
        return tf.constant(a, dtype=self._dt(v["dtype"]))

    def py_value(self, v, arrays):
        a = arrays[v["$arr"]]
        if v["dtype"] == "bfloat16":
            return self.tf.bitcast(self.tf.constant(a, self.tf.uint16), self.tf.bfloat16)
        return a

    def build(self, s, arrays, h, acc):
        tf, raw, c = self.tf, self.tf.raw_ops, self.case
        self_acc = acc
        a, op = s["args"], s["op"]
        dense = c["kind"] == "dense"
        py = c["api"] == "py"
        if op in ("create", "num"):
            if py:
                return [("num", self_acc.num_accumulated())]
            return [("num", raw.AccumulatorNumAccumulated(handle=h))]
        if op == "set_step":
            if py:
                return [(None, self_acc.set_global_step(a["step"]))]
            return [(None, raw.AccumulatorSetGlobalStep(handle=h, new_global_step=tf.constant(a["step"], tf.int64)))]
        if op == "take":
            if py:
                out = self_acc.take_grad(a["n"])
            elif dense:
                out = raw.AccumulatorTakeGradient(handle=h, num_required=tf.constant(a["n"], tf.int32),
                                                  dtype=self._dt(c["dtype"]))
            else:
                out = raw.SparseAccumulatorTakeGradient(handle=h, num_required=tf.constant(a["n"], tf.int32),
                                                        dtype=self._dt(c["dtype"]))
            if dense:
                return [("average", out)]
            return [("indices", out[0]), ("values", out[1]), ("shape", out[2])]
        if op == "apply":
            if dense:
                if py:
                    return [(None, self_acc.apply_grad(self.py_value(a["grad"], arrays), local_step=a["local_step"]))]
                return [(None, raw.AccumulatorApplyGradient(handle=h, local_step=tf.constant(a["local_step"], tf.int64),
                                                            gradient=self.const(a["grad"], arrays)))]
            if py:
                shp = None if a["shape"] is None else self.py_value(a["shape"], arrays)
                return [(None, self_acc.apply_grad(self.py_value(a["indices"], arrays),
                                                   self.py_value(a["values"], arrays), grad_shape=shp,
                                                   local_step=a["local_step"]))]
            shp = tf.constant(np.zeros(0, np.int64)) if a["shape"] is None else self.const(a["shape"], arrays)
            return [(None, raw.SparseAccumulatorApplyGradient(
                handle=h, local_step=tf.constant(a["local_step"], tf.int64),
                gradient_indices=self.const(a["indices"], arrays), gradient_values=self.const(a["values"], arrays),
                gradient_shape=shp, has_known_shape=a.get("has_known", a["shape"] is not None)))]
        raise ValueError(op)

    def call(self, s, arrays):
        k = s["args"].get("h", 0)
        err = self.errs[k]
        if err is not None:
            return {"err": err}
        try:
            with self.built, self.graph.as_default():
                fetches = self.build(s, arrays, self.hs[k], self.accs[k])
        except Exception as e:  # noqa: BLE001  (graph-construction errors: the step raises)
            return {"err": [type(e).__name__, message(e)]}
        timeout = s["args"].get("timeout", TAKE_TIMEOUT) if s["op"] == "take" else TAKE_TIMEOUT
        opts = self.tf1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
        try:
            vals = self.sess.run([f for _, f in fetches], options=opts)
        except Exception as e:  # noqa: BLE001
            return {"err": [type(e).__name__, message(e)]}
        out = []
        for (lab, _), v in zip(fetches, vals):
            if lab is None:
                continue
            v = np.asarray(v)
            if str(v.dtype) == "bfloat16":
                out.append((lab, "bfloat16", v.view(np.uint16).copy()))
            else:
                out.append((lab, str(v.dtype), v))
        return {"ok": out}

    def num_accumulated(self):
        """Hidden query (not a recorded step) for drawing the next step; None if the accumulator does not work."""
        if self.create_err is not None:
            return None
        try:
            with self.built, self.graph.as_default():
                if self.hidden_num is None:
                    self.hidden_num = self.acc.num_accumulated() if self.case["api"] == "py" else \
                        self.tf.raw_ops.AccumulatorNumAccumulated(handle=self.handle)
            return int(self.sess.run(self.hidden_num))
        except Exception:  # noqa: BLE001
            return None

    def close(self):
        self.sess.close()


def message(e):
    """The error's own text (TF's "Graph execution error ... Node: ..." frame and traceback lines dropped)."""
    m = getattr(e, "message", None) or str(e)
    skip = ("Graph execution error", "Detected at node", "Node: ", "[[", "Registered ")
    lines = [ln.strip() for ln in m.split("\n")
             if ln.strip() and not ln.startswith((" ", "\t")) and not ln.strip().startswith(skip)]
    return " ".join(lines[:3])[:600]


# ------------------------------------------------------------------------------------------------------------
# drawing

def rand_values(rng, shape, dtype, ints):
    """Small integers (exact sums and means in every dtype), or floats with specials (float32 / float64) or
    small non-integers (float16)."""
    shape = tuple(int(d) for d in shape)
    if ints or dtype in ("bfloat16",):
        return rng.integers(-8, 9, shape).astype(np.float64)
    if dtype == "float16":
        if rng.random() < 0.1:   # large: sums overflow half (TF adds in half)
            return rng.integers(-8, 9, shape).astype(np.float64) * 8000
        return np.round(rng.uniform(-4, 4, shape), 3)
    n = int(np.prod(shape)) if shape else 1
    v = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 1e30, 1e-30])
    mask = rng.random(n) < 0.05
    v[mask] = specials[rng.integers(0, len(specials), int(mask.sum()))]
    return v.reshape(shape)


def np_dtype(dt):
    return {"bfloat16": np.float32}.get(dt, dt)


class Drawer:
    """Draws one scenario; sequential scenarios against the live TF accumulator."""

    def __init__(self, case, rng, tf_side, save):
        self.c, self.rng, self.tf, self.save = case, rng, tf_side, save
        self.outcomes = {}
        self.gs = 0                     # TF's global step (set_global_step sets it, a completed take adds 1)
        self.round = []                 # accepted gradients since the last take (dense: arrays; sparse: (idx, vals))
        self.round_note = ""            # a deliberate difference that affects this round's take
        self.rshape = None              # dense: this round's concrete shape; sparse: the values' row dims
        self.ints = rng.random() < 0.6  # integer-valued gradients (exact comparison)
        self.deliberate_dtype = D_BF16 if case.dtype == "bfloat16" else ""
        case.deliberate_all = self.deliberate_dtype

    # -- running
    def run(self, s):
        if s.get("may_abort"):   # TF may abort the process on this step: the case is saved up to it first
            self.outcomes[s["name"]] = {"crash": True}
            self.save(self.outcomes)
        o = self.tf.call(s, self.c.arrays)
        self.outcomes[s["name"]] = o
        return o

    def count(self):
        n = self.tf.num_accumulated()
        return 0 if n is None else n

    # -- shapes
    def concrete(self):
        """A concrete shape compatible with the declared one (unknown dims / rank drawn)."""
        r = self.rng
        if self.c.shape is None:
            return [int(r.integers(0, 4)) for _ in range(int(r.integers(0, 4)))]
        return [int(r.integers(1, 4)) if d < 0 else d for d in self.c.shape]

    def other_shape(self, shape):
        r = self.rng
        s = list(shape)
        k = r.random()
        if k < 0.3 or not s:
            s = s + [int(r.integers(1, 3))]
        elif k < 0.5:
            s = s[:-1]
        else:
            i = int(r.integers(0, len(s)))
            s[i] = s[i] + int(r.integers(1, 3))
        return s

    # -- dense
    def dense_apply(self, bad_ok=True, ls=None, run=True):
        r, c = self.rng, self.c
        if self.rshape is None:
            self.rshape = self.concrete()
        shape, gdt = self.rshape, c.dtype
        k = r.random()
        if bad_ok and k < 0.12:
            shape = self.other_shape(self.rshape)
        elif bad_ok and k < 0.145:
            gdt = str(r.choice([d for d in FLOATS + ["int32"] if d != c.dtype]))
        ls = self.draw_step() if ls is None else ls
        vals = rand_values(r, shape, c.dtype, self.ints)
        s = c.step("apply", local_step=ls, grad=c.arr(vals.astype(np_dtype(gdt)), gdt))
        if gdt != c.dtype and c.api == "raw":
            s["may_abort"] = True   # TF CHECK-fails on a fresh gradient of another dtype (the wrapper converts)
        if not run:
            return None
        o = self.run(s)
        if "ok" in o and ls >= self.gs:
            if not self.round:
                self.rshape = list(np.asarray(vals).shape)
            self.round.append(np.asarray(vals, np.float64))
        return None

    def draw_step(self):
        r = self.rng
        k = r.random()
        if k < 0.08:
            return int(r.choice([2 ** 40, -(2 ** 40), 2 ** 62, I64_MAX]))
        return min(max(self.gs + int(r.integers(-2, 3)), -I64_MAX - 1), I64_MAX)

    # -- sparse
    def sparse_apply(self, bad_ok=True, ls=None, run=True):
        r, c = self.rng, self.c
        ds = c.shape
        drank = -1 if ds is None else len(ds)
        if self.rshape is None:   # the values' row dims for this round
            vrank = max(drank, 1) + int(r.integers(0, 2)) if drank >= 0 else int(r.integers(1, 4))
            self.rshape = [(ds[i] if (0 <= i < drank and ds[i] >= 0) else int(r.integers(0, 3) if r.random() < 0.1
                                                                                 else r.integers(1, 4)))
                           for i in range(1, vrank)]
        d0 = ds[0] if drank > 0 and ds[0] >= 0 else None
        limit = d0 if d0 is not None else 6
        nnz = int(r.integers(0, min(limit, 4) + 1)) if r.random() < 0.9 else 0
        idx = np.sort(r.choice(limit, size=min(nnz, limit), replace=False)).astype(np.int64) if limit else \
            np.zeros(0, np.int64)
        rows = list(self.rshape)
        note = ""
        taint = ""
        idt = "int64"
        vdt = c.dtype
        shape_mode = str(r.choice(["omit", "given", "bad"], p=[0.4, 0.45, 0.15] if bad_ok else [0.5, 0.5, 0.0]))
        k = r.random() if bad_ok else 1.0
        idx_shape_override = None
        vals_shape = None
        if k < 0.07 and idx.size >= 2:
            idx = r.permutation(idx)
            if np.all(np.diff(idx) > 0):
                idx = idx[::-1].copy()
            taint = D_UNSORTED
        elif k < 0.14 and idx.size >= 1:
            j = int(r.integers(0, idx.size))
            idx = np.sort(np.concatenate([idx, idx[j:j + 1]]))
            taint = D_UNSORTED
        elif k < 0.17 and idx.size >= 1:
            idx = idx.copy()
            idx[int(r.integers(0, idx.size))] = -int(r.integers(1, 3))
            idx = np.sort(idx)
            note = D_NEG
        elif k < 0.22 and d0 is not None:
            idx = np.sort(np.concatenate([idx, [d0 + int(r.integers(0, 2))]])).astype(np.int64)
        elif k < 0.25:
            idx_shape_override = "matrix"
        elif k < 0.28:
            vals_shape = []                 # 0-d values
        elif k < 0.32:
            vals_shape = [idx.size + int(r.choice([-1, 1])) if idx.size else 1] + rows
        elif k < 0.40:
            vals_shape = [idx.size] + self.other_shape(rows)
        elif k < 0.46:
            idt = "int32"
        elif k < 0.475 and c.dtype in FLOATS:
            vdt = str(r.choice([d for d in FLOATS if d != c.dtype]))
        if vals_shape is None:
            vals_shape = [idx.size] + rows
        vals = rand_values(r, vals_shape, c.dtype, self.ints)
        full = [d0 if d0 is not None else (int(idx.max()) + 1 if idx.size and idx.max() >= 0 else 3)] + list(
            vals_shape[1:])
        if shape_mode == "omit":
            shp = None
        elif shape_mode == "given":
            shp = c.arr(np.array(full, np.int64 if idt == "int64" else np.int32), idt)
        else:
            bad_full = list(full)
            if bad_full and r.random() < 0.5:
                bad_full = bad_full[:-1]
            elif bad_full:
                i = int(r.integers(0, len(bad_full)))
                bad_full[i] += 1
            shp = c.arr(np.array(bad_full, np.int64), "int64")
        has_known = shp is not None
        if c.api == "raw" and bad_ok and r.random() < 0.12:
            if shp is None:     # a shape tensor that has_known_shape=False says to ignore
                shp, has_known = c.arr(np.array(self.other_shape(full), np.int64), "int64"), False
            else:               # the shape as a [1, n] matrix or (rank 1) a scalar
                a_ = c.arrays[shp["$arr"]]
                c.arrays[shp["$arr"]] = a_.reshape(()) if a_.size == 1 and r.random() < 0.5 else a_.reshape(1, -1)
        ia = idx.reshape(-1, 1) if idx_shape_override == "matrix" else idx
        ls = self.draw_step() if ls is None else ls
        s = c.step("apply", local_step=ls, indices=c.arr(ia.astype(idt), idt),
                   values=c.arr(vals.astype(np_dtype(vdt)), vdt), shape=shp, has_known=has_known, deliberate=note)
        if vdt != c.dtype:
            s["may_abort"] = True
            if c.api == "py":
                s["deliberate"] = s["deliberate"] or D_PYCONV
        if not run:
            return note
        o = self.run(s)
        if "ok" in o and ls >= self.gs:
            if not self.round:
                self.rshape = list(vals.shape[1:])
            self.round.append((idx, vals))
            if taint:
                self.round_note = self.round_note or taint
        return note

    # -- takes
    def take(self, n, timeout=TAKE_TIMEOUT, thread=0):
        c = self.c
        note = self.round_note or self.deliberate_dtype
        tol = self.f16_tol() if c.dtype == "float16" else 0.0
        if tol and not note:
            note = D_F16    # equal within tol, or (TF overflowed half) deliberately different
        s = c.step("take", thread=thread, n=int(n), timeout=float(timeout), deliberate=note, tol=tol)
        return s

    def f16_tol(self):
        if not self.round:
            return 0.0
        mags = [float(np.max(np.abs(g if not isinstance(g, tuple) else g[1]), initial=0.0)) for g in self.round]
        ints = all(np.all(np.round(g if not isinstance(g, tuple) else g[1]) ==
                          (g if not isinstance(g, tuple) else g[1])) for g in self.round)
        if ints and sum(mags) <= 2048:
            return 0.0
        return (len(self.round) + 1) * 2.0 ** -11 * max(sum(mags), 1.0)

    def after_take(self, o):
        if "ok" in o:
            self.gs = self.gs + 1 if self.gs < I64_MAX else -I64_MAX - 1   # (int64 wraps on both sides)
            self.round, self.round_note = [], ""
            self.rshape = None

    # -- scenarios
    def sequential(self):
        r, c = self.rng, self.c
        s = c.step("create")
        self.run(s)
        if c.handles:   # a second handle on the same shared_name; steps then use either
            h1 = c.handles[0]
            if h1["shape"] != c.shape or h1["reduction"] != c.reduction:
                c.deliberate_all = c.deliberate_all or D_SHARED
            c.cur_h = 1
            self.run(c.step("create"))
        apply = self.dense_apply if c.kind == "dense" else self.sparse_apply
        for _ in range(int(r.integers(4, 16))):
            k = r.random()
            if c.handles:
                c.cur_h = int(r.integers(0, 2))
            if r.random() < 0.4 and c.steps[-1]["op"] != "num":
                self.run(c.step("num"))
            have = self.count()
            if k < 0.5:
                if apply() == D_NEG:
                    self.run(c.step("num", deliberate=D_NEG))
                    return
            elif k < 0.6:
                self.run(c.step("num"))
            elif k < 0.78:
                if have == 0 and r.random() < 0.5:
                    apply(bad_ok=False)
                    have = self.count()
                if have == 0:
                    self.run(self.take(1, BLOCK_TIMEOUT))
                    continue
                o = self.run(self.take(int(r.integers(1, have + 1))))
                self.after_take(o)
            elif k < 0.85:
                self.run(self.take(have + int(r.integers(1, 3)), BLOCK_TIMEOUT))
            elif k < 0.88:
                self.run(self.take(int(r.choice([0, -1, -7]))))
            else:
                k = r.random()
                new = min(max(self.gs + int(r.integers(-3, 4)), -I64_MAX - 1), I64_MAX) if k < 0.85 else (int(r.integers(-5, 5)) if k < 0.95 else
                                                                          I64_MAX - int(r.integers(0, 2)))
                o = self.run(c.step("set_step", step=new))
                if "ok" in o:
                    self.gs = new
        self.run(c.step("num"))
        have = self.count()
        if have:
            self.after_take(self.run(self.take(have)))

    def blocking(self):
        """Thread 1 takes n1 (and, with two takers, thread 2 takes n2 after it: head-of-line blocking, although
        n2 <= n1); thread 0 then applies exactly n1 fresh gradients at step 0 and n2 at step 1 (each take bumps
        the step), stale ones in between, and finally asks num_accumulated (0)."""
        r, c = self.rng, self.c
        self.ints = True
        self.run(c.step("create"))
        two = r.random() < 0.5
        n1 = int(r.integers(1, 4))
        n2 = int(r.integers(1, n1 + 1)) if two else 0
        c.delays = {"1": 0.0, "2": 0.25, "0": 0.6 if two else 0.35}
        apply = self.dense_apply if c.kind == "dense" else self.sparse_apply
        for ls, n in ((0, n1), (1, n2)):
            if ls == 1:
                self.rshape = None   # a new round may have other unknown dims
            for _ in range(n):
                if r.random() < 0.3:
                    apply(bad_ok=False, ls=ls - 1, run=False)
                apply(bad_ok=False, ls=ls, run=False)
        c.step("num")
        c.step("take", thread=1, n=n1, timeout=TAKE_TIMEOUT)
        if two:
            c.step("take", thread=2, n=n2, timeout=TAKE_TIMEOUT)
        for s in c.steps[1:]:
            s["deliberate"] = self.deliberate_dtype
        self.outcomes.update({k: v for k, v in run_scenario(c.to_json(), c.arrays, self.tf).items()
                              if k != c.steps[0]["name"]})


def draw_case(idx, rng):
    kind = "dense" if rng.random() < 0.5 else "sparse"
    api = "raw" if rng.random() < 0.6 else "py"
    k = rng.random()
    if k < 0.06:
        dtype = str(rng.choice(OTHER_DTYPES))
    else:
        dtype = str(rng.choice(FLOATS, p=[0.3, 0.4, 0.3]))
    red = "MEAN" if rng.random() < 0.6 else "SUM"
    if rng.random() < 0.02:
        red = str(rng.choice(["Invalid", "mean"]))
    k = rng.random()
    if k < 0.25:
        shape = None
    else:
        rank = int(rng.integers(0, 4))
        shape = [int(-1 if rng.random() < 0.35 else rng.integers(1, 5)) for _ in range(rank)]
    if rng.random() < 0.015:
        shape = [-2, 3]
    k = rng.random()
    sub = "block" if k < 0.15 else ("shared" if k < 0.25 else "seq")
    c = Case(idx, kind, api, sub, dtype, shape, red)
    if sub == "shared":
        h = {"shape": shape, "reduction": red}
        if rng.random() < 0.3:
            if shape and rng.random() < 0.6:
                h["shape"] = [d + 1 if d > 0 else 2 for d in shape]
            else:
                h["reduction"] = "SUM" if red == "MEAN" else "MEAN"
        c.handles.append(h)
    return c


def case_path(outdir, i):
    return os.path.join(outdir, "case_%05d.npz" % i)


def worker(outdir, seed, which):
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    for i in which:
        rng = np.random.default_rng([seed, i])
        c = draw_case(i, rng)
        side = TFSide(c.to_json())   # (uses the accumulator's attributes only)
        d = Drawer(c, rng, side, lambda outcomes, c=c, i=i: save_case(case_path(outdir, i), c, outcomes))
        try:
            if c.sub == "block":
                d.blocking()
            else:
                d.sequential()   # (also "shared")
        finally:
            side.close()
        save_case(case_path(outdir, i), c, d.outcomes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--worker", nargs="*", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if a.worker is not None:
        worker(a.outdir, a.seed, a.worker)
        return
    # TF aborts the process on some inputs (a dense gradient of another dtype): a worker process runs the cases
    # in order and, when it dies, a new one continues after the case that was saved with the abort marker.
    t0 = time.time()
    todo = list(range(a.cases))
    aborts = 0
    while todo:
        cmd = [sys.executable, os.path.abspath(__file__), a.outdir, "--seed", str(a.seed), "--worker"] + [
            str(i) for i in todo]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        left = [i for i in todo if not os.path.exists(case_path(a.outdir, i))]
        if p.returncode != 0:
            aborts += 1
            if left and left[0] == todo[0]:   # died before saving anything: give up on that case
                print("gen_accumulator: case %d: TF process died without a result:\n%s" % (
                    todo[0], p.stdout.decode(errors="replace")[-2000:]), file=sys.stderr)
                left = left[1:]
        todo = left
    print("gen_accumulator: %d scenarios (seed %d, %d TF aborts) in %.0f s -> %s" % (
        a.cases, a.seed, aborts, time.time() - t0, a.outdir), file=sys.stderr)


if __name__ == "__main__":
    main()
