"""Synchronous-replica training (TF's `SyncReplicasOptimizer`) on top of torchops' ConditionalAccumulator.

* `SyncReplicasOptimizer(optimizer, replicas_to_aggregate, total_num_replicas)` wraps the optimizer of the
  master copy of the parameters (the chief's / parameter server's). One dense accumulator per parameter.
  Workers `pull()` a consistent snapshot of the parameters with its global step (their token), compute
  gradients on their own replica, and `apply_gradients(grads, local_step=token)`. The chief calls `step()`:
  it takes from every accumulator once `replicas_to_aggregate` fresh gradients are there (the mean of all
  fresh ones), applies it with the wrapped optimizer and advances the global step. Gradients computed at an
  older step are dropped by the accumulators (they bump their step on each take) and counted as stale.
* `train_sync_replicas(...)`: a driver running the whole pattern with worker threads in one process or with
  worker processes (the networked path of `torchops.optim.cluster.run_sync_replicas`, which also runs under
  torchrun across machines).

See docs/accumulator.md.
"""
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..accumulator import ConditionalAccumulator

__all__ = ["SyncReplicasOptimizer", "SyncReplicasResult", "train_sync_replicas"]


class SyncReplicasOptimizer:
    """TF's SyncReplicasOptimizer pattern (see the module docstring).

    Thread-safe: `pull`, `apply_gradients` and `wait_for_step` may be called from any number of worker
    threads (or the parameter server's connection threads) while one chief thread calls `step`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, replicas_to_aggregate: int,
                 total_num_replicas: Optional[int] = None):
        if replicas_to_aggregate < 1:
            raise ValueError(f"replicas_to_aggregate must be >= 1, got {replicas_to_aggregate}")
        if total_num_replicas is None:
            total_num_replicas = replicas_to_aggregate
        if total_num_replicas < 1:
            raise ValueError(f"total_num_replicas must be >= 1, got {total_num_replicas}")
        self.optimizer = optimizer
        self.replicas_to_aggregate = int(replicas_to_aggregate)
        self.total_num_replicas = int(total_num_replicas)
        self.params: List[Tensor] = [p for g in optimizer.param_groups for p in g["params"]]
        if not self.params:
            raise ValueError("SyncReplicasOptimizer: the optimizer has no parameters")
        for p in self.params:
            if p.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                raise TypeError(f"SyncReplicasOptimizer: parameter dtype {p.dtype} is not supported by the accumulators")
        self._accums = [ConditionalAccumulator(p.dtype, shape=list(p.shape), reduction_type="MEAN") for p in self.params]
        self._cond = threading.Condition()
        self._push_lock = threading.Lock()
        self._global_step = 0
        self._closed = False
        self.pushes = 0
        self._base = {"applied": 0, "dropped_stale": 0, "takes": 0}  # counts carried over by load_state_dict
        self._round: List[Any] = []  # tags of the fresh pushes of the current round
        self.last_contributors: List[Any] = []  # tags of the pushes the last step aggregated
        self.stale_by_tag: Dict[Any, int] = {}  # stale pushes per tag

    # ------------------------------------------------------------------------------------- workers
    @property
    def global_step(self) -> int:
        with self._cond:
            return self._global_step

    def wait_for_step(self, after: int, timeout: Optional[float] = None) -> int:
        """Blocks until the global step is greater than `after` (TF: the next sync token), or the optimizer
        is closed. Returns the global step. TimeoutError after `timeout` seconds."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._global_step > after or self._closed, timeout)
            if not ok:
                raise TimeoutError(f"SyncReplicasOptimizer: no global step after {after} within {timeout} s")
            return self._global_step

    def pull(self, after: int = -1, timeout: Optional[float] = None) -> Tuple[int, List[Tensor], bool]:
        """(global_step, copies of the parameters at that step, closed), once the step is past `after`."""
        with self._cond:
            ok = self._cond.wait_for(lambda: self._global_step > after or self._closed, timeout)
            if not ok:
                raise TimeoutError(f"SyncReplicasOptimizer: no global step after {after} within {timeout} s")
            with torch.no_grad():
                return self._global_step, [p.detach().clone() for p in self.params], self._closed

    def apply_gradients(self, grads: Sequence[Optional[Tensor]], local_step: int, tag: Any = None) -> bool:
        """Pushes one replica's gradients computed at `local_step` (None: zeros). Stale ones are dropped by the
        accumulators (and counted). Returns False, doing nothing, once the optimizer is closed (a worker racing
        the end of training). `tag` (e.g. the worker's index) lands in `last_contributors` of the step that
        aggregates this push."""
        if len(grads) != len(self.params):
            raise ValueError(f"apply_gradients: expected {len(self.params)} gradients, got {len(grads)}")
        if self._closed:
            return False
        # One push is atomic with respect to the chief's takes: every accumulator sees it at the same step,
        # so a gradient is either aggregated for all parameters or dropped as stale for all of them.
        with self._push_lock:
            try:
                fresh = local_step >= self._accums[0].global_step()
                for acc, p, g in zip(self._accums, self.params, grads):
                    if g is None:
                        g = torch.zeros_like(p)
                    acc.apply_grad(g.detach(), local_step=local_step)
            except RuntimeError:
                if self._closed:
                    return False
                raise
            if fresh:
                self._round.append(tag)
            else:
                self.stale_by_tag[tag] = self.stale_by_tag.get(tag, 0) + 1
        with self._cond:
            self.pushes += 1
            self._cond.notify_all()
        return True

    # --------------------------------------------------------------------------------------- chief
    def step(self, timeout: Optional[float] = None) -> int:
        """Chief: waits for `replicas_to_aggregate` fresh gradients of every parameter, applies their mean
        with the wrapped optimizer, and advances the global step (new sync token). Returns the new step."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self.pushes
            with self._push_lock:  # (no push half-way through the accumulators)
                if self._accums[0].num_accumulated() >= self.replicas_to_aggregate:
                    grads = [acc.take_grad(self.replicas_to_aggregate, timeout=0) for acc in self._accums]
                    self.last_contributors, self._round = self._round, []
                    break
            with self._cond:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"SyncReplicasOptimizer.step: TakeGrad timed out after {timeout} s waiting for "
                                       f"{self.replicas_to_aggregate} fresh gradients "
                                       f"({self._accums[0].num_accumulated()} accumulated)")
                if self._closed:
                    raise RuntimeError("SyncReplicasOptimizer.step: the optimizer is closed")
                self._cond.wait_for(lambda: self.pushes != seen or self._closed, left)
        with self._cond:  # (workers pull a consistent snapshot: never in the middle of an update)
            for p, g in zip(self.params, grads):
                p.grad = g.to(p.device)
            self.optimizer.step()
            for p in self.params:
                p.grad = None
            self._global_step += 1
            # Every accumulator bumped its own step on its take; keep them aligned with ours (TF's chief
            # initialises them with set_global_step too).
            for acc in self._accums:
                acc.set_global_step(self._global_step)
            self._cond.notify_all()
            return self._global_step

    def pending_tags(self) -> List[Any]:
        """Tags of the fresh pushes waiting for the next step."""
        with self._push_lock:
            return list(self._round)

    def stale_gradients(self) -> int:
        """Pushes dropped as stale (every accumulator drops each stale push; counted once)."""
        return self.stats()["dropped_stale"]

    def stats(self) -> Dict[str, int]:
        s = self._accums[0].stats()
        return {"global_step": self.global_step, "pushes": self.pushes,
                **{k: self._base[k] + s[k] for k in ("applied", "dropped_stale", "takes")}}

    def state_dict(self) -> Dict[str, Any]:
        """The chief's state besides the parameters: the global step, the wrapped optimizer's state and the
        counts. Gradients accumulated for the current round are not part of it (a resumed run collects
        that round again)."""
        with self._cond:
            # (a snapshot: the optimizer's own state_dict shares its state tensors, which the next step updates)
            return {"global_step": self._global_step, "optimizer": copy.deepcopy(self.optimizer.state_dict()),
                    "counts": {"pushes": self.pushes, **{k: v for k, v in self.stats().items() if k in self._base}}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores `state_dict()` (on a fresh optimizer whose parameters were restored too): the accumulators
        then accept gradients from the restored step on."""
        step = state["global_step"]
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"load_state_dict: global_step must be an int >= 0, got {step!r}")
        with self._cond:
            self.optimizer.load_state_dict(state["optimizer"])
            counts = state.get("counts", {})
            self.pushes = int(counts.get("pushes", 0))
            s = self._accums[0].stats()
            self._base = {k: int(counts.get(k, 0)) - s[k] for k in self._base}
            self._global_step = step
            for acc in self._accums:
                acc.set_global_step(step)
            self._cond.notify_all()

    def close(self) -> None:
        """Wakes every waiting worker (pull returns closed=True) and fails a blocked chief step."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for acc in self._accums:
            acc.close()


# ------------------------------------------------------------------------------------------- driver

@dataclass
class SyncReplicasResult:
    model: nn.Module                 # the master model after training (in this process)
    state_dict: Dict[str, Tensor]
    global_steps: int                # chief updates done
    stale_gradients: int             # pushes dropped as stale
    applied_gradients: int           # pushes accepted
    pushes_per_worker: List[int] = field(default_factory=list)
    worker_exitcodes: List[Optional[int]] = field(default_factory=list)  # process mode
    seconds: float = 0.0
    # networked runs (process mode, run_sync_replicas): per step the workers whose gradients it aggregated,
    # stale pushes and connections (joins, re-joins after a restart) per worker, the step resumed from
    contributors: List[List[int]] = field(default_factory=list)
    stale_per_worker: List[int] = field(default_factory=list)
    joins_per_worker: List[int] = field(default_factory=list)
    resumed_from: int = 0
    server_address: str = ""         # where rank 0 listened (host:port)


def _grads_of(model: nn.Module, loss_fn: Callable, batch) -> List[Optional[Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn(model, batch)
    loss.backward()
    return [p.grad for p in model.parameters()]


def _load(model: nn.Module, params: List[Tensor]) -> None:
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)


def _scheduled(schedule, worker: int, step: int) -> bool:
    return schedule is None or worker in schedule(step)


def _delay(worker_delay, worker: int, step: int) -> None:
    if worker_delay is None:
        return
    d = worker_delay(worker, step) if callable(worker_delay) else worker_delay.get(worker, 0.0)
    if d:
        time.sleep(d)


def _worker_loop(worker: int, model: nn.Module, loss_fn, shard, pull, push, schedule, worker_delay, alive) -> int:
    """One replica: pull params (waiting for a new token), compute gradients on its shard's batch for that
    step, push them tagged with the step. Returns the number of pushes. alive(): False -> stop ("killed")."""
    last = -1
    pushes = 0
    while alive():
        step, params, done = pull(worker, last)
        if done:
            break
        last = step
        if not _scheduled(schedule, worker, step):
            continue
        _load(model, params)
        grads = _grads_of(model, loss_fn, shard[step % len(shard)])
        _delay(worker_delay, worker, step)
        if not alive():
            break
        push(worker, step, [None if g is None else g.detach() for g in grads])
        pushes += 1
    return pushes


def train_sync_replicas(model_fn: Callable[[], nn.Module], optimizer_fn: Callable[[Any], torch.optim.Optimizer],
                        loss_fn: Callable[[nn.Module, Any], Tensor], data_shards: Sequence[Sequence[Any]], *,
                        num_workers: int, replicas_to_aggregate: int, num_steps: int, mode: str = "threads",
                        on_step: Optional[Callable[[int, Dict[str, Any]], None]] = None,
                        worker_delay=None, schedule: Optional[Callable[[int], Sequence[int]]] = None,
                        timeout: float = 120.0) -> SyncReplicasResult:
    """Trains `model_fn()` with synchronous replicas: one chief/parameter server (this process, holding the
    master model, its optimizer and the accumulators) and `num_workers` replicas.

    * `model_fn()` builds the model (every call must build the same initial parameters, e.g. by seeding);
      `optimizer_fn(params)` builds the chief's optimizer; `loss_fn(model, batch)` returns a scalar loss.
    * `data_shards[w]` is worker w's sequence of batches; at global step s worker w uses
      `data_shards[w][s % len(data_shards[w])]` (so a run is reproducible whatever the timing).
    * Each chief step applies the mean of the first `replicas_to_aggregate` fresh gradients (all fresh ones
      that arrived before the take); gradients computed at an older step are dropped and counted.
    * `mode="threads"`: workers are threads sharing the parameter server object. `mode="processes"`: every run
      spawns fresh processes (torch.multiprocessing spawn) running `torchops.optim.run_sync_replicas` as rank 0
      (the parameter server and chief) and ranks 1..num_workers, on 127.0.0.1 with a free TCP port; this
      process only waits for the result. `model_fn`, `optimizer_fn`, `loss_fn`, `data_shards`, `on_step`,
      `worker_delay` and `schedule` must then be picklable (top-level callables).
    * `on_step(global_step, info)` runs on the chief after each update (in process mode: in the parameter-server
      process); `info` has "stale_gradients", "applied_gradients", "pushes", "model" and `kill_worker(w)`
      (threads: the worker stops before its next push; processes: SIGKILL), to simulate failures.
    * `worker_delay`: `{worker: seconds}` or `f(worker, step) -> seconds`, slept before each push (stragglers).
    * `schedule(step) -> workers`: only these workers compute and push at that step (a fixed schedule makes
      the aggregate deterministic: with exactly `replicas_to_aggregate` scheduled workers per step the run
      equals a single-process loop applying the mean of their gradients).
    * `timeout`: seconds the chief waits for enough gradients (TimeoutError, e.g. when too many workers died)
      and the bound on process start-up and shutdown.

    Returns a `SyncReplicasResult` (trained model and state_dict, global steps, stale and applied counts,
    pushes per worker, process exit codes). Every worker thread/process is stopped before it returns.
    """
    if mode not in ("threads", "processes"):
        raise ValueError(f"mode must be 'threads' or 'processes', got {mode!r}")
    if num_workers < 1 or len(data_shards) != num_workers:
        raise ValueError(f"need num_workers >= 1 and one data shard per worker, got num_workers={num_workers} and "
                         f"{len(data_shards)} shards")
    if any(len(s) == 0 for s in data_shards):
        raise ValueError("every data shard needs at least one batch")
    if not 1 <= replicas_to_aggregate:
        raise ValueError(f"replicas_to_aggregate must be >= 1, got {replicas_to_aggregate}")
    t0 = time.monotonic()
    if mode == "threads":
        model = model_fn()
        opt = SyncReplicasOptimizer(optimizer_fn(model.parameters()), replicas_to_aggregate, num_workers)
        exitcodes, pushes = _run_threads(model, opt, model_fn, loss_fn, data_shards, num_workers, num_steps, on_step,
                                         worker_delay, schedule, timeout)
        s = opt.stats()
    else:
        from .cluster import _run_processes

        return _run_processes(model_fn, optimizer_fn, loss_fn, data_shards, num_workers, replicas_to_aggregate,
                              num_steps, on_step, worker_delay, schedule, timeout)
    return SyncReplicasResult(model=model, state_dict={k: v.detach().clone() for k, v in model.state_dict().items()},
                              global_steps=s["global_step"], stale_gradients=s["dropped_stale"],
                              applied_gradients=s["applied"], pushes_per_worker=pushes, worker_exitcodes=exitcodes,
                              seconds=time.monotonic() - t0)


def _chief_loop(model, opt: SyncReplicasOptimizer, num_steps, on_step, kill_worker, timeout) -> None:
    for _ in range(num_steps):
        step = opt.step(timeout=timeout)
        if on_step is not None:
            s = opt.stats()
            on_step(step, {"stale_gradients": s["dropped_stale"], "applied_gradients": s["applied"],
                           "pushes": s["pushes"], "model": model, "kill_worker": kill_worker})


def _run_threads(model, opt, model_fn, loss_fn, data_shards, num_workers, num_steps, on_step, worker_delay,
                 schedule, timeout):
    alive = [True] * num_workers
    pushes = [0] * num_workers
    errors: List[BaseException] = []

    def pull(w, last):
        return opt.pull(last, timeout=timeout)

    def push(w, step, grads):
        opt.apply_gradients(grads, local_step=step)

    def run(w):
        try:
            pushes[w] = _worker_loop(w, model_fn(), loss_fn, data_shards[w], pull, push, schedule, worker_delay,
                                     lambda: alive[w])
        except BaseException as e:  # noqa: B902  (carried to the caller)
            if alive[w] and not opt._closed:
                errors.append(e)
                opt.close()

    def kill_worker(w):
        alive[w] = False

    threads = [threading.Thread(target=run, args=(w,), name=f"sync-replica-{w}", daemon=True)
               for w in range(num_workers)]
    for t in threads:
        t.start()
    try:
        _chief_loop(model, opt, num_steps, on_step, kill_worker, timeout)
    except BaseException:
        if errors:
            raise errors[0]
        raise
    finally:
        opt.close()  # releases every waiting worker
        for t in threads:
            t.join(timeout)
    if errors:
        raise errors[0]
    return [None] * num_workers, pushes


