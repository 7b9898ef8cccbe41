"""A scripted nn.Batched model run from 16 C++ threads of a Python-free libtorch process (forward and
per-thread backward), loading the torchops library with dlopen."""
import pytest
import torch

import torchops
from conftest import build_libtorch_program, run_libtorch_program

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


class _Affine(torch.nn.Module):
    def forward(self, x):
        return 3.0 * x + 1.0


def test_scripted_batched_model_from_cpp_threads(tmp_path):
    exe = build_libtorch_program("batching_threads", "batching_threads.cpp")
    model = torch.jit.script(torchops.nn.Batched(_Affine(), 2, 8, 2000, allowed_batch_sizes=[4, 8],
                                                 grad_timeout_micros=20_000_000, unbatch_timeout_micros=20_000_000))
    path = str(tmp_path / "batched.pt")
    model.save(path)
    lib = torchops._loader.library_path()
    p = run_libtorch_program(exe, lib, path, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "done=640 bad=0" in p.stdout
