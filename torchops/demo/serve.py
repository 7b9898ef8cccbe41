"""Export and serving: the trained model scripted with TorchScript, saved, reloaded and checked in a
fresh process; then the reloaded model served through torchops.nn.Batched to concurrent client threads,
against the same clients calling it unbatched. The same model is also exported with torch.export and
compiled into an AOTInductor package, which is served to the same clients, and exported to ONNX
(torchops.onnx), which ONNX Runtime serves to the same clients without torchops."""
import os
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, List

import torch
from torch import Tensor, nn

import torchops

CLIENTS = 16


def export(model: nn.Module, path: str) -> torch.jit.ScriptModule:
    model.eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # TorchScript is what this step shows
        scripted = torch.jit.script(model)
        torch.jit.save(scripted, path)
    return scripted


def _load(path: str, device: str):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        m = torch.jit.load(path, map_location=device)
    m.eval()
    return m


def check_in_fresh_process(model_path: str, x: Tensor, device: str, timeout: float = 300) -> Tensor:
    """Runs the saved model on x in a new Python interpreter (nothing shared with this one but the
    file) and returns its logits."""
    work = os.path.dirname(os.path.abspath(model_path))
    inp, out = os.path.join(work, "fresh_input.pt"), os.path.join(work, "fresh_logits.pt")
    torch.save(x.cpu(), inp)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(torchops.__file__)))  # this torchops, not another
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "torchops.demo.serve", model_path, inp, out, device],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"reloading {model_path} in a fresh process failed (exit {proc.returncode}):\n"
                           f"{proc.stdout}{proc.stderr}")
    return torch.load(out)


def _fresh_process_main(model_path: str, inp: str, out: str, device: str) -> None:
    m = _load(model_path, device)
    x = torch.load(inp).to(device)
    with torch.no_grad():
        y = torch.cat([m(x[i:i + 512]) for i in range(0, len(x), 512)])
    torch.save(y.cpu(), out)


def export_aoti(model: nn.Module, example: Tensor, path: str) -> str:
    """torch.export (dynamic batch) + AOTInductor: a package (.pt2) that runs without Python, from
    `torch._inductor.aoti_load_package` or C++'s `torch::inductor::AOTIModelPackageLoader`."""
    model.eval()
    ep = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    return torch._inductor.aoti_compile_and_package(ep, package_path=path)


class AOTIModule(nn.Module):
    """A loaded AOTInductor package as a module, so that torchops.nn.Batched can batch its calls."""

    def __init__(self, package_path: str):
        super().__init__()
        self.package = torch._inductor.aoti_load_package(package_path)

    def forward(self, x: Tensor) -> Tensor:
        return self.package(x)


@dataclass
class ServeResult:
    name: str
    seconds: float
    latencies_us: List[float]
    predictions: Tensor
    accuracy: float
    histogram: Dict[int, int] = field(default_factory=dict)
    batches: int = 0
    queue_wait_us: Dict[str, float] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return len(self.latencies_us) / self.seconds

    def percentile(self, q: float) -> float:
        s = sorted(self.latencies_us)
        return s[min(len(s) - 1, int(q / 100.0 * len(s)))]


def _run_clients(fn, x: Tensor, clients: int, timeout: float = 300):
    """`clients` threads; thread k sends images k, k+clients, ... one request each; every request's latency."""
    n = len(x)
    out: List = [None] * n
    lat = [0.0] * n
    errors: List[BaseException] = []
    start = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        try:
            with torch.no_grad():
                start.wait()
                for i in range(k, n, clients):
                    t = time.perf_counter()
                    out[i] = fn(x[i:i + 1])
                    lat[i] = (time.perf_counter() - t) * 1e6
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join(timeout)
    seconds = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        raise RuntimeError(f"serving clients did not finish within {timeout} s")
    if errors:
        raise RuntimeError(f"a serving client failed: {errors[0]!r}") from errors[0]
    return torch.cat(out), lat, seconds


def serve(model_path: str, test_set, device: str = "cpu", clients: int = CLIENTS, max_batch_size: int = 16,
          batch_timeout_micros: int = 2000):
    """(unbatched, batched): every test image as one request from `clients` threads, calling the reloaded
    model directly, then through torchops.nn.Batched."""
    x, y = test_set[0].to(device), test_set[1]
    model = _load(model_path, device)

    def batched_model():  # scripted: the batch holder runs the model without going back to Python
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            return torch.jit.script(torchops.nn.Batched(model, num_batch_threads=1, max_batch_size=max_batch_size,
                                                        batch_timeout_micros=batch_timeout_micros))

    # Warm-up (not measured): TorchScript's profiling executor specialises on the first calls' shapes.
    warm = x[:8 * clients]
    _run_clients(model, warm, clients)
    _run_clients(batched_model(), warm, clients)
    logits, lat, sec = _run_clients(model, x, clients)
    pred = logits.argmax(1).cpu()
    unbatched = ServeResult("unbatched", sec, lat, pred, (pred == y).float().mean().item())

    served = batched_model()
    logits, lat, sec = _run_clients(served, x, clients)
    stats = torchops.batching.stats(served.shared_name)
    pred = logits.argmax(1).cpu()
    batched = ServeResult("torchops.nn.Batched (scripted)", sec, lat, pred, (pred == y).float().mean().item(),
                          histogram=dict(sorted(stats["batch_size_histogram"].items())),
                          batches=stats["batches_formed"], queue_wait_us=stats["queue_wait_us"])
    return unbatched, batched


def serve_aoti(package_path: str, test_set, device: str = "cpu", clients: int = CLIENTS, max_batch_size: int = 16,
               batch_timeout_micros: int = 2000):
    """(unbatched, batched): the AOTInductor package served as `serve` serves the TorchScript model."""
    x, y = test_set[0].to(device), test_set[1]
    model = AOTIModule(package_path)
    batched_model = torchops.nn.Batched(model, num_batch_threads=1, max_batch_size=max_batch_size,
                                        batch_timeout_micros=batch_timeout_micros)
    warm = x[:8 * clients]
    _run_clients(model, warm, clients)
    _run_clients(batched_model, warm, clients)
    logits, lat, sec = _run_clients(model, x, clients)
    pred = logits.argmax(1).cpu()
    unbatched = ServeResult("AOTInductor", sec, lat, pred, (pred == y).float().mean().item())
    before = torchops.batching.stats(batched_model.shared_name)
    logits, lat, sec = _run_clients(batched_model, x, clients)
    stats = torchops.batching.stats(batched_model.shared_name)
    pred = logits.argmax(1).cpu()
    hist = {k: v - before["batch_size_histogram"].get(k, 0) for k, v in stats["batch_size_histogram"].items()}
    batched = ServeResult("AOTInductor + Batched", sec, lat, pred, (pred == y).float().mean().item(),
                          histogram={k: v for k, v in sorted(hist.items()) if v},
                          batches=stats["batches_formed"] - before["batches_formed"])
    return unbatched, batched


def onnx_unavailable():
    """None when the ONNX export and ONNX Runtime can run here, else why not (a note for the demo)."""
    import importlib.util

    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None]
    return f"not installed: {', '.join(missing)}" if missing else None


def export_onnx(model: nn.Module, example: Tensor, path: str) -> None:
    """torchops.onnx.export with a dynamic batch: a graph of standard ONNX ops only."""
    import contextlib
    import io

    import torchops.onnx

    with contextlib.redirect_stdout(io.StringIO()), torch.no_grad():  # the exporter's progress lines
        torchops.onnx.export(model.eval(), (example,), path, dynamic_shapes=({0: torch.export.Dim("batch")},))


class OnnxRuntimeModel:
    """An ONNX Runtime CPU session called like the model (tensor in, logits out); one session serves every
    client thread (ONNX Runtime's `run` is thread-safe)."""

    def __init__(self, path: str):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1  # the clients are the parallelism: one thread per request
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: Tensor) -> Tensor:
        return torch.from_numpy(self.session.run(None, {self.input: x.detach().cpu().numpy()})[0])


def serve_onnx(path: str, test_set, clients: int = CLIENTS) -> ServeResult:
    """The ONNX export served by ONNX Runtime (CPU) to `clients` threads, one request per test image."""
    x, y = test_set[0].cpu(), test_set[1]
    model = OnnxRuntimeModel(path)
    _run_clients(model, x[:8 * clients], clients)  # warm-up, not measured
    logits, lat, sec = _run_clients(model, x, clients)
    pred = logits.argmax(1)
    return ServeResult("ONNX Runtime", sec, lat, pred, (pred == y).float().mean().item())


if __name__ == "__main__":
    _fresh_process_main(*sys.argv[1:5])
