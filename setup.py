"""Build torchops: one extension library, CUDA kernels included when torch has CUDA and nvcc is found.

Environment:
  TORCHOPS_WITH_CUDA=auto|0|1   auto (default): CUDA build iff torch was built with CUDA and nvcc exists.
  TORCH_CUDA_ARCH_LIST          defaults to "8.0;9.0+PTX" when unset (no GPU is queried at build time).
  MAX_JOBS, DEBUG=1             parallel compile jobs; -O0 -g build.
"""
import glob
import os
import platform
import shutil
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def _toolkit_root(nvcc):
    """The CUDA toolkit root for an nvcc path. `nvcc` may be a wrapper script outside the toolkit
    (e.g. /usr/local/bin/nvcc that execs /usr/local/cuda-13.0/bin/nvcc), so ask nvcc itself."""
    def is_root(d):
        return d and os.path.isfile(os.path.join(d, "include", "cuda_runtime.h"))

    guess = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    if is_root(guess):
        return guess
    try:  # a dry run prints the toolkit's real root as "#$ TOP=..."
        out = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True, timeout=60)
        for line in (out.stdout + out.stderr).splitlines():
            if line.startswith("#$ TOP="):
                top = os.path.normpath(line.split("=", 1)[1].strip())
                if is_root(top):
                    return top
    except (OSError, subprocess.SubprocessError):
        pass
    for d in ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
        if is_root(d):
            return d
    return None


def _configure_cuda_env():
    """Decide on a CUDA build and point torch.utils.cpp_extension at the toolkit. Must run before
    cpp_extension is imported (it reads CUDA_HOME at import time)."""
    mode = os.environ.get("TORCHOPS_WITH_CUDA", "auto").lower()
    if mode not in ("auto", "0", "1"):
        sys.exit(f"TORCHOPS_WITH_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return False
    import torch

    nvcc = None
    if os.environ.get("CUDA_HOME"):
        nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")
    nvcc = nvcc if nvcc and os.path.exists(nvcc) else shutil.which("nvcc")
    have = torch.version.cuda is not None and nvcc is not None
    if not have:
        if mode == "1":
            sys.exit("TORCHOPS_WITH_CUDA=1 but torch has no CUDA (torch.version.cuda is None) or nvcc was not found")
        return False
    root = os.environ.get("CUDA_HOME") or _toolkit_root(nvcc)
    if root is None:
        if mode == "1":
            sys.exit(f"TORCHOPS_WITH_CUDA=1 but no CUDA toolkit root (include/cuda_runtime.h) found for {nvcc}")
        return False
    os.environ["CUDA_HOME"] = root
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    return True


def _wheel_cuda_includes():
    """Headers ATen's CUDA headers need (cuBLAS, cuSPARSE, cuDNN, ...) that a pip-installed torch gets
    from the nvidia-* wheels rather than from the toolkit."""
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs = glob.glob(os.path.join(site, "nvidia", "*", "include"))
    return sorted(d for d in dirs if os.path.isdir(d))


WITH_CUDA = _configure_cuda_env()

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def write_build_info():
    """Record what the library is built against; the loader compares it with the running torch."""
    import torch

    with open(os.path.join(ROOT, "torchops", "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.write(f"TORCH_VERSION = {torch.__version__!r}\n")
        f.write(f"WITH_CUDA = {WITH_CUDA!r}\n")
        f.write(f"CUDA_ARCH_LIST = {os.environ.get('TORCH_CUDA_ARCH_LIST') if WITH_CUDA else None!r}\n")


def extension():
    debug = os.environ.get("DEBUG", "0") == "1"
    # csrc/*.cpp and every folder's .cpp (family folders, cpu/, autograd/); csrc/cuda/ only in CUDA builds.
    sources = sorted(glob.glob("csrc/*.cpp")
                     + [p for p in glob.glob("csrc/*/*.cpp") if os.path.dirname(p) != os.path.join("csrc", "cuda")])
    opt = ["-O0", "-g"] if debug else ["-O3"]
    cxx = opt + ["-fvisibility=hidden", "-Wno-unused-parameter", "-Wno-psabi"]
    link = []
    if platform.machine() == "x86_64" and sys.platform != "win32" and not debug:
        # Hot loops start on a 64-byte line (GCC's default aligns to 16): the channels-first inference loop
        # crossed a line and ran 1.23x (median of 5 processes) the same loop in a separate extension; aligned
        # 1.06x.
        cxx.append("-falign-loops=64")
    if sys.platform.startswith("linux"):
        # at::parallel_for is an OpenMP pragma in ATen's headers (AT_PARALLEL_OPENMP): without -fopenmp the
        # kernels run on one thread. libgomp.so.1 resolves to the copy torch has already loaded.
        cxx.append("-fopenmp")
        link.append("-fopenmp")
        # Link the shared libstdc++ explicitly: a toolchain that links it statically (e.g. a gcc wrapper with
        # -static-libstdc++) gives the library its own iostream code beside the process's, and every
        # `ostream << integer` in it then crashes or prints nothing. check_shared_libstdcxx verifies the result.
        link += ["-Wl,--push-state,--no-as-needed", "-lstdc++", "-Wl,--pop-state"]
    kwargs = dict(
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx},
        extra_link_args=link,
        # The library carries no Python: it must load into a plain libtorch process (torch::jit::load).
        py_limited_api=True,
    )
    if WITH_CUDA:
        # csrc/cuda/*.cpp: CUDA-only host code (ATen's cuDNN ops), compiled by the C++ compiler.
        sources += sorted(glob.glob("csrc/cuda/*.cu") + glob.glob("csrc/cuda/*.cpp"))
        kwargs["include_dirs"] += _wheel_cuda_includes()
        kwargs["extra_compile_args"]["nvcc"] = opt + ["--expt-relaxed-constexpr", "-lineinfo",
                                                      "--threads", os.environ.get("NVCC_THREADS", "2")]
        return CUDAExtension("torchops._C", sources, **kwargs)
    return CppExtension("torchops._C", sources, **kwargs)


def _load_elf_reader():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_torchops_elf", os.path.join(ROOT, "torchops", "_elf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_shared_libstdcxx(path):
    """Fail the build if the linked library does not depend on the shared libstdc++ (see extension())."""
    if sys.platform.startswith("linux"):
        error = _load_elf_reader().static_libstdcxx_error(path, os.environ.get("CXX", "c++"))
        if error:
            sys.exit(error)


class BuildTorchops(BuildExtension.with_options(no_python_abi_suffix=True)):
    def build_extension(self, ext):
        super().build_extension(ext)
        check_shared_libstdcxx(self.get_ext_fullpath(ext.name))


write_build_info()

setup(
    name="torchops",
    version="0.1.0",
    description="TensorFlow's fused training ops as first-class PyTorch operators",
    packages=find_packages(include=["torchops", "torchops.*"]),
    package_data={"torchops.bench": ["*.cpp"]},  # the batching benchmark's libtorch client driver
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildTorchops},
    python_requires=">=3.10",
    install_requires=["torch>=2.11"],
    extras_require={"tf": ["numpy", "h5py"]},  # torchops.tf's readers (h5py only for Keras files)
)
