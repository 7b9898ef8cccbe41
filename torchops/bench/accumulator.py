"""ConditionalAccumulator: apply_gradient throughput vs an in-place `Tensor.add_` of the same tensors, take
latency, and SyncReplicas training steps/s (4 worker threads vs a single-threaded loop over the same shards).

* apply: `handle.apply_grad(step, g)` (a custom-class method call from Python: lock, checks, the in-place
  accumulation kernel) against `buf.add_(g)`; at 64 KB the per-call overhead dominates, so the same pair
  is also timed as a TorchScript loop of 100 calls (`script x100`), which removes the Python call cost.
* take latency: a taker thread blocked in `take_grad(1)`; the time from the start of the last (and only)
  apply to the take's return in the taker (wake-up + finishing the mean), next to one apply alone.
* sync replicas: `train_sync_replicas(mode="threads")` with 4 workers and replicas_to_aggregate=4, against a
  plain loop that computes the 4 shards' gradients one after the other, averages and steps.
"""
import statistics
import threading
import time

import torch
from torch import nn

from ._timing import median_seconds, print_table, side_by_side

SIZES = [("64KB", 16 * 1024), ("4MB", 1024 * 1024), ("64MB", 16 * 1024 * 1024)]


@torch.jit.script
def _script_apply(h: torch.classes.torchops.ConditionalAccumulator, g: torch.Tensor, n: int) -> None:
    for _ in range(n):
        h.apply_grad(0, g)


@torch.jit.script
def _script_add(buf: torch.Tensor, g: torch.Tensor, n: int) -> None:
    for _ in range(n):
        buf.add_(g)


def _apply_rows(device, args):
    rows = []
    min_time = 0.1 if args.quick else 0.3
    rounds = 1 if args.quick else 3
    for label, n in SIZES:
        g = torch.randn(n, device=device)
        buf = torch.randn(n, device=device)
        q = torch.classes.torchops.ConditionalAccumulator(torch.float32, [n], "", "", "SUM")
        q.apply_grad(0, g)  # (the first apply of a round copies; the timed ones add in place)
        t_ours, t_nat = side_by_side(lambda: q.apply_grad(0, g), lambda: buf.add_(g), device, rounds=rounds,
                                     min_time=min_time)
        rows.append({"case": f"apply {label}", "torchops_us": t_ours * 1e6, "add__us": t_nat * 1e6,
                     "ratio": t_ours / t_nat, "torchops_GB/s": 3 * n * 4 / t_ours / 1e9})
        if label == "64KB":
            t_ours, t_nat = side_by_side(lambda: _script_apply(q, g, 100), lambda: _script_add(buf, g, 100), device,
                                         rounds=rounds, min_time=min_time)
            rows.append({"case": f"apply {label} script x100", "torchops_us": t_ours * 1e6 / 100,
                         "add__us": t_nat * 1e6 / 100, "ratio": t_ours / t_nat,
                         "torchops_GB/s": 3 * n * 4 * 100 / t_ours / 1e9})
        q.close()
    print_table("accumulator apply_gradient (float32) vs Tensor.add_, per call", rows,
                ["case", "torchops_us", "add__us", "ratio", "torchops_GB/s"])
    return rows


def _take_rows(device, args):
    rows = []
    reps = 20 if args.quick else 100
    for label, n in SIZES[:2]:
        g = torch.randn(n, device=device)
        lat = []
        for _ in range(reps):
            q = torch.classes.torchops.ConditionalAccumulator(torch.float32, [n], "", "", "MEAN")
            done = {}

            def taker():
                q.take_grad(1, None)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                done["t"] = time.perf_counter()

            t = threading.Thread(target=taker)
            t.start()
            time.sleep(0.002)  # let it block
            t0 = time.perf_counter()
            q.apply_grad(0, g)
            t.join()
            lat.append(done["t"] - t0)
        q = torch.classes.torchops.ConditionalAccumulator(torch.float32, [n], "", "", "SUM")
        q.apply_grad(0, g)
        t_apply = median_seconds(lambda: q.apply_grad(0, g), device, 0.1)
        rows.append({"case": f"take after last apply {label}", "latency_us": statistics.median(lat) * 1e6,
                     "apply_alone_us": t_apply * 1e6})
    print_table("accumulator take_gradient: blocked taker, time from the last apply to the take's return", rows,
                ["case", "latency_us", "apply_alone_us"])
    return rows


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


def _optimizer(params):
    return torch.optim.SGD(params, lr=0.01)


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _sync_rows(device, args):
    from ..optim import train_sync_replicas

    workers, steps = 4, (10 if args.quick else 40)
    g = torch.Generator().manual_seed(0)
    shards = [[(torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(4)]
              for _ in range(workers)]

    def sync():
        return train_sync_replicas(_model, _optimizer, _loss, shards, num_workers=workers,
                                   replicas_to_aggregate=workers, num_steps=steps, mode="threads", timeout=120)

    def single():
        model = _model()
        opt = _optimizer(model.parameters())
        params = list(model.parameters())
        for s in range(steps):
            total = None
            for w in range(workers):
                model.zero_grad(set_to_none=True)
                _loss(model, shards[w][s % 4]).backward()
                total = [p.grad.clone() for p in params] if total is None else [t.add_(p.grad) for t, p in
                                                                              zip(total, params)]
            for p, t in zip(params, total):
                p.grad = t.div_(workers)
            opt.step()

    reps = 1 if args.quick else 3
    t_sync = statistics.median(_timed(sync) for _ in range(reps))
    t_single = statistics.median(_timed(single) for _ in range(reps))
    rows = [{"case": f"MLP 256-512-256-10, batch 64/worker, {workers} workers", "sync_threads_steps/s": steps / t_sync,
             "single_loop_steps/s": steps / t_single, "speedup": t_single / t_sync}]
    print_table(f"SyncReplicas (threads, replicas_to_aggregate={workers}) vs single-threaded loop over the same shards",
                rows, ["case", "sync_threads_steps/s", "single_loop_steps/s", "speedup"])
    return rows


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(args):
    device = torch.device(args.device)
    rows = _apply_rows(device, args) + _take_rows(device, args)
    if device.type == "cpu":
        rows += _sync_rows(device, args)
    return rows
