"""`pip wheel .`: a wheel that pins the torch it was built against, installs into a fresh environment with that
torch and runs; beside another torch, pip refuses the pin and a forced install fails at import, naming both."""
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from packaging_helpers import ROOT, clean_env, make_venv, shared_packages

TORCH_PUBLIC = torch.__version__.split("+")[0]

CHECK = """
import os, sys, torch, torchops
assert os.path.realpath(torchops.__file__).startswith(os.path.realpath(sys.prefix)), torchops.__file__
x = torch.randn(4, 3, 5, 5, dtype=torch.float64)
y = torch.ops.torchops.fused_batch_norm_v3(x, torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
                                           torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64),
                                           epsilon=1e-3, data_format="NCHW", is_training=True)[0]
ref = (x - x.mean((0, 2, 3), keepdim=True)) / (x.var((0, 2, 3), unbiased=False, keepdim=True) + 1e-3).sqrt()
torch.testing.assert_close(y, ref)
print("op ok from", torchops.__file__)
"""


KEY = os.path.join(ROOT, "torchops", "_C.so.buildkey")


def _read_key():
    try:
        with open(KEY) as f:
            return f.read()
    except FileNotFoundError:
        return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    key_before = _read_key()
    # In the checkout, like `pip wheel .`: the objects of its build folder are reused (a link, not a rebuild).
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", ROOT, "--no-build-isolation", "--no-deps", "-q",
                          "-w", str(dist)], capture_output=True, text=True, env=clean_env(), cwd=ROOT, timeout=3000)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    wheels = [p for p in os.listdir(dist) if p.endswith(".whl")]
    assert len(wheels) == 1, wheels
    # A wheel build leaves the checkout's in-place library and its build key alone (the next in-place build skips).
    assert _read_key() == key_before
    return os.path.join(dist, wheels[0])


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_wheel_pins_the_torch_it_was_built_against(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        build_info = z.read("torchops/_build_info.py").decode()
    assert f"Requires-Dist: torch=={TORCH_PUBLIC}\n" in metadata
    assert f"TORCH_VERSION = {torch.__version__!r}" in build_info
    for name in ("torchops/_C.so", "torchops/info.py", "torchops/bench/batching_driver.cpp"):
        assert name in names, name
    assert not [n for n in names if n.endswith(".buildkey")]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_wheel_installs_into_a_fresh_venv_and_runs_an_op(wheel, tmp_path):
    py = make_venv(tmp_path / "venv", [shared_packages(tmp_path / "shared")])
    env = clean_env()
    # --no-index: the pin must be met by the torch already there (nothing may be downloaded).
    out = subprocess.run([py, "-m", "pip", "install", "--no-index", "-q", wheel], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "op ok from " + str(tmp_path / "venv") in out.stdout
    out = subprocess.run([py, "-m", "torchops.info"], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert f"built for {torch.__version__}" in out.stdout and str(tmp_path / "venv") in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_wheel_beside_another_torch_is_refused_by_pip_and_by_the_loader(wheel, tmp_path):
    # Another torch release: a stand-in package `torch` 2.11.0 (installing a real one would download it).
    other = tmp_path / "other_torch"
    (other / "torch").mkdir(parents=True)
    (other / "torch" / "__init__.py").write_text('__version__ = "2.11.0"\n')
    (other / "torch-2.11.0.dist-info").mkdir()
    (other / "torch-2.11.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    (other / "torch-2.11.0.dist-info" / "RECORD").write_text("")
    py = make_venv(tmp_path / "venv", [str(other), shared_packages(tmp_path / "shared", skip=("torch",))])
    env = clean_env()
    # (not -q: pip names the conflicting requirement only in its full report)
    out = subprocess.run([py, "-m", "pip", "install", "--no-index", wheel], capture_output=True, text=True,
                         env=env, cwd=str(tmp_path), timeout=600)
    assert out.returncode != 0
    assert f"torch=={TORCH_PUBLIC}" in out.stdout + out.stderr
    out = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-deps", "-q", wheel], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run([py, "-c", "import torchops"], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                         timeout=600)
    assert out.returncode != 0
    assert f"torchops was built against torch {torch.__version__} but torch 2.11.0 is installed" in out.stderr
