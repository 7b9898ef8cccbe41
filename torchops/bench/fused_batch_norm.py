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
(`torch.ops.aten.clone(x)`): what that calling path adds to a pass of this size. `torchops_y_blocks` /
`clone_y_blocks`: how many heap blocks the output y rotates over in 20 calls (`_timing.output_blocks`);
`shared_y_blocks`: how many of the op's blocks `clone` takes too (the same physical pages, so the same cache state).
"""
import torch

from ._timing import RATIO_COLUMNS, compare, faults_per_call, output_blocks, print_table

SHAPES = [(32, 64, 56, 56), (64, 256, 14, 14)]


def _cases(device, dtype):
    for shape in SHAPES:
        for layout in ("NCHW", "channels_last"):
            x = torch.randn(shape, device=device, dtype=dtype)
            if layout == "channels_last":
                x = x.contiguous(memory_format=torch.channels_last)
            c = shape[1]
            u = torch.float32
            w = torch.rand(c, device=device, dtype=u) + 0.5
            b = torch.randn(c, device=device, dtype=u)
            rm = torch.randn(c, device=device, dtype=u)
            rv = torch.rand(c, device=device, dtype=u) + 0.5
            dy = torch.randn_like(x)
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


def run(args):
    device = torch.device(args.device)
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
            if device.type == "cpu":
                ours_y, clone_y = output_blocks(ours), output_blocks(floor)
                row["torchops_y_blocks"], row["clone_y_blocks"] = len(ours_y), len(clone_y)
                row["shared_y_blocks"] = len(ours_y & clone_y)
        rows.append(row)
    print_table("fused_batch_norm (float32): torchops vs aten.native_batch_norm", rows,
                ["case", "torchops_ms", "native_ms"] + RATIO_COLUMNS + ["torchops_GB/s", "native_GB/s", "torchops_faults",
                                                                     "native_faults", "clone_ms", "clone/native",
                                                                     "torchops/clone", "aten_mul/clone",
                                                                     "clone_again/clone", "ops_clone/clone",
                                                                     "torchops_y_blocks", "clone_y_blocks",
                                                                     "shared_y_blocks"])
    return rows
