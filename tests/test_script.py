"""TorchScript end to end: script -> save -> load in a fresh Python process -> run -> backward, and the
same file in a libtorch C++ program with no Python (proves ops and autograd live in C++)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchops
from conftest import build_libtorch_program, run_libtorch_program


class ScriptedNet(nn.Module):
    """Calls the op directly and through the drop-in module."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torchops.nn.BatchNorm2d(4)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3))
        self.offset = nn.Parameter(torch.linspace(-0.2, 0.2, 3))

    def forward(self, x):
        e = torch.empty([0])
        y = torch.ops.torchops.fused_batch_norm_v3(x, self.scale, self.offset, e, e, 0.001, 1.0, "NCHW", True)[0]
        return self.bn(self.conv(torch.relu(y)))


def _input():
    return torch.linspace(-2.0, 2.0, 2 * 3 * 6 * 6).reshape(2, 3, 6, 6).sin()


def _results(model):
    x = _input().requires_grad_()
    model.train()
    y = model(x)
    y.pow(2).sum().backward()
    out = {"y_sum": y.sum().item(), "y_abs_sum": y.abs().sum().item(), "x_grad_abs_sum": x.grad.abs().sum().item()}
    for name, p in model.named_parameters():
        out[f"grad {name}"] = p.grad.abs().sum().item()
    return out


def _parse(text):
    out = {}
    for line in text.strip().splitlines():
        key, value = line.rsplit(" ", 1)
        out[key] = float(value)
    return out


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "net.pt"
    torch.jit.script(ScriptedNet()).save(str(path))
    return path


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(torchops.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.slow
def test_saved_script_runs_and_backprops_in_fresh_process(saved_model):
    code = textwrap.dedent(f"""
        import torch, torchops
        m = torch.jit.load({str(saved_model)!r})
        x = torch.linspace(-2.0, 2.0, 2 * 3 * 6 * 6).reshape(2, 3, 6, 6).sin().requires_grad_()
        m.train()
        y = m(x)
        y.pow(2).sum().backward()
        print("y_sum", y.sum().item())
        print("y_abs_sum", y.abs().sum().item())
        print("x_grad_abs_sum", x.grad.abs().sum().item())
        for name, p in m.named_parameters():
            print("grad " + name, p.grad.abs().sum().item())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    got, want = _parse(out.stdout), _results(torch.jit.load(str(saved_model)))
    assert got.keys() == want.keys() and len(got) == 9
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-5), k


@pytest.mark.slow
def test_libtorch_cpp_program_runs_scripted_model(saved_model):
    exe = build_libtorch_program("run_scripted_model", "run_scripted_model.cpp")
    out = run_libtorch_program(exe, torchops.library_path, saved_model)
    assert out.returncode == 0, out.stderr
    got, want = _parse(out.stdout), _results(torch.jit.load(str(saved_model)))
    assert got.keys() == want.keys() and len(got) == 9
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-4), k


def test_library_has_no_python_dependency():
    # The op library must load into a Python-free libtorch process.
    out = subprocess.run(["ldd", torchops.library_path], capture_output=True, text=True)
    assert out.returncode == 0
    assert "libpython" not in out.stdout and "torch_python" not in out.stdout, out.stdout


def _copy_python_package(dst):
    """The torchops Python sources without the compiled library."""
    import shutil

    src = os.path.dirname(torchops.__file__)
    shutil.copytree(src, os.path.join(dst, "torchops"),
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "_build_info.py"))


def test_import_without_library_says_how_to_rebuild(tmp_path):
    _copy_python_package(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import torchops"], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), timeout=120)
    assert out.returncode != 0
    assert "compiled library torchops/_C.so was not found" in out.stderr
    assert "pip install --no-build-isolation -e ." in out.stderr


def test_import_against_other_torch_names_both_versions():
    code = "import torch; torch.__version__ = '1.0.0'; import torchops"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode != 0
    from torchops import _build_info

    assert f"torchops was built against torch {_build_info.TORCH_VERSION} but torch 1.0.0 is installed" in out.stderr
    assert "rebuild it with" in out.stderr
