"""A chart of a saved run (`python -m torchops.bench --plot FILE.json OUT.png`): per case the time ratio
torchops / PyTorch, one panel per family, 1.0 marked (left of it torchops is faster). Batching's cases show
direct / batched requests per second (1 / speedup), so that left of 1.0 means the same there: nn.Batched
serves more than direct calls. A `--repeat` summary shows each case's median, with its worst run as a tick.
Needs matplotlib (optional: without it the command says so and exits with status 2).
"""
import json
import math
import sys
from typing import Dict, List, Tuple

from . import markdown

# (case label, value, worst value or None) per family
Series = Dict[str, List[Tuple[str, float, object]]]


def _batching_label(r: dict) -> str:
    mode = f"{r.get('mode', '?')} {r['model']}" if r.get("model") else str(r.get("mode", "?"))
    return f"{mode} c{r.get('clients', '?')} mb{r.get('max_batch', '?')}"


def series(data: dict) -> Series:
    """What the chart shows, from either JSON shape the bench writes."""
    out: Series = {}
    if "cases" in data:  # --repeat summary: the per-case median (and worst) of ratio, or of batching's speedup
        for c in data["cases"]:
            if c.get("value") == "ratio":
                out.setdefault(c["family"], []).append((c["case"], c["median"], c["worst"]))
            elif c.get("value") == "speedup" and c["family"] == "batching" and c["median"] > 0:
                out.setdefault(c["family"], []).append((c["case"], 1 / c["median"], 1 / c["worst"]))
        return out
    for family, result in data.get("results", {}).items():
        rows = [r for rows in (result.values() if isinstance(result, dict) else [result])
                for r in (rows if isinstance(rows, list) else []) if isinstance(r, dict)]
        for r in markdown.summary_rows(family, rows):
            if family == "batching":
                if isinstance(r.get("speedup"), (int, float)) and r["speedup"] > 0:
                    out.setdefault(family, []).append((_batching_label(r), 1 / r["speedup"], None))
            else:
                out.setdefault(family, []).append((str(r.get("case", "?")), r["ratio"], None))
    return {f: s for f, s in out.items() if s}


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = series(data)
    if not panels:
        raise ValueError("the file has no torchops / PyTorch ratios to plot (no `ratio` rows, no batching speedups)")
    heights = [max(1.5, 0.22 * len(s) + 0.8) for s in panels.values()]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights)), gridspec_kw={"height_ratios": heights},
                             squeeze=False)
    for ax, (family, items) in zip(axes[:, 0], panels.items()):
        labels = [label for label, _, _ in items]
        values = [v for _, v, _ in items]
        y = list(range(len(items)))
        # Bars grow from 1.0 (on a log axis a bar from 0 has no meaning); the axis is symmetric about 1.0.
        ax.barh(y, [v - 1 for v in values], left=1, color=["tab:green" if v <= 1 else "tab:red" for v in values],
                height=0.7)
        worst = [(i, w) for i, (_, _, w) in enumerate(items) if isinstance(w, (int, float))]
        if worst:
            ax.plot([w for _, w in worst], [i for i, _ in worst], "k|", markersize=8, label="worst run")
            ax.legend(loc="lower right", fontsize=7)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        span = 1.15 * max(abs(math.log(v)) for v in values + [w for _, w in worst] + [1.25])
        ax.set_xlim(math.exp(-span), math.exp(span))
        ticks = [t for t in (0.02, 0.05, 0.1, 0.25, 0.5, 0.8, 1, 1.25, 2, 4, 10, 20, 50)
                 if math.exp(-span) <= t <= math.exp(span) and (span < 1.5 or t not in (0.8, 1.25))]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        measure = ("direct / batched requests per second (left of 1: nn.Batched serves more)" if family == "batching"
                   else "torchops / PyTorch time (left of 1: torchops faster)")
        ax.set_title(f"{family}: {measure}", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    header = ", ".join(str(data[k]) for k in ("date", "machine", "gpu", "torch", "device") if data.get(k))
    fig.suptitle(f"torchops benchmarks: {header}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / sum(heights)))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(json_path: str, out_path: str) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("python -m torchops.bench --plot needs matplotlib, which is not installed "
              "(pip install matplotlib); `--markdown FILE.json` prints the same results as tables",
              file=sys.stderr)
        return 2
    with open(json_path) as f:
        data = json.load(f)
    try:
        plot(data, out_path)
    except ValueError as e:
        print(f"python -m torchops.bench --plot {json_path}: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out_path}")
    return 0
