"""The route table (torchops.backends): listing, defaults (never-run routes off), run-time switches, the
environment variables, the CPU capability override, and parity of every CPU route the machine can run against
plain PyTorch references (each test asserts that its route ran)."""
import os
import pathlib
import platform
import re
import subprocess
import sys

import pytest
import torch

import torchops
from conftest import CPU_CAPABILITIES, ROOT, forced_route, slot_routes
from torchops import backends

ops = torch.ops.torchops

# Routes that have never passed the suite on their device: they must be off by default until a GPU session
# verifies them (and then this list shrinks in the same commit that records the card).
NEVER_RUN = {"fused_batch_norm.cuda.cudnn", "fused_batch_norm.cuda.cudnn_inference", "fused_batch_norm.cuda.vectorized",
             "cudnn_rnn.cuda.cudnn", "block_rnn.cuda.persistent"}


def by_id():
    return {r["id"]: r for r in backends.routes()}


def env_without_route_settings():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCHOPS_ROUTES", None)
    env.pop("TORCHOPS_CPU_CAPABILITY", None)
    return env


def run_python(code, **env_extra):
    env = env_without_route_settings()
    env.update(env_extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


# ------------------------------------------------------------------------------------------ the table
def test_every_slot_ends_in_a_fallback_and_ids_are_unique():
    rs = backends.routes()
    ids = [r["id"] for r in rs]
    assert len(ids) == len(set(ids))
    slots = {}
    for r in rs:
        assert r["id"] == f"{r['family']}.{r['device']}.{r['name']}"
        slots.setdefault((r["family"], r["slot"], r["device"]), []).append(r)
    assert {k[0] for k in slots} == {"fused_batch_norm", "cudnn_rnn", "block_rnn", "rnn"}
    for key, members in slots.items():
        assert [m["fallback"] for m in members] == [False] * (len(members) - 1) + [True], key
        assert members[-1]["verified"], f"the fallback of {key} must be verified"


def test_never_run_routes_are_off_by_default():
    rs = by_id()
    assert NEVER_RUN <= set(rs)
    for r in rs.values():
        if r["verified"] is None:
            assert r["id"] in NEVER_RUN, f"{r['id']} is unverified but not listed as never run"
            assert not r["default"], r["id"]
    # In a process with no TORCHOPS_ROUTES, every unverified route is off, every verified one at its default.
    out = run_python("import torchops, json; print(json.dumps(torchops.backends.routes()))")
    assert out.returncode == 0, out.stderr
    import json
    for r in json.loads(out.stdout.strip().splitlines()[-1]):
        assert r["on"] == r["default"], r["id"]
        if r["id"] in NEVER_RUN:
            assert not r["on"] and not r["enabled"], r["id"]


def test_verified_cuda_routes_name_card_torch_and_date():
    for r in backends.routes(device="cuda"):
        if r["verified"]:
            assert re.fullmatch(r"NVIDIA H[12]00, torch \d+\.\d+, \d{4}-\d{2}-\d{2}", r["verified"]), r


def test_no_getenv_outside_the_route_registry():
    offenders = []
    for path in pathlib.Path(ROOT, "csrc").rglob("*"):
        if path.suffix in (".cpp", ".cu", ".h", ".cuh") and path.name != "routes.cpp":
            if "getenv" in path.read_text():
                offenders.append(str(path))
    assert offenders == []


def _cpu_is_intel():
    try:
        return "GenuineIntel" in pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_building_doc_lists_every_route_with_its_default():
    doc = pathlib.Path(ROOT, "docs", "building.md").read_text()
    rows = re.findall(r"^\| `([a-z_0-9.]+)` \| ([a-z_0-9]+) \| (on|off|on, off on Intel CPUs) \|", doc, flags=re.M)
    assert rows, "docs/building.md has no route table"
    expected = [(r["id"], r["slot"]) for r in backends.routes()]
    assert [(i, s) for i, s, _ in rows] == expected, "docs/building.md's route table differs from the routes"
    for (rid, _, default) in rows:
        want = not _cpu_is_intel() if default == "on, off on Intel CPUs" else default == "on"
        assert by_id()[rid]["default"] == want, rid


def test_format_routes_lists_every_route():
    text = backends.format_routes()
    for r in backends.routes():
        assert r["id"] in text


# ------------------------------------------------------------------------------------------ switches
def test_set_enabled_and_flags_restore():
    rid = "cudnn_rnn.cpu.onednn"
    assert backends.is_enabled(rid)
    with backends.flags({rid: False}):
        assert not backends.is_enabled(rid)
        assert not by_id()[rid]["on"]
    assert backends.is_enabled(rid)
    backends.set_enabled(rid, False)
    try:
        assert not backends.is_enabled(rid)
    finally:
        backends.set_enabled(rid, True)
    assert backends.is_enabled(rid)


def test_unknown_route_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown torchops route 'cudnn_rnn\.cuda\.nope'.*cudnn_rnn\.cuda\.cudnn"):
        backends.set_enabled("cudnn_rnn.cuda.nope", True)
    with pytest.raises(ValueError, match="unknown torchops route"):
        with backends.flags({"nope": True}):
            pass


def test_fallback_cannot_be_turned_off():
    with pytest.raises(ValueError, match="fallback.*cannot be turned off"):
        backends.set_enabled("cudnn_rnn.cpu.loops", False)
    assert backends.is_enabled("cudnn_rnn.cpu.loops")


def test_flags_restore_after_an_error_inside():
    rid = "cudnn_rnn.cpu.onednn"
    with pytest.raises(KeyError):
        with backends.flags({rid: False}):
            raise KeyError("x")
    assert backends.is_enabled(rid)


def test_never_run_route_can_be_turned_on_and_off():
    rid = "cudnn_rnn.cuda.cudnn"
    with backends.flags({rid: True}):
        assert by_id()[rid]["on"]
    assert not by_id()[rid]["on"]


def test_route_ops_are_scriptable():
    @torch.jit.script
    def toggle(rid: str) -> bool:
        torch.ops.torchops._route_set(rid, False)
        off = torch.ops.torchops._route_enabled(rid)
        torch.ops.torchops._route_set(rid, True)
        return (not off) and torch.ops.torchops._route_enabled(rid)

    assert toggle("cudnn_rnn.cpu.onednn")


def test_environment_sets_defaults():
    code = ("import torchops; r = {x['id']: x for x in torchops.backends.routes()}; "
            "print(r['cudnn_rnn.cpu.onednn']['on'], r['cudnn_rnn.cuda.cudnn']['on'])")
    out = run_python(code, TORCHOPS_ROUTES="cudnn_rnn.cpu.onednn=off, cudnn_rnn.cuda.cudnn=on")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


@pytest.mark.parametrize("value,message", [
    ("cudnn_rnn.cpu.nope=on", r"unknown torchops route 'cudnn_rnn\.cpu\.nope'; the routes are: .*cudnn_rnn\.cpu\.onednn"),
    ("cudnn_rnn.cpu.onednn=maybe", "must be <route>=on or <route>=off"),
    ("cudnn_rnn.cpu.loops=off", "fallback.*cannot be turned off"),
])
def test_environment_errors_at_import(value, message):
    out = run_python("import torchops", TORCHOPS_ROUTES=value)
    assert out.returncode != 0
    assert re.search(message, out.stderr), out.stderr


# ------------------------------------------------------------------------------------------ CPU capability
def test_cpu_capability_default_is_the_best():
    out = run_python("import torchops.backends.cpu as c; print(c.get_cpu_capability(), c.supported_cpu_capabilities())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == CPU_CAPABILITIES[-1]


def test_the_library_holds_a_build_of_the_loops_for_every_capability():
    """setup.py compiles csrc/cpu/*_isa.cpp once per CPU capability, with that capability's flags."""
    from torchops import _build_info

    builds = _build_info.CPU_CAPABILITY_BUILDS
    assert builds[0] == "default"
    assert set(CPU_CAPABILITIES) <= set(builds), (CPU_CAPABILITIES, builds)
    if platform.machine() == "x86_64":
        assert builds == ["default", "avx2", "avx512"]


def test_cpu_capability_environment_and_errors():
    out = run_python("import torchops.backends.cpu as c; print(c.get_cpu_capability())", TORCHOPS_CPU_CAPABILITY="default")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "default"
    out = run_python("import torchops", TORCHOPS_CPU_CAPABILITY="avx1024")
    assert out.returncode != 0 and "must be one of 'default', 'avx2', 'avx512', got 'avx1024'" in out.stderr
    with pytest.raises(ValueError, match="must be one of"):
        backends.cpu.set_cpu_capability("sse9")
    if CPU_CAPABILITIES[-1] != "avx512":
        with pytest.raises(ValueError, match="cannot run here"):
            backends.cpu.set_cpu_capability("avx512")


def test_capability_limits_capability_routes(cpu_capability):
    rs = by_id()
    order = ["default", "avx2", "avx512"]
    for r in rs.values():
        if r["isa"] is not None:
            assert r["enabled"] == (r["on"] and order.index(r["isa"]) <= order.index(cpu_capability)), r["id"]
    assert backends.cpu.get_cpu_capability() == cpu_capability


# ------------------------------------------------------------------------------------------ parity per route
def _capability_route(family_slot, capability):
    """The capability route that runs at `capability` (AVX-512 runs BatchNorm's AVX2 build)."""
    names = [r["id"] for r in slot_routes(family_slot) if r["isa"] is not None]
    order = ["default", "avx2", "avx512"]
    return next(n for n in names if order.index(by_id()[n]["isa"]) <= order.index(capability))


def _lstm_ref(mode, x, h0, c0, m):
    return m(x, (h0, c0)) if mode == "lstm" else m(x, h0)


@pytest.mark.parametrize("mode", ["lstm", "gru", "rnn_tanh"])
def test_cudnn_rnn_gate_kernels_at_each_capability(cpu_capability, mode):
    torch.manual_seed(0)
    T, B, I, H = 5, 3, 4, 6
    mod = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(mode, torch.nn.RNN)(I, H, 2).double()
    from test_cudnn_rnn import params_of
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, B, H, dtype=torch.float64)
    c0 = torch.randn(2, B, H, dtype=torch.float64)
    p = params_of(mod).detach().requires_grad_()
    route = _capability_route("cudnn_rnn.cpu.default", cpu_capability)
    with forced_route(route):
        y, hN, cN, _ = torchops.functional.cudnn_rnn(x, h0, c0, p, rnn_mode=mode, is_training=True)
        y.sum().backward()
    ref = _lstm_ref(mode, x.detach().requires_grad_(), h0, c0, mod)
    yr, xr = ref[0], None
    torch.testing.assert_close(y, yr, rtol=1e-10, atol=1e-10)
    xg = x.grad.clone()
    x.grad = None
    xr = x.detach().requires_grad_()
    _lstm_ref(mode, xr, h0, c0, mod)[0].sum().backward()
    torch.testing.assert_close(xg, xr.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("route", ["cudnn_rnn.cpu.onednn", "cudnn_rnn.cpu.loops"])
def test_cudnn_rnn_sequence_routes_float32_lstm(route):
    torch.manual_seed(1)
    T, B, I, H = 6, 4, 5, 7
    mod = torch.nn.LSTM(I, H, 2, bidirectional=True)
    from test_cudnn_rnn import params_of
    x = torch.randn(T, B, I, requires_grad=True)
    h0, c0 = torch.randn(4, B, H), torch.randn(4, B, H)
    p = params_of(mod).detach().requires_grad_()
    with forced_route(route):
        y, hN, cN, _ = torchops.functional.cudnn_rnn(x, h0, c0, p, direction="bidirectional", is_training=True)
        (y.sum() + hN.sum() + cN.sum()).backward()
    xr = x.detach().requires_grad_()
    yr, (hr, cr) = mod(xr, (h0, c0))
    (yr.sum() + hr.sum() + cr.sum()).backward()
    torch.testing.assert_close(y, yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)


def _block_lstm_ref(x, cs, h, w, b, forget_bias):
    C = h.shape[1]
    hs = []
    for t in range(x.shape[0]):
        g = torch.cat([x[t], h], 1) @ w + b
        i, ci, f, o = g.split(C, 1)
        i, f, o, ci = torch.sigmoid(i), torch.sigmoid(f + forget_bias), torch.sigmoid(o), torch.tanh(ci)
        cs = ci * i + cs * f
        h = torch.tanh(cs) * o
        hs.append(h)
    return torch.stack(hs)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
def test_block_lstm_step_kernels_at_each_capability(cpu_capability, dtype, tol):
    torch.manual_seed(2)
    T, B, I, C = 4, 3, 5, 8
    x = torch.randn(T, B, I, dtype=dtype)
    cs, h = torch.randn(B, C, dtype=dtype), torch.randn(B, C, dtype=dtype)
    w, b = torch.randn(I + C, 4 * C, dtype=dtype) * 0.3, torch.randn(4 * C, dtype=dtype) * 0.1
    z = torch.zeros(C, dtype=dtype)
    route = _capability_route("block_rnn.cpu.default", cpu_capability)
    with forced_route(route):
        out = ops.block_lstm(torch.tensor(T), x, cs, h, w, z, z, z, b, forget_bias=1.0, cell_clip=-1.0,
                             use_peephole=False)
    ref = _block_lstm_ref(x.double(), cs.double(), h.double(), w.double(), b.double(), 1.0)
    torch.testing.assert_close(out[6].double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_kernels_at_each_capability(cpu_capability, fmt, training):
    torch.manual_seed(3)
    x = torch.randn(4, 6, 5, 7) * 3 + 1
    C = 7 if fmt == "NHWC" else 6
    scale, offset = torch.rand(C) + 0.5, torch.randn(C)
    mean, var = torch.randn(C), torch.rand(C) + 0.5
    route = _capability_route("fused_batch_norm.cpu.default", cpu_capability)
    with forced_route(route):
        y, *_ = ops.fused_batch_norm_v3(x, scale, offset, mean, var, epsilon=1e-3, data_format=fmt,
                                        is_training=training)
    xd = x.double() if fmt == "NCHW" else x.double().permute(0, 3, 1, 2)
    ref = torch.nn.functional.batch_norm(xd, None if training else mean.double(), None if training else var.double(),
                                         scale.double(), offset.double(), training=training, eps=1e-3)
    if fmt == "NHWC":
        ref = ref.permute(0, 2, 3, 1)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("route", ["rnn.cpu.packed_avx512", "rnn.cpu.packed_avx2", "rnn.cpu.mkl_packed",
                                   "rnn.cpu.aten"])
def test_recurrent_gemm_routes(route):
    r = by_id()[route]
    order = ["default", "avx2", "avx512"]
    if r["isa"] is not None and order.index(r["isa"]) > order.index(backends.cpu.get_cpu_capability()):
        pytest.skip(f"{route} needs {r['isa']}")
    if route == "rnn.cpu.mkl_packed" and not torch.backends.mkl.is_available():
        pytest.skip("torch without MKL")
    torch.manual_seed(4)
    T, B, I, C = 6, 4, 5, 16
    x = torch.randn(T, B, I)
    cs, h = torch.randn(B, C), torch.randn(B, C)
    w, b = torch.randn(I + C, 4 * C) * 0.3, torch.randn(4 * C) * 0.1
    z = torch.zeros(C)
    with forced_route(route):
        out = ops.block_lstm(torch.tensor(T), x, cs, h, w, z, z, z, b, forget_bias=1.0, cell_clip=-1.0,
                             use_peephole=False)
    ref = _block_lstm_ref(x.double(), cs.double(), h.double(), w.double(), b.double(), 1.0)
    torch.testing.assert_close(out[6].double(), ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("route", ["rnn.cpu.packed_avx512_bf16", "rnn.cpu.aten_bf16"])
def test_recurrent_gemm_bf16_routes(route):
    # The bfloat16 BlockLSTM (float32 cell route) by each route of its recurrent GEMM against float64 on the
    # bfloat16-rounded inputs, within bfloat16 rounding of h (|h| < 1).
    if route == "rnn.cpu.packed_avx512_bf16":
        flags = pathlib.Path("/proc/cpuinfo").read_text().split() if pathlib.Path("/proc/cpuinfo").exists() else []
        if "avx512_bf16" not in flags or backends.cpu.get_cpu_capability() != "avx512":
            pytest.skip(f"{route} needs AVX-512 BF16 and the AVX-512 capability")
    torch.manual_seed(5)
    T, B, I, C = 6, 4, 5, 16
    x = torch.randn(T, B, I).bfloat16()
    cs, h = torch.randn(B, C).bfloat16(), torch.randn(B, C).bfloat16()
    w, b = (torch.randn(I + C, 4 * C) * 0.3).bfloat16(), (torch.randn(4 * C) * 0.1).bfloat16()
    z = torch.zeros(C, dtype=torch.bfloat16)
    with forced_route("block_rnn.cpu.float32_cell"), forced_route(route):
        out = ops.block_lstm(torch.tensor(T), x, cs, h, w, z, z, z, b, forget_bias=1.0, cell_clip=-1.0,
                             use_peephole=False)
    ref = _block_lstm_ref(x.double(), cs.double(), h.double(), w.double(), b.double(), 1.0)
    torch.testing.assert_close(out[6].double(), ref, rtol=0, atol=3e-2)


@pytest.mark.parametrize("case", ["lstm_block_cell", "block_lstm T=1", "gru_block_cell", "block_gru T=1"])
def test_single_step_bf16_loops_count_the_aten_gemm(case):
    # One step runs ATen's bfloat16 GEMM whatever the CPU (packing the weight would cost as much as the
    # product): forward and backward count route rnn.cpu.aten_bf16 and never the kernel's.
    torch.manual_seed(6)
    B, I, C = 3, 4, 8
    r = lambda *s: (torch.randn(*s) * 0.3).bfloat16().requires_grad_()  # noqa: E731
    x = r(1, B, I)
    packed, aten = backends.hits("rnn.cpu.packed_avx512_bf16"), backends.hits("rnn.cpu.aten_bf16")
    with forced_route("block_rnn.cpu.float32_cell", check=False):
        if case.startswith("lstm_block_cell"):
            out = ops.lstm_block_cell(x[0], r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C), r(4 * C))[6]
        elif case.startswith("block_lstm"):
            out = ops.block_lstm(torch.tensor(1), x, r(B, C), r(B, C), r(I + C, 4 * C), r(C), r(C), r(C),
                                 r(4 * C))[6]
        elif case.startswith("gru_block_cell"):
            out = ops.gru_block_cell(x[0], r(B, C), r(I + C, 2 * C), r(I + C, C), r(2 * C), r(C))[3]
        else:
            out = ops.block_gru(torch.tensor(1), x, r(B, C), r(I + C, 2 * C), r(I + C, C), r(2 * C), r(C))[3]
        forward = backends.hits("rnn.cpu.aten_bf16") - aten
        out.float().sum().backward()
    assert forward >= 1
    assert backends.hits("rnn.cpu.aten_bf16") - aten > forward
    assert backends.hits("rnn.cpu.packed_avx512_bf16") == packed
