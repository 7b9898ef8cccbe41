"""Shared by the scenario families (batching, accumulator): the case files both sides read, and the summary table
of their checkers. Plain numpy / json: imported from the TF venv (gen_*) and the torch venv (check_*)."""
import json

import numpy as np


def load_case(path):
    """(meta, arrays) of a case file written by a gen_<family>.py."""
    z = np.load(path, allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    arrays = {k: z[k] for k in z.files if k != "meta"}
    return meta, arrays


def encode_outcomes(outcomes, out):
    """Step outcomes -> their JSON form, the arrays of {"ok": [(label, dtype, array), ...]} stored in `out` (the
    case file's npz entries) under res_<step>_<k>."""
    enc = {}
    for name, o in outcomes.items():
        if "ok" in o:
            items = []
            for k, (lab, dt, a) in enumerate(o["ok"]):
                key = "res_%s_%d" % (name, k)
                out[key] = a
                items.append([lab, dt, key])
            enc[name] = {"ok": items}
        else:
            enc[name] = o
    return enc


def decode_outcomes(enc, arrays):
    """The inverse of encode_outcomes, given the case's arrays."""
    return {name: {"ok": [(lab, dt, arrays[key]) for lab, dt, key in o["ok"]]} if "ok" in o else o
            for name, o in enc.items()}


def record_difference(found, row, entry, deliberate):
    """A step whose outcomes differ: (b) when the generator tagged it with a declared deliberate difference, else
    (a); row is the scenario kind's [cases, steps, same, a, b, c] counts."""
    if deliberate:
        row[4] += 1
        found["b"].append(entry)
    else:
        row[3] += 1
        found["a"].append(entry)


def print_summary(summary, width, last_column):
    """Per scenario kind and in total: cases, steps, same, (a), (b) and the family's (c) column."""
    fmt = "%-" + str(width) + "s %6d %6d %6d %8d %14d %13d"
    print(("%-" + str(width) + "s %6s %6s %6s %8s %14s %13s") % ("scenario kind", "cases", "steps", "same",
                                                                 "(a) diff", "(b) deliberate", last_column))
    tot = [0] * 6
    for k in sorted(summary):
        r = summary[k]
        tot = [x + y for x, y in zip(tot, r)]
        print(fmt % ((k,) + tuple(r)))
    print(fmt % (("total",) + tuple(tot)))


def print_deliberate(found_b, doc):
    """The (b) differences grouped by the deliberate rule the generator named, one example each."""
    groups = {}
    for e in found_b:
        groups.setdefault(e[3], []).append(e)
    if groups:
        print("\n== (b) differences %s declares deliberate (%d)" % (doc, len(found_b)))
        for note, items in groups.items():
            where, call, lines, _ = items[0]
            print("* [%s] x%d, e.g. %s\n    %s" % (note, len(items), where, call))
            for ln in lines:
                print("    " + ln)
