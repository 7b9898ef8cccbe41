"""Checker (run with the torch venv, PYTHONPATH = the worktree): replays gen_batching.py's scenarios through
torch.ops.torchops.batch / unbatch / unbatch_grad (same threads, start delays, arguments; references to earlier
outputs resolve to torchops' own outputs) and compares every step with TF's recorded outcome.

Per step:
* both return: same number of outputs, dtypes and shapes; values bit-exact (these ops only move data; bfloat16
  compared as its bits). `id` values are random on both sides: only dtype / shape are compared; a Batch
  `batch_index` is compared after mapping TF's ids to torchops' (the ids returned by the scenario's Batch calls),
  its start / end columns exactly.
* both raise: message-only difference (c); the two messages are printed side by side (wording need not match).
* one raises (or stays blocked past the scenario's join timeout, "hung") and the other does not, or values differ:
  a mismatch (a), unless the generator tagged the step with a difference docs/batching.md declares deliberate (b), e.g.
  (attribute mismatch on a shared resource raises), (batch-forming errors reach every task; TF
  leaves the others blocked), rank-1 batch_index in Unbatch (TF crashes), negative max_enqueued_batches / split
  sizes. Scenarios whose TF process aborted are listed with torchops' outcome.
Exit status 1 if any (a) was found.
"""
import argparse
import glob
import os
import sys
import time

import numpy as np
import torch

import torchops  # noqa: F401
from torchops.batching import close_all

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_batching import run_scenario  # noqa: E402
from scenarios import decode_outcomes, load_case, print_deliberate, print_summary, record_difference  # noqa: E402

ops = torch.ops.torchops


class TorchBackend:
    @staticmethod
    def tensor(a, dtype):
        t = torch.from_numpy(np.array(a, copy=True))  # (ascontiguousarray would make 0-d arrays 1-d)
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t

    @staticmethod
    def to_numpy(t):
        t = t.detach().contiguous()
        if t.dtype == torch.bfloat16:
            return "bfloat16", t.view(torch.uint16).numpy().copy()
        a = t.numpy().copy()
        return str(a.dtype), a

    @staticmethod
    def times2(x):   # see gen_batching.times2
        if x.dtype == torch.bool:
            return torch.logical_not(x)
        if not (x.is_floating_point() or x.is_complex()):
            return x * 2
        return torch.roll(x, 1, 0)

    @staticmethod
    def message(e):
        return " ".join(str(e).split("\n")[:3]).strip()

    @staticmethod
    def call(op, a):
        if op == "batch":
            batched, index, id_ = ops.batch(**a)
            return {"batched": list(batched), "index": index, "id": id_}
        return {"out": getattr(ops, op)(**a)}


def short(a, n=10):
    a = np.asarray(a)
    if a.size <= n:
        return np.array2string(a.reshape(-1) if a.ndim > 1 else a, separator=",", threshold=n).replace("\n", "")
    return "[%s ...]" % ",".join(str(x) for x in a.reshape(-1)[:n])


def describe_outcome(o):
    if "ok" in o:
        return "returns " + "; ".join("%s %s%s=%s" % (lab, dt, list(a.shape), short(a)) for lab, dt, a in o["ok"])
    if "err" in o:
        return "raises %s: %s" % (o["err"][0], o["err"][1][:400])
    if "hung" in o:
        return "still blocked after the join timeout (hung)"
    return "not run (%s)" % o.get("skipped", "?")


def describe_args(step, arrays):
    def one(v):
        if isinstance(v, dict) and "$arr" in v:
            a = arrays[v["$arr"]]
            return "%s%s%s" % (v["dtype"], list(a.shape), ("=" + short(a, 12)) if a.size <= 12 else "")
        if isinstance(v, dict) and "$ref" in v:
            s, w, i = v["$ref"]
            return "<%s.%s%s>" % (s, w, "" if i is None else "[%d]" % i)
        if isinstance(v, dict) and "$f" in v:
            return "f(%s)" % one(v["x"])
        if isinstance(v, list):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return repr(v)
    return "%s(%s)" % (step["op"], ", ".join("%s=%s" % (k, one(v)) for k, v in step["args"].items()
                                             if k not in ("container",)))


def compare_ok(name, t_out, p_out, idmap):
    """Returns a list of differences (strings) between TF's and torchops' outputs of one step."""
    diffs = []
    if [o[0] for o in t_out] != [o[0] for o in p_out]:
        return ["outputs differ: TF %s vs torchops %s" % ([o[0] for o in t_out], [o[0] for o in p_out])]
    for (lab, tdt, ta), (_, pdt, pa) in zip(t_out, p_out):
        if tdt != pdt or ta.shape != pa.shape:
            diffs.append("%s: TF %s%s vs torchops %s%s" % (lab, tdt, list(ta.shape), pdt, list(pa.shape)))
            continue
        if lab == "id":
            continue
        if lab == "batch_index" and ta.ndim == 2 and ta.shape[1] == 3:
            mapped = np.array([idmap.get(int(x), None) for x in ta[:, 0]], dtype=object)
            if any(m is None for m in mapped) or not np.array_equal(mapped.astype(np.int64), pa[:, 0]):
                diffs.append("batch_index ids: TF %s (mapped %s) vs torchops %s" % (
                    short(ta[:, 0]), short(mapped), short(pa[:, 0])))
            if not np.array_equal(ta[:, 1:], pa[:, 1:]):
                diffs.append("batch_index start/end: TF %s vs torchops %s" % (short(ta[:, 1:], 30),
                                                                             short(pa[:, 1:], 30)))
            continue
        if ta.tobytes() != pa.tobytes():
            bad = np.flatnonzero(ta.reshape(-1).view(np.uint8) != pa.reshape(-1).view(np.uint8))
            diffs.append("%s values differ (first differing byte %d): TF %s vs torchops %s" % (
                lab, int(bad[0]) if bad.size else -1, short(ta, 16), short(pa, 16)))
    return diffs


def id_map(steps, tf, pt):
    m = {}
    for s in steps:
        t, p = tf.get(s["name"], {}), pt.get(s["name"], {})
        if s["op"] == "batch" and "ok" in t and "ok" in p:
            ti, pi = t["ok"][-1][2], p["ok"][-1][2]
            if ti.shape == () and pi.shape == ():
                m[int(ti)] = int(pi)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("indir")
    ap.add_argument("--verbose", action="store_true", help="print every message-only difference")
    a = ap.parse_args()
    torch.set_num_threads(1)
    files = sorted(glob.glob(os.path.join(a.indir, "case_*.npz")))
    backend = TorchBackend()
    summary = {}      # kind -> [cases, steps, same, a, b, c]
    found = {"a": [], "b": [], "c": [], "tf_crash": []}
    t0 = time.time()
    for f in files:
        meta, arrays = load_case(f)
        try:
            pt = run_scenario(meta, arrays, backend)
        finally:
            close_all()     # wakes anything left blocked, drops this scenario's resources
        tf = decode_outcomes(meta["tf"], arrays)
        kind = meta["kind"]
        row = summary.setdefault(kind, [0, 0, 0, 0, 0, 0])
        row[0] += 1
        where = "%s [%s/%s]" % (os.path.basename(f), kind, meta["sub"])
        if meta.get("tf_crash"):
            deliberate = [s["deliberate"] for s in meta["steps"] if s["deliberate"]]
            entry = (where, "TF aborted the process: %s" % meta["tf_crash"],
                     ["%s -> torchops %s" % (describe_args(s, arrays), describe_outcome(pt[s["name"]]))
                      for s in meta["steps"]], "; ".join(deliberate))
            row[1] += len(meta["steps"])
            if deliberate:
                row[4] += 1
                found["b"].append(entry)
            else:
                found["tf_crash"].append(entry)
            continue
        idmap = id_map(meta["steps"], tf, pt)
        tf_ids = [k for k in idmap]
        if len(set(idmap.values())) != len(tf_ids):
            row[3] += 1
            found["a"].append((where, "torchops returned the same id to two Batch calls", [], ""))
        for s in meta["steps"]:
            row[1] += 1
            t, p = tf.get(s["name"], {"hung": True}), pt[s["name"]]
            call = describe_args(s, arrays)
            if "skipped" in t or "skipped" in p:
                if "skipped" in t and "skipped" in p:
                    row[2] += 1
                continue   # follows from a difference reported on an earlier step
            if "ok" in t and "ok" in p:
                d = compare_ok(s["name"], t["ok"], p["ok"], idmap)
                if d:
                    row[3] += 1
                    found["a"].append((where + " step " + s["name"], call, ["TF:       " + describe_outcome(t),
                                                                            "torchops: " + describe_outcome(p)]
                                       + d, ""))
                else:
                    row[2] += 1
            elif "err" in t and "err" in p:
                row[5] += 1
                found["c"].append((where + " step " + s["name"], call, t["err"], p["err"]))
            elif "hung" in t and "hung" in p:
                row[2] += 1
            else:
                entry = (where + " step " + s["name"], call, ["TF:       " + describe_outcome(t),
                                                            "torchops: " + describe_outcome(p)], s["deliberate"])
                record_difference(found, row, entry, s["deliberate"])

    print_summary(summary, 20, "(c) msg-only")

    def show(title, items, limit=None):
        if not items:
            return
        print("\n== %s (%d)" % (title, len(items)))
        for where, call, lines, note in items[:limit]:
            print("* %s%s\n    %s" % (where, ("  [" + note + "]") if note else "", call))
            for ln in lines:
                print("    " + ln)
        if limit and len(items) > limit:
            print("  ... %d more" % (len(items) - limit))

    show("(a) MISMATCHES: torchops differs from TF (not declared deliberate)", found["a"])
    print_deliberate(found["b"], "docs/batching.md")
    show("TF aborted (no torchops difference implied)", found["tf_crash"])
    # (c): one example per (kind/sub, step); all with --verbose
    groups = {}
    for e in found["c"]:
        key = e[0].split(" ", 1)[1].split(" step ")[0] + " " + e[0].rsplit(" step ", 1)[1].rstrip("0123456789_")
        groups.setdefault(key, []).append(e)
    if groups:
        print("\n== (c) both raise, messages differ or match (%d steps, %d groups); TF | torchops" % (
            len(found["c"]), len(groups)))
        for key, items in sorted(groups.items()):
            for where, call, te, pe in (items if a.verbose else items[:1]):
                print("* %s x%d: %s\n    TF:       %s: %s\n    torchops: %s: %s" % (
                    key, len(items), call, te[0], te[1][:300], pe[0], pe[1][:300]))
    print("\n%d scenarios (%.0f s), %d mismatches (a), %d deliberate (b), %d message-only (c), %d TF aborts" % (
        len(files), time.time() - t0, len(found["a"]), len(found["b"]), len(found["c"]), len(found["tf_crash"])))
    return 1 if found["a"] or not files else 0


if __name__ == "__main__":
    sys.exit(main())
