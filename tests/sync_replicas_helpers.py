"""Picklable (top-level) pieces of the synchronous-replica tests: worker processes import this module."""
import torch
from torch import nn


def model_fn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def cuda_model_fn():
    return model_fn().cuda()


def cuda_loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x.cuda()), y.cuda())


def optimizer_fn(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.5)


def loss_fn(model, batch):
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def make_shards(num_workers, batches=4, batch_size=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 1, generator=g, dtype=torch.float64)
    shards = []
    for _ in range(num_workers):
        shard = []
        for _ in range(batches):
            x = torch.randn(batch_size, 4, generator=g, dtype=torch.float64)
            shard.append((x, x @ w + 0.01 * torch.randn(batch_size, 1, generator=g, dtype=torch.float64)))
        shards.append(shard)
    return shards


def rotating_schedule(step):
    """Two of three workers per step (replicas_to_aggregate=2): a fixed, timing-independent aggregate."""
    return [step % 3, (step + 1) % 3]


def rejoin_schedule(step):
    """Worker 2 is needed at every odd step: a step after its death waits for its restart."""
    return [0, 1] if step % 2 == 0 else [1, 2]


def slow_worker_2(worker, step):
    """Worker 2 straggles before worker 0 is killed at step 3: its gradients arrive after the other two were
    aggregated (stale), by a margin a loaded machine does not erase; after the kill both survivors are needed at
    every step, so waiting longer would only slow the run."""
    return 1.5 if worker == 2 and step < 3 else 0.0


def worker_2_joins_step_0(step):
    """Step 0 aggregates workers 0 and 2, so it waits for worker 2's process to join (a late start cannot leave it
    out of the steps before worker 0 is killed); from step 1 every worker computes every step."""
    return [0, 2] if step == 0 else [0, 1, 2]


def kill_worker_0_at_step_3(step, info):
    if step == 3:
        info["kill_worker"](0)


def reference_run(shards, num_steps, schedule):
    """Single process: at each step the mean of the scheduled workers' gradients, summed in worker order as the
    accumulator does (a + b is commutative, so two gradients give the exact same mean in any arrival order)."""
    model = model_fn()
    opt = optimizer_fn(model.parameters())
    params = list(model.parameters())
    for s in range(num_steps):
        total = None
        ws = list(schedule(s))
        for w in ws:
            model.zero_grad(set_to_none=True)
            loss_fn(model, shards[w][s % len(shards[w])]).backward()
            gs = [p.grad.detach().clone() for p in params]
            total = gs if total is None else [t.add_(g) for t, g in zip(total, gs)]
        for p, t in zip(params, total):
            p.grad = t.div_(len(ws))
        opt.step()
    return model.state_dict()
