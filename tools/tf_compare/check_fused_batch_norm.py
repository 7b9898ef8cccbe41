"""Checker (run with the torch venv): replays gen_fused_batch_norm.py's cases through torchops.

Compared: y, batch_mean, batch_variance (and in training reserve_space_1/2, which are TF-CPU's batch mean and
biased variance), GradV3's three outputs, and in float32 training the second-order gradients. Not compared
(deliberate differences, docs/fused_batch_norm.md): reserve_space_3/4/5 shapes, inference reserve spaces (TF
leaves them uninitialized). Errors are relative to max(1, |TF|); y, x_backprop in float16/bfloat16 are
compared with one rounding step of tolerance. An output above tolerance still passes when torchops is no
further than 2x TF's distance from the exact answer (the same case run through torchops in float64):
ill-conditioned cases (large means, tiny variances) separate any two float32 implementations, and TF
accumulates in float32 where torchops flushes sums to double. Exits 1 on a real mismatch.
"""
import argparse
import glob
import os
import sys

import numpy as np
import torch

import torchops  # noqa: F401

TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def run_case(d, t, dt, fmt, training, eaf, eps, wide):
    """All compared outputs of one case; `wide` runs it in float64 (the exact reference)."""
    xdt, sdt = (torch.float64, torch.float64) if wide else (DT[dt], torch.float32)
    v = lambda k: t(k).to(sdt)  # noqa: E731
    x = t("x").to(DT[dt]).to(xdt)
    out = torch.ops.torchops.fused_batch_norm_v3(x, v("scale"), v("offset"), v("mean"), v("variance"), eps, eaf,
                                                 fmt, training)
    res = {"y": out[0], "batch_mean": out[1], "batch_variance": out[2]}
    if training:
        res.update(reserve_space_1=out[3], reserve_space_2=out[4])
    if "x_backprop" in d:
        dy = t("dy").to(DT[dt]).to(xdt).requires_grad_()
        xg = x.clone().requires_grad_()
        sc = v("scale").requires_grad_()
        g = torch.ops.torchops.fused_batch_norm_grad_v3(dy, xg, sc, v("rs1"), v("rs2"), torch.empty(0, dtype=sdt), eps,
                                                        fmt, training)
        res.update(x_backprop=g[0], scale_backprop=g[1], offset_backprop=g[2])
        if "d_dy" in d:
            loss = (g[0].to(sdt) * v("gx")).sum() + (g[1] * v("gs")).sum() + (g[2] * v("go")).sum()
            res.update(zip(("d_dy", "d_x", "d_scale"), torch.autograd.grad(loss, [dy, xg, sc])))
    return {k: r.detach().double() for k, r in res.items()}


def rel(a, b):
    return ((a - b).abs() / b.abs().clamp(min=1.0)).max().item() if b.numel() else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("indir")
    args = ap.parse_args()
    worst, bad, rescued = {}, [], 0
    files = sorted(glob.glob(os.path.join(args.indir, "fbn_*.npz")))
    for f in files:
        d = np.load(f)
        t = lambda k: torch.from_numpy(d[k])  # noqa: E731
        fmt, training, eaf, eps, dt = str(d["fmt"]), bool(d["training"]), float(d["eaf"]), float(d["eps"]), str(d["dtype"])
        ours = run_case(d, t, dt, fmt, training, eaf, eps, wide=False)
        exact = None
        for name, got in ours.items():
            ref = t(name).double()
            err = rel(got, ref)
            tol = TOL[dt] if name in ("y", "x_backprop") else (1e-4 if name.startswith("d_") else 2e-5)
            if err > tol:
                exact = exact or run_case(d, t, dt, fmt, training, eaf, eps, wide=True)
                if rel(got, exact[name]) <= 2 * rel(ref, exact[name]):
                    rescued += 1
                    continue
                bad.append(f"{os.path.basename(f)} {fmt} training={training} eaf={eaf} {dt} {name}: {err:.2e} > "
                           f"{tol:.0e} (torchops/TF from exact: {rel(got, exact[name]):.1e}/{rel(ref, exact[name]):.1e})")
            worst[(dt, name)] = max(worst.get((dt, name), 0.0), err)
    print(f"{len(files)} cases; worst relative error vs TF per dtype and output (within tolerance):")
    for k in sorted(worst):
        print(f"  {k[0]:9s} {k[1]:16s} {worst[k]:.2e}")
    print(f"{rescued} outputs above tolerance where torchops is closer to the exact answer than 2x TF")
    for line in bad:
        print("FAIL", line)
    return 1 if bad or not files else 0


if __name__ == "__main__":
    sys.exit(main())
