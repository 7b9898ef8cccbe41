"""`python -m torchops.bench [--json FILE] [--filter NAME] [--device cpu|cuda] [--quick] [--repeat N] [--precision P]`

Times each torchops op against the best PyTorch-native equivalent, side by side in one process, and
prints medians and the ratio torchops/native (below 1 = torchops faster). One module per family.
`python -m torchops.bench --markdown FILE.json [...]` prints a saved run as Markdown tables (docs/benchmarks.md),
one summary table per family; `python -m torchops.bench --plot FILE.json OUT.png` draws its ratios (matplotlib).
The columns below stay in the JSON file and the printed tables.
`--route ROUTE` (a route id of `python -m torchops.info`) runs the chosen families twice in the process, with the
default routes and with ROUTE preferred (torchops.backends.prefer), and prints per case `route/default`, the
torchops side's time with the route over its time with the defaults.

Columns:
  torchops_ms, native_ms   median time per call of each side (us columns likewise, in microseconds)
  ratio                    torchops_ms / native_ms
  ratio_min/med/max        spread of the per-round ratio; each round times both sides back to back, so a
                           swing of the machine between rounds cancels out in ratio_med but not in ratio
  *_GB/s                   bytes the case must move (inputs read, outputs written) per second
  *_faults                 minor page faults per call (a large output faulted in again on every call)
--repeat N runs the whole comparison N times, each in a fresh process, and prints per case the median and the
worst of ratio and ratio_med (one run's median hides how much runs differ on a noisy machine).
FusedBatchNorm's inference rows also time, in the same rounds:
  clone_ms, clone/native   x.clone(): the least memory traffic any inference pass must have
  torchops/clone           the op against that floor
  aten_mul/clone           ATen's x * 2, a computing pass with the same traffic
  clone_again/clone        x.clone() a second time: the benchmark's own noise
  ops_clone/clone          torch.ops.aten.clone(x): the copy through the torch.ops calling path the op uses
Other families print their own columns (throughput, latency percentiles, speedups); each family module's
docstring says what it measures.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

import torchops  # noqa: F401  (loads the ops)

from . import batching, block_rnn, fused_batch_norm
from . import cudnn_rnn
from . import accumulator
from . import cudnn_rnn_nn
from . import markdown
from . import plot

# filter keyword -> family module; each exposes run(args) -> list of result dicts (and prints its table)
FAMILIES = {
    "bn": fused_batch_norm,
    "rnn": block_rnn,
    "batching": batching,
    "cudnn_rnn": cudnn_rnn,
    "accumulator": accumulator,
    "cudnn_rnn_nn": cudnn_rnn_nn,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchops.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--filter", default="", help=f"a family name runs that family; otherwise families whose name contains this ({', '.join(FAMILIES)})")
    p.add_argument("--case", default="", help="only the cases whose name contains this, or one of A|B|... "
                   "(families that time named cases side by side: rnn, cudnn_rnn, cudnn_rnn_nn)")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="shorter timings (for smoke runs)")
    p.add_argument("--precision", choices=["fp32", "tf32", "both"], default="both",
                   help="CUDA only: float32 matmuls and convolutions in full FP32 (torch.backends.cuda.matmul."
                        "allow_tf32 and torch.backends.cudnn.allow_tf32 off), in TF32 (both on), or both runs; "
                        "both sides of every comparison run under the same setting")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole comparison N times, each in a fresh process, then print the median and the "
                        "worst ratio per case")
    p.add_argument("--route", default=None, help="also time the torchops side with this route preferred and print "
                   "its time over the default routes' (route/default) per case")
    p.add_argument("--markdown", nargs="+", metavar="FILE.json", default=None,
                   help="print these saved --json results as Markdown tables and exit (runs nothing)")
    p.add_argument("--plot", nargs=2, metavar=("FILE.json", "OUT.png"), default=None,
                   help="draw a saved --json result (per case the ratio torchops / PyTorch, one panel per family, 1.0 "
                        "marked) into OUT.png and exit (runs nothing; needs matplotlib)")
    args = p.parse_args(argv)
    if args.markdown:
        return markdown.main(args.markdown)
    if args.plot:
        return plot.main(*args.plot)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    # An exact family name runs that family alone (`rnn` is the block RNN family, not every RNN family).
    chosen = ({args.filter: FAMILIES[args.filter]} if args.filter in FAMILIES
              else {k: m for k, m in FAMILIES.items() if args.filter in k})
    if not chosen:
        print(f"no benchmark family matches --filter {args.filter!r}; families: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    if args.route:
        torchops.backends.prefer(args.route)  # (an unknown route fails here, listing the known ones)
    if args.repeat > 1:
        return _repeat(args)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    results = {}
    info = {"torch": torch.__version__, "device": args.device}
    if torch.device(args.device).type != "cuda":
        for key, module in chosen.items():
            results[key] = _run_family(module, args)
    else:
        info["device_name"] = torch.cuda.get_device_name(torch.device(args.device))
        info["cudnn"] = torch.backends.cudnn.version()
        print(f"card {info['device_name']}, CUDA {torch.version.cuda}, cuDNN {info['cudnn']}")
        for precision in (["fp32", "tf32"] if args.precision == "both" else [args.precision]):
            _set_tf32(precision == "tf32")
            print(f"\n######## {precision}: torch.backends.cuda.matmul.allow_tf32="
                  f"{torch.backends.cuda.matmul.allow_tf32}, torch.backends.cudnn.allow_tf32="
                  f"{torch.backends.cudnn.allow_tf32} (both sides)", flush=True)
            for key, module in chosen.items():
                rows = _run_family(module, args)
                for row in rows:
                    if isinstance(row, dict) and "case" in row:
                        row["case"] = f"{precision} {row['case']}"
                        row["precision"] = precision
                results.setdefault(key, []).extend(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**info, **markdown.run_metadata(args.device), "command": _command(args), "results": results},
                      f, indent=1)
    return 0


def _run_family(module, args):
    """module.run(args); with --route, also with that route preferred, and `route/default` per case."""
    rows = module.run(args)
    if not args.route:
        return rows
    print(f"\n== with route {args.route} preferred", flush=True)
    with torchops.backends.prefer(args.route):
        routed = module.run(args)
    default_ms = {r["case"]: r.get("torchops_ms") for r in rows if isinstance(r, dict) and "case" in r}
    for r in routed:
        base = default_ms.get(r.get("case")) if isinstance(r, dict) else None
        if base and r.get("torchops_ms"):
            r["route"], r["default_ms"], r["route/default"] = args.route, base, r["torchops_ms"] / base
    width = max([len(str(r.get("case", ""))) for r in routed] + [4])
    print(f"{'case'.ljust(width)}  default_ms  route_ms  route/default")
    for r in routed:
        if isinstance(r, dict) and "route/default" in r:
            print(f"{r['case'].ljust(width)}  {r['default_ms']:<10.4f}  {r['torchops_ms']:<8.4f}  {r['route/default']:.3f}")
    return routed


def _set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


# Per-case values summarised over --repeat runs: name -> the row key it is read from (rows without it are skipped).
# "ratio" is the ratio of the two sides' median times; "ratio_med" the median of the per-round ratios, each from
# one round in which both sides ran back to back, so that a swing of the machine between rounds cancels out.
REPEATED = {"ratio": "ratio", "ratio_med": "ratio_med", "torchops/clone": "torchops/clone",
            "aten_mul/clone": "aten_mul/clone", "clone_again/clone": "clone_again/clone",
            "ops_clone/clone": "ops_clone/clone", "speedup": "speedup", "of_ceiling": "of_ceiling",
            "of_compute_now": "of_compute_now", "of_batcher_ceiling": "of_batcher_ceiling",
            "of_pipeline_ceiling": "of_pipeline_ceiling", "pipeline_speedup": "pipeline_speedup",
            "batcher_us_per_req": "batcher_us_per_req", "cpu_us_per_req": "cpu_us_per_req",
            "route/default": "route/default"}
# Values where more is better (throughput ratios): their worst run is the smallest.
HIGHER_IS_BETTER = {"speedup", "of_ceiling", "of_compute_now", "of_batcher_ceiling", "of_pipeline_ceiling",
                    "pipeline_speedup"}


def _command(args) -> str:
    """The command line that reproduces this run (recorded in the JSON file)."""
    parts = ["python -m torchops.bench"] + ([f"--filter {args.filter}"] if args.filter else [])
    parts += [f"--device {args.device}"] + (["--quick"] if args.quick else [])
    parts += [f"--case '{args.case}'"] if args.case else []
    parts += [f"--route {args.route}"] if args.route else []
    return " ".join(parts + ([f"--repeat {args.repeat}"] if args.repeat > 1 else []))


def _repeat(args) -> int:
    """Fresh processes, so that heap state, page faults and thread placement of one run do not carry over."""
    per_case = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.repeat):
            out = os.path.join(tmp, f"run{run}.json")
            cmd = [sys.executable, "-m", "torchops.bench", "--filter", args.filter, "--device", args.device,
                   "--json", out, "--precision", args.precision, "--case", args.case] + (["--quick"] if args.quick else [])
            cmd += ["--route", args.route] if args.route else []
            print(f"\n#### run {run + 1}/{args.repeat} (fresh process)", flush=True)
            rc = subprocess.run(cmd).returncode
            if rc != 0:
                print(f"run {run + 1} failed with exit status {rc}", file=sys.stderr)
                return rc
            with open(out) as f:
                data = json.load(f)
            for family, rows in data["results"].items():
                for row in rows if isinstance(rows, list) else []:
                    if isinstance(row, dict) and "case" in row:
                        for name, key in REPEATED.items():
                            if isinstance(row.get(key), (int, float)):
                                per_case.setdefault((family, row["case"], name), []).append(row[key])
    print(f"\n== over {args.repeat} fresh-process runs: median and worst per case (largest; smallest for "
          f"{', '.join(sorted(HIGHER_IS_BETTER))})")
    width = max((len(c) for _, c, _ in per_case), default=4)
    print(f"{'case'.ljust(width)}  {'value'.ljust(14)}  median  worst   runs")
    for (family, case, name), values in per_case.items():
        runs = " ".join(f"{v:.2f}" for v in values)
        worst = min(values) if name in HIGHER_IS_BETTER else max(values)
        print(f"{case.ljust(width)}  {name.ljust(14)}  {statistics.median(values):<6.3f}  {worst:<6.3f}  {runs}")
    if args.json:
        with open(args.json, "w") as f:
            cases = [{"family": fam, "case": c, "value": n, "median": statistics.median(v),
                      "worst": min(v) if n in HIGHER_IS_BETTER else max(v), "runs": v}
                     for (fam, c, n), v in per_case.items()]
            json.dump({**markdown.run_metadata(args.device), "command": _command(args), "repeat": args.repeat,
                       "cases": cases}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
