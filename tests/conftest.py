import os
import subprocess

import pytest
import torch

import torchops  # noqa: F401  (loads the library once for every test module)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def _runs_on_cuda(item) -> bool:
    """Named test_cuda_*, or a case parametrized with device "cuda" (those exist only with a GPU, see DEVICES)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return item.name.startswith("test_cuda") or any(
        (isinstance(v, str) and v == "cuda") or (isinstance(v, torch.device) and v.type == "cuda")
        for v in params.values())


# Under pytest-xdist's `--dist loadfile` (scripts/test.sh) one worker runs each file's tests in order, as without
# xdist, so that its module fixtures are made once; files that must not overlap share one such unit (here: the
# wheel's build, not in place, deletes the in-place build key that test_scripts.py's clone copies).
_SHARED_UNITS = {"test_scripts.py": "packaging", "test_wheel.py": "packaging"}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid):
            scope = super()._split_scope(nodeid)
            return _SHARED_UNITS.get(os.path.basename(scope), scope)

    return FileScheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # (before `-m` deselects by marker)
def pytest_collection_modifyitems(config, items):
    # Every CUDA test carries the `cuda` marker, so that `pytest -m cuda` selects them all; tests marked
    # `cuda` need a GPU.
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if _runs_on_cuda(item):
            item.add_marker(pytest.mark.cuda)
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fp32_cuda_math():
    """CUDA results are compared with the CPU at float32 tolerances: TF32 (cuDNN's is on by default, and the
    CudnnRNN ops run cuDNN on the GPU) is off in tests, for torchops and for the PyTorch references alike."""
    if not CUDA:
        yield
        return
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


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


def python_exit_delays(scripts, tmp_path, marker, timeout=300):
    """Runs each script in a fresh Python (the repo on its path) at the same time; each prints
    f"{marker} {time.time()}" once it is done and only the interpreter's exit is left. Returns, per script,
    (stdout, stderr, returncode, seconds from that print to the process's exit). Timing from the print, not from
    the start, keeps a slow `import torch` on a loaded machine out of what a hang test measures."""
    import sys
    import time

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    files, procs = [], []
    for i, script in enumerate(scripts):  # files, not pipes: a full pipe would block the exit being timed
        out, err = open(tmp_path / f"out{i}", "w+"), open(tmp_path / f"err{i}", "w+")
        files.append((out, err))
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=out, stderr=err, text=True))
    exited = {}
    deadline = time.monotonic() + timeout
    try:
        while len(exited) < len(procs):
            for i, p in enumerate(procs):
                if i not in exited and p.poll() is not None:
                    exited[i] = time.time()
            if len(exited) < len(procs) and time.monotonic() > deadline:
                raise AssertionError(f"{len(procs) - len(exited)} of {len(procs)} processes still running after "
                                     f"{timeout} s")
            time.sleep(0.01)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for i, (p, (out, err)) in enumerate(zip(procs, files)):
        out.seek(0), err.seek(0)
        o, e = out.read(), err.read()
        out.close(), err.close()
        printed = [line.split()[1] for line in o.splitlines() if line.startswith(marker + " ")]
        delay = exited[i] - float(printed[-1]) if printed else float("inf")
        results.append((o, e, p.returncode, delay))
    return results


CPU_CAPABILITIES = torchops.backends.cpu.supported_cpu_capabilities()


@pytest.fixture(params=CPU_CAPABILITIES)
def cpu_capability(request):
    """Runs a test at each CPU capability this machine can run (every CPU kernel's capability routes), in-process."""
    with torchops.backends.cpu.capability(request.param):
        yield request.param


def slot_routes(route_id):
    """The routes of `route_id`'s slot, in order of preference."""
    rs = torchops.backends.routes()
    me = next(r for r in rs if r["id"] == route_id)
    return [r for r in rs if (r["family"], r["slot"], r["device"]) == (me["family"], me["slot"], me["device"])]


class forced_route:
    """Within the block, `route_id` runs every case it covers (torchops.backends.prefer); on exit the previous
    settings come back and, unless `check=False`, it is asserted that the route ran."""

    def __init__(self, route_id, check=True):
        self.route_id, self.check = route_id, check

    def __enter__(self):
        self._flags = torchops.backends.prefer(self.route_id)
        self._flags.__enter__()
        self._hits = torchops.backends.hits(self.route_id)
        return self

    def __exit__(self, *exc):
        ran = torchops.backends.hits(self.route_id) - self._hits
        self._flags.__exit__(*exc)
        if exc[0] is None and self.check:
            assert ran > 0, f"route {self.route_id} did not run"
        return False


@pytest.fixture
def set_routes():
    """set_routes({route_id: on, ...}) for the rest of the test; the previous settings come back at teardown."""
    import contextlib

    stack = contextlib.ExitStack()
    yield lambda settings: stack.enter_context(torchops.backends.flags(settings))
    stack.close()


# TORCHOPS_ROUTE_REPORT=FILE (scripts/gpu_check.sh sets it): per route, how many tests it ran in passed and failed,
# written as JSON at the end of the session, so that a GPU run says which routes can be marked verified. Under
# pytest-xdist each worker writes FILE.<worker> and the controller merges them into FILE (removing them).
_ROUTE_REPORT = os.environ.get("TORCHOPS_ROUTE_REPORT")
_route_outcomes = {}


_routes = torchops.backends.routes  # (this one: tests/test_info.py swaps torchops.backends for stand-ins)


def _route_hits():
    return {r["id"]: r["hits"] for r in _routes()}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not _ROUTE_REPORT:
        yield
        return
    before = _route_hits()
    yield
    after = _route_hits()
    item._torchops_routes_ran = [r for r, n in after.items() if n > before.get(r, 0)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _ROUTE_REPORT and report.when == "call":
        for route in getattr(item, "_torchops_routes_ran", []):
            entry = _route_outcomes.setdefault(route, {"passed": 0, "failed": 0, "failed_tests": []})
            if report.passed:
                entry["passed"] += 1
            elif report.failed:
                entry["failed"] += 1
                entry["failed_tests"].append(item.nodeid)


def _worker_reports():
    import glob

    return glob.glob(glob.escape(_ROUTE_REPORT) + ".gw*")


def pytest_configure(config):
    if _ROUTE_REPORT and not os.environ.get("PYTEST_XDIST_WORKER"):
        for path in _worker_reports():  # (an earlier run's, which the merge must not count)
            os.remove(path)


def pytest_sessionfinish(session, exitstatus):
    if not _ROUTE_REPORT:
        return
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    merged = _route_outcomes
    if not worker:
        for path in sorted(_worker_reports()):  # (the workers have finished: their sessions end before this one)
            with open(path) as f:
                for route, e in json.load(f).items():
                    m = merged.setdefault(route, {"passed": 0, "failed": 0, "failed_tests": []})
                    m["passed"] += e["passed"]
                    m["failed"] += e["failed"]
                    m["failed_tests"] += e["failed_tests"]
            os.remove(path)
    with open(_ROUTE_REPORT + (f".{worker}" if worker else ""), "w") as f:
        json.dump(merged, f, indent=1)
