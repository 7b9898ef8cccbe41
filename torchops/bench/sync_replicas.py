"""Synchronous replicas across processes with a straggler: `run_sync_replicas` (1 parameter server + 4 worker
processes, replicas_to_aggregate=3: one backup worker) against `DistributedDataParallel` (gloo, 4 processes),
both on 127.0.0.1 with the same model, batches and per-step delay of one worker.

Columns (steps/s over the steps after a warm-up, timed in rank 0 of each run, process start-up excluded):
  sync_backup_steps/s    SyncReplicas, worker 3 sleeps `delay_ms` before each push
  sync_steps/s           SyncReplicas, no straggler
  ddp_steps/s            DDP, rank 3 sleeps `delay_ms` before each backward (so every all-reduce waits for it)
  ddp_no_delay_steps/s   DDP, no straggler
  speedup                sync_backup_steps/s / ddp_steps/s
CPU only (every process runs one intra-op thread).
"""
import os
import statistics
import time

import torch
from torch import nn

from ..optim import cluster
from ._timing import print_table

WORKERS = 4
WARMUP = 3


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def _optimizer(params):
    return torch.optim.SGD(params, lr=0.01)


def _loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _batches(worker):
    g = torch.Generator().manual_seed(worker)
    return [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)]


class _Delay:
    """worker_delay: the straggler's sleep before each push (picklable)."""

    def __init__(self, worker, seconds):
        self.worker, self.seconds = worker, seconds

    def __call__(self, worker, step):
        return self.seconds if worker == self.worker else 0.0


class _StepTimes:
    def __init__(self):
        self.times = []

    def __call__(self, step, info):
        self.times.append(time.perf_counter())


def _rate(times):
    t = times[WARMUP:]
    return (len(t) - 1) / (t[-1] - t[0])


def _sync_proc(rank, port, steps, delay, results):
    from ..optim import run_sync_replicas

    torch.set_num_threads(1)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    times = _StepTimes()
    r = run_sync_replicas(_model, _optimizer, _loss, _batches, replicas_to_aggregate=WORKERS - 1, num_steps=steps,
                          on_step=times, worker_delay=_Delay(WORKERS - 1, delay), timeout=120, rank=rank,
                          world_size=WORKERS + 1, master_addr="127.0.0.1", master_port=port, token="")
    if rank == 0:
        results.put(_rate(times.times) if r.global_steps == steps else None)


def _ddp_proc(rank, port, steps, delay, results):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORKERS)
    try:
        model = DistributedDataParallel(_model())
        opt = _optimizer(model.parameters())
        batches = _batches(rank + 1)
        times = []
        for s in range(steps):
            loss = _loss(model, batches[s % len(batches)])
            if rank == WORKERS - 1 and delay:
                time.sleep(delay)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # (the all-reduce: waits for every rank)
            opt.step()
            times.append(time.perf_counter())
        if rank == 0:
            results.put(_rate(times))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _spawn(target, nprocs, steps, delay):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = cluster._free_port()
    procs = [ctx.Process(target=target, args=(rank, port, steps, delay, results), daemon=True) for rank in range(nprocs)]
    for p in procs:
        p.start()
    try:
        rate = results.get(timeout=300)
        for p in procs:
            p.join(60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    if rate is None or any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"bench sync_replicas: {target.__name__} failed (exit codes {[p.exitcode for p in procs]})")
    return rate


def run(args):
    if torch.device(args.device).type != "cpu":
        return []
    steps, delay = (15, 0.05) if args.quick else (40, 0.05)
    reps = 1 if args.quick else 3
    med = {}
    for name, target, nprocs, d in (("sync_backup", _sync_proc, WORKERS + 1, delay), ("sync", _sync_proc, WORKERS + 1, 0.0),
                                    ("ddp", _ddp_proc, WORKERS, delay), ("ddp_no_delay", _ddp_proc, WORKERS, 0.0)):
        med[name] = statistics.median(_spawn(target, nprocs, steps, d) for _ in range(reps))
    rows = [{"case": f"MLP 64-128-10, batch 32, {WORKERS} workers, one +{delay * 1e3:.0f} ms/step",
             "delay_ms": delay * 1e3, "sync_backup_steps/s": med["sync_backup"], "sync_steps/s": med["sync"],
             "ddp_steps/s": med["ddp"], "ddp_no_delay_steps/s": med["ddp_no_delay"],
             "speedup": med["sync_backup"] / med["ddp"]}]
    print_table(f"SyncReplicas (run_sync_replicas, 1 server + {WORKERS} workers, replicas_to_aggregate={WORKERS - 1}) "
                f"vs DDP (gloo, {WORKERS} processes) with one slow worker", rows,
                ["case", "delay_ms", "sync_backup_steps/s", "sync_steps/s", "ddp_steps/s", "ddp_no_delay_steps/s",
                 "speedup"])
    return rows
