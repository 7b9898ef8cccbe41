"""The batching benchmark's libtorch driver (torchops/bench/batching_driver.cpp): C++ client threads calling
a scripted model, with request rows of any shape, host requests for a model that moves them (_HostIO)."""
import subprocess

import pytest
import torch

import torchops
from torchops.bench import batching as bench_batching

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def driver():
    return bench_batching._cpp_driver()


class _RowSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).sum(1, keepdim=True)


def test_driver_serves_image_shaped_rows_through_batched_host_io(driver, tmp_path):
    name = "test_bench_batching/host_io"
    model = torchops.nn.Batched(bench_batching._HostIO(_RowSum(), "cpu"), num_batch_threads=1, max_batch_size=4,
                                batch_timeout_micros=2000, shared_name=name)
    m = bench_batching._CppModel(driver, torch.jit.script(model), str(tmp_path), name, shape=(1, 8, 8))
    rps, p50, p99, cpus = m.drive(clients=4, seconds=0.3)
    assert rps > 0 and 0 < p50 <= p99 and cpus > 0
    s = m.stats
    assert s["tasks"] > 0 and s["rows"] == s["tasks"]  # one [1, 1, 8, 8] row per request
    assert s["batches_formed"] >= s["tasks"] / 4  # batches of at most max_batch_size rows
    assert s["rejections"] == {}


def test_driver_rejects_a_bad_shape(driver, tmp_path):
    m = bench_batching._CppModel(driver, torch.jit.script(_RowSum()), str(tmp_path), shape=(1, 8, 8))
    for bad in ("1x0x8", "8y8", ""):
        m.shape = bad
        with pytest.raises(RuntimeError, match="bad shape"):
            m.drive(clients=1, seconds=0.1)


def test_host_io_moves_rows_to_the_device_and_back():
    m = torch.jit.script(bench_batching._HostIO(_RowSum(), "cpu"))
    x = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(m(x), x.flatten(1).sum(1, keepdim=True))
    assert m(x).device.type == "cpu"


class _Slow(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(200):
            y = torch.tanh(y @ torch.ones(64, 64))
        return y


@pytest.mark.parametrize("spin", [False, True])
def test_pipeline_runs_the_model_for_every_batch(driver, tmp_path, spin):
    # The minimal batcher with a model that takes far longer than a hand-off: its rate is bounded by the model run
    # on full batches, far below the same batcher without a model.
    m = bench_batching._CppModel(driver, torch.jit.script(_Slow()), str(tmp_path), shape=(64,))
    rps = m.pipeline(clients=4, batch=2, seconds=0.3, spin=spin)
    full, _, _, _ = m.drive(clients=2, seconds=0.3, rows=2)  # 2 threads running full batches, back to back
    free = 1e6 / bench_batching._handoff_us(driver, 4, 2, 0.3)  # requests per CPU second without a model
    # (rates of separate runs on a shared machine: the bound leaves room for the machine's swings, and a batcher
    # that skipped the model would still exceed it by orders of magnitude, as `free` shows)
    assert 0 < rps <= 2 * full * 4
    assert rps * 5 < free


def test_pipeline_rejects_bad_arguments(driver, tmp_path):
    m = bench_batching._CppModel(driver, torch.jit.script(_Slow()), str(tmp_path), shape=(64,))
    for batch, mode in (("0", "sleep"), ("2", "nap")):
        p = subprocess.run([driver, "--pipeline", batch, mode, "lib", m.path, "1", "0.1", "64"], capture_output=True,
                           text=True, env=m._env())
        assert p.returncode == 2 and "--pipeline" in p.stderr
