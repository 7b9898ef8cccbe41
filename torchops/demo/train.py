"""Training: K replicas computing gradients on their own shards, synchronised by
torchops.optim.SyncReplicasOptimizer (ConditionalAccumulator underneath) with
replicas_to_aggregate = K - 1, until the test accuracy reaches the target."""
import copy
import functools
import io
import math
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import torch
from torch import nn

from .data import shards
from .model import accuracy, build_model, predict, recalibrate_batchnorm


@dataclass
class TrainConfig:
    rnn: str = "gru"
    workers: int = 4
    processes: bool = False
    device: str = "cpu"
    batch_size: int = 32
    lr: float = 3e-3
    max_epochs: int = 12
    target: float = 0.95
    max_steps: Optional[int] = None  # cap on global steps (tests); None: max_epochs decide
    seed: int = 0

    @property
    def replicas_to_aggregate(self) -> int:
        return max(1, self.workers - 1)


@dataclass
class TrainResult:
    model: nn.Module
    history: List[dict] = field(default_factory=list)  # per evaluation: epoch, step, loss, test_acc, seconds
    global_steps: int = 0
    stale: int = 0
    seconds: float = 0.0
    mode: str = ""

    @property
    def test_acc(self) -> float:
        return self.history[-1]["test_acc"] if self.history else float("nan")


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    """Cross entropy of one (images, labels) batch, moved to the model's device (batches stay on the CPU so
    that they pickle to worker processes)."""
    x, y = batch
    dev = next(model.parameters()).device
    return nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr)


def evaluate(model: nn.Module, train_set, test_set) -> Tuple[float, float]:
    """(training-set loss, test accuracy) of a copy of `model` whose batch-norm statistics are set from the
    training set, in eval mode."""
    m = copy.deepcopy(model)
    dev = next(m.parameters()).device
    recalibrate_batchnorm(m, train_set[0].to(dev), batch_size=len(train_set[0]))
    loss = nn.functional.cross_entropy(predict(m, train_set[0].to(dev)), train_set[1].to(dev)).item()
    return loss, accuracy(predict(m, test_set[0].to(dev)), test_set[1])


class Progress:
    """tqdm when it is installed and stderr is a terminal; otherwise one line per epoch."""

    def __init__(self, total_steps: int, quiet: bool = False):
        self.bar = None
        self.quiet = quiet
        if not quiet and sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total_steps, unit="step", desc="training", leave=False)
            except ImportError:
                pass

    def step(self, n: int = 1, loss: Optional[float] = None) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    @staticmethod
    def line(rec: dict) -> str:
        stale = f"  stale {rec['stale']}" if "stale" in rec else ""
        return (f"epoch {rec['epoch']:3d}  global step {rec['step']:5d}  train loss {rec['loss']:.4f}  "
                f"test accuracy {rec['test_acc']:.4f}{stale}  ({rec['seconds']:.1f} s)")

    def epoch(self, rec: dict) -> None:
        line = self.line(rec)
        if self.bar is not None:
            self.bar.write(line)
        elif not self.quiet:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def steps_per_epoch(n_train: int, cfg: TrainConfig) -> int:
    """Global steps for one pass over the training set: each step averages replicas_to_aggregate batches."""
    return max(1, math.ceil(n_train / (cfg.batch_size * cfg.replicas_to_aggregate)))


class ShardBatches:
    """A worker's batches: `idx[i]` are the rows of batch i in its shard (3 tensors in all, so that it
    pickles cheaply to a worker process)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor):
        self.x, self.y, self.idx = x, y, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = self.idx[i]
        return self.x[rows], self.y[rows]


def worker_batches(train_set, cfg: TrainConfig, num_steps: int) -> List[ShardBatches]:
    """Per worker: its shard cut into shuffled batches, reshuffled every pass (a pass drops the remainder),
    enough for `num_steps` global steps (worker w uses batch s % len at global step s, so the batches a
    run sees do not depend on thread timing)."""
    out = []
    for w, (x, y) in enumerate(shards(train_set, cfg.workers)):
        g = torch.Generator().manual_seed(cfg.seed * 1000 + w + 1)
        b = min(cfg.batch_size, len(y))
        per_pass = len(y) // b
        passes = max(1, math.ceil(num_steps / per_pass))
        idx = torch.cat([torch.randperm(len(y), generator=g)[:per_pass * b].view(per_pass, b) for _ in range(passes)])
        out.append(ShardBatches(x, y, idx[:max(1, num_steps)]))
    return out


class TrainingDone(Exception):
    """Raised by the chief's on_step callback at the last evaluation (target reached, or the step budget
    spent) to end training and carry the results out of the chief (which, with --processes, runs in the
    parameter-server process: the driver re-raises its exception in this one). args[0]: dict with
    "history", "step", "stale" and "state" (the master model's state_dict, serialised) or, in threads
    mode, "model"."""


class EpochEvaluator:
    """on_step callback: after every epoch's worth of global steps, evaluates the master model (training-set
    loss and test accuracy, batch-norm statistics recalibrated on a copy), prints a line (or updates the
    progress bar) and ends training at the target or at the last step. Picklable (for --processes)."""

    def __init__(self, train_set, test_set, per_epoch: int, total: int, target: float, in_process: bool,
                 quiet: bool = False):
        self.train_set, self.test_set = train_set, test_set
        self.per_epoch, self.total, self.target = per_epoch, total, target
        self.in_process, self.quiet = in_process, quiet
        self.history: List[dict] = []
        self.t0 = time.time()  # wall clock: comparable across processes
        self.progress: Optional["Progress"] = None  # threads mode only (set by the caller, not pickled)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["progress"] = None
        return d

    def __call__(self, step: int, info: dict) -> None:
        if self.progress is not None:
            self.progress.step(1)
        if step % self.per_epoch != 0 and step != self.total:
            return
        model = info["model"]
        loss, acc = evaluate(model, self.train_set, self.test_set)
        rec = dict(epoch=math.ceil(step / self.per_epoch), step=step, loss=loss, test_acc=acc,
                   seconds=time.time() - self.t0, stale=info["stale_gradients"])
        self.history.append(rec)
        if self.progress is not None:
            self.progress.epoch(rec)
        elif not self.quiet:
            print(Progress.line(rec), flush=True)
        if acc >= self.target or step >= self.total:
            out = dict(history=self.history, step=step, stale=info["stale_gradients"])
            if self.in_process:
                out["model"] = model
            else:
                buf = io.BytesIO()
                torch.save(model.state_dict(), buf)
                out["state"] = buf.getvalue()
            raise TrainingDone(out)


def train(cfg: TrainConfig, train_set, test_set, quiet: bool = False) -> TrainResult:
    per_epoch = steps_per_epoch(len(train_set[1]), cfg)
    total = cfg.max_steps if cfg.max_steps is not None else per_epoch * cfg.max_epochs
    from torchops.optim import train_sync_replicas

    progress = Progress(total, quiet)
    try:
        return _train_sync_replicas(train_sync_replicas, cfg, train_set, test_set, per_epoch, total, progress)
    finally:
        progress.close()


def _train_sync_replicas(driver, cfg, train_set, test_set, per_epoch, total, progress) -> TrainResult:
    mode = "processes" if cfg.processes else "threads"
    res = TrainResult(model=None, mode=f"SyncReplicasOptimizer, {cfg.workers} worker {mode}, "  # type: ignore[arg-type]
                                        f"replicas_to_aggregate={cfg.replicas_to_aggregate}")
    evaluator = EpochEvaluator(train_set, test_set, per_epoch, total, cfg.target, in_process=not cfg.processes,
                               quiet=progress.quiet)
    if not cfg.processes:
        evaluator.progress = progress
    t0 = time.perf_counter()
    model_fn = functools.partial(build_model, cfg.rnn, cfg.seed, cfg.device)
    try:
        driver(model_fn, functools.partial(make_optimizer, lr=cfg.lr), loss_fn, worker_batches(train_set, cfg, total),
               num_workers=cfg.workers, replicas_to_aggregate=cfg.replicas_to_aggregate, num_steps=total,
               mode=mode, on_step=evaluator, timeout=120.0)
        raise RuntimeError("train_sync_replicas returned without the last evaluation")  # (on_step always ends it)
    except TrainingDone as done:
        out = done.args[0]
    res.history, res.global_steps, res.stale = out["history"], out["step"], out["stale"]
    if "model" in out:
        res.model = out["model"]
    else:
        res.model = model_fn()
        res.model.load_state_dict(torch.load(io.BytesIO(out["state"]), weights_only=True))
    res.seconds = time.perf_counter() - t0
    # The replicas' batch-norm running statistics stay with them (only gradients are aggregated): set the
    # trained model's from the whole training set.
    recalibrate_batchnorm(res.model, train_set[0].to(cfg.device), batch_size=len(train_set[1]))
    return res
