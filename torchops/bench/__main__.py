"""`python -m torchops.bench [--json FILE] [--filter NAME] [--device cpu|cuda] [--quick] [--repeat N]`

Times each torchops op against the best PyTorch-native equivalent, side by side in one process, and
prints medians and the ratio torchops/native (below 1 = torchops faster). One module per family.
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
    p = argparse.ArgumentParser(prog="python -m torchops.bench", description=__doc__.splitlines()[0])
    p.add_argument("--filter", default="", help=f"a family name runs that family; otherwise families whose name contains this ({', '.join(FAMILIES)})")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="shorter timings (for smoke runs)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole comparison N times, each in a fresh process, then print the median and the "
                        "worst ratio per case")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error(f"--repeat must be at least 1, got {args.repeat}")
    # An exact family name runs that family alone (`rnn` is the block RNN family, not every RNN family).
    chosen = ({args.filter: FAMILIES[args.filter]} if args.filter in FAMILIES
              else {k: m for k, m in FAMILIES.items() if args.filter in k})
    if not chosen:
        print(f"no benchmark family matches --filter {args.filter!r}; families: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    if args.repeat > 1:
        return _repeat(args)
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    results = {}
    for key, module in chosen.items():
        results[key] = module.run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": args.device, "results": results}, f, indent=1)
    return 0


# Per-case values summarised over --repeat runs: name -> the row key it is read from (rows without it are skipped).
# "ratio" is the ratio of the two sides' median times; "ratio_med" the median of the per-round ratios, each from
# one round in which both sides ran back to back, so that a swing of the machine between rounds cancels out.
REPEATED = {"ratio": "ratio", "ratio_med": "ratio_med", "torchops/clone": "torchops/clone",
            "aten_mul/clone": "aten_mul/clone", "clone_again/clone": "clone_again/clone",
            "ops_clone/clone": "ops_clone/clone", "speedup": "speedup", "of_ceiling": "of_ceiling",
            "of_compute_now": "of_compute_now"}
# Values where more is better (throughput ratios): their worst run is the smallest.
HIGHER_IS_BETTER = {"speedup", "of_ceiling", "of_compute_now"}


def _repeat(args) -> int:
    """Fresh processes, so that heap state, page faults and thread placement of one run do not carry over."""
    per_case = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.repeat):
            out = os.path.join(tmp, f"run{run}.json")
            cmd = [sys.executable, "-m", "torchops.bench", "--filter", args.filter, "--device", args.device,
                   "--json", out] + (["--quick"] if args.quick else [])
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
            json.dump({"repeat": args.repeat, "cases": [
                {"family": fam, "case": c, "value": n, "median": statistics.median(v),
                 "worst": min(v) if n in HIGHER_IS_BETTER else max(v), "runs": v}
                for (fam, c, n), v in per_case.items()]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
