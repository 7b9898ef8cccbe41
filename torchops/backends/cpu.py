"""The CPU capability the CPU kernels run at, as ATen's ``ATEN_CPU_CAPABILITY``: ``default`` (baseline x86-64),
``avx2`` (AVX2 + FMA) or ``avx512``. The best one the CPU and the build support is used unless
``TORCHOPS_CPU_CAPABILITY`` (read when the library loads) or :func:`set_cpu_capability` asks for a lower one."""
import contextlib
from typing import Iterator, List

import torch

__all__ = ["get_cpu_capability", "set_cpu_capability", "supported_cpu_capabilities", "capability"]

_ORDER = ("default", "avx2", "avx512")


def get_cpu_capability() -> str:
    """The capability in use."""
    return str(torch.ops.torchops._cpu_capability())


def supported_cpu_capabilities() -> List[str]:
    """Every capability this CPU and this build can run, lowest first."""
    best = str(torch.ops.torchops._best_cpu_capability())
    return list(_ORDER[: _ORDER.index(best) + 1])


def set_cpu_capability(name: str) -> None:
    """Runs the CPU kernels at ``name`` from now on, in the whole process. A ValueError names a capability that
    is unknown or that this CPU cannot run."""
    torch.ops.torchops._set_cpu_capability(name)


@contextlib.contextmanager
def capability(name: str) -> Iterator[None]:
    """``set_cpu_capability(name)`` inside a ``with`` block, the previous capability restored after it."""
    saved = get_cpu_capability()
    set_cpu_capability(name)
    try:
        yield
    finally:
        set_cpu_capability(saved)
