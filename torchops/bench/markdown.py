"""Markdown tables from `python -m torchops.bench --json FILE` output (`python -m torchops.bench --markdown FILE`).

Accepts both JSON shapes the bench writes: a single run (per-family rows with times and ratios) and a
`--repeat N` summary (per case: median and worst ratio over the fresh-process runs). The header names the
date, machine, torch version, device and thread count recorded in the file.
"""
import json
import platform
import sys
from datetime import datetime, timezone
from typing import Dict, List

# Diagnostic columns of single runs that a reference table leaves out (they explain a number, they are not one).
_DIAGNOSTIC = ("faults", "clone", "aten_mul", "ratio_min", "ratio_max", "GB/s", "cpus")
# Summary values of `--repeat` runs shown in the table: ratios, and batching's throughput ratios (the others
# are diagnostics).
_REPEAT_VALUES = ("ratio", "ratio_med", "speedup", "of_ceiling", "of_compute_now", "of_pipeline_ceiling")


def machine_description() -> str:
    """CPU model and logical core count (Linux), else the platform's processor string."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import os
    return f"{model or platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def run_metadata(device: str) -> Dict[str, object]:
    """What every JSON file records about the run (the Markdown header shows it)."""
    import torch
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "torch": torch.__version__,
            "device": device, "threads": torch.get_num_threads(), "machine": machine_description()}
    if device.startswith("cuda") and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    return meta


def _fmt(v) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return str(v)
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _table(columns: List[str], rows: List[List[str]]) -> List[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _header(data: dict) -> List[str]:
    fields = [("date", "date"), ("machine", "machine"), ("gpu", "GPU"), ("torch", "torch"),
              ("device", "device"), ("threads", "threads")]
    parts = [f"{label} {data[key]}" for key, label in fields if data.get(key) not in (None, "")]
    lines = ["Run: " + ", ".join(parts) + "." if parts else "Run: (no metadata recorded)."]
    if data.get("command"):
        lines.append(f"Command: `{data['command']}`.")
    return lines


def _tables(rows: List[dict]) -> List[str]:
    """One table per run of consecutive rows that share their (non-diagnostic) columns."""
    lines: List[str] = []
    groups: List[List[dict]] = []
    keys: List[tuple] = []
    for r in rows:
        k = tuple(c for c in r if not any(d in c for d in _DIAGNOSTIC))
        if not groups or k != keys[-1]:
            groups.append([])
            keys.append(k)
        groups[-1].append(r)
    for columns, group in zip(keys, groups):
        lines += [""] + _table(list(columns), [[_fmt(r.get(c, "-")) for c in columns] for r in group])
    return lines


def _single_run(data: dict) -> List[str]:
    lines: List[str] = []
    for family, result in data.get("results", {}).items():
        # A family returns a list of rows, or a dict of named lists (one per table it prints).
        named = result if isinstance(result, dict) else {"": result}
        body: List[str] = []
        for name, rows in named.items():
            rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
            if rows:
                body += ([f"", f"{name}:"] if name else []) + _tables(rows)
        if body:
            lines += ["", f"### {family}"] + body
    return lines


def _repeated(data: dict) -> List[str]:
    lines: List[str] = []
    by_family: Dict[str, List[dict]] = {}
    for c in data.get("cases", []):
        if c.get("value") in _REPEAT_VALUES:
            by_family.setdefault(c["family"], []).append(c)
    for family, cases in by_family.items():
        lines += ["", f"### {family}", ""]
        lines += _table(["case", "value", "median", "worst", "runs"],
                        [[c["case"], c["value"], _fmt(c["median"]), _fmt(c["worst"]),
                          " ".join(_fmt(v) for v in c["runs"])] for c in cases])
    return lines


def to_markdown(data: dict) -> str:
    """One Markdown section (header lines and one table per family) for one JSON file."""
    lines = _header(data)
    if "cases" in data:
        lines.append(f"Median and worst over {data.get('repeat', '?')} fresh-process runs of the ratio "
                     "torchops / PyTorch-native (below 1: torchops faster).")
        lines += _repeated(data)
    else:
        lines.append("One run; `ratio` is torchops / PyTorch-native (below 1: torchops faster).")
        lines += _single_run(data)
    return "\n".join(lines) + "\n"


def main(paths: List[str]) -> int:
    for i, path in enumerate(paths):
        with open(path) as f:
            data = json.load(f)
        if i:
            sys.stdout.write("\n")
        sys.stdout.write(to_markdown(data))
    return 0
