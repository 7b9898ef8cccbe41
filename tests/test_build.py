"""The built library itself: it must use the process's shared libstdc++ (issue: a statically linked copy made
every number vanish from, or crash, the library's error messages)."""
import glob
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import torchops
from torchops import _elf


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF check (Linux)")
def test_library_links_shared_libstdcxx():
    needed = _elf.needed_libraries(torchops.library_path)
    assert any(n.startswith("libstdc++.so") for n in needed), needed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF check (Linux)")
def test_elf_reader_reads_torch_library():
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")
    needed = _elf.needed_libraries(lib)
    assert any(n.startswith("libc.so") for n in needed), needed


def test_elf_reader_rejects_non_elf(tmp_path):
    p = tmp_path / "x.so"
    p.write_bytes(b"not an elf file")
    with pytest.raises(ValueError, match="not an ELF file"):
        _elf.needed_libraries(str(p))


def test_numbers_survive_in_error_messages():
    # With a static libstdc++ copy, `ostream << integer` printed nothing (or crashed): the shape would vanish.
    with pytest.raises(RuntimeError, match=r"got shape \[2, 3\]"):
        torch.ops.torchops.fused_batch_norm_v3(torch.ones(2, 3), torch.ones(3), torch.zeros(3), torch.zeros(3),
                                               torch.ones(3))


def test_numbers_survive_in_ostringstream_output():
    # batching.stats() is JSON built with std::ostringstream in the library.
    x = torch.ones(1, 2)
    torchops.functional.batch([x], num_batch_threads=1, max_batch_size=4, batch_timeout_micros=0,
                              grad_timeout_micros=0, shared_name="test_build_stats")
    try:
        s = torchops.batching.stats("test_build_stats")
        assert s["tasks"] >= 1 and isinstance(s["batches_formed"], int)
    finally:
        torchops.batching.close_all()


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("g++") is None, reason="needs Linux and g++")
@pytest.mark.parametrize("explicit_link", [False, True])
def test_static_libstdcxx_detected_and_fixed_by_explicit_link(tmp_path, explicit_link):
    # What setup.py does after linking, on a small library linked the way the GPU machine's default CXX links:
    # -static-libstdc++ alone is refused; setup.py's explicit shared -lstdc++ (before the driver's static one) fixes it.
    src = tmp_path / "t.cpp"
    src.write_text("#include <sstream>\n#include <string>\n"
                   "std::string f(long x) { std::ostringstream s; s << x; return s.str(); }\n")
    lib = tmp_path / "t.so"
    cmd = ["g++", "-shared", "-fPIC", str(src), "-o", str(lib), "-static-libstdc++"]
    if explicit_link:
        cmd += ["-Wl,--push-state,--no-as-needed", "-lstdc++", "-Wl,--pop-state"]
    subprocess.run(cmd, check=True)
    error = _elf.static_libstdcxx_error(str(lib), "g++ -static-libstdc++")
    if explicit_link:
        assert error is None
    else:
        assert error is not None and "CXX=g++ -static-libstdc++" in error and "CXX=/usr/bin/g++" in error


def _setup_py(env_changes, path=None):
    """`python setup.py --version` (decides on CUDA, builds nothing) with these environment changes."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHOPS_WITH_CUDA", "TORCH_CUDA_ARCH_LIST")}
    env.update(env_changes)
    if path is not None:
        env["PATH"] = path
        env.pop("CUDA_HOME", None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, "setup.py", "--version"], capture_output=True, text=True, cwd=root,
                          env=env, timeout=300)


def _nvcc_found():
    return shutil.which("nvcc") is not None or os.path.exists(os.path.join(os.environ.get("CUDA_HOME", "/-"), "bin", "nvcc"))


@pytest.mark.slow
def test_setup_rejects_a_bad_cuda_mode():
    out = _setup_py({"TORCHOPS_WITH_CUDA": "yes"})
    assert out.returncode != 0 and "TORCHOPS_WITH_CUDA must be auto, 0 or 1, got 'yes'" in out.stderr


@pytest.mark.slow
def test_setup_forced_cuda_without_nvcc_fails_clearly(tmp_path):
    out = _setup_py({"TORCHOPS_WITH_CUDA": "1"}, path=str(tmp_path))  # a PATH without nvcc
    assert out.returncode != 0
    assert "TORCHOPS_WITH_CUDA=1 but" in out.stderr
    assert ("nvcc was not found" in out.stderr) is (torch.version.cuda is not None)


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is None or not _nvcc_found(), reason="needs a CUDA torch and nvcc")
def test_setup_auto_builds_cuda_kernels_only_where_they_can_run():
    out = _setup_py({})
    assert out.returncode == 0, out.stderr
    if torch.cuda.is_available():
        assert "torchops: CUDA kernels: yes (auto: GPU visible)" in out.stderr
    else:
        assert "torchops: CUDA kernels: no (auto: no GPU visible and TORCH_CUDA_ARCH_LIST unset" in out.stderr
    out = _setup_py({"TORCH_CUDA_ARCH_LIST": "9.0"})  # a build machine
    assert out.returncode == 0, out.stderr
    assert "torchops: CUDA kernels: yes (" in out.stderr
    out = _setup_py({"TORCHOPS_WITH_CUDA": "0", "TORCH_CUDA_ARCH_LIST": "9.0"})
    assert out.returncode == 0 and "torchops: CUDA kernels: no (TORCHOPS_WITH_CUDA=0)" in out.stderr


def _post_cflags(build_ninja):
    with open(build_ninja) as f:
        return next(line for line in f if line.startswith("post_cflags ="))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="GCC builds (Linux)")
def test_main_build_uses_one_precompiled_header():
    from torchops import _build_info

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(root, "build", "torchops-cuda" if _build_info.WITH_CUDA else "torchops-cpu")
    if not os.path.exists(os.path.join(folder, "build.ninja")):
        pytest.skip(f"no build of this checkout in {folder} (an installed wheel)")
    if "clang" in (_build_info.COMPILER or "").lower() or os.environ.get("DEBUG") == "1":
        pytest.skip("precompiled headers are for GCC builds without DEBUG=1")
    post = _post_cflags(os.path.join(folder, "build.ninja"))
    m = re.search(r"-include (\S+)/pch/([0-9a-f]{16})/precompiled\.h\b", post)
    assert m, f"the main build does not use the precompiled header: {post}"
    assert os.path.realpath(m.group(1)) == os.path.realpath(folder)
    pch = os.path.join(folder, "pch", m.group(2), "precompiled.h.gch")
    assert os.path.getsize(pch) > 1 << 20
    assert os.listdir(os.path.join(folder, "pch")) == [m.group(2)], "a stale precompiled header was kept"
    with open(os.path.join(root, "csrc", "common", "precompiled.h"), "rb") as f, \
            open(os.path.join(folder, "pch", m.group(2), "precompiled.h"), "rb") as g:
        assert f.read() == g.read(), "the precompiled header is not the checkout's"
    capability_builds = glob.glob(os.path.join(folder, "cpu_*", "build.ninja"))
    assert capability_builds
    for build_ninja in capability_builds:  # other flags: a header precompiled with the main build's is refused
        assert "-include" not in _post_cflags(build_ninja), build_ninja
