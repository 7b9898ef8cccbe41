"""FusedBatchNormV3 / GradV3 vs torch.ops.aten.native_batch_norm(_backward), same layout and dtype.

`torchops_faults` / `native_faults`: minor page faults per call (getrusage), the usual cause when a ratio
jumps between runs. Inference rows also time `x.clone()` (one read of x, one write of a fresh output: the least any
inference forward must move) in the same rounds as the op, so `clone/native` is the best ratio a single pass over
memory can reach and `torchops/clone` (median of the per-round ratios) compares runs in the same machine state.
`aten_mul/clone` times ATen's `x * 2` the same way: one read, one write and one operation per element, what an
inference pass costs without per-channel coefficients, so its spread over runs shows how close to `clone` any
computing pass stays on the machine. `clone_again/clone` times `x.clone()` a second time in the same rounds: the
spread of that ratio over runs is the benchmark's own noise for two identical ops .
`ops_clone/clone` times the same copy called the way the op is, through `torch.ops`
(`torch.ops.aten.clone(x)`): what that calling path adds to a pass of this size.

On CUDA every row also times what a user's `torch.nn.functional.batch_norm` runs (cuDNN: `cudnn_batch_norm`,
its backward `cudnn_batch_norm_backward`), `x.clone()` (`clone_GB/s`), and torchops with each route forced
(`ours_own`: the cuDNN routes off, torchops' kernels; `ours_cudnn`: the cuDNN training and inference routes on; set
with torchops.backends.flags around each call). `torchops/best` is torchops over the faster of ATen's native kernel
and cuDNN.
"""
import torch

import torchops

from ._timing import RATIO_COLUMNS, compare, faults_per_call, print_table

SHAPES = [(32, 64, 56, 56), (64, 256, 14, 14)]


def _inputs(shape, layout, device, dtype):
    """x (in the layout's memory format), float32 scale, offset, running mean and variance, and dy."""
    x = torch.randn(shape, device=device, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    c = shape[1]
    w = torch.rand(c, device=device) + 0.5
    b = torch.randn(c, device=device)
    rm = torch.randn(c, device=device)
    rv = torch.rand(c, device=device) + 0.5
    return x, w, b, rm, rv, torch.randn_like(x)


def _cases(device, dtype):
    for shape in SHAPES:
        for layout in ("NCHW", "channels_last"):
            x, w, b, rm, rv, dy = _inputs(shape, layout, device, dtype)
            eps = 1e-3
            ours_train = lambda: torch.ops.torchops.fused_batch_norm_v3(x, w, b, rm, rv, eps, 1.0, "NCHW", True)  # noqa: E731
            nat_train = lambda: torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.0, eps)  # noqa: E731
            ours_inf = lambda: torch.ops.torchops.fused_batch_norm_v3(x, w, b, rm, rv, eps, 1.0, "NCHW", False)  # noqa: E731
            nat_inf = lambda: torch.ops.aten.native_batch_norm(x, w, b, rm, rv, False, 0.0, eps)  # noqa: E731
            _, _, _, rs1, rs2, rs3 = ours_train()
            _, save_mean, save_invstd = nat_train()
            ours_bwd = lambda: torch.ops.torchops.fused_batch_norm_grad_v3(dy, x, w, rs1, rs2, rs3, eps, "NCHW", True)  # noqa: E731
            nat_bwd = lambda: torch.ops.aten.native_batch_norm_backward(  # noqa: E731
                dy, x, w, None, None, save_mean, save_invstd, True, eps, [True, True, True])
            nbytes = x.numel() * x.element_size()
            yield shape, layout, "train fwd", ours_train, nat_train, 2 * nbytes, None, None
            yield shape, layout, "backward", ours_bwd, nat_bwd, 3 * nbytes, None, None
            others = {"aten_mul": lambda: x.mul(2.0), "clone_again": lambda: x.clone(),
                      "ops_clone": lambda: torch.ops.aten.clone(x)}
            yield shape, layout, "infer fwd", ours_inf, nat_inf, 2 * nbytes, x.clone, others


def _routed(fn, settings):
    def call():
        with torchops.backends.flags(settings):
            return fn()
    return call


_OWN = {"fused_batch_norm.cuda.cudnn": False, "fused_batch_norm.cuda.cudnn_inference": False}
_CUDNN = {"fused_batch_norm.cuda.cudnn": True, "fused_batch_norm.cuda.cudnn_inference": True}


def _cuda_cases(device, dtype):
    """The CUDA rows: torchops (its default routes) vs aten.native_batch_norm, with cuDNN through F.batch_norm's
    ops, clone and both torchops routes timed in the same rounds."""
    aten = torch.ops.aten
    for shape in SHAPES:
        for layout in ("NCHW", "channels_last"):
            x, w, b, rm, rv, dy = _inputs(shape, layout, device, dtype)
            eps = 1e-3
            op, grad = torch.ops.torchops.fused_batch_norm_v3, torch.ops.torchops.fused_batch_norm_grad_v3
            ours_train = lambda: op(x, w, b, rm, rv, eps, 1.0, "NCHW", True)  # noqa: E731
            ours_inf = lambda: op(x, w, b, rm, rv, eps, 1.0, "NCHW", False)  # noqa: E731
            nat_train = lambda: aten.native_batch_norm(x, w, b, None, None, True, 0.0, eps)  # noqa: E731
            nat_inf = lambda: aten.native_batch_norm(x, w, b, rm, rv, False, 0.0, eps)  # noqa: E731
            cudnn_train = lambda: aten.cudnn_batch_norm(x, w, b, None, None, True, 0.0, eps)  # noqa: E731
            cudnn_inf = lambda: aten.cudnn_batch_norm(x, w, b, rm, rv, False, 0.0, eps)  # noqa: E731
            _, save_mean, save_invstd = nat_train()
            _, c_mean, c_invstd, c_reserve = cudnn_train()
            nat_bwd = lambda: aten.native_batch_norm_backward(  # noqa: E731
                dy, x, w, None, None, save_mean, save_invstd, True, eps, [True, True, True])
            cudnn_bwd = lambda: aten.cudnn_batch_norm_backward(  # noqa: E731
                x, dy, w, None, None, c_mean, c_invstd, eps, c_reserve)
            # Each route's backward consumes its own forward's reserve spaces.
            rs = ours_train()[3:]
            with torchops.backends.flags(_OWN):
                rs_own = ours_train()[3:]
            with torchops.backends.flags(_CUDNN):
                rs_cudnn = ours_train()[3:]
            bwd = lambda rs: lambda: grad(dy, x, w, rs[0], rs[1], rs[2], eps, "NCHW", True)  # noqa: E731
            nbytes = x.numel() * x.element_size()
            yield (shape, layout, "train fwd", ours_train, nat_train, 2 * nbytes, x.clone,
                   {"cudnn": cudnn_train, "ours_own": _routed(ours_train, _OWN),
                    "ours_cudnn": _routed(ours_train, _CUDNN)})
            yield (shape, layout, "backward", bwd(rs), nat_bwd, 3 * nbytes, x.clone,
                   {"cudnn": cudnn_bwd, "ours_own": _routed(bwd(rs_own), _OWN),
                    "ours_cudnn": _routed(bwd(rs_cudnn), _CUDNN)})
            yield (shape, layout, "infer fwd", ours_inf, nat_inf, 2 * nbytes, x.clone,
                   {"cudnn": cudnn_inf, "ours_own": _routed(ours_inf, _OWN),
                    "ours_cudnn": _routed(ours_inf, _CUDNN)})


def _run_cuda(args, device):
    rows = []
    for shape, layout, what, ours, native, nbytes, floor, others in _cuda_cases(device, torch.float32):
        r = compare(ours, native, device, rounds=1 if args.quick else 5, min_time=0.1 if args.quick else 0.3,
                    floor=floor, floor_name="clone", others=others)
        row = {"case": f"{what} {tuple(shape)} {layout}", **r}
        row["torchops/cudnn"] = row["torchops_ms"] / row["cudnn_ms"]
        row["torchops/best"] = row["torchops_ms"] / min(row["native_ms"], row["cudnn_ms"])
        for name in ("torchops", "native", "cudnn", "clone", "ours_own", "ours_cudnn"):
            row[f"{name}_GB/s"] = nbytes / row[f"{name}_ms"] / 1e6
        rows.append(row)
    print_table("fused_batch_norm (float32, CUDA): torchops vs aten.native_batch_norm and cuDNN (F.batch_norm)", rows,
                ["case", "torchops_ms", "native_ms", "cudnn_ms", "ratio", "torchops/cudnn", "torchops/best",
                 "torchops/clone", "ours_own_ms", "ours_cudnn_ms", "torchops_GB/s", "native_GB/s", "cudnn_GB/s",
                 "clone_GB/s", "ratio_min", "ratio_max"])
    return rows


def run(args):
    device = torch.device(args.device)
    if device.type == "cuda":
        return _run_cuda(args, device)
    rows = []
    min_time = 0.1 if args.quick else 0.3
    for shape, layout, what, ours, native, nbytes, floor, others in _cases(device, torch.float32):
        r = compare(ours, native, device, rounds=1 if args.quick else 5, min_time=min_time, floor=floor,
                    floor_name="clone", others=others)
        row = {"case": f"{what} {tuple(shape)} {layout}", **r,
               "torchops_GB/s": nbytes / r["torchops_ms"] / 1e6, "native_GB/s": nbytes / r["native_ms"] / 1e6,
               "torchops_faults": faults_per_call(ours, device), "native_faults": faults_per_call(native, device)}
        if floor is not None:
            row["clone/native"] = row["clone_ms"] / row["native_ms"]
        rows.append(row)
    print_table("fused_batch_norm (float32): torchops vs aten.native_batch_norm", rows,
                ["case", "torchops_ms", "native_ms"] + RATIO_COLUMNS + ["torchops_GB/s", "native_GB/s", "torchops_faults",
                                                                     "native_faults", "clone_ms", "clone/native",
                                                                     "torchops/clone", "aten_mul/clone",
                                                                     "clone_again/clone", "ops_clone/clone"])
    return rows
