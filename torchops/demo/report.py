"""Report: the summary table, and a PNG with the training curve and the serving latency histograms
(matplotlib, when it is installed; a note otherwise)."""
import os
from typing import List, Optional, Tuple


def table(rows: List[Tuple[str, str]], title: str = "summary") -> str:
    w = max(len(k) for k, _ in rows)
    v = max(len(val) for _, val in rows)
    line = "+" + "-" * (w + 2) + "+" + "-" * (v + 2) + "+"
    out = [line, f"| {title:<{w + v + 3}} |", line]
    out += [f"| {k:<{w}} | {val:<{v}} |" for k, val in rows]
    out.append(line)
    return "\n".join(out)


def plot(path: str, history, unbatched, batched, title: str) -> Optional[str]:
    """Writes the PNG; returns None on success, or the reason it was skipped."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no PNG written"
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in history]
    a.plot(steps, [r["loss"] for r in history], "o-", color="tab:blue", label="training-set loss")
    a.set_xlabel("global step")
    a.set_ylabel("training-set loss", color="tab:blue")
    a2 = a.twinx()
    a2.plot(steps, [100 * r["test_acc"] for r in history], "s-", color="tab:green", label="test accuracy")
    a2.axhline(95, color="tab:green", ls=":", lw=1)
    a2.set_ylabel("test accuracy (%)", color="tab:green")
    a.set_title("training")
    hi = max(max(unbatched.latencies_us), max(batched.latencies_us)) / 1000.0
    bins = [hi * i / 60 for i in range(61)]
    for r, c in ((unbatched, "tab:gray"), (batched, "tab:orange")):
        b.hist([v / 1000.0 for v in r.latencies_us], bins=bins, alpha=0.6, color=c,
               label=f"{r.name}: p50 {r.percentile(50) / 1000:.2f} ms, p99 {r.percentile(99) / 1000:.2f} ms")
    b.set_xlabel("request latency (ms)")
    b.set_ylabel("requests")
    b.set_title("serving, 16 client threads")
    b.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
