"""The README's two commands with arguments, in a fresh copy of the checkout: the arguments reach pytest and the
demo, pytest's "no tests ran" fails the script, and an unchanged checkout is not rebuilt."""
import os
import re
import shutil
import subprocess

import pytest

from packaging_helpers import ROOT, clean_env, make_venv, shared_packages

BUILT = ("torchops/_C.so", "torchops/_C.so.buildkey", "torchops/_build_info.py")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The checkout's files (tracked and untracked, not ignored) plus its built library and build key, as a clone
    after a first build would have them; a venv that sees this environment's packages (no downloads)."""
    if not os.path.exists(os.path.join(ROOT, BUILT[1])):
        pytest.skip("the checkout's library was not built by setup.py's in-place or editable build (no build key)")
    base = tmp_path_factory.mktemp("fresh")
    dst = base / "torchops"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True, timeout=120).stdout.decode().split("\0")
    for rel in [f for f in files if f] + list(BUILT):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(dst / rel), exist_ok=True)
            shutil.copy2(src, dst / rel)
    py = make_venv(base / "venv", [shared_packages(base / "shared")])
    return dst, base / "venv", py


def _run(clone, script, *args, timeout=1800):
    dst, venv, _ = clone
    return subprocess.run(["bash", str(dst / "scripts" / script), *args], capture_output=True, text=True,
                          cwd=str(dst), env=clean_env(TORCHOPS_VENV=str(venv)), timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_test_sh_passes_its_arguments_to_pytest_without_rebuilding(clone):
    dst = clone[0]
    before = os.stat(dst / "torchops" / "_C.so").st_mtime_ns
    out = _run(clone, "test.sh", "-k", "test_cpu_isa_from_flags or test_readme_has_one_python_example",
               "-p", "no:cacheprovider")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "2 passed" in out.stdout
    assert os.stat(dst / "torchops" / "_C.so").st_mtime_ns == before, "an unchanged checkout was rebuilt"
    collect = _run(clone, "test.sh", "--co", "-q", "-k", "test_cpu_isa_from_flags", "-p", "no:cacheprovider")
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    # (test.sh's own -q and this one: pytest lists the files with their counts of collected tests)
    assert "tests/test_info.py: 1\n" in collect.stdout and "passed" not in collect.stdout


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_test_sh_fails_when_no_test_ran(clone):
    out = _run(clone, "test.sh", "-k", "no_test_has_this_name", "-p", "no:cacheprovider")
    assert out.returncode == 5, out.stdout[-3000:] + out.stderr[-3000:]
    # (pytest says how many it deselected; under pytest-xdist the workers deselect and it says no tests ran)
    assert re.search(r"\b[1-9]\d* deselected|\bno tests ran\b", out.stdout), out.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_demo_sh_passes_its_arguments_to_the_demo(clone, tmp_path):
    out = _run(clone, "demo.sh", "--rnn", "block-lstm", "--workers", "2", "--steps", "1", "--target", "0",
               "--no-aoti", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "== python -m torchops.demo --rnn block-lstm" in out.stdout
    assert "torchops demo: OK" in out.stdout
    assert "2 threads" in out.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_setup_env_rejects_an_argument_that_is_not_a_requirement_file(tmp_path):
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_env.sh"), "-k"], capture_output=True,
                         text=True, env=clean_env(TORCHOPS_VENV=str(tmp_path / "never")), timeout=120)
    assert out.returncode == 2
    assert "requirement file not found: '-k'" in out.stderr
    assert not (tmp_path / "never").exists()
