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


@pytest.mark.parametrize("spin", [False, True])
def test_handoff_with_model_time_is_bounded_by_the_model(driver, spin):
    # 4 clients, batches of 2, 2 ms of the holder's own CPU time per batch: at most min(cores, 4 // 2) batches
    # compute at once, so at most 2 * 2 / 2 ms = 2000 requests/s whatever the scheduler does.
    rps, cpus = bench_batching._handoff(driver, 4, 2, 0.3, work_us=2000, spin=spin)
    free, _ = bench_batching._handoff(driver, 4, 2, 0.3)
    assert 0 < rps <= 2000 * 1.05
    assert free > 2 * rps  # without the model's time the same batcher is far faster
    assert cpus > 0


def test_pipeline_ceiling_is_the_better_waiting_mode(driver):
    rps = bench_batching._pipeline_ceiling(driver, 4, 2, 0.3, 2000)
    assert 0 < rps <= 2000 * 1.05
