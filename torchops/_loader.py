"""Find and load the compiled operator library (torchops/_C.so) exactly once."""
import glob
import os

import torch

_PKG = os.path.dirname(os.path.abspath(__file__))
_loaded = None

_REBUILD = "rebuild it with `pip install --no-build-isolation -e .` (or `python setup.py build_ext --inplace`) in the torchops source tree"


def _library_path():
    candidates = sorted(glob.glob(os.path.join(_PKG, "_C*.so")) + glob.glob(os.path.join(_PKG, "_C*.pyd")))
    if not candidates:
        raise ImportError(f"torchops: the compiled library torchops/_C.so was not found in {_PKG}; {_REBUILD}")
    return candidates[0]


def _built_against():
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info


def load():
    """Load the library; raise ImportError saying what was built against what when it cannot load."""
    global _loaded
    if _loaded is not None:
        return _loaded
    path = _library_path()
    info = _built_against()
    built = getattr(info, "TORCH_VERSION", None)
    if built is not None and built.split("+")[0] != torch.__version__.split("+")[0]:
        raise ImportError(
            f"torchops was built against torch {built} but torch {torch.__version__} is installed; {_REBUILD}")
    try:
        torch.ops.load_library(path)
    except OSError as e:
        raise ImportError(
            f"torchops: could not load {path} (built against torch {built or 'unknown'}, running torch "
            f"{torch.__version__}): {e}; {_REBUILD}") from e
    # TORCHOPS_ROUTES / TORCHOPS_CPU_CAPABILITY: a malformed or unknown value is reported at import.
    torch.ops.torchops._routes_apply_environment()
    _loaded = path
    return path


def library_path():
    """Path of the loaded library, e.g. to dlopen it from a libtorch C++ program."""
    return load()
