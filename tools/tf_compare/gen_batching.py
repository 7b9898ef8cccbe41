"""Generator (run with the TensorFlow venv): random, deterministic scenarios of TF's Batch / Unbatch / UnbatchGrad
raw ops (eager, CPU), written as .npz. Usage: gen_batching.py OUTDIR [--cases N] [--seed S]

A scenario is a list of op calls ("steps") on one or more Python threads (each thread starts after a fixed delay
and runs its steps in order); a step's tensor arguments are literal arrays or references to outputs of earlier
steps of the same scenario (e.g. Unbatch of f(batched) with the `batch_index` / `id` that Batch returned), so
that check_batching.py can replay exactly the same calls through torch.ops.torchops. Every scenario uses its own
shared_names. Outcomes are deterministic: single calls form their own batch (batch_timeout_micros = 0, or a full
batch); multi-thread scenarios wait for a full batch (long timeout; start delays fix the arrival order, so the
last caller holds the batch), or, for padding, start all calls well inside a 0.6 s batch timeout.

Per step the file records TF's outcome: outputs, or the error (type + message), or "hung" (thread still blocked
when the scenario's join timeout expired; e.g. TF leaves the non-last tasks of a batch that fails to form
blocked forever), or, for the few scenarios run in their own process because TF may abort on them, "crash".

This module has no TensorFlow import at module level: check_batching.py imports its scenario format and runner.
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

# ------------------------------------------------------------------------------------------------------------
# scenario drawing (numpy only)

DTYPES = ["float32", "float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8", "int16",
          "bool", "complex64"]
I64 = np.iinfo(np.int64)
BIG_TIMEOUT = 20_000_000     # micros: a batch that must ship because it is full, never by timeout
UNBATCH_TIMEOUT = 3_000_000  # micros


class Builder:
    """Collects a scenario: steps + arrays (stored as npz entries, referenced by key from the JSON part)."""

    def __init__(self, idx, kind, sub):
        self.idx, self.kind, self.sub = idx, kind, sub
        self.steps, self.arrays, self.delays = [], {}, {}
        self.join_s = 8.0
        self.isolate = False  # run TF in its own process (TF may abort)
        self.note = ""

    def name(self, what):
        return "tfcmp_batching_%05d_%s" % (self.idx, what)

    def arr(self, a, dtype):
        key = "arr%d" % len(self.arrays)
        self.arrays[key] = a
        return {"$arr": key, "dtype": dtype}

    def step(self, name, op, thread=0, deliberate="", expect="", **args):
        self.steps.append({"name": name, "op": op, "thread": thread, "args": args, "deliberate": deliberate,
                           "expect": expect})

    def to_json(self):
        return {"idx": self.idx, "kind": self.kind, "sub": self.sub, "steps": self.steps, "delays": self.delays,
                "join_s": self.join_s, "isolate": self.isolate, "note": self.note}


def ref(step, what, i=None):
    return {"$ref": [step, what, i]}


def times2(x):
    """A function of a batched tensor, for Unbatch: 2*x for integer dtypes, logical not for bool, rows rotated by
    one (roll along dim 0) for floating / complex dtypes (TF's float kernels flush subnormal results to zero and
    torch's do not: arithmetic, not batching, so floats are only moved)."""
    return {"$f": "times2", "x": x}


def rand_array(rng, dtype, shape):
    """Random values (bit-exact comparisons, so any pattern is fine), with specials for floats."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.startswith("int") or dtype.startswith("uint"):
        info = np.iinfo(np.dtype(dtype))
        return rng.integers(info.min, info.max, shape, dtype=np.dtype(dtype), endpoint=True)
    if dtype == "complex64":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    base = "float32" if dtype == "bfloat16" else dtype
    v = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(base)
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, np.finfo(base).max, np.finfo(base).tiny / 4],
                        dtype=base)
    mask = rng.random(n) < 0.15
    v[mask] = specials[rng.integers(0, len(specials), int(mask.sum()))]
    v = v.reshape(shape)
    if dtype == "bfloat16":   # stored as its bit pattern (uint16); both sides bit-cast it
        return (np.ascontiguousarray(v).view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    return v


def rand_dtype(rng):
    return str(rng.choice(DTYPES))


def rand_trailing(rng, allow_zero=True):
    r = rng.random()
    if r < 0.25:
        return ()                                  # rank-1 inputs
    dims = [0, 1, 2, 3, 5] if allow_zero else [1, 2, 3, 5]
    p = [0.1, 0.3, 0.25, 0.2, 0.15] if allow_zero else [0.3, 0.3, 0.25, 0.15]
    return tuple(int(rng.choice(dims, p=p)) for _ in range(int(rng.integers(1, 4))))


def rand_allowed(rng, M):
    if rng.random() < 0.4 or M == 1:
        return [] if rng.random() < 0.7 or M > 1 else [1]
    k = int(rng.integers(0, M - 1)) if M > 2 else 0
    sub = sorted(rng.choice(np.arange(1, M), size=min(k, M - 1), replace=False).tolist()) if k else []
    return [int(s) for s in sub] + [int(M)]


def batch_args(b, rng, M, timeout, allowed=None, shared=None, **kw):
    a = {"num_batch_threads": int(rng.integers(1, 3)), "max_batch_size": int(M),
         "batch_timeout_micros": int(timeout), "grad_timeout_micros": int(rng.choice([0, 1_000_000])),
         "max_enqueued_batches": int(rng.choice([10, 10, 1, 3, 0])),
         "allowed_batch_sizes": rand_allowed(rng, M) if allowed is None else allowed,
         "container": "", "shared_name": shared or b.name("b"), "batching_queue": str(rng.choice(["", "q1"]))}
    a.update(kw)
    return a


def rand_inputs(b, rng, rows, n=None, specs=None):
    """n input tensors with their own dtype / trailing shape; specs = [(dtype, trailing)] to reuse."""
    if specs is None:
        specs = [(rand_dtype(rng), rand_trailing(rng)) for _ in range(n or int(rng.integers(1, 5)))]
    return [b.arr(rand_array(rng, dt, (rows,) + tr), dt) for dt, tr in specs], specs


def empty_index(b):
    return b.arr(np.zeros((0, 3), np.int64), "int64")


def rand_ids(rng, k):
    ids = set()
    while len(ids) < k:
        ids.add(int(rng.integers(I64.min, I64.max)))
    return [int(i) for i in rng.permutation(list(ids))]


def index_rows(rng, ids, sizes, garbage_starts=False):
    rows, start = [], 0
    for i, s in zip(ids, sizes):
        st = int(rng.integers(0, 50)) if garbage_starts else start
        rows.append([i, st, st + int(s)])
        start += int(s)
    return np.array(rows, np.int64).reshape(len(ids), 3)


# --- scenario kinds -----------------------------------------------------------------------------------------

def k_single(b, rng):
    """One Batch call forming its own batch, then Unbatch of batched[i] and of batched[j]*2, and UnbatchGrad."""
    M = int(rng.integers(1, 9))
    rows = 0 if rng.random() < 0.15 else int(rng.integers(1, M + 1))
    full = rows == M and rng.random() < 0.5
    b.sub = "empty_input" if rows == 0 else ("full_batch" if full else "timeout0")
    ins, specs = rand_inputs(b, rng, rows)
    b.step("batch", "batch", in_tensors=ins, **batch_args(b, rng, M, BIG_TIMEOUT if full else 0))
    if rows == 0:
        return
    i, j = (int(rng.integers(0, len(ins))) for _ in range(2))
    u = dict(timeout_micros=UNBATCH_TIMEOUT, container="", shared_name=b.name("u"))
    b.step("unbatch", "unbatch", batched_tensor=ref("batch", "batched", i), batch_index=ref("batch", "index"),
           id=ref("batch", "id"), **u)
    b.step("unbatch_f", "unbatch", batched_tensor=times2(ref("batch", "batched", j)),
           batch_index=ref("batch", "index"), id=ref("batch", "id"), **u)
    dt, tr = specs[i]
    b.step("unbatch_grad", "unbatch_grad", original_input=ref("batch", "batched", i),
           batch_index=ref("batch", "index"), grad=b.arr(rand_array(rng, dt, (rows,) + tr), dt),
           id=ref("batch", "id"), container="", shared_name=b.name("g"))


def k_unbatch(b, rng):
    """Hand-made batch_index with several ids: the caller gets its own piece, the others are stored and claimed
    by later calls with empty inputs (or a waiting call, on another thread, is completed)."""
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    K = int(rng.integers(1, 6))
    ids = rand_ids(rng, K)
    sizes = rng.integers(0, 4, K)
    D = max(int(sizes.sum()) + int(rng.integers(0, 3)), K)   # index dim 0 must not exceed data dim 0
    garbage = rng.random() < 0.25
    idx = index_rows(rng, ids, sizes, garbage)
    data = b.arr(rand_array(rng, dt, (D,) + tr), dt)
    u = dict(timeout_micros=UNBATCH_TIMEOUT, container="", shared_name=b.name("u"))
    p = int(rng.integers(0, K))
    others = [q for q in rng.permutation(K).tolist() if q != p]
    waiter = others[0] if others and rng.random() < 0.3 else None
    b.sub = ("waiting_claimant" if waiter is not None else "stored_pieces") + ("+garbage_starts" if garbage else "")
    if waiter is not None:          # thread 1 waits first for its piece; thread 0 brings the batch 0.12 s later
        b.delays = {"1": 0.0, "0": 0.12}
        b.step("claim_wait", "unbatch", thread=1, batched_tensor=b.arr(rand_array(rng, dt, (0,) + tr), dt),
               batch_index=empty_index(b), id=b.arr(np.array(ids[waiter], np.int64), "int64"), **u)
    b.step("holder", "unbatch", batched_tensor=data, batch_index=b.arr(idx, "int64"),
           id=b.arr(np.array(ids[p], np.int64), "int64"), **u)
    for q in others:
        if q == waiter:
            continue
        b.step("claim_%d" % q, "unbatch", batched_tensor=b.arr(rand_array(rng, dt, (0,) + tr), dt),
               batch_index=empty_index(b), id=b.arr(np.array(ids[q], np.int64), "int64"), **u)


# Inputs TF's UnbatchGrad takes unchecked and torchops' holder rejects (docs/batching.md).
HOLDER_CHECKS = ("unbatch_grad holder validation (TF unchecked: rows past original_input, holder id not in "
                 "batch_index, grad's trailing dims, rank-3 batch_index)")


def k_unbatch_grad(b, rng):
    """Hand-made batch_index with several ids; every id deposits its gradient piece; the holder (non-empty
    original_input) gets them concatenated in index order. Holder last (one thread) or first (waits on its own
    thread while the others arrive 0.12 s later)."""
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    K = int(rng.integers(1, 6))
    ids = rand_ids(rng, K)
    sizes = rng.integers(0, 4, K)
    garbage = rng.random() < 0.2
    idx = index_rows(rng, ids, sizes, garbage)
    h = int(rng.integers(0, K))
    g = dict(container="", shared_name=b.name("g"))
    if K > 1 and rng.random() < 0.15:             # the holder's own id is not in the index: its grad is unused
        idx = np.delete(idx, h, 0)
        b.sub += "holder_not_in_index+"

    otr = tr if 0 not in tr else rand_trailing(rng, allow_zero=False)
    orig = b.arr(rand_array(rng, dt, (max(1, int(sizes.sum())) + int(rng.integers(0, 3)),) + otr), dt)
    first = K > 1 and rng.random() < 0.3
    b.sub += ("holder_first" if first else "holder_last") + ("+garbage_starts" if garbage else "")
    checked = HOLDER_CHECKS if garbage or otr != tr or "holder_not_in_index" in b.sub else ""
    order = [q for q in rng.permutation(K).tolist() if q != h]
    if first:
        b.delays = {"1": 0.0, "0": 0.12}
    if first:
        b.step("holder", "unbatch_grad", thread=1, deliberate=checked, original_input=orig,
               batch_index=b.arr(idx, "int64"), grad=b.arr(rand_array(rng, dt, (int(sizes[h]),) + tr), dt),
               id=b.arr(np.array(ids[h], np.int64), "int64"), **g)
    for q in order:
        r = rng.random()
        if r < 0.15 and otr:       # rows but zero elements: still not a holder (TF tests NumElements() > 0)
            oin = b.arr(rand_array(rng, dt, (2, 0) + otr[1:]), dt)
            b.sub += "+zero_numel_nonholder"
        else:
            oin = b.arr(rand_array(rng, dt, (0,) + otr), dt)
        bi = b.arr(idx, "int64") if rng.random() < 0.3 else empty_index(b)
        b.step("deposit_%d" % q, "unbatch_grad", original_input=oin, batch_index=bi,
               grad=b.arr(rand_array(rng, dt, (int(sizes[q]),) + tr), dt),
               id=b.arr(np.array(ids[q], np.int64), "int64"), **g)
    if not first:
        b.step("holder", "unbatch_grad", deliberate=checked, original_input=orig, batch_index=b.arr(idx, "int64"),
               grad=b.arr(rand_array(rng, dt, (int(sizes[h]),) + tr), dt),
               id=b.arr(np.array(ids[h], np.int64), "int64"), **g)


def k_threads(b, rng, padded):
    """2-3 calls on their own threads, arriving 0.12 s apart; full batch (long timeout: the last to arrive holds
    it) or padded (0.6 s timeout, allowed sizes with padding). Then every thread: Unbatch(batched*2) with the
    batch_index / id it received, and UnbatchGrad (the holder waits for every thread's gradient)."""
    C = int(rng.integers(2, 4))
    rows = [int(rng.integers(1, 4)) for _ in range(C)]
    N = sum(rows)
    specs = [(rand_dtype(rng), rand_trailing(rng)) for _ in range(int(rng.integers(1, 4)))]
    if padded:
        M = N + int(rng.integers(1, 5))
        # the smallest allowed size >= N is > N, so that padding happens
        small = [int(x) for x in rng.choice(np.arange(1, N), size=int(rng.integers(0, 3)))] if N > 1 else []
        allowed = sorted(set([int(rng.integers(N + 1, M + 1))] + small + [M]))
        timeout, b.sub = 600_000, "padded_timeout"
    else:
        M, allowed, timeout, b.sub = N, rand_allowed(rng, N), BIG_TIMEOUT, "full_batch"
    attrs = batch_args(b, rng, M, timeout, allowed=allowed, max_enqueued_batches=10)
    i = int(rng.integers(0, len(specs)))
    u = dict(timeout_micros=UNBATCH_TIMEOUT, container="", shared_name=b.name("u"))
    for c in range(C):
        b.delays[str(c)] = 0.12 * c
        ins, _ = rand_inputs(b, rng, rows[c], specs=specs)
        s = "c%d_" % c
        b.step(s + "batch", "batch", thread=c, in_tensors=ins, **attrs)
        b.step(s + "unbatch_f", "unbatch", thread=c, batched_tensor=times2(ref(s + "batch", "batched", i)),
               batch_index=ref(s + "batch", "index"), id=ref(s + "batch", "id"), **u)
        dt, tr = specs[i]
        b.step(s + "unbatch_grad", "unbatch_grad", thread=c, original_input=ref(s + "batch", "batched", i),
               batch_index=ref(s + "batch", "index"), grad=b.arr(rand_array(rng, dt, (rows[c],) + tr), dt),
               id=ref(s + "batch", "id"), container="", shared_name=b.name("g"))


def k_form_error(b, rng):
    """Two calls of one batch whose inputs cannot be concatenated (trailing dims or number of inputs differ).
    TF fails the last task only and leaves the first blocked (torchops fails both)."""
    rows = [int(rng.integers(1, 3)), int(rng.integers(1, 3))]
    dt = rand_dtype(rng)
    tr = (int(rng.integers(1, 4)),)
    what = str(rng.choice(["trailing_dims", "rank", "num_inputs"]))
    b.sub = what
    first = [b.arr(rand_array(rng, dt, (rows[0],) + tr), dt)]
    if what == "trailing_dims":
        second = [b.arr(rand_array(rng, dt, (rows[1], tr[0] + 1)), dt)]
    elif what == "rank":
        second = [b.arr(rand_array(rng, dt, (rows[1],) + tr + (2,)), dt)]
    else:
        second = [b.arr(rand_array(rng, dt, (rows[1],) + tr), dt), b.arr(rand_array(rng, dt, (rows[1],)), dt)]
    attrs = batch_args(b, rng, sum(rows), BIG_TIMEOUT, allowed=[], max_enqueued_batches=10)
    b.delays = {"0": 0.0, "1": 0.12}
    b.join_s = 2.0
    b.step("first", "batch", thread=0, deliberate="batch-forming errors reach every task (TF: others hang)",
           in_tensors=first, **attrs)
    b.step("last", "batch", thread=1, expect="batch-forming error", in_tensors=second, **attrs)


def k_attr_mismatch(b, rng):
    """A second call under the same shared_name with different attributes (torchops raises; TF silently
    uses the first creator's)."""
    which = str(rng.choice(["max_batch_size", "batch_timeout_micros", "allowed_batch_sizes", "num_batch_threads",
                            "max_enqueued_batches", "grad_timeout_micros", "unbatch_timeout_micros"]))
    b.sub = which
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    if which == "unbatch_timeout_micros":
        for k, t in enumerate([UNBATCH_TIMEOUT, UNBATCH_TIMEOUT + 1000]):
            i = rand_ids(rng, 1)[0]
            b.step("unbatch%d" % k, "unbatch", deliberate="attribute mismatch on a shared resource"
                   if k else "", batched_tensor=b.arr(rand_array(rng, dt, (2,) + tr), dt),
                   batch_index=b.arr(np.array([[i, 0, 2]], np.int64), "int64"),
                   id=b.arr(np.array(i, np.int64), "int64"), timeout_micros=t, container="",
                   shared_name=b.name("u"))
        return
    a1 = batch_args(b, rng, 4, 0, allowed=[], num_batch_threads=1, max_enqueued_batches=10, grad_timeout_micros=0,
                    batching_queue="")
    a2 = dict(a1)
    a2[which] = {"max_batch_size": 5, "batch_timeout_micros": 1000, "allowed_batch_sizes": [2, 4],
                 "num_batch_threads": 2, "max_enqueued_batches": 3, "grad_timeout_micros": 1000}[which]
    for k, a in enumerate([a1, a2]):
        ins, _ = rand_inputs(b, rng, int(rng.integers(1, 4)), specs=[(dt, tr)])
        b.step("batch%d" % k, "batch", deliberate="attribute mismatch on a shared resource" if k else "",
               in_tensors=ins, **a)


def k_misc(b, rng, sub):
    """Multi-thread scenarios whose outcome is fixed by generous timing margins (0.1-0.4 s)."""
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    b.sub = sub
    arr = lambda shape: b.arr(rand_array(rng, dt, shape), dt)  # noqa: E731
    i64 = lambda v: b.arr(np.array(v, np.int64), "int64")  # noqa: E731
    if sub == "unbatch_expired_piece":
        # the piece stored for q expires after 0.1 s; q's claim at 0.35 s waits its own 0.1 s and times out
        p, q = rand_ids(rng, 2)
        u = dict(timeout_micros=100_000, container="", shared_name=b.name("u"))
        b.delays = {"0": 0.0, "1": 0.35}
        b.step("holder", "unbatch", thread=0, batched_tensor=arr((3,) + tr),
               batch_index=i64([[p, 0, 1], [q, 1, 3]]), id=i64(p), **u)
        b.step("late_claim", "unbatch", thread=1, batched_tensor=arr((0,) + tr), batch_index=empty_index(b),
               id=i64(q), **u)
    elif sub == "unbatch_duplicate_waiter":
        x = rand_ids(rng, 1)[0]
        u = dict(timeout_micros=400_000, container="", shared_name=b.name("u"))
        b.delays = {"0": 0.0, "1": 0.12}
        b.step("waiter", "unbatch", thread=0, batched_tensor=arr((0,) + tr), batch_index=empty_index(b), id=i64(x),
               **u)
        b.step("second_waiter", "unbatch", thread=1, batched_tensor=arr((0,) + tr), batch_index=empty_index(b),
               id=i64(x), **u)
    elif sub in ("queue_full", "queue_full_max_enqueued_0", "open_batch_closed_by_overflow"):
        # max_batch_size 2; A enqueues 1 row, B 2 rows 0.12 s later: B does not fit the open batch. With
        # max_enqueued_batches 1 (or 0, treated as 1) the queue is full: B fails, A ships alone after 0.4 s. With
        # max_enqueued_batches 2 A's batch is closed (and ships), B's new batch is full (ships).
        meb = {"queue_full": 1, "queue_full_max_enqueued_0": 0, "open_batch_closed_by_overflow": 2}[sub]
        attrs = batch_args(b, rng, 2, 400_000 if meb < 2 else BIG_TIMEOUT, max_enqueued_batches=meb)
        b.delays = {"0": 0.0, "1": 0.12}
        b.step("a", "batch", thread=0, in_tensors=[arr((1,) + tr)], **attrs)
        b.step("b", "batch", thread=1, in_tensors=[arr((2,) + tr)], **attrs)
    elif sub == "unbatch_grad_missing_wanted_twice":
        # holder A waits for x; holder B also wants x (error); then x arrives and completes A
        ia, ib, ix = rand_ids(rng, 3)
        trn = tr if 0 not in tr else ()
        g = dict(container="", shared_name=b.name("g"))
        b.delays = {"0": 0.0, "1": 0.12}
        b.step("holder_a", "unbatch_grad", thread=0, original_input=arr((2,) + trn),
               batch_index=i64([[ia, 0, 1], [ix, 1, 2]]), grad=arr((1,) + trn), id=i64(ia), **g)
        b.step("holder_b", "unbatch_grad", thread=1, original_input=arr((2,) + trn),
               batch_index=i64([[ib, 0, 1], [ix, 1, 2]]), grad=arr((1,) + trn), id=i64(ib), **g)
        b.step("deposit_x", "unbatch_grad", thread=1, original_input=arr((0,) + trn), batch_index=empty_index(b),
               grad=arr((1,) + trn), id=i64(ix), **g)


MISC = ["unbatch_expired_piece", "unbatch_duplicate_waiter", "queue_full", "queue_full_max_enqueued_0",
        "open_batch_closed_by_overflow", "unbatch_grad_missing_wanted_twice"]


def e_batch(b, rng, sub):
    M = int(rng.integers(1, 7))
    rows = int(rng.integers(1, M + 1))
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    kw, ins, deliberate, expect = {}, None, "", ""
    if sub == "task_too_large":
        rows = M + int(rng.integers(1, 4))
    elif sub == "allowed_not_increasing":
        kw["allowed_batch_sizes"] = [M, M] if rng.random() < 0.5 else [M + 1, M]
    elif sub == "allowed_last_ne_max":
        kw["allowed_batch_sizes"] = [int(rng.integers(1, M + 1))] + [M + 1] if rng.random() < 0.5 else [max(M - 1, 0)]
        if kw["allowed_batch_sizes"] == [0]:
            kw["allowed_batch_sizes"] = [M + 2]
    elif sub == "dim0_mismatch":
        n = int(rng.integers(2, 4))
        ins, _ = rand_inputs(b, rng, rows, n)
        k = int(rng.integers(1, n))
        ins[k] = b.arr(rand_array(rng, dt, (rows + int(rng.integers(1, 3)),) + tr), dt)
    elif sub == "rank0_input":
        n = int(rng.integers(1, 4))
        ins, _ = rand_inputs(b, rng, rows, n)
        ins.insert(int(rng.integers(0, n + 1)), b.arr(rand_array(rng, dt, ()), dt))
    elif sub == "empty_list":
        ins = []
    elif sub == "num_batch_threads_nonpositive":
        kw["num_batch_threads"] = int(rng.choice([0, -1]))
    elif sub == "max_batch_size_nonpositive":
        kw["max_batch_size"] = int(rng.choice([0, -2]))
        kw["allowed_batch_sizes"] = []
        if kw["max_batch_size"] < 0:
            deliberate = "batch attributes (max_batch_size < 1 rejected; TF 2.21 rejects only 0)"
    elif sub == "batch_timeout_negative":
        kw["batch_timeout_micros"] = -int(rng.integers(1, 1000))
    elif sub == "empty_input_invalid_max_or_timeout":
        rows = 0
        deliberate = ("batch attributes (attributes validated on every call, empty inputs included; TF returns "
                      "before checking them)")
        if rng.random() < 0.5:
            kw["max_batch_size"], kw["allowed_batch_sizes"] = int(rng.choice([0, -2])), []
        else:
            kw["batch_timeout_micros"] = -int(rng.integers(1, 1000))
    elif sub == "max_enqueued_batches_zero":
        kw["max_enqueued_batches"] = 0
    elif sub == "max_enqueued_batches_negative":
        kw["max_enqueued_batches"] = -int(rng.integers(1, 5))
        deliberate = "batch attributes (negative max_enqueued_batches: TF unchecked, torchops rejects)"
    if ins is None:
        ins, _ = rand_inputs(b, rng, rows, specs=[(dt, tr)] * int(rng.integers(1, 3)))
    b.step("batch", "batch", deliberate=deliberate, expect=expect, in_tensors=ins,
           **batch_args(b, rng, M, 0, allowed=kw.pop("allowed_batch_sizes", []), **kw))


def e_unbatch(b, rng, sub):
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    D = int(rng.integers(1, 6))
    data = rand_array(rng, dt, (D,) + tr)
    K = int(rng.integers(1, D + 1))
    ids = rand_ids(rng, K + 1)
    sizes = np.ones(K, np.int64)
    idx = index_rows(rng, ids[:K], sizes)
    me = np.array(ids[0], np.int64)
    timeout, deliberate = UNBATCH_TIMEOUT, ""
    if sub == "index_dim0_gt_data":
        idx = index_rows(rng, ids[:K], sizes)
        data = rand_array(rng, dt, (K - 1,) + tr) if K > 1 else rand_array(rng, dt, (0,) + tr)
    elif sub == "index_dim1_ne_3":
        idx = np.concatenate([idx, idx[:, :1]], 1) if rng.random() < 0.5 else idx[:, :2].copy()
    elif sub == "id_not_scalar":
        me = np.array([ids[0]] * int(rng.integers(1, 3)), np.int64).reshape([(-1,), (1, -1)][rng.integers(0, 2)])
    elif sub == "index_rank3_id_not_scalar":       # TF testUnbatchInvalidIdArg
        data = rand_array(rng, dt, (3, 3, 1))
        idx = rng.integers(0, 3, (3, 3, 1)).astype(np.int64)
        me = rng.integers(0, 3, (3, 3, 1)).astype(np.int64)
    elif sub == "index_rank3_scalar_id":           # [K,3,1]: TF reads it as [K,3]
        idx = idx.reshape(K, 3, 1)
        deliberate = "unbatch validation (torchops may reject a batch_index of rank != 2 after the id check)"
    elif sub == "split_sizes_exceed_dim0":
        idx = index_rows(rng, ids[:K], sizes + 1)
        idx[-1, 2] += D                              # make the sum certainly exceed dim 0
    elif sub == "id_not_in_index_timeout0":
        me = np.array(ids[K], np.int64)
        timeout = 0
        if rng.random() < 0.4:
            data, idx = rand_array(rng, dt, (0,) + tr), np.zeros((0, 3), np.int64)
    elif sub == "negative_timeout_own_piece":
        timeout = -int(rng.integers(1, 1000))
        deliberate = "docs/batching.md only (negative Unbatch timeout_micros: TF unchecked, torchops rejects)"
    b.step("unbatch", "unbatch", deliberate=deliberate, batched_tensor=b.arr(data, dt),
           batch_index=b.arr(idx, "int64"), id=b.arr(me, "int64"), timeout_micros=timeout, container="",
           shared_name=b.name("u"))


def e_unbatch_grad(b, rng, sub):
    dt, tr = rand_dtype(rng), rand_trailing(rng, allow_zero=False)
    K = int(rng.integers(1, 4))
    ids = rand_ids(rng, K)
    sizes = rng.integers(1, 3, K)
    idx = index_rows(rng, ids, sizes)
    g = dict(container="", shared_name=b.name("g"))
    grads = [rand_array(rng, dt, (int(s),) + tr) for s in sizes]
    orig = rand_array(rng, dt, (int(sizes.sum()),) + tr)
    me = np.array(ids[-1], np.int64)
    if sub == "trailing_mismatch" and K == 1:
        K, ids, sizes = 2, rand_ids(rng, 2), np.array([1, 1])
        idx, grads = index_rows(rng, ids, sizes), [rand_array(rng, dt, (1,) + tr) for _ in range(2)]
        me = np.array(ids[-1], np.int64)
    for q in range(K - 1):                            # the non-holders deposit first
        gq = grads[q]
        if sub == "trailing_mismatch" and q == 0:
            gq = rand_array(rng, dt, (int(sizes[q]),) + tr + (2,))
        if sub == "duplicate_id_in_index" and q == 0:
            continue
        b.step("deposit_%d" % q, "unbatch_grad", original_input=b.arr(rand_array(rng, dt, (0,) + tr), dt),
               batch_index=empty_index(b), grad=b.arr(gq, dt), id=b.arr(np.array(ids[q], np.int64), "int64"), **g)
    bi = idx
    if sub == "id_not_scalar":
        me = np.array([ids[-1]] * int(rng.integers(1, 3)), np.int64)
    elif sub == "empty_index_nonempty_input":
        bi = np.zeros((0, 3), np.int64)
    elif sub == "index_k_by_2":
        bi = idx[:, :2].copy()
    elif sub == "index_rank1":
        bi = idx.reshape(-1)
    elif sub == "index_rank3":                        # numel == dim0 * 3: TF accepts it
        bi = idx.reshape(K, 3, 1)
    elif sub == "duplicate_id":
        b.step("first", "unbatch_grad", original_input=b.arr(rand_array(rng, dt, (0,) + tr), dt),
               batch_index=empty_index(b), grad=b.arr(grads[-1], dt), id=b.arr(me, "int64"), **g)
    elif sub == "duplicate_id_in_index":
        bi = idx.copy()
        if K == 1:
            bi = np.concatenate([bi, bi])
        else:
            bi[0, 0] = bi[-1, 0]
    b.step("holder", "unbatch_grad", deliberate=HOLDER_CHECKS if sub in ("index_rank3", "trailing_mismatch") else "",
           original_input=b.arr(orig, dt), batch_index=b.arr(bi, "int64"), grad=b.arr(grads[-1], dt),
           id=b.arr(me, "int64"), **g)


ERRORS = [(e_batch, s) for s in ["task_too_large", "allowed_not_increasing", "allowed_last_ne_max", "dim0_mismatch",
                                 "rank0_input", "empty_list", "num_batch_threads_nonpositive",
                                 "max_batch_size_nonpositive", "batch_timeout_negative",
                                 "empty_input_invalid_max_or_timeout", "max_enqueued_batches_zero",
                                 "max_enqueued_batches_negative"]] + \
         [(e_unbatch, s) for s in ["index_dim0_gt_data", "index_dim1_ne_3", "id_not_scalar",
                                   "index_rank3_id_not_scalar", "index_rank3_scalar_id", "split_sizes_exceed_dim0",
                                   "id_not_in_index_timeout0", "negative_timeout_own_piece"]] + \
         [(e_unbatch_grad, s) for s in ["id_not_scalar", "empty_index_nonempty_input", "index_k_by_2", "index_rank1",
                                        "index_rank3", "duplicate_id", "trailing_mismatch", "duplicate_id_in_index"]]


def k_isolated(b, rng, which):
    """Inputs on which TF may abort the process (a rank-1 index crashes TF); run in their own TF process."""
    b.isolate, b.sub, b.join_s = True, which, 4.0
    dt, tr = rand_dtype(rng), rand_trailing(rng)
    u = dict(container="", shared_name=b.name("u"))
    if which == "unbatch_rank1_index_from_empty_batch":   # empty-input Batch outputs fed to Unbatch
        b.step("batch", "batch", in_tensors=[b.arr(rand_array(rng, dt, (0,) + tr), dt)],
               **batch_args(b, rng, 4, 0, allowed=[]))
        b.step("unbatch", "unbatch", deliberate="unbatch validation (rank-1 batch_index: TF crashes, torchops errors)",
               batched_tensor=ref("batch", "batched", 0), batch_index=ref("batch", "index"), id=ref("batch", "id"),
               timeout_micros=0, **u)
    elif which == "unbatch_negative_split_size":
        ids = rand_ids(rng, 2)
        b.step("unbatch", "unbatch",
               deliberate="unbatch split (negative split sizes: TF unchecked, torchops errors)",
               batched_tensor=b.arr(rand_array(rng, dt, (4,) + tr), dt),
               batch_index=b.arr(np.array([[ids[0], 0, 3], [ids[1], 3, 2]], np.int64), "int64"),
               id=b.arr(np.array(ids[0], np.int64), "int64"), timeout_micros=UNBATCH_TIMEOUT, **u)
    elif which == "unbatch_duplicate_piece":
        ids = rand_ids(rng, 3)
        b.step("first", "unbatch", batched_tensor=b.arr(rand_array(rng, dt, (2,) + tr), dt),
               batch_index=b.arr(np.array([[ids[0], 0, 1], [ids[1], 1, 2]], np.int64), "int64"),
               id=b.arr(np.array(ids[0], np.int64), "int64"), timeout_micros=200_000, **u)
        b.step("second", "unbatch", batched_tensor=b.arr(rand_array(rng, dt, (2,) + tr), dt),
               batch_index=b.arr(np.array([[ids[1], 0, 1], [ids[2], 1, 2]], np.int64), "int64"),
               id=b.arr(np.array(ids[2], np.int64), "int64"), timeout_micros=200_000, **u)
        b.step("after", "unbatch", batched_tensor=b.arr(rand_array(rng, dt, (0,) + tr), dt),
               batch_index=empty_index(b), id=b.arr(np.array(ids[2], np.int64), "int64"), timeout_micros=200_000,
               **u)
    elif which == "batch_dtype_mismatch_across_calls":
        dts = ["float32", "int32"] if rng.random() < 0.5 else ["float64", "float32"]
        attrs = batch_args(b, rng, 2, BIG_TIMEOUT, allowed=[], max_enqueued_batches=10)
        b.delays = {"0": 0.0, "1": 0.12}
        b.step("first", "batch", thread=0, deliberate="batch-forming errors reach every task",
               in_tensors=[b.arr(rand_array(rng, dts[0], (1, 2)), dts[0])], **attrs)
        b.step("last", "batch", thread=1, deliberate="batch inputs (torchops also covers dtype mismatches)",
               in_tensors=[b.arr(rand_array(rng, dts[1], (1, 2)), dts[1])], **attrs)


ISOLATED = ["unbatch_rank1_index_from_empty_batch", "unbatch_negative_split_size", "unbatch_duplicate_piece",
            "batch_dtype_mismatch_across_calls"]


def plan(n, seed):
    """Kind of every case (deterministic in n, seed)."""
    kinds = ([("isolated", w) for w in ISOLATED] + [("form_error", None)] * max(2, n // 100)
             + [("attr_mismatch", None)] * max(2, n // 60) + [("threads_padded", None)] * max(2, n // 40)
             + [("misc", MISC[k % len(MISC)]) for k in range(max(len(MISC), n // 25))])
    err = max(len(ERRORS), int(n * 0.2))
    kinds += [("error", ERRORS[k % len(ERRORS)]) for k in range(err)]
    rest = max(0, n - len(kinds))
    weights = [("single", 0.42), ("unbatch", 0.18), ("unbatch_grad", 0.2), ("threads_full", 0.2)]
    for name, w in weights:
        kinds += [(name, None)] * int(round(rest * w))
    kinds = (kinds + [("single", None)] * n)[:max(n, len(ISOLATED) + len(ERRORS))]
    order = np.random.default_rng([seed, 7]).permutation(len(kinds))
    return [kinds[i] for i in order]


def draw(idx, kind, seed):
    rng = np.random.default_rng([seed, idx])
    name, extra = kind
    b = Builder(idx, name, "")
    if name == "single":
        k_single(b, rng)
    elif name == "unbatch":
        k_unbatch(b, rng)
    elif name == "unbatch_grad":
        k_unbatch_grad(b, rng)
    elif name == "threads_full":
        k_threads(b, rng, False)
    elif name == "threads_padded":
        k_threads(b, rng, True)
    elif name == "form_error":
        k_form_error(b, rng)
    elif name == "attr_mismatch":
        k_attr_mismatch(b, rng)
    elif name == "misc":
        k_misc(b, rng, extra)
    elif name == "error":
        fn, sub = extra
        b.kind = "error_" + fn.__name__[2:]
        b.sub = sub
        fn(b, rng, sub)
    elif name == "isolated":
        k_isolated(b, rng, extra)
    return b


# ------------------------------------------------------------------------------------------------------------
# runner (shared with check_batching.py; `backend` supplies the ops)

class Skip(Exception):
    pass


def resolve(v, backend, arrays, values):
    if isinstance(v, dict) and "$arr" in v:
        return backend.tensor(arrays[v["$arr"]], v["dtype"])
    if isinstance(v, dict) and "$ref" in v:
        step, what, i = v["$ref"]
        if step not in values:
            raise Skip("%s did not produce outputs" % step)
        out = values[step][what]
        return out[i] if i is not None else out
    if isinstance(v, dict) and "$f" in v:
        return backend.times2(resolve(v["x"], backend, arrays, values))
    if isinstance(v, list):
        return [resolve(x, backend, arrays, values) for x in v]
    return v


def run_scenario(case, arrays, backend):
    """Runs every thread of the scenario; returns {step name: outcome}. Outcome: {"ok": [(label, dtype, array)]},
    {"err": [type, message]}, {"hung": True} or {"skipped": reason}."""
    steps = case["steps"]
    threads = sorted({s["thread"] for s in steps})
    results, values, lock = {}, {}, threading.Lock()

    def work(t):
        time.sleep(float(case["delays"].get(str(t), 0.0)))
        for s in (s for s in steps if s["thread"] == t):
            try:
                args = {k: resolve(v, backend, arrays, values) for k, v in s["args"].items()}
            except Skip as e:
                with lock:
                    results[s["name"]] = {"skipped": str(e)}
                continue
            try:
                out = backend.call(s["op"], args)
            except Exception as e:  # noqa: BLE001
                with lock:
                    results[s["name"]] = {"err": [type(e).__name__, backend.message(e)]}
                continue
            values[s["name"]] = out
            flat = [("batched[%d]" % i, x) for i, x in enumerate(out["batched"])] + [
                ("batch_index", out["index"]), ("id", out["id"])] if "batched" in out else [("out", out["out"])]
            with lock:
                results[s["name"]] = {"ok": [(lab,) + backend.to_numpy(x) for lab, x in flat]}

    ths = [threading.Thread(target=work, args=(t,), daemon=True) for t in threads]
    for th in ths:
        th.start()
    deadline = time.monotonic() + max(float(d) for d in list(case["delays"].values()) + [0.0]) + case["join_s"]
    for th in ths:
        th.join(max(0.0, deadline - time.monotonic()))
    with lock:
        snap = dict(results)
    for s in steps:
        if s["name"] not in snap:
            snap[s["name"]] = {"hung": True}
    return snap


def save_case(path, b, tf_outcomes, crash=None):
    out = dict(b.arrays)
    meta = b.to_json()
    meta["tf"] = encode_outcomes(tf_outcomes, out)
    meta["tf_crash"] = crash
    out["meta"] = np.array(json.dumps(meta))
    np.savez(path, **out)


# ------------------------------------------------------------------------------------------------------------
# TensorFlow backend

class TFBackend:
    def __init__(self):
        import tensorflow as tf
        self.tf = tf
        self.raw = tf.raw_ops

    def tensor(self, a, dtype):
        tf = self.tf
        if dtype == "bfloat16":
            return tf.bitcast(tf.constant(a, tf.uint16), tf.bfloat16)
        return tf.constant(a)

    def to_numpy(self, t):
        tf = self.tf
        if t.dtype == tf.bfloat16:
            return "bfloat16", np.array(tf.bitcast(t, tf.uint16).numpy())
        a = np.array(t.numpy())
        return str(a.dtype), a

    def times2(self, x):
        tf = self.tf
        if x.dtype == tf.bool:
            return tf.logical_not(x)
        if x.dtype.is_integer:
            return tf.multiply(x, tf.constant(2, x.dtype))
        return tf.roll(x, 1, 0)

    @staticmethod
    def message(e):
        m = getattr(e, "message", None) or str(e)
        m = m.split(" [Op:")[0].strip()
        if m.startswith("{{function_node") and "}} " in m:      # eager's wrapper prefix
            m = m.split("}} ", 1)[1]
        return m

    def call(self, op, a):
        raw = self.raw
        if op == "batch":
            r = raw.Batch(**a)
            return {"batched": list(r[0]), "index": r[1], "id": r[2]}
        if op == "unbatch":
            return {"out": raw.Unbatch(**a)}
        return {"out": raw.UnbatchGrad(**a)}


def worker(outdir, cases, seed, idxs):
    kinds = plan(cases, seed)
    backend = TFBackend()
    for i in idxs:
        b = draw(i, kinds[i], seed)
        save_case(os.path.join(outdir, "case_%05d.npz" % i), b, run_scenario(b.to_json(), b.arrays, backend))
    sys.stdout.flush()
    os._exit(0)   # TF threads left blocked on purpose (batch-forming error scenarios) must not hold the process


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--chunk", type=int, default=40, help="cases per TF process (TF's batching resources poll "
                    "every 1 ms and cannot be deleted in eager mode, so each process runs only a few)")
    ap.add_argument("--worker", nargs="*", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.outdir, exist_ok=True)
    if a.worker is not None:
        worker(a.outdir, a.cases, a.seed, a.worker)
        return
    kinds = plan(a.cases, a.seed)
    normal = [i for i, k in enumerate(kinds) if k[0] != "isolated"]
    groups = [normal[k:k + a.chunk] for k in range(0, len(normal), a.chunk)]
    groups += [[i] for i, k in enumerate(kinds) if k[0] == "isolated"]
    t0 = time.time()
    for g in groups:
        cmd = [sys.executable, os.path.abspath(__file__), a.outdir, "--cases", str(a.cases), "--seed", str(a.seed),
               "--worker"] + [str(i) for i in g]
        try:
            p = subprocess.run(cmd, timeout=60 + 15 * len(g), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            rc, log = p.returncode, p.stdout.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            rc, log = "timeout", (e.stdout or b"").decode(errors="replace")
        missing = [i for i in g if not os.path.exists(os.path.join(a.outdir, "case_%05d.npz" % i))]
        if missing:
            if len(g) == 1 and kinds[g[0]][0] == "isolated":
                b = draw(g[0], kinds[g[0]], a.seed)   # TF aborted: record it for the checker
                lines = [ln for ln in log.splitlines() if ln.strip() and "oneDNN" not in ln]
                fatal = [ln for ln in lines if "Check failed" in ln or ln.startswith("F0") or "Fatal" in ln
                         or "Aborted" in ln or "Segmentation" in ln or "SIG" in ln]
                tail = " | ".join(fatal[:3] or lines[-3:])[:600]
                save_case(os.path.join(a.outdir, "case_%05d.npz" % g[0]), b, {},
                          crash="TF process ended with %s; last output: %s" % (rc, tail))
            else:
                sys.exit("TF worker failed (%s) on cases %s:\n%s" % (rc, missing, log[-3000:]))
    print("wrote %d cases to %s (%.0f s)" % (len(kinds), a.outdir, time.time() - t0))


if __name__ == "__main__":
    main()
