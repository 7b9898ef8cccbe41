"""Timing helpers shared by the benchmark families."""
import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

try:
    import resource
except ImportError:  # not on Windows
    resource = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast_dtypes(device: torch.device) -> List[torch.dtype]:
    """The autocast dtypes the mixed-precision rows run: bfloat16 on the CPU, float16 and bfloat16 on CUDA."""
    return [torch.float16, torch.bfloat16] if device.type == "cuda" else [torch.bfloat16]


def under_autocast(fn: Callable[[], object], device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    """fn() run inside torch.autocast(device, dtype)."""
    def run():
        with torch.autocast(device.type, dtype=dtype):
            return fn()
    return run


def median_seconds(fn: Callable[[], object], device: torch.device, min_time: float = 0.5, warmup: int = 3,
                   max_reps: int = 200) -> float:
    """Median wall time of fn() over repetitions that together take about `min_time` seconds. On CUDA each
    sample is a run of calls issued back to back with one synchronisation at its end (about 1 ms of work), as a
    training step issues them: the time per call is then the GPU's, not a host round trip per call."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times: List[float] = []
    if device.type == "cuda":
        t0 = time.perf_counter()
        fn()
        _sync(device)
        calls = max(1, min(100, int(1e-3 / max(time.perf_counter() - t0, 1e-7))))
        budget_end = time.perf_counter() + min_time
        while len(times) < 5 or (time.perf_counter() < budget_end and len(times) < max_reps):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(device)
            times.append((time.perf_counter() - t0) / calls)
        return statistics.median(times)
    budget_end = time.perf_counter() + min_time
    while len(times) < 5 or (time.perf_counter() < budget_end and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def faults_per_call(fn: Callable[[], object], device: torch.device, calls: int = 10) -> Optional[float]:
    """Minor page faults per call of fn() (getrusage; None where unavailable). A fresh large output whose
    pages the allocator gave back to the OS faults in again on every call: on a VM each fault costs
    microseconds, so a few thousand per call can double a memory-bound op's time."""
    if resource is None:
        return None
    fn()
    _sync(device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    _sync(device)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def side_by_side(ours: Callable[[], object], native: Callable[[], object], device: torch.device, rounds: int = 3,
                 min_time: float = 0.3):
    """Median times of two callables measured in alternating rounds (so drift hits both alike)."""
    r = compare(ours, native, device, rounds, min_time)
    return r["torchops_ms"] / 1e3, r["native_ms"] / 1e3


def compare(ours: Callable[[], object], native: Callable[[], object], device: torch.device, rounds: int = 3,
            min_time: float = 0.3, floor: Optional[Callable[[], object]] = None, floor_name: str = "floor",
            others: Optional[Dict[str, Callable[[], object]]] = None) -> dict:
    """side_by_side, plus the spread of the per-round ratio (min / median / max): one median hides how far
    single rounds wander on a noisy machine. `floor` (e.g. x.clone(), the least memory traffic the op can
    have) is timed in the same rounds, so that ours / floor compares runs made in the same machine state:
    adds `<floor_name>_ms` and `torchops/<floor_name>` (the median of the per-round ratios). `others` (name ->
    callable, e.g. an ATen op with the same traffic) are timed in the same rounds too and compared with the
    floor alike: `<name>_ms` and `<name>/<floor_name>`."""
    others = others or {}
    a, b, f = [], [], []
    o: Dict[str, List[float]] = {name: [] for name in others}
    for _ in range(rounds):
        a.append(median_seconds(ours, device, min_time))
        b.append(median_seconds(native, device, min_time))
        if floor is not None:
            f.append(median_seconds(floor, device, min_time))
        for name, fn in others.items():
            o[name].append(median_seconds(fn, device, min_time))
    ratios = [x / y for x, y in zip(a, b)]
    t_ours, t_nat = statistics.median(a), statistics.median(b)
    row = {"torchops_ms": t_ours * 1e3, "native_ms": t_nat * 1e3, "ratio": t_ours / t_nat,
           "ratio_min": min(ratios), "ratio_med": statistics.median(ratios), "ratio_max": max(ratios)}
    if floor is not None:
        row[f"{floor_name}_ms"] = statistics.median(f) * 1e3
        row[f"torchops/{floor_name}"] = statistics.median([x / y for x, y in zip(a, f)])
    for name, times in o.items():
        row[f"{name}_ms"] = statistics.median(times) * 1e3
        if floor is not None:
            row[f"{name}/{floor_name}"] = statistics.median([x / y for x, y in zip(times, f)])
    return row


RATIO_COLUMNS = ["ratio", "ratio_min", "ratio_med", "ratio_max"]


def compare_cases(cases, args, device: torch.device, title: str, rounds: int = 5) -> List[dict]:
    """Times (name, ours, native) cases side by side with `compare` (one round with --quick), prints the table
    and returns the rows."""
    rows = []
    for name, ours, native in cases:
        if not any(c in name for c in getattr(args, "case", "").split("|")):
            continue
        rows.append({"case": name, **compare(ours, native, device, rounds=1 if args.quick else rounds,
                                            min_time=0.1 if args.quick else 0.3)})
    print_table(title, rows, ["case", "torchops_ms", "native_ms"] + RATIO_COLUMNS)
    return rows


def print_table(title: str, rows: List[dict], columns: List[str]) -> None:
    print(f"\n== {title}")
    widths = [max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).ljust(w) for c, w in zip(columns, widths)))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)
