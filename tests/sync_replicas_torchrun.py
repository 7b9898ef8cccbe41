"""The training script of the torchrun tests (tests/test_sync_replicas_cluster.py): every rank runs
torchops.optim.run_sync_replicas on the helpers' model and shards; rank 0 saves what the test checks.
Failures are injected from inside: a worker SIGKILLs itself before a push, the server after a step, in the
first attempt only (TORCHELASTIC_RESTART_COUNT 0), so that torchrun's restart runs clean."""
import argparse
import os
import signal
import time


import sync_replicas_helpers as H
from torchops.optim import run_sync_replicas
from torchops.optim.cluster import save_checkpoint

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--replicas", type=int, default=2)
p.add_argument("--schedule", choices=["rotating", "rejoin", "none"], default="rotating")
p.add_argument("--delay", default="", help="RANK:SECONDS[,RANK:SECONDS...] slept before each push of those ranks")
p.add_argument("--kill-worker", default="", help="RANK:STEP: that rank kills itself before its push at STEP")
p.add_argument("--kill-server", type=int, default=0, help="rank 0 kills itself after this step")
p.add_argument("--checkpoint", default=None)
p.add_argument("--every", type=int, default=0)
p.add_argument("--timeout", type=float, default=120.0)
args = p.parse_args()
FIRST_ATTEMPT = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
delays = {int(k): float(v) for k, v in (item.split(":") for item in args.delay.split(",") if item)}
kill_rank, kill_step = (int(x) for x in args.kill_worker.split(":")) if args.kill_worker else (-1, -1)


def worker_delay(worker, step):
    if worker + 1 == kill_rank and step >= kill_step and FIRST_ATTEMPT:
        os.kill(os.getpid(), signal.SIGKILL)
    return delays.get(worker + 1, 0.0)


def on_step(step, info):
    if args.kill_server and step == args.kill_server and FIRST_ATTEMPT:
        os.kill(os.getpid(), signal.SIGKILL)


schedule = {"rotating": H.rotating_schedule, "rejoin": H.rejoin_schedule, "none": None}[args.schedule]
shards = H.make_shards(int(os.environ["WORLD_SIZE"]) - 1)
t0 = time.monotonic()
r = run_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, lambda w: shards[w], replicas_to_aggregate=args.replicas,
                      num_steps=args.steps, checkpoint=args.checkpoint, checkpoint_every=args.every,
                      on_step=on_step, worker_delay=worker_delay, schedule=schedule, timeout=args.timeout)
if r is not None:
    save_checkpoint(args.out, {"state_dict": r.state_dict, "global_steps": r.global_steps, "stale": r.stale_gradients,
                               "contributors": r.contributors, "joins": r.joins_per_worker,
                               "stale_per_worker": r.stale_per_worker, "pushes": r.pushes_per_worker,
                               "resumed_from": r.resumed_from, "server_address": r.server_address,
                               "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                               "seconds": time.monotonic() - t0})
