"""A scripted nn.Batched model run from 16 C++ threads of a Python-free libtorch process (forward and
per-thread backward), loading the torchops library with dlopen."""
import os
import subprocess

import pytest
import torch

import torchops

pytestmark = pytest.mark.timeout(400)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Affine(torch.nn.Module):
    def forward(self, x):
        return 3.0 * x + 1.0


def test_scripted_batched_model_from_cpp_threads(tmp_path):
    from torch.utils.cpp_extension import load

    build = os.path.join(ROOT, "build", "test_batching_libtorch")
    os.makedirs(build, exist_ok=True)
    exe = load(name="batching_threads", sources=[os.path.join(ROOT, "tests", "cpp", "batching_threads.cpp")],
               extra_ldflags=["-ldl"], build_directory=build, is_standalone=True, is_python_module=False,
               verbose=False)
    model = torch.jit.script(torchops.nn.Batched(_Affine(), 2, 8, 2000, allowed_batch_sizes=[4, 8],
                                                 grad_timeout_micros=20_000_000, unbatch_timeout_micros=20_000_000))
    path = str(tmp_path / "batched.pt")
    model.save(path)
    lib = torchops._loader.library_path()
    p = subprocess.run([exe, lib, path], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "done=640 bad=0" in p.stdout
