import os
import subprocess

import pytest
import torch

import torchops  # noqa: F401  (loads the library once for every test module)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def pytest_collection_modifyitems(config, items):
    # Tests parametrized with device "cuda" only exist when a GPU is present (see DEVICES); tests
    # marked `cuda` need one explicitly.
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def restore_threads():
    """For tests that change torch's intra-op thread count."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def build_libtorch_program(name, source):
    """Compile tests/cpp/<source> into a standalone libtorch executable (cached under build/tests/)."""
    from torch.utils.cpp_extension import load

    build = os.path.join(ROOT, "build", "tests", name)
    os.makedirs(build, exist_ok=True)
    return load(name=name, sources=[os.path.join(ROOT, "tests", "cpp", source)], extra_ldflags=["-ldl"],
                build_directory=build, is_standalone=True, is_python_module=False, verbose=False)


def run_libtorch_program(exe, *args, timeout=300):
    """Run a libtorch program with torch's libraries on the loader path (and no Python involved)."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.dirname(torch.__file__), "lib") + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)
