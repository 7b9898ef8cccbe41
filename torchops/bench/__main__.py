"""`python -m torchops.bench [--json FILE] [--filter NAME] [--device cpu|cuda] [--quick]`

Times each torchops op against the best PyTorch-native equivalent, side by side in one process, and
prints medians and the ratio torchops/native (below 1 = torchops faster). One module per family.
"""
import argparse
import json
import sys

import torch

import torchops  # noqa: F401  (loads the ops)

from . import batching, block_rnn, fused_batch_norm
from . import cudnn_rnn
from . import cudnn_rnn_nn

# filter keyword -> family module; each exposes run(args) -> list of result dicts (and prints its table)
FAMILIES = {
    "bn": fused_batch_norm,
    "rnn": block_rnn,
    "batching": batching,
    "cudnn_rnn": cudnn_rnn,
    "cudnn_rnn_nn": cudnn_rnn_nn,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchops.bench", description=__doc__.splitlines()[0])
    p.add_argument("--filter", default="", help=f"run only families whose keyword contains this ({', '.join(FAMILIES)})")
    p.add_argument("--json", default=None, help="write all results to this JSON file")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="shorter timings (for smoke runs)")
    args = p.parse_args(argv)
    chosen = {k: m for k, m in FAMILIES.items() if args.filter in k}
    if not chosen:
        print(f"no benchmark family matches --filter {args.filter!r}; families: {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    results = {}
    for key, module in chosen.items():
        results[key] = module.run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": args.device, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
