"""`python -m torchops.info`: the build and machine report users paste into bug reports."""
import json
import os
import subprocess
import sys
import types

import pytest
import torch

import torchops
from torchops import _build_info, info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cpu_isa_from_flags_needs_every_flag_of_a_level():
    avx512 = ["sse4_2", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"]
    assert info.cpu_isa_from_flags(avx512) == "avx512"
    assert info.cpu_isa_from_flags([f for f in avx512 if f != "avx512dq"]) == "avx2"
    assert info.cpu_isa_from_flags(["sse4_2", "avx2"]) == "default"  # AVX2 without FMA
    assert info.cpu_isa_from_flags([]) == "default"


@pytest.mark.parametrize("archs, cap, runs", [
    ("8.0;9.0+PTX", (8, 0), True), ("8.0;9.0+PTX", (8, 6), True), ("8.0;9.0+PTX", (7, 5), False),
    ("8.0;9.0+PTX", (9, 0), True), ("8.0;9.0+PTX", (12, 0), True), ("9.0", (12, 0), False),
    ("9.0", (9, 0), True), ("8.6 9.0", (8, 0), False), (None, (9, 0), False), ("", (9, 0), False)])
def test_kernels_run_on_follows_cuda_compatibility(archs, cap, runs):
    assert info.kernels_run_on(archs, cap) is runs


def test_json_report_matches_the_build_and_the_process(capsys):
    assert info.main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["torchops"]["version"] == torchops.__version__
    assert data["torchops"]["library"] == torchops.library_path
    assert data["torch"]["running"] == torch.__version__
    assert data["torch"]["built_for"] == _build_info.TORCH_VERSION
    assert data["build"]["cuda_kernels"] is torchops.built_with_cuda()
    assert data["build"]["cuda_reason"] == _build_info.CUDA_REASON
    assert data["build"]["cuda_archs"] == (_build_info.CUDA_ARCH_LIST if torchops.built_with_cuda() else None)
    assert data["cpu"]["logical_cores"] == os.cpu_count()
    assert data["cpu"]["capability"]
    assert len(data["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if data["routes"] is None:  # no route table in this build: the CPU's own flags decide
        model, flags = info._cpuinfo()
        if flags:
            assert data["cpu"]["capability"] == info.cpu_isa_from_flags(flags)
            assert data["cpu"]["capability_source"] == "/proc/cpuinfo flags"


def test_text_report_from_the_command_line():
    out = subprocess.run([sys.executable, "-m", "torchops.info"], capture_output=True, text=True, env=_env(),
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert f"torchops:      {torchops.__version__}" in text
    assert f"torch:         {torch.__version__} running, built for {_build_info.TORCH_VERSION}" in text
    if torchops.built_with_cuda():
        assert f"CUDA kernels:  compiled for {_build_info.CUDA_ARCH_LIST}" in text
    else:
        assert f"CUDA kernels:  not compiled ({_build_info.CUDA_REASON})" in text
    assert "CPU kernels:   " in text
    assert "builds: " + " ".join(_build_info.CPU_CAPABILITY_BUILDS) in text
    assert ("GPU:           none visible" in text) is not torch.cuda.is_available()


def test_route_table_and_capability_come_from_the_backends_when_present(monkeypatch, capsys):
    routes = [{"family": "fused_batch_norm", "slot": "forward", "device": "cpu", "name": "channels_last",
               "isa": "avx2", "verified": True, "enabled": True, "covers": ["float32", "float64"]},
              {"family": "block_rnn", "slot": "gemm", "device": "cpu", "name": "packed", "isa": "avx512",
               "verified": False, "enabled": False, "covers": []}]
    cpu = types.SimpleNamespace(get_cpu_capability=lambda: "avx2")
    backends = types.ModuleType("torchops.backends")
    backends.cpu = cpu
    backends.routes = lambda: routes
    monkeypatch.setitem(sys.modules, "torchops.backends", backends)
    monkeypatch.setitem(sys.modules, "torchops.backends.cpu", cpu)
    monkeypatch.setattr(torchops, "backends", backends, raising=False)
    data = info.collect()
    assert data["cpu"]["capability"] == "avx2" and data["cpu"]["capability_source"] == "torchops.backends.cpu"
    assert data["routes"] == routes
    text = info.format_text(data)
    lines = text.splitlines()
    header = lines.index("routes:") + 1
    assert lines[header].split() == ["family", "slot", "device", "name", "isa", "verified", "enabled", "covers"]
    assert lines[header + 1].split() == ["fused_batch_norm", "forward", "cpu", "channels_last", "avx2", "True",
                                         "True", "float32,float64"]
    assert lines[header + 2].split() == ["block_rnn", "gemm", "cpu", "packed", "avx512", "False", "False", "-"]
    assert "CPU kernels:   avx2 (from torchops.backends.cpu)" in text
    # a backends module that formats its own table: info prints that one
    backends.format_routes = lambda rows: "\n".join(f"route {r['name']} {r['enabled']}" for r in rows)
    text = info.format_text(info.collect())
    assert "routes:\n  route channels_last True\n  route packed False\n" in text


def test_without_backends_there_is_no_route_table(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchops.backends", None)  # importing it raises ImportError
    monkeypatch.delattr(torchops, "backends", raising=False)
    data = info.collect()
    assert data["routes"] is None
    assert "routes:" not in info.format_text(data)
    assert data["cpu"]["capability"] in ("avx512", "avx2", "default")
