"""`python -m torchops.info [--json]`: what this torchops build contains and where it runs, for bug reports.

Prints the torchops version, the torch version the library was built for and the one running, whether the
CUDA kernels were compiled (and for which GPU architectures, and why not), the CPU instruction set the CPU
kernels use, the visible GPUs (and whether the compiled kernels run on them) and, where the build has one, the
table of kernel routes.
"""
import argparse
import json
import os
import platform
import sys
from typing import Dict, List, Optional, Tuple

import torch

import torchops

# The CPU kernels' instruction-set levels (csrc/cpu/cpu_isa.h) and the /proc/cpuinfo flags each one needs.
_ISA_FLAGS = (("avx512", ("avx512f", "avx512vl", "avx512bw", "avx512dq")), ("avx2", ("avx2", "fma")))


def cpu_isa_from_flags(flags) -> str:
    """The best CPU kernel build these /proc/cpuinfo flags allow: "avx512", "avx2" or "default"."""
    flags = set(flags)
    for name, needed in _ISA_FLAGS:
        if all(f in flags for f in needed):
            return name
    return "default"


def _cpuinfo() -> Tuple[str, List[str]]:
    """CPU model name and flags from /proc/cpuinfo (Linux); ("", []) elsewhere."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = value.split()
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


def _cpu_capability(flags) -> Tuple[str, str]:
    """(capability, where it comes from): the library's own choice when it reports it, else the CPU's flags."""
    try:
        from torchops.backends import cpu as backend_cpu

        return str(backend_cpu.get_cpu_capability()), "torchops.backends.cpu"
    except (ImportError, AttributeError):
        pass
    if platform.machine() not in ("x86_64", "AMD64"):
        return "default", platform.machine()
    return cpu_isa_from_flags(flags), "/proc/cpuinfo flags"


def _routes() -> Optional[List[dict]]:
    try:
        from torchops import backends

        return [dict(r) for r in backends.routes()]
    except (ImportError, AttributeError):
        return None


def _format_routes(routes: List[dict]) -> List[str]:
    """The route table as torchops.backends prints it, else as a plain table of the routes' keys."""
    try:
        from torchops import backends

        return ["  " + line for line in backends.format_routes(routes).splitlines()]
    except (ImportError, AttributeError):
        return _route_table(routes)


def _parse_archs(arch_list: Optional[str]) -> List[Tuple[int, int, bool]]:
    """TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX", "8.6 9.0a") as (major, minor, ptx) triples."""
    archs = []
    for item in (arch_list or "").replace(" ", ";").split(";"):
        item = item.strip()
        if not item:
            continue
        ptx = item.upper().endswith("+PTX")
        number = item[:-4] if ptx else item
        major, _, minor = number.partition(".")
        try:
            archs.append((int(major), int("".join(c for c in minor if c.isdigit()) or 0), ptx))
        except ValueError:
            continue
    return archs


def kernels_run_on(arch_list: Optional[str], capability: Tuple[int, int]) -> bool:
    """Whether a library compiled for `arch_list` has code a GPU of this compute capability runs: machine code
    for the same major version and an equal or lower minor one, or PTX for an equal or lower version (the
    driver compiles it)."""
    for major, minor, ptx in _parse_archs(arch_list):
        if (major == capability[0] and minor <= capability[1]) or (ptx and (major, minor) <= tuple(capability)):
            return True
    return False


def _gpus(arch_list: Optional[str], with_cuda: bool) -> List[dict]:
    gpus = []
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:
        count = 0
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        cap = (props.major, props.minor)
        gpus.append({"index": i, "name": props.name, "capability": f"{cap[0]}.{cap[1]}",
                     "memory_gib": round(props.total_memory / 2**30, 1),
                     "torchops_kernels_run": bool(with_cuda and kernels_run_on(arch_list, cap))})
    return gpus


def collect() -> Dict[str, object]:
    """Everything `python -m torchops.info` reports, as a JSON-serialisable dict."""
    try:
        from torchops import _build_info as build
    except ImportError:
        build = None

    def built(name):
        return getattr(build, name, None)

    with_cuda = torchops.built_with_cuda()
    model, flags = _cpuinfo()
    capability, capability_source = _cpu_capability(flags)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torchops": {"version": torchops.__version__, "package": os.path.dirname(os.path.abspath(torchops.__file__)),
                     "library": torchops.library_path},
        "torch": {"running": torch.__version__, "built_for": built("TORCH_VERSION"), "cuda": torch.version.cuda,
                  "cudnn": cudnn},
        "python": {"version": platform.python_version(), "platform": platform.platform()},
        "build": {"cuda_kernels": with_cuda, "cuda_reason": built("CUDA_REASON"),
                  "cuda_archs": built("CUDA_ARCH_LIST") if with_cuda else None,
                  "cuda_version": built("CUDA_VERSION"), "nvcc": built("NVCC"), "compiler": built("COMPILER"),
                  "cpu_capability_builds": built("CPU_CAPABILITY_BUILDS")},
        "cpu": {"model": model or platform.processor() or platform.machine(), "logical_cores": os.cpu_count(),
                "torch_threads": torch.get_num_threads(), "capability": capability,
                "capability_source": capability_source},
        "gpus": _gpus(built("CUDA_ARCH_LIST"), with_cuda),
        "routes": _routes(),
    }


def _route_table(routes: List[dict]) -> List[str]:
    columns = (["id"] if any("id" in r for r in routes) else []) + ["family", "slot", "device", "name", "isa",
                                                                     "verified", "enabled", "covers"]
    cells = [[_cell(r.get(c)) for c in columns] for r in routes]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return lines


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def format_text(info: Dict[str, object]) -> str:
    """The report as plain text, one `key: value` line per fact (pastes into an issue as it is)."""
    t, b, c = info["torchops"], info["build"], info["cpu"]
    torch_info = info["torch"]
    if b["cuda_kernels"]:
        cuda = f"compiled for {b['cuda_archs'] or '?'} (CUDA {b['cuda_version'] or '?'})"
    else:
        cuda = "not compiled" + (f" ({b['cuda_reason']})" if b["cuda_reason"] else "")
    lines = [
        f"torchops:      {t['version']} ({t['package']})",
        f"library:       {t['library']}",
        f"torch:         {torch_info['running']} running, built for {torch_info['built_for'] or 'unknown'}",
        f"torch CUDA:    {torch_info['cuda'] or 'none'}, cuDNN {torch_info['cudnn'] or 'none'}",
        f"python:        {info['python']['version']} on {info['python']['platform']}",
        f"CUDA kernels:  {cuda}",
        f"compiler:      {b['compiler'] or 'unknown'}" + (f"; nvcc {b['nvcc']}" if b["nvcc"] else ""),
        f"CPU:           {c['model']}, {c['logical_cores']} logical cores, torch threads {c['torch_threads']}",
        f"CPU kernels:   {c['capability']} (from {c['capability_source']}); builds: "
        + (" ".join(b["cpu_capability_builds"]) if b["cpu_capability_builds"] else "unknown"),
    ]
    gpus = info["gpus"]
    if not gpus:
        lines.append("GPU:           none visible")
    for g in gpus:
        runs = "torchops kernels run on it" if g["torchops_kernels_run"] else "no torchops kernel for it"
        lines.append(f"GPU {g['index']}:         {g['name']}, compute capability {g['capability']}, "
                     f"{g['memory_gib']} GiB; {runs}")
    if info["routes"] is not None:
        lines += ["routes:"] + (_format_routes(info["routes"]) if info["routes"] else ["  (none)"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchops.info", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    info = collect()
    sys.stdout.write(json.dumps(info, indent=1) + "\n" if args.json else format_text(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
