"""python -m torchops.demo [--rnn gru|lstm|block-lstm] [--workers K] [--processes] [--device cpu|cuda]
                          [--epochs N] [--steps N] [--target ACC] [--no-aoti] [--out DIR]

End to end on scikit-learn's bundled 8x8 digits (no download):
1. data: a fixed-seed train/test split, the training set sharded over K workers;
2. model: conv net with torchops.nn.BatchNorm2d on channels-last memory, recurrent head over image rows
   (torchops.nn.CudnnGRU / CudnnLSTM / BlockLSTM);
3. training: K worker threads (or processes, torchops.optim.run_sync_replicas over 127.0.0.1, with --processes) with
   torchops.optim.SyncReplicasOptimizer, replicas_to_aggregate = K - 1, until test accuracy >= target;
4. export: TorchScript, saved, reloaded in a fresh process, outputs checked equal;
5. serving: the reloaded model behind torchops.nn.Batched, 16 client threads, every test image;
   accuracy equal to unbatched serving, throughput, p50/p99 latency, batch-size histogram; then the
   model exported with torch.export into an AOTInductor package, checked equal to eager and served
   to the same clients, directly and behind torchops.nn.Batched (skipped with --no-aoti); then the model
   exported to ONNX (torchops.onnx), checked equal to eager in ONNX Runtime and served by it to the same
   clients (skipped, with a note, when onnx / onnxscript / onnxruntime are not installed);
6. a summary table and a PNG (training curve, latency histograms; needs matplotlib).
Exits non-zero, saying why, if any check fails or the accuracy target is not reached.
"""
import argparse
import os
import sys
import time

import torch


def parse_args(argv=None):
    from .model import RNN_KINDS

    p = argparse.ArgumentParser(prog="python -m torchops.demo", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--rnn", choices=RNN_KINDS, default="gru", help="recurrent head (default: gru)")
    p.add_argument("--workers", type=int, default=4, help="K replicas; K - 1 gradients aggregated per step (default: 4)")
    p.add_argument("--processes", action="store_true", help="replicas as processes (torchops.optim.run_sync_replicas over 127.0.0.1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--epochs", type=int, default=15, help="most epochs before giving up on the target (default: 15)")
    p.add_argument("--steps", type=int, default=None, help="most global steps (overrides --epochs; for quick runs)")
    p.add_argument("--target", type=float, default=0.95, help="test accuracy to reach (default: 0.95; 0: none)")
    p.add_argument("--batch-size", type=int, default=32, help="per-replica batch size (default: 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default: 3e-3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=16, help="concurrent serving client threads (default: 16)")
    p.add_argument("--no-aoti", action="store_true",
                   help="skip the torch.export + AOTInductor package (its compile takes a minute or more)")
    p.add_argument("--out", default="demo_out", help="folder for the model, the PNG and the summary (default: demo_out)")
    a = p.parse_args(argv)
    if a.workers < 1:
        p.error(f"--workers must be >= 1, got {a.workers}")
    if a.processes and a.workers < 2:
        p.error("--processes needs --workers >= 2")
    if a.steps is not None and a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    if not 0.0 <= a.target <= 1.0:
        p.error(f"--target must be in [0, 1], got {a.target}")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is visible to torch")
    return a


HEAD_MODULES = {"gru": "torchops.nn.CudnnGRU", "lstm": "torchops.nn.CudnnLSTM", "block-lstm": "torchops.nn.BlockLSTM"}


def fail(msg: str) -> None:
    print(f"demo FAILED: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def print_serving(results, clients: int) -> None:
    for r in results:
        print(f"serving {r.name:31s}: {len(r.latencies_us)} requests from {clients} threads in {r.seconds:.2f} s, "
              f"{r.throughput:.0f} req/s, latency p50 {r.percentile(50):.0f} us / p99 {r.percentile(99):.0f} us, "
              f"accuracy {r.accuracy:.4f}", flush=True)


def check_against_eager(what: str, header: str, logits, eager, y):
    """Prints how an exported model's logits compare with eager ones; fails unless they agree. Returns
    (max difference, accuracy, eager accuracy)."""
    from .model import accuracy

    diff = (logits - eager).abs().max().item()
    acc, acc_eager = accuracy(logits, y), accuracy(eager, y)
    print(f"{header}; max |logit difference| {diff:.1e}, test accuracy {acc:.4f} (eager {acc_eager:.4f})", flush=True)
    if diff > 1e-4 or acc != acc_eager:
        fail(f"{what} differs from the trained model (max difference {diff:.2e}, accuracy {acc:.4f} vs "
             f"{acc_eager:.4f})")
    return diff, acc, acc_eager


def check_served(results, clients: int, acc_eager: float) -> None:
    print_serving(results, clients)
    for r in results:
        if r.accuracy != acc_eager:
            fail(f"serving {r.name} gave accuracy {r.accuracy:.4f}, eager {acc_eager:.4f}")


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    import torchops
    from . import data, report, serve, train
    from .model import accuracy, predict

    os.makedirs(args.out, exist_ok=True)
    train_set, test_set = data.load_digits(args.seed)
    print(f"torchops demo: digits {len(train_set[1])} train / {len(test_set[1])} test images; --rnn {args.rnn}, "
          f"{args.workers} {'processes' if args.processes else 'threads'}, device {args.device}; torch "
          f"{torch.__version__}, {torch.get_num_threads()} intra-op threads, torchops CUDA kernels: "
          f"{torchops.built_with_cuda()}", flush=True)

    # 3. training
    cfg = train.TrainConfig(rnn=args.rnn, workers=args.workers, processes=args.processes, device=args.device,
                            batch_size=args.batch_size, lr=args.lr, max_epochs=args.epochs,
                            target=args.target, max_steps=args.steps, seed=args.seed)
    try:
        res = train.train(cfg, train_set, test_set)
    except (RuntimeError, ValueError, TimeoutError) as e:
        fail(f"training: {type(e).__name__}: {e}")
    print(f"trained: {res.global_steps} global steps in {res.seconds:.1f} s ({res.mode}), test accuracy "
          f"{res.test_acc:.4f}, stale gradients dropped: {res.stale}", flush=True)
    if res.test_acc < args.target:
        fail(f"test accuracy {res.test_acc:.4f} < target {args.target} after {res.global_steps} global steps")

    # 4. export, reload in a fresh process
    model = res.model.eval()
    path = os.path.join(args.out, f"digits_{args.rnn}.pt")
    x_test = test_set[0].to(args.device)
    eager = predict(model, x_test).cpu()
    t = time.perf_counter()
    scripted = serve.export(model, path)
    in_proc = predict(scripted, x_test).cpu()
    fresh = serve.check_in_fresh_process(path, test_set[0], args.device)
    t_export = time.perf_counter() - t
    d_script = (in_proc - eager).abs().max().item()
    d_fresh = (fresh - eager).abs().max().item()
    acc_fresh = accuracy(fresh, test_set[1])
    print(f"TorchScript: saved {path} ({os.path.getsize(path) // 1024} KiB); reloaded in a fresh process: max "
          f"|logit difference| {d_fresh:.1e} (scripted in this process {d_script:.1e}), test accuracy "
          f"{acc_fresh:.4f} ({t_export:.1f} s)", flush=True)
    if d_fresh > 1e-4 or not torch.equal(fresh.argmax(1), eager.argmax(1)):
        fail(f"the model reloaded in a fresh process differs from the trained one (max difference {d_fresh:.2e})")

    # 5. serving
    unb, bat = serve.serve(path, test_set, args.device, clients=args.clients)
    print_serving((unb, bat), args.clients)
    print(f"batching statistics: {bat.batches} batches, batch sizes {bat.histogram}, queue wait p50 "
          f"{bat.queue_wait_us.get('p50', 0):.0f} us / p99 {bat.queue_wait_us.get('p99', 0):.0f} us", flush=True)
    if not torch.equal(bat.predictions, unb.predictions) or bat.accuracy != unb.accuracy:
        n = int((bat.predictions != unb.predictions).sum())
        fail(f"batched serving answered {n} requests differently from unbatched serving "
             f"(accuracy {bat.accuracy:.4f} vs {unb.accuracy:.4f})")
    if unb.accuracy != acc_fresh:
        fail(f"unbatched serving accuracy {unb.accuracy:.4f} != the reloaded model's {acc_fresh:.4f}")

    aoti_rows = []
    if not args.no_aoti:
        pkg = os.path.join(args.out, f"digits_{args.rnn}.pt2")
        t = time.perf_counter()
        serve.export_aoti(model, x_test[:2], pkg)
        t_aoti = time.perf_counter() - t
        with torch.no_grad():
            aoti = predict(serve.AOTIModule(pkg), x_test).cpu()
        d_aoti, acc_aoti, acc_eager = check_against_eager(
            "the AOTInductor package", f"AOTInductor: torch.export + aoti_compile_and_package -> {pkg} "
            f"({os.path.getsize(pkg) // 1024} KiB, {t_aoti:.1f} s)", aoti, eager, test_set[1])
        a_unb, a_bat = serve.serve_aoti(pkg, test_set, args.device, clients=args.clients)
        check_served((a_unb, a_bat), args.clients, acc_eager)
        aoti_rows = [
            ("AOTInductor package", f"max |diff| {d_aoti:.1e}, accuracy {acc_aoti:.4f} = eager, compiled in "
                                    f"{t_aoti:.1f} s"),
            ("AOTInductor serving (req/s)", f"unbatched {a_unb.throughput:.0f}, batched {a_bat.throughput:.0f} "
                                            f"(accuracy {a_unb.accuracy:.4f} / {a_bat.accuracy:.4f})"),
        ]

    onnx_rows = []
    why_not = serve.onnx_unavailable()
    if why_not is not None:
        print(f"ONNX: skipped ({why_not})", flush=True)
        onnx_rows = [("ONNX Runtime", f"skipped ({why_not})")]
    else:
        onnx_path = os.path.join(args.out, f"digits_{args.rnn}.onnx")
        t = time.perf_counter()
        serve.export_onnx(model, x_test[:2], onnx_path)
        t_onnx = time.perf_counter() - t
        on = predict(serve.OnnxRuntimeModel(onnx_path), test_set[0])
        d_onnx, _, acc_eager = check_against_eager(
            "the ONNX export in ONNX Runtime", f"ONNX: torchops.onnx.export -> {onnx_path} "
            f"({os.path.getsize(onnx_path) // 1024} KiB, {t_onnx:.1f} s), in ONNX Runtime", on, eager, test_set[1])
        o = serve.serve_onnx(onnx_path, test_set, clients=args.clients)
        check_served((o,), args.clients, acc_eager)
        onnx_rows = [("ONNX Runtime (CPU)", f"max |diff| {d_onnx:.1e}, accuracy {o.accuracy:.4f} = eager, "
                                            f"{o.throughput:.0f} req/s unbatched")]

    # 6. summary
    total = time.perf_counter() - t_start
    png = os.path.join(args.out, "demo.png")
    note = report.plot(png, res.history, unb, bat,
                       f"torchops demo: --rnn {args.rnn}, {args.workers} {'processes' if args.processes else 'threads'}")
    hist = " ".join(f"{k}:{v}" for k, v in bat.histogram.items())
    rows = [
        ("data", f"sklearn digits, {len(train_set[1])} train / {len(test_set[1])} test, seed {args.seed}"),
        ("model", f"conv + torchops.nn.BatchNorm2d (channels-last) + {HEAD_MODULES[args.rnn]} head, "
                  f"{sum(p.numel() for p in model.parameters())} parameters"),
        ("training", f"{res.mode}, {res.global_steps} global steps, {res.seconds:.1f} s"),
        ("stale gradients dropped", str(res.stale)),
        ("test accuracy", f"{res.test_acc:.4f} (target {args.target})"),
        ("TorchScript fresh process", f"max |diff| {d_fresh:.1e}, accuracy {acc_fresh:.4f}"),
        ("serving accuracy", f"batched {bat.accuracy:.4f} = unbatched {unb.accuracy:.4f}"),
        ("throughput (req/s)", f"batched {bat.throughput:.0f} vs unbatched {unb.throughput:.0f} "
                               f"({bat.throughput / unb.throughput:.2f}x)"),
        ("latency p50 / p99 (us)", f"batched {bat.percentile(50):.0f} / {bat.percentile(99):.0f}, "
                                   f"unbatched {unb.percentile(50):.0f} / {unb.percentile(99):.0f}"),
        ("batch sizes (size:count)", hist),
        *aoti_rows,
        *onnx_rows,
        ("PNG", png if note is None else note),
        ("wall time", f"{total:.1f} s"),
    ]
    summary = report.table(rows, "torchops demo: OK")
    print(summary)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(summary + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
