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
        k = tuple(c for c in r if not any(d in c for d in _DIAGNOSTIC) and c != "table")
        if not groups or k != keys[-1]:
            groups.append([])
            keys.append(k)
        groups[-1].append(r)
    for columns, group in zip(keys, groups):
        lines += [""] + _table(list(columns), [[_fmt(r.get(c, "-")) for c in columns] for r in group])
    return lines


_UNITS = {"_ms": "ms", "_us": "µs"}


def time_pair(row: dict):
    """(torchops key, PyTorch key, unit) of a row that times torchops against PyTorch (a `torchops_ms` or
    `torchops_us` column, the first other column in the same unit and a `ratio`), else None."""
    if not isinstance(row.get("ratio"), (int, float)):
        return None
    for suffix, unit in _UNITS.items():
        ours = next((k for k in row if k.startswith("torchops_") and k.endswith(suffix)), None)
        if ours is None:
            continue
        theirs = next((k for k in row if k != ours and k.endswith(suffix) and k != "case"
                       and not any(d in k for d in _DIAGNOSTIC)), None)
        if theirs is not None:
            return ours, theirs, unit
    return None


def _pair(row: dict, a: str, b: str) -> str:
    return f"{_fmt(row.get(a, '-'))} / {_fmt(row.get(b, '-'))}"


# The batching summary: throughput and latency of nn.Batched against direct calls of the same model. Diagnostic
# columns (CPU time per request, mean batch, queue wait, ceilings) stay in the JSON and the printed tables.
_BATCHING_COLUMNS = [
    ("mode", lambda r: f"{r.get('mode', '-')} {r['model']}" if r.get("model") else str(r.get("mode", "-"))),
    ("clients", lambda r: _fmt(r.get("clients", "-"))),
    ("max batch", lambda r: _fmt(r.get("max_batch", "-"))),
    ("batch threads", lambda r: _fmt(r.get("nbt", "-"))),  # the better num_batch_threads (summary_rows)
    ("direct req/s", lambda r: _fmt(r.get("unbatched_req/s", "-"))),
    ("batched req/s", lambda r: _fmt(r.get("batched_req/s", "-"))),
    ("speedup", lambda r: _fmt(r.get("speedup", "-"))),
    ("direct p50 / p99 µs", lambda r: _pair(r, "unbatched_p50_us", "unbatched_p99_us")),
    ("batched p50 / p99 µs", lambda r: _pair(r, "batched_p50_us", "batched_p99_us")),
]
_ADDED_LATENCY_COLUMNS = [
    ("mode", lambda r: str(r.get("mode", "-"))),
    ("batch_timeout_micros", lambda r: _fmt(r.get("batch_timeout_us", "-"))),
    ("direct p50 µs", lambda r: _fmt(r.get("unbatched_p50_us", "-"))),
    ("batched p50 / p99 µs", lambda r: _pair(r, "batched_p50_us", "batched_p99_us")),
    ("added p50 µs", lambda r: _fmt(r.get("added_p50_us", "-"))),
]
# Row tables (a row's "table" key) left out of the page: they explain the summary, they are not one.
_DIAGNOSTIC_TABLES = ("ceiling",)


def _columns_table(columns, rows: List[dict]) -> List[str]:
    return _table([name for name, _ in columns], [[get(r) for _, get in columns] for r in rows])


def summary_rows(family: str, rows: List[dict]) -> List[dict]:
    """The rows a family's summary table and chart show: torchops against PyTorch, one row per case."""
    if family == "batching":
        # One row per mode, model, clients and max batch: the num_batch_threads setting that served more.
        best: Dict[tuple, dict] = {}
        for r in rows:
            if r.get("table") in ("throughput", "cuda_cpp"):
                key = (r.get("mode"), r.get("model"), r.get("clients"), r.get("max_batch"))
                if key not in best or r.get("batched_req/s", 0) > best[key].get("batched_req/s", 0):
                    best[key] = r
        return list(best.values())
    return [r for r in rows if time_pair(r)]


def _family_tables(family: str, rows: List[dict]) -> List[str]:
    summary = summary_rows(family, rows)
    lines: List[str] = []
    if family == "batching":
        if summary:
            lines += [""] + _columns_table(_BATCHING_COLUMNS, summary)
        added = [r for r in rows if r.get("table") == "added_latency"]
        if added:
            lines += ["", "Added latency per request at low load (one client):", ""]
            lines += _columns_table(_ADDED_LATENCY_COLUMNS, added)
        shown = {id(r) for r in rows if r.get("table") in ("throughput", "cuda_cpp", "added_latency")}
    else:
        if summary:
            body = []
            for r in summary:
                ours, theirs, unit = time_pair(r)
                native = theirs[:-3]  # the column's name without its unit: what the PyTorch side ran
                body.append([str(r.get("case", "-")), f"{_fmt(r[ours])} {unit}",
                             f"{_fmt(r[theirs])} {unit}" + ("" if native == "native" else f" (`{native}`)"),
                             _fmt(r["ratio"])])
            lines += [""] + _table(["case", "torchops", "PyTorch", "ratio"], body)
        shown = {id(r) for r in summary}
    rest = [r for r in rows if id(r) not in shown and r.get("table") not in _DIAGNOSTIC_TABLES]
    if rest:
        lines += ["", "Also measured:"] + _tables(rest)
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
                body += ([f"", f"{name}:"] if name else []) + _family_tables(family, rows)
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
        lines.append("One run; `ratio` is torchops / PyTorch time (below 1: torchops faster); batching's `speedup` "
                     "is batched / direct requests per second (above 1: batching serves more).")
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
