"""Dynamic batching (torchops.nn.Batched = batch -> MLP -> unbatch) vs unbatched calls of the same MLP.

Client threads send 1-row requests back to back for a fixed time; we report throughput and p50/p99
request latency for 1, 4, 16 and 32 clients (at 16+ clients with num_batch_threads 1 and the core count), and the batcher's own added latency per request at low
load (1 client: batched minus unbatched median latency; it includes the wait for the batch timeout,
since a lone client never fills a batch). Targets (issue 4): batched throughput >= 3x unbatched at 16+
clients; added latency at low load <= batch_timeout_micros + 200 us.

`cpus_busy` (process CPU time / wall time) tells a CPU-bound run (close to the core count) from one
that waits on thread wake-ups. A last table gives what the machine allows at all: the compute-only
ceiling (every core running full batches back to back, nothing else) and the ceiling once the
hand-off floor is paid (the CPU time per request of a minimal mutex + condition-variable batcher with
no tensors, measured by the C++ driver's `--handoff` mode), against the measured unbatched rate, next to the better of the two num_batch_threads settings;
`of_ceiling` is measured / ceiling throughput, per row. What separates a row from its ceiling, per request:
`cpu_us_per_req` (the batched side's CPU time per request: model, hand-off and everything else) against the
ceiling's `model_us_per_row` + `handoff_us_per_req`, `batcher_us_per_req` (nn.Batched's own CPU time per request,
measured around a module that returns its input: hand-off plus op calls) and the cores the batched side leaves
idle (cores - `batched_cpus`); `batcher_ceiling` is the ceiling with the batcher's measured cost in place of the
floor's. `pipeline_ceiling` is the minimal batcher whose batches' last arrival runs the plain model on a full
batch (the better of sleeping and yield-spinning waiters, no batching ops): what a batcher of nn.Batched's structure
reaches with this model on this machine, where woken callers queue behind a computing thread while another core
idles and the model, run by a different thread each batch, runs slower than alone.

On a GPU (`--device cuda`) the Python threads call the modules with device tensors (eager and script), and a
last table has C++ client threads send host requests to the MLP and to the demo's model, each wrapped so that
it copies rows to the GPU and results back (`_HostIO`): per call for direct calls, per batch behind nn.Batched.
"""
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import uuid

import torch

import torchops
from ._timing import median_seconds, print_table

IN, HIDDEN, OUT = 256, 1024, 256
CLIENTS = [1, 4, 16, 32]
MAX_BATCH = [8, 16, 32]
TIMEOUT_US = 1000
# On a GPU: the C++ clients at >= 2x max_batch_size (and fewer configurations: each driver run is a process
# that initialises CUDA).
CUDA_CLIENTS = [1, 16, 32]
CUDA_CPP = [(16, 8), (32, 8), (32, 16)]  # (clients, max_batch)
CUDA_SPEEDUP_TARGET = 3.0


def _mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT)).to(device)


def _drive(fn, clients, seconds, device):
    """Each client calls fn(x) back to back for `seconds`; returns (requests/s, p50 us, p99 us, cpus busy)."""
    lat = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    stop = threading.Event()
    errors = []

    def client(i):
        torch.set_grad_enabled(False)  # inference serving (grad mode is per thread)
        torch.set_num_threads(1)  # OpenMP's thread count is per thread too
        x = torch.randn(1, IN, device=device)
        try:
            fn(x)  # warm-up
            start.wait()
            while not stop.is_set():
                t0 = time.perf_counter()
                fn(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                lat[i].append(time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0, cpu0 = time.perf_counter(), time.process_time()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(60)
    elapsed = time.perf_counter() - t0
    cpus = (time.process_time() - cpu0) / elapsed
    if errors:
        raise errors[0]
    all_lat = sorted(v for l in lat for v in l)
    n = len(all_lat)
    p = lambda q: all_lat[min(n - 1, int(q * (n - 1) + 0.5))] * 1e6  # noqa: E731
    return n / elapsed, p(0.5), p(0.99), cpus


def _interleaved_latency(direct, batched, device, seconds):
    """One client: alternates a direct and a batched call, so that both see the same machine state;
    returns the median latency (us) of each and the p99 of the batched calls."""
    x = torch.randn(1, IN, device=device)
    for _ in range(5):
        direct(x), batched(x)
    d, b = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(d) < 50:
        t0 = time.perf_counter()
        direct(x)
        t1 = time.perf_counter()
        batched(x)
        t2 = time.perf_counter()
        d.append(t1 - t0)
        b.append(t2 - t1)
    b_sorted = sorted(b)
    return statistics.median(d) * 1e6, statistics.median(b) * 1e6, b_sorted[int(0.99 * (len(b) - 1))] * 1e6


def _cpp_driver():
    """Builds (once, cached by torch.utils.cpp_extension) the libtorch driver of mode "cpp"."""
    from torch.utils.cpp_extension import load

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "batching_driver.cpp")
    return load(name="torchops_batching_bench_driver", sources=[src], extra_cflags=["-O2"], extra_ldflags=["-ldl"],
                is_standalone=True, is_python_module=False, verbose=False)


class _HostIO(torch.nn.Module):
    """Host rows in, host rows out, the module on `device`: what a server receiving requests from the network
    runs. Behind nn.Batched the copies to and from the device are made once per batch."""

    device: str

    def __init__(self, module: torch.nn.Module, device: str):
        super().__init__()
        self.module = module
        self.device = device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x.to(torch.device(self.device))).cpu()


class _CppModel:
    """A scripted model driven by N C++ threads of a separate libtorch process (no GIL)."""

    def __init__(self, exe, scripted, tmpdir, shared_name="", shape=(IN,), device="cpu"):
        self.exe = exe
        self.shared_name = shared_name  # (batched models: its queue's statistics come back too)
        self.shape = "x".join(str(d) for d in shape)  # one request row
        self.device = device  # (cuda: host requests and results, see _HostIO)
        self.stats = None
        self.path = os.path.join(tmpdir, f"{uuid.uuid4().hex}.pt")
        scripted.save(self.path)

    @staticmethod
    def _env():
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")  # libtorch (and libc10_cuda) for the driver
        return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                    LD_LIBRARY_PATH=torch_lib + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""))

    def drive(self, clients, seconds, rows=1):
        cmd = [self.exe, torchops._loader.library_path(), self.path, str(clients), str(seconds), self.shape]
        p = subprocess.run(cmd + [self.shared_name, str(rows), self.device], capture_output=True, text=True,
                           timeout=300, env=self._env())
        if p.returncode != 0:
            raise RuntimeError(f"batching bench driver failed: {p.stdout}{p.stderr}")
        lines = p.stdout.splitlines()
        self.stats = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else None
        return tuple(float(v) for v in lines[0].split())

    def pipeline(self, clients, batch, seconds, spin):
        """Requests/s of the driver's minimal batcher whose batches' last arrival runs this (plain) model on
        `batch` rows; the waiters sleep, or yield-spin with `spin`."""
        cmd = [self.exe, "--pipeline", str(batch), "spin" if spin else "sleep", torchops._loader.library_path(),
               self.path, str(clients), str(seconds), self.shape]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=self._env())
        if p.returncode != 0:
            raise RuntimeError(f"batching bench driver (--pipeline) failed: {p.stdout}{p.stderr}")
        return float(p.stdout.split()[0])


def _handoff_us(exe, clients, max_batch, seconds):
    """CPU microseconds per request of the driver's minimal batcher (no tensors): the hand-off floor."""
    p = subprocess.run([exe, "--handoff", str(clients), str(max_batch), str(seconds)], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"batching bench driver (--handoff) failed: {p.stdout}{p.stderr}")
    rps, _, _, cpus = (float(v) for v in p.stdout.split())
    return cpus / rps * 1e6


class _Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _batcher_us(exe, clients, max_batch, nbt, seconds, tmpdir):
    """CPU microseconds per request of nn.Batched around a module that returns its input (cpp mode)."""
    name = f"bench/{uuid.uuid4().hex}"
    b = torch.jit.script(torchops.nn.Batched(_Identity(), num_batch_threads=nbt, max_batch_size=max_batch,
                                             batch_timeout_micros=TIMEOUT_US, shared_name=name))
    rps, _, _, cpus = _CppModel(exe, b, tmpdir, name).drive(clients, seconds)
    return cpus / rps * 1e6


def _ceilings(mlp, exe, rows, seconds, tmpdir):
    """What this machine allows for the cpp mode's batched runs at 16+ clients (see the module doc), next to
    the better measured num_batch_threads setting; adds `of_ceiling` to the throughput rows it covers."""
    cores = len(os.sched_getaffinity(0))
    unbatched = {r["clients"]: r["unbatched_req/s"] for r in rows if r["mode"] == "cpp"}
    scripted = _CppModel(exe, torch.jit.script(mlp), tmpdir)
    out = []
    for max_batch in MAX_BATCH:
        x = torch.randn(max_batch, IN)
        row_us = median_seconds(lambda: mlp(x), torch.device("cpu"), min_time=0.3) / max_batch * 1e6
        for clients in (c for c in CLIENTS if c >= 16 and c >= max_batch):
            in_flight = min(cores, clients // max_batch)  # batches that can run at once
            handoff = _handoff_us(exe, clients, max_batch, seconds)
            compute = in_flight / row_us * 1e6
            with_handoff = min(compute, cores / (row_us + handoff) * 1e6)
            # The batcher's own CPU time per request: the same clients and queue around a module that returns
            # its input (hand-off plus op calls; no model).
            best_nbt = max((r for r in rows if r["mode"] == "cpp" and r["clients"] == clients
                            and r["max_batch"] == max_batch), key=lambda r: r["batched_req/s"])["nbt"]
            batcher = _batcher_us(exe, clients, max_batch, best_nbt, seconds, tmpdir)
            with_batcher = min(compute, cores / (row_us + batcher) * 1e6)
            # The minimal batcher running this model (the better of sleeping and yield-spinning waiters).
            pipeline = max(scripted.pipeline(clients, max_batch, seconds, spin) for spin in (False, True))
            # The same, measured now: batches_at_once C++ threads running full batches of the plain
            # model back to back (on a shared machine, less than the cores' worth of it).
            rps, _, _, _ = scripted.drive(in_flight, seconds, rows=max_batch)
            compute_now = rps * max_batch
            same = [r for r in rows if r["clients"] == clients and r["max_batch"] == max_batch]
            for r in same:
                r["of_ceiling"] = r["batched_req/s"] / with_handoff
                r["of_compute_now"] = r["batched_req/s"] / compute_now
            best = max((r for r in same if r["mode"] == "cpp"), key=lambda r: r["batched_req/s"])
            out.append({"table": "ceiling", "case": f"ceiling c{clients} mb{max_batch}", "clients": clients,
                        "max_batch": max_batch, "model_us_per_row": row_us,
                        "batches_at_once": in_flight, "handoff_us_per_req": handoff, "compute_ceiling_req/s": compute,
                        "ceiling_req/s": with_handoff, "compute_now_req/s": compute_now,
                        "batcher_us_per_req": batcher, "batcher_ceiling_req/s": with_batcher,
                        "of_batcher_ceiling": best["batched_req/s"] / with_batcher,
                        "pipeline_ceiling_req/s": pipeline, "pipeline_speedup": pipeline / unbatched[clients],
                        "of_pipeline_ceiling": best["batched_req/s"] / pipeline,
                        "unbatched_req/s": unbatched[clients],
                        "ceiling_speedup": with_handoff / unbatched[clients], "best_nbt": best["nbt"],
                        "measured_req/s": best["batched_req/s"], "speedup": best["speedup"],
                        "of_ceiling": best["batched_req/s"] / with_handoff,
                        "of_compute_now": best["batched_req/s"] / compute_now,
                        "cpu_us_per_req": best["cpu_us_per_req"], "batched_cpus": best["batched_cpus"],
                        "batched_p99_us": best["batched_p99_us"],
                        "unbatched_p99_us": best["unbatched_p99_us"]})
    return out


def _cuda_cpp_rows(exe, device, seconds, rounds, tmpdir):
    """C++ client threads on a GPU: the MLP and the demo's model (untrained DigitNet), host requests and
    results (_HostIO), direct calls against nn.Batched with one batch thread."""
    from ..demo.model import build_model

    workloads = [("mlp", lambda: _mlp(device).eval(), (IN,)),
                 ("demo", lambda: build_model("gru", device=str(device)).eval(), (1, 8, 8))]
    rows = []
    for label, make, shape in workloads:
        try:
            host = _HostIO(make(), str(device))
            rows += _cuda_cpp_workload(exe, label, host, shape, device, seconds, rounds, tmpdir)
        except Exception as e:  # noqa: BLE001  (one workload failing must not hide the other's rows)
            print(f"batching: C++ clients on {device}, model {label!r} failed: {e}")
    return rows


def _cuda_cpp_workload(exe, label, host, shape, device, seconds, rounds, tmpdir):
    """The rows of one model (host requests, _HostIO) in _cuda_cpp_rows."""
    rows = []
    direct = _CppModel(exe, torch.jit.script(host), tmpdir, shape=shape, device="cuda")
    for clients in sorted({c for c, _ in CUDA_CPP}):
        configs, batched = [], []
        for max_batch in [m for c, m in CUDA_CPP if c == clients]:
            name = f"bench/{uuid.uuid4().hex}"
            b = torch.jit.script(torchops.nn.Batched(host, num_batch_threads=1, max_batch_size=max_batch,
                                                     batch_timeout_micros=TIMEOUT_US, shared_name=name))
            configs.append(max_batch)
            batched.append(_CppModel(exe, b, tmpdir, name, shape=shape, device="cuda"))
        results = _median_drive([direct] + batched, clients, seconds, device, rounds)
        tp_u, p50_u, p99_u, cpus_u = results[0][:4]
        for max_batch, res in zip(configs, results[1:]):
            tp_b, p50_b, p99_b, cpus_b = res[:4]
            row = {"table": "cuda_cpp", "case": f"cpp {label} c{clients} mb{max_batch}", "mode": "cpp",
                   "model": label, "clients": clients, "max_batch": max_batch, "nbt": 1,
                   "unbatched_req/s": tp_u, "batched_req/s": tp_b, "speedup": tp_b / tp_u,
                   "unbatched_p50_us": p50_u, "unbatched_p99_us": p99_u, "batched_p50_us": p50_b,
                   "batched_p99_us": p99_b, "p50_budget_us": p50_u + TIMEOUT_US, "unbatched_cpus": cpus_u,
                   "batched_cpus": cpus_b, "cpu_us_per_req": cpus_b / tp_b * 1e6}
            if label == "mlp":
                row["met"] = tp_b >= CUDA_SPEEDUP_TARGET * tp_u and p50_b <= p50_u + TIMEOUT_US
            s = res[4]
            if s:
                row["mean_batch"] = s["rows"] / max(1, s["batches_formed"])
                row["queue_wait_p50_us"] = s["queue_wait_us"]["p50"]
            rows.append(row)
    return rows


def _median_drive(fns, clients, seconds, device, rounds):
    """Alternates the callables `rounds` times; per callable the round with the median throughput."""
    per = [[] for _ in fns]
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            if isinstance(fn, _CppModel):
                per[i].append(fn.drive(clients, seconds) + (fn.stats,))
            else:
                per[i].append(_drive(fn, clients, seconds, device))
    return [sorted(r, key=lambda v: v[0])[len(r) // 2] for r in per]


def run(args):
    device = torch.device(args.device)
    if device.type != "cpu":
        print("batching: the gradients of the batching ops are CPU-only; the forward benchmark runs on "
              f"{device} anyway")
    seconds = 0.3 if args.quick else 0.7
    rounds = 1 if args.quick else 2
    mlp = _mlp(device).eval()
    # Serving-style: one intra-op thread per call (many client threads share the cores); every mode
    # is measured under the same setting.
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    modes = ["eager", "script"]
    exe = None
    try:
        exe = _cpp_driver()
        if device.type == "cpu":
            modes.append("cpp")  # (on a GPU, the C++ clients' own table below)
    except Exception as e:  # noqa: BLE001
        print(f"batching: mode 'cpp' skipped (could not build the libtorch driver: {e})")
    tmpdir = tempfile.mkdtemp(prefix="torchops-bench-")
    cores = len(os.sched_getaffinity(0))
    cuda = device.type == "cuda"
    cuda_rows = []
    with torch.no_grad():
        for mode in modes:
            for clients in CUDA_CLIENTS if cuda else CLIENTS:
                direct = mlp if mode == "eager" else torch.jit.script(mlp)
                if mode == "cpp":
                    direct = _CppModel(exe, direct, tmpdir)
                # One batch thread, and one per core where several batches can be under way at once (on the
                # CPU: the batch thread count is what shares the cores).
                nbts = sorted({1, cores}) if clients >= 16 and not cuda else [1]
                configs, batched = [], []
                for nbt in nbts:
                    for max_batch in MAX_BATCH:
                        name = f"bench/{uuid.uuid4().hex}"
                        b = torchops.nn.Batched(mlp, num_batch_threads=nbt, max_batch_size=max_batch,
                                                batch_timeout_micros=TIMEOUT_US, shared_name=name)
                        if mode != "eager":
                            b = torch.jit.script(b)
                        configs.append((nbt, max_batch, name))
                        batched.append(_CppModel(exe, b, tmpdir, name) if mode == "cpp" else b)
                results = _median_drive([direct] + batched, clients, seconds, device, rounds)
                tp_u, p50_u, p99_u, cpus_u = results[0][:4]
                for (nbt, max_batch, name), b, res in zip(configs, batched, results[1:]):
                    tp_b, p50_b, p99_b, cpus_b = res[:4]
                    row = {"table": "throughput", "case": f"{mode} c{clients} mb{max_batch} nbt{nbt}", "mode": mode,
                           "clients": clients, "max_batch": max_batch, "nbt": nbt, "unbatched_req/s": tp_u,
                           "batched_req/s": tp_b, "speedup": tp_b / tp_u, "unbatched_p50_us": p50_u,
                           "unbatched_p99_us": p99_u, "batched_p50_us": p50_b, "batched_p99_us": p99_b,
                           "unbatched_cpus": cpus_u, "batched_cpus": cpus_b,
                           "cpu_us_per_req": cpus_b / tp_b * 1e6}
                    # (the cpp driver's queues live in its own process: it reports their statistics)
                    s = res[4] if mode == "cpp" else torchops.batching.stats(name)
                    if s:
                        row["mean_batch"] = s["rows"] / max(1, s["batches_formed"])
                        row["queue_wait_p50_us"] = s["queue_wait_us"]["p50"]
                    rows.append(row)
        # The batcher's own cost at low load: one client, so every batch waits for its timeout and
        # ships alone; added = batched - unbatched median latency.
        added = []
        for mode in ("eager", "script"):
            for timeout in (0, TIMEOUT_US):
                batched = torchops.nn.Batched(mlp, 1, MAX_BATCH[-1], timeout, shared_name=f"bench/{uuid.uuid4().hex}")
                direct = mlp
                if mode == "script":
                    batched, direct = torch.jit.script(batched), torch.jit.script(mlp)
                p50_u, p50_b, p99_b = _interleaved_latency(direct, batched, device, 1.0 if args.quick else 2.0)
                added.append({"table": "added_latency", "mode": mode, "batch_timeout_us": timeout, "unbatched_p50_us": p50_u,
                              "batched_p50_us": p50_b, "batched_p99_us": p99_b, "added_p50_us": p50_b - p50_u,
                              "budget_us": timeout + 200, "met": p50_b - p50_u <= timeout + 200})
        ceilings = _ceilings(mlp, exe, rows, seconds, tmpdir) if exe is not None and not cuda else []
        if cuda and exe is not None:
            cuda_rows = _cuda_cpp_rows(exe, device, seconds, rounds, tmpdir)
    torch.set_num_threads(prev_threads)
    print_table(f"batching: MLP {IN}->{HIDDEN}->{OUT} float32, 1-row requests from N client threads; "
                f"nn.Batched(max_batch_size=max_batch, batch_timeout_micros={TIMEOUT_US}, num_batch_threads=nbt) "
                f"vs direct calls ({device}; eager = Python threads calling the modules, script = Python threads "
                f"calling torch.jit.script'ed modules, cpp = C++ threads of a libtorch process calling the scripted "
                f"modules)", rows,
                ["mode", "clients", "max_batch", "nbt", "unbatched_req/s", "batched_req/s", "speedup", "of_ceiling",
                 "of_compute_now", "unbatched_p50_us", "unbatched_p99_us", "batched_p50_us", "batched_p99_us", "unbatched_cpus",
                 "batched_cpus", "cpu_us_per_req", "mean_batch", "queue_wait_p50_us"])
    print_table("batching: added latency per request at low load (1 client alternating direct and batched "
                "calls, medians)", added,
                ["mode", "batch_timeout_us", "unbatched_p50_us", "batched_p50_us", "batched_p99_us", "added_p50_us",
                 "budget_us", "met"])
    if ceilings:
        print_table(f"batching: what this machine allows ({len(os.sched_getaffinity(0))} cores; cpp mode's "
                    "unbatched rate as the baseline; model_us_per_row: the MLP on one max_batch-row batch, one "
                    "thread; ceiling = min(batches_at_once / model time per row, cores / (model time per row + "
                    "hand-off floor per request)); measured: the cpp mode's better num_batch_threads (best_nbt); "
                    "of_ceiling = measured / ceiling; compute_now: batches_at_once threads running full batches of the "
                    "plain model, measured now; batcher_us_per_req: nn.Batched's CPU time per request around a module "
                    "that returns its input (the batcher without a model); batcher_ceiling = min(batches_at_once / "
                    "model time per row, cores / (model time per row + batcher_us_per_req)); pipeline_ceiling: the "
                    "minimal batcher (no batching ops) whose batches' last arrival runs the plain model, the better "
                    "of sleeping and yield-spinning waiters, pipeline_speedup = pipeline_ceiling / unbatched; "
                    "cpu_us_per_req, "
                    "batched_cpus: the measured side's CPU time per request and busy cores)", ceilings,
                    ["clients", "max_batch", "model_us_per_row", "batches_at_once", "handoff_us_per_req",
                     "batcher_us_per_req", "compute_ceiling_req/s", "ceiling_req/s", "batcher_ceiling_req/s",
                     "pipeline_ceiling_req/s", "unbatched_req/s", "ceiling_speedup", "pipeline_speedup", "best_nbt",
                     "measured_req/s", "speedup", "of_ceiling", "of_batcher_ceiling", "of_pipeline_ceiling", "compute_now_req/s", "of_compute_now", "cpu_us_per_req", "batched_cpus",
                     "unbatched_p99_us", "batched_p99_us"])
    if cuda_rows:
        print_table(f"batching on {torch.cuda.get_device_name(device)}: C++ client threads of a libtorch process, "
                    f"host requests and results (the model copies each call's or each batch's rows to the GPU and "
                    f"back), direct calls vs nn.Batched(num_batch_threads=1, batch_timeout_micros={TIMEOUT_US}); mlp = "
                    f"the MLP above, demo = the demo's DigitNet (GRU head); met: mlp speedup >= "
                    f"{CUDA_SPEEDUP_TARGET} and batched p50 <= unbatched p50 + batch_timeout_micros", cuda_rows,
                    ["model", "clients", "max_batch", "unbatched_req/s", "batched_req/s", "speedup", "met",
                     "unbatched_p50_us", "batched_p50_us", "p50_budget_us", "unbatched_p99_us", "batched_p99_us",
                     "unbatched_cpus", "batched_cpus", "cpu_us_per_req", "mean_batch", "queue_wait_p50_us"])
    torchops.batching.close_all()
    return rows + added + ceilings + cuda_rows
