"""Synchronous-replica training (torchops.optim): SyncReplicasOptimizer across threads, and the
train_sync_replicas driver with worker threads and with worker processes (run_sync_replicas over 127.0.0.1:
1 parameter server + 3 workers, replicas_to_aggregate=2)."""
import threading
import time

import pytest
import torch

import torchops
from torchops.optim import SyncReplicasOptimizer, train_sync_replicas

import sync_replicas_helpers as H

pytestmark = pytest.mark.timeout(300)

NUM_STEPS = 8


def _assert_state_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-12, atol=1e-12)


def test_optimizer_threads_stale_and_mean():
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = SyncReplicasOptimizer(torch.optim.SGD([p], lr=1.0), replicas_to_aggregate=2, total_num_replicas=3)
    step, params, done = opt.pull()
    assert step == 0 and not done and params[0].tolist() == [0.0] * 3
    one = torch.ones(3, dtype=torch.float64)
    t = threading.Thread(target=lambda: opt.apply_gradients([one * 3], local_step=0))
    opt.apply_gradients([one], local_step=0)
    t.start()
    t.join(30)
    assert opt.step(timeout=30) == 1
    assert p.detach().tolist() == [-2.0] * 3  # SGD with the mean (1 + 3) / 2
    opt.apply_gradients([one * 100], local_step=0)  # late: dropped and counted
    assert opt.stale_gradients() == 1
    with pytest.raises(TimeoutError, match="timed out"):
        opt.step(timeout=0.05)
    assert opt.wait_for_step(0, timeout=1) == 1
    with pytest.raises(TimeoutError):
        opt.wait_for_step(1, timeout=0.05)
    opt.close()
    assert opt.pull(5)[2] is True


def test_threads_fixed_schedule_equals_single_process():
    shards = H.make_shards(3)
    r = train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=NUM_STEPS, mode="threads", schedule=H.rotating_schedule, timeout=60)
    assert r.global_steps == NUM_STEPS and r.stale_gradients == 0
    assert 2 * NUM_STEPS <= r.applied_gradients <= 2 * (NUM_STEPS + 1)  # (+ the next step's, racing the end)
    _assert_state_equal(r.state_dict, H.reference_run(shards, NUM_STEPS, H.rotating_schedule))
    before = H.model_fn().state_dict()
    assert any(not torch.equal(before[k], r.state_dict[k]) for k in before)  # it trained


def test_threads_worker_killed_midrun_completes_with_stale():
    shards = H.make_shards(3)
    seen = []

    def on_step(step, info):
        seen.append(step)
        if step == 3:
            info["kill_worker"](0)

    r = train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=NUM_STEPS, mode="threads", worker_delay=H.slow_worker_2, on_step=on_step,
                            timeout=60)
    assert r.global_steps == NUM_STEPS and seen == list(range(1, NUM_STEPS + 1))
    assert r.stale_gradients > 0
    assert r.pushes_per_worker[0] <= 4


def test_threads_too_many_dead_times_out():
    shards = H.make_shards(3)

    def on_step(step, info):
        if step == 1:
            info["kill_worker"](0)
            info["kill_worker"](1)
            info["kill_worker"](2)

    with pytest.raises(TimeoutError):
        train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=NUM_STEPS, mode="threads", on_step=on_step, timeout=1.0)


def test_invalid_arguments():
    shards = H.make_shards(2)
    with pytest.raises(ValueError, match="mode"):
        train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=2, replicas_to_aggregate=2,
                            num_steps=1, mode="gpus")
    with pytest.raises(ValueError, match="one data shard per worker"):
        train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=1)
    with pytest.raises(ValueError, match="replicas_to_aggregate"):
        SyncReplicasOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1), 0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_processes_fixed_schedule_equals_single_process():
    shards = H.make_shards(3)
    r = train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=NUM_STEPS, mode="processes", schedule=H.rotating_schedule, timeout=180)
    assert r.global_steps == NUM_STEPS and r.stale_gradients == 0
    _assert_state_equal(r.state_dict, H.reference_run(shards, NUM_STEPS, H.rotating_schedule))
    assert r.worker_exitcodes == [0, 0, 0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_processes_worker_killed_midrun_completes_with_stale():
    shards = H.make_shards(3)
    # (process mode: on_step runs in the parameter-server process, so it is a picklable top-level function)
    r = train_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, shards, num_workers=3, replicas_to_aggregate=2,
                            num_steps=NUM_STEPS, mode="processes", worker_delay=H.slow_worker_2,
                            schedule=H.worker_2_joins_step_0, on_step=H.kill_worker_0_at_step_3,
                            timeout=180)
    assert r.global_steps == NUM_STEPS
    assert r.stale_gradients > 0
    assert r.worker_exitcodes[0] == -9 and r.worker_exitcodes[1:] == [0, 0]
    assert r.pushes_per_worker[0] <= 4


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_processes_cuda_model_equals_single_process():
    # models on the GPU in every process: parameters and gradients cross the connections as CPU tensors
    shards = H.make_shards(3)
    r = train_sync_replicas(H.cuda_model_fn, H.optimizer_fn, H.cuda_loss_fn, shards, num_workers=3,
                            replicas_to_aggregate=2, num_steps=NUM_STEPS, mode="processes",
                            schedule=H.rotating_schedule, timeout=180)
    assert r.global_steps == NUM_STEPS and r.stale_gradients == 0
    ref = H.reference_run(shards, NUM_STEPS, H.rotating_schedule)
    for k, v in r.state_dict.items():
        assert v.is_cuda, k
        torch.testing.assert_close(v.cpu(), ref[k], rtol=1e-10, atol=1e-10)  # (cuBLAS vs CPU float64 GEMMs)
    assert r.worker_exitcodes == [0, 0, 0]
