"""Build torchops: one extension library, CUDA kernels included where they can run.

Environment:
  TORCHOPS_WITH_CUDA=auto|0|1   auto (default): CUDA kernels iff torch was built with CUDA, nvcc is found and
                                a GPU is visible or TORCH_CUDA_ARCH_LIST is set (a build machine); 1: require
                                them (fails without nvcc); 0: CPU only.
  TORCH_CUDA_ARCH_LIST          GPU architectures; unset: the visible GPUs' own, else "8.0;9.0+PTX".
  MAX_JOBS, DEBUG=1             parallel compile jobs; -O0 -g build.

Objects are kept in build/torchops-cpu or build/torchops-cuda, so a rebuild recompiles only what changed; an
in-place or editable build whose inputs (csrc/, setup.py, flags, torch, compiler) are unchanged is skipped.
"""
import glob
import hashlib
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


def _find_nvcc():
    nvcc = os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc") if os.environ.get("CUDA_HOME") else None
    return nvcc if nvcc and os.path.exists(nvcc) else shutil.which("nvcc")


def _visible_gpu_archs(torch):
    """The compute capabilities of the visible GPUs ("9.0;8.6"), or "" when none is visible."""
    try:
        if not torch.cuda.is_available():
            return ""
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    except RuntimeError:  # a driver that cannot initialise counts as no GPU
        return ""
    return ";".join(f"{major}.{minor}" for major, minor in sorted(caps))


def _configure_cuda_env():
    """Decide on a CUDA build and point torch.utils.cpp_extension at the toolkit. Must run before
    cpp_extension is imported (it reads CUDA_HOME at import time). Returns (with_cuda, reason)."""
    mode = os.environ.get("TORCHOPS_WITH_CUDA", "auto").lower()
    if mode not in ("auto", "0", "1"):
        sys.exit(f"TORCHOPS_WITH_CUDA must be auto, 0 or 1, got {mode!r}")
    if mode == "0":
        return False, "TORCHOPS_WITH_CUDA=0"
    import torch

    nvcc = _find_nvcc()
    if torch.version.cuda is None or nvcc is None:
        missing = (f"torch {torch.__version__} has no CUDA (torch.version.cuda is None)" if torch.version.cuda is None
                   else "nvcc was not found (neither $CUDA_HOME/bin/nvcc nor on PATH)")
        if mode == "1":
            sys.exit(f"TORCHOPS_WITH_CUDA=1 but {missing}")
        return False, f"auto: {missing}"
    gpus = _visible_gpu_archs(torch)
    if mode == "auto" and not gpus and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        # Kernels that cannot run here cost most of the build time; a build machine says TORCH_CUDA_ARCH_LIST.
        return False, "auto: no GPU visible and TORCH_CUDA_ARCH_LIST unset; TORCHOPS_WITH_CUDA=1 forces them"
    root = os.environ.get("CUDA_HOME") or _toolkit_root(nvcc)
    if root is None:
        if mode == "1":
            sys.exit(f"TORCHOPS_WITH_CUDA=1 but no CUDA toolkit root (include/cuda_runtime.h) found for {nvcc}")
        return False, f"auto: no CUDA toolkit root (include/cuda_runtime.h) found for {nvcc}"
    os.environ["CUDA_HOME"] = root
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", gpus or DEFAULT_CUDA_ARCHS)
    reason = "TORCHOPS_WITH_CUDA=1" if mode == "1" else ("auto: GPU visible" if gpus else "auto: TORCH_CUDA_ARCH_LIST set")
    return True, reason


def _wheel_cuda_includes():
    """Headers ATen's CUDA headers need (cuBLAS, cuSPARSE, cuDNN, ...) that a pip-installed torch gets
    from the nvidia-* wheels rather than from the toolkit."""
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs = glob.glob(os.path.join(site, "nvidia", "*", "include"))
    return sorted(d for d in dirs if os.path.isdir(d))


WITH_CUDA, CUDA_REASON = _configure_cuda_env()
print(f"torchops: CUDA kernels: {'yes' if WITH_CUDA else 'no'} ({CUDA_REASON})", file=sys.stderr)

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402


def _tool_version(command):
    """First line of `command --version` ("" when it cannot run): part of what the library is built with."""
    try:
        out = subprocess.run([*command.split(), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    release = [line for line in lines if "release" in line]  # nvcc: "Cuda compilation tools, release 13.0, V13.0.88"
    return (release or lines or [""])[0]


COMPILER = _tool_version(os.environ.get("CXX", "c++"))
NVCC_VERSION = _tool_version(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")) if WITH_CUDA else ""


# The CPU loops built once per CPU capability, as ATen's native/cpu kernels (csrc/cpu/cpu_isa.h): each
# capability's compiler flags and level, and the capabilities each source is built for. On x86-64 with a
# GCC-style compiler every capability is built and picked at run time; elsewhere the Default build only.
CPU_CAPABILITIES = {
    "default": (0, []),
    "avx2": (1, ["-mavx2", "-mfma"]),
    "avx512": (2, ["-mavx512f", "-mavx512vl", "-mavx512bw", "-mavx512dq", "-mavx2", "-mfma"]),
}
CPU_CAPABILITY_SOURCES = {
    "csrc/cpu/block_rnn_kernel_isa.cpp": ("default", "avx2", "avx512"),
    "csrc/cpu/cudnn_rnn_kernel_isa.cpp": ("default", "avx2", "avx512"),
    "csrc/cpu/fused_batch_norm_kernel_isa.cpp": ("default", "avx2"),  # 32-byte vectors: AVX-512 runs the AVX2 build
    "csrc/cpu/packed_gemm_kernel_isa.cpp": ("avx2", "avx512"),  # callers fall back to MKL or ATen below AVX2
}
CPU_DISPATCH = platform.machine() in ("x86_64", "AMD64") and sys.platform != "win32"


def cpu_capability_builds():
    """(capability, level, flags, sources) of each capability build, lowest first."""
    listed = set(glob.glob("csrc/cpu/*_isa.cpp"))
    if listed != set(CPU_CAPABILITY_SOURCES):
        sys.exit(f"setup.py: CPU_CAPABILITY_SOURCES lists {sorted(CPU_CAPABILITY_SOURCES)} but csrc/cpu holds "
                 f"{sorted(listed)}")
    builds = []
    for cap, (level, flags) in CPU_CAPABILITIES.items():
        sources = [src for src, caps in CPU_CAPABILITY_SOURCES.items() if cap in caps]
        if sources and (CPU_DISPATCH or cap == "default"):
            builds.append((cap, level, flags, sources))
    return builds


def write_build_info(package_dir):
    """Record what the library is built against, next to it; the loader compares it with the running torch and
    `python -m torchops.info` prints it."""
    import torch

    info = {"TORCH_VERSION": torch.__version__, "WITH_CUDA": WITH_CUDA, "CUDA_REASON": CUDA_REASON,
            "CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST") if WITH_CUDA else None,
            "CUDA_VERSION": torch.version.cuda if WITH_CUDA else None, "NVCC": NVCC_VERSION or None,
            "COMPILER": COMPILER or None, "CPU_CAPABILITY_BUILDS": [b[0] for b in cpu_capability_builds()]}
    os.makedirs(package_dir, exist_ok=True)
    with open(os.path.join(package_dir, "_build_info.py"), "w") as f:
        f.write("# Written by setup.py at build time.\n")
        f.writelines(f"{key} = {value!r}\n" for key, value in info.items())


def extension():
    debug = os.environ.get("DEBUG", "0") == "1"
    # csrc/*.cpp and every folder's .cpp (family folders, cpu/, autograd/); csrc/cuda/ only in CUDA builds.
    # (csrc/cpu/*_isa.cpp: compiled once per CPU capability by BuildTorchops, see CPU_CAPABILITY_SOURCES)
    sources = sorted(glob.glob("csrc/*.cpp")
                     + [p for p in glob.glob("csrc/*/*.cpp") if os.path.dirname(p) != os.path.join("csrc", "cuda")
                        and not p.endswith("_isa.cpp")])
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # -g0 overrides the -g of Python's own CFLAGS: debug info of torch's templates doubled the compile time of the
    # heaviest units (DEBUG=1 builds keep it).
    cxx = opt + ([] if debug else ["-g0"]) + ["-fvisibility=hidden", "-Wno-unused-parameter", "-Wno-psabi"]
    link = []
    if platform.machine() == "x86_64" and sys.platform != "win32" and not debug:
        # Hot loops start on a 64-byte line (GCC's default aligns to 16): the channels-first inference loop
        # crossed a line and ran 1.23x (median of 5 processes) the same loop in a separate extension; aligned
        # 1.06x.
        cxx.append("-falign-loops=64")
    if CPU_DISPATCH:
        cxx.append("-DTORCHOPS_CPU_DISPATCH=1")
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


# Inputs of the build besides the sources: a change to any of them rebuilds (see BuildTorchops.build_key).
_BUILD_ENV = ("CXX", "CC", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "DEBUG", "TORCH_CUDA_ARCH_LIST", "CUDA_HOME",
              "NVCC_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS")


class BuildTorchops(BuildExtension.with_options(no_python_abi_suffix=True)):
    """torch's ninja build in a fixed folder under build/ (setuptools gives editable installs a fresh temporary
    build_temp every time, so `pip install -e .` recompiled everything), skipped altogether for in-place and
    editable builds whose inputs are unchanged."""

    def finalize_options(self):
        super().finalize_options()
        # One folder per configuration, so that switching TORCHOPS_WITH_CUDA does not recompile the other's objects.
        self.build_temp = os.path.join(ROOT, "build", "torchops-cuda" if WITH_CUDA else "torchops-cpu")

    def build_key(self):
        """A digest of everything the library is built from, with paths relative to the checkout (a copy of the
        checkout elsewhere, e.g. a fresh clone given the built library, has the same key)."""
        import torch

        h = hashlib.sha256()
        paths = ["setup.py"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**"),
                                                                                      recursive=True)
                                      if os.path.isfile(p))
        for rel in paths:
            with open(os.path.join(ROOT, rel), "rb") as f:
                h.update(rel.replace(os.sep, "/").encode() + b"\0" + hashlib.sha256(f.read()).digest())
        settings = [torch.__version__, sys.version.split()[0], WITH_CUDA, COMPILER, NVCC_VERSION]
        settings += [(k, os.environ.get(k)) for k in _BUILD_ENV]
        for ext in self.extensions:
            # (include folders resolved: a virtual environment that links to torch's site-packages is the same torch)
            settings += [ext.name, ext.sources, [os.path.realpath(d) for d in ext.include_dirs],
                         ext.extra_compile_args, ext.extra_link_args, ext.define_macros, ext.libraries]
        # Packages' folders by their site-packages (a venv inside the checkout, as scripts/setup_env.sh makes, would
        # otherwise read as a checkout path), then the checkout's own paths.
        site = os.path.dirname(os.path.dirname(os.path.realpath(torch.__file__)))
        h.update(repr(settings).replace(site, "<site>").replace(ROOT, "<root>").encode())
        return h.hexdigest()

    def _key_path(self, ext):
        return self._inplace_path(ext) + ".buildkey"

    def _inplace_path(self, ext):
        return os.path.join(ROOT, *ext.name.split(".")[:-1], os.path.basename(self.get_ext_filename(ext.name)))

    def run(self):
        inplace = self.inplace or getattr(self, "editable_mode", False)
        # In place (and editable): the checkout's torchops/; a wheel: the build folder the wheel is made from.
        package_dir = os.path.join(ROOT, "torchops") if inplace else os.path.join(self.build_lib, "torchops")
        key = self.build_key()
        if inplace and all(os.path.exists(self._inplace_path(e)) and _read(self._key_path(e)) == key
                           for e in self.extensions):
            print(f"torchops: {', '.join(os.path.relpath(self._inplace_path(e), ROOT) for e in self.extensions)} "
                  "is up to date (sources, flags, torch and compiler unchanged): nothing to build")
            if not os.path.exists(os.path.join(package_dir, "_build_info.py")):
                write_build_info(package_dir)
            return
        # An in-place build that stops half-way must not leave a key that claims it finished; a wheel build leaves
        # the checkout's library and key alone.
        for ext in self.extensions if inplace else ():
            if os.path.exists(self._key_path(ext)):
                os.remove(self._key_path(ext))
        super().run()
        write_build_info(package_dir)
        if inplace:
            for ext in self.extensions:
                with open(self._key_path(ext), "w") as f:
                    f.write(key + "\n")

    def build_extension(self, ext):
        pch = self.start_precompiled_header(ext)  # compiles beside the CPU capability builds
        # Linked after the other objects, lowest capability first: an inline function of a shared header that a
        # wider build emits too is then taken from a build every CPU runs (the linker keeps the first copy).
        ext.extra_objects = list(ext.extra_objects or []) + self.compile_cpu_capabilities(ext)
        include = self.finish_precompiled_header(pch)
        if include:
            ext.extra_compile_args = dict(ext.extra_compile_args, cxx=ext.extra_compile_args["cxx"] + include)
        super().build_extension(ext)
        check_shared_libstdcxx(self.get_ext_fullpath(ext.name))

    def start_precompiled_header(self, ext):
        """Start compiling csrc/common/precompiled.h into a GCC precompiled header for the main build's C++ units,
        with exactly their command line; returns (process, folder, flags to use it) or None (not GCC, DEBUG=1).
        The folder is named by a digest of the command, the header and torch's version: a change of any of them
        gives a new path, so the units' command lines change and ninja recompiles them all (their depfiles do not
        list headers that come from a precompiled one)."""
        import torch
        from torch.utils.cpp_extension import get_cxx_compiler

        args = ext.extra_compile_args
        if os.environ.get("DEBUG", "0") == "1" or not isinstance(args, dict) or not _is_gcc(get_cxx_compiler()):
            return None
        _, _, _, pp_opts, _ = self.compiler._setup_compile(self.build_temp, ext.define_macros, ext.include_dirs, [],
                                                           ext.depends, args)
        with open(os.path.join(ROOT, "csrc", "common", "precompiled.h"), "rb") as f:
            header = f.read()
        command = [get_cxx_compiler(), *self.compiler.compiler_so[1:], *pp_opts, "-x", "c++-header"]
        post = list(args["cxx"])
        if not any(flag.startswith("-std=") for flag in post):
            # What torch's ninja build appends (a different standard makes GCC refuse the header, with a warning).
            post.append("-std=c++20")
        digest = hashlib.sha256(repr([command, post, torch.__version__, torch.version.git_version, COMPILER]).encode()
                                + header).hexdigest()[:16]
        root = os.path.join(self.build_temp, "pch")
        folder = os.path.join(root, digest)
        path = os.path.join(folder, "precompiled.h")
        flags = ["-include", path, "-Winvalid-pch"]
        if os.path.exists(path + ".gch"):
            return None, folder, flags
        shutil.rmtree(root, ignore_errors=True)  # a stale one is half a gigabyte
        os.makedirs(folder)
        with open(path, "wb") as f:
            f.write(header)
        full = command + [path, "-o", path + ".gch.part"] + post
        print("torchops: precompiling the torch headers:", " ".join(full))
        return subprocess.Popen(full), folder, flags

    @staticmethod
    def finish_precompiled_header(pch):
        """The flags that use the precompiled header once it is compiled; none (a note) when it failed to compile:
        the units then parse the headers themselves."""
        if pch is None:
            return []
        process, folder, flags = pch
        if process is not None:
            path = os.path.join(folder, "precompiled.h")
            if process.wait() != 0:
                print("torchops: could not precompile the torch headers; building without them", file=sys.stderr)
                shutil.rmtree(folder, ignore_errors=True)
                return []
            os.replace(path + ".gch.part", path + ".gch")
        return flags

    def compile_cpu_capabilities(self, ext):
        """Objects of the CPU capability builds: each capability's sources compiled with its flags, in a folder of
        its own (an incremental ninja build of its own, as the extension's)."""
        objects = []
        args = ext.extra_compile_args
        for cap, level, flags, sources in cpu_capability_builds():
            cxx = (args["cxx"] if isinstance(args, dict) else list(args)) + flags + [
                f"-DTORCHOPS_CPU_CAPABILITY={level}"]
            objects += self.compiler.compile(sources, output_dir=os.path.join(self.build_temp, "cpu_" + cap),
                                             macros=ext.define_macros, include_dirs=ext.include_dirs,
                                             debug=self.debug, extra_postargs=dict(args, cxx=cxx)
                                             if isinstance(args, dict) else cxx, depends=ext.depends)
        return objects


def _is_gcc(cxx):
    """Whether `cxx` is GCC (clang defines __GNUC__ too, and reads precompiled headers of its own format)."""
    try:
        out = subprocess.run([*cxx.split(), "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "#define __GNUC__ " in out and "__clang__" not in out


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _torch_public_version():
    import torch

    return torch.__version__.split("+")[0]


setup(
    name="torchops",
    version="0.1.0",
    description="TensorFlow's fused training ops as first-class PyTorch operators",
    packages=find_packages(include=["torchops", "torchops.*"]),
    package_data={"torchops.bench": ["*.cpp"]},  # the batching benchmark's libtorch client driver
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildTorchops},
    python_requires=">=3.10",
    # The library links against this torch's C++ ABI: the wheel says so (the loader checks it again at import).
    install_requires=[f"torch=={_torch_public_version()}"],
    extras_require={"tf": ["numpy", "h5py"]},  # torchops.tf's readers (h5py only for Keras files)
)
