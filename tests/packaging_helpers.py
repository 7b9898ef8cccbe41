"""Fresh virtual environments for the packaging tests that see this process's torch (and the other
installed packages) without downloading anything, and without this checkout's own torchops install."""
import os
import subprocess
import sys

import torch

SITE = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _is_torchops(name: str) -> bool:
    low = name.lower()
    return low.startswith(("torchops", "__editable__.torchops", "__editable___torchops"))


def shared_packages(dest, skip=()):
    """A folder of links to every installed package of this environment except torchops (and `skip`)."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(SITE):
        if _is_torchops(name) or name.endswith(".pth") or any(name.lower().startswith(s) for s in skip):
            continue
        os.symlink(os.path.join(SITE, name), os.path.join(dest, name))
    return dest


def make_venv(path, packages_dirs):
    """A venv without pip of its own whose site-packages adds `packages_dirs` (pip included) to sys.path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    py = os.path.join(str(path), "bin", "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True, timeout=120).stdout.strip()
    with open(os.path.join(site, "shared_packages.pth"), "w") as f:
        f.write("".join(f"{d}\n" for d in packages_dirs))
    return py


def clean_env(**extra):
    """This environment without PYTHONPATH (which would import this checkout's torchops)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **extra)
    return env
