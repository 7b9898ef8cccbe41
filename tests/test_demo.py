"""The end-to-end demo (`python -m torchops.demo`), shortened: a few global steps, no accuracy target,
in thread and process mode, so CI covers the wiring (training through SyncReplicasOptimizer, TorchScript
export + reload in a fresh process, Batched serving, summary). Its pieces are tested directly too."""
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("sklearn", reason="the demo's dataset ships with scikit-learn (requirements-demo.txt)")

import torchops  # noqa: E402
from torchops.demo import data, model as demo_model  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_demo(tmp_path, *args, timeout=540):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "torchops.demo", "--out", str(tmp_path), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(60)
def test_digits_split_is_fixed_and_disjoint():
    (xa, ya), (ta, tya) = data.load_digits(seed=0)
    (xb, yb), (tb, tyb) = data.load_digits(seed=0)
    assert torch.equal(xa, xb) and torch.equal(ta, tb) and torch.equal(ya, yb)
    assert len(ya) + len(tya) == 1797 and len(tya) == 359
    assert xa.shape[1:] == (1, 8, 8) and 0.0 <= xa.min() and xa.max() <= 1.0
    # no test image is also a training image (the digits set has no exact duplicates across a random split)
    train_rows = {tuple(r.tolist()) for r in xa.flatten(1)}
    assert sum(tuple(r.tolist()) in train_rows for r in ta.flatten(1)) == 0
    (xc, _), _ = data.load_digits(seed=1)
    assert not torch.equal(xa, xc)
    shards = data.shards((xa, ya), 3)
    assert sum(len(s[1]) for s in shards) == len(ya)
    assert max(len(s[1]) for s in shards) - min(len(s[1]) for s in shards) <= 1
    assert torch.equal(torch.cat([s[1] for s in shards]).sort()[0], ya.sort()[0])
    assert torch.equal(torch.cat([s[0] for s in shards]).sum(0), xa.sum(0))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("rnn", demo_model.RNN_KINDS)
def test_model_is_rowwise_scriptable_and_channels_last(rnn):
    if rnn != "block-lstm" and not hasattr(torchops.nn, "CudnnGRU"):
        with pytest.raises(RuntimeError, match="CudnnGRU|CudnnLSTM"):
            demo_model.build_model(rnn)
        return
    m = demo_model.build_model(rnn)
    assert any(isinstance(x, torchops.nn.BatchNorm2d) for x in m.modules())
    assert m.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.rand(6, 1, 8, 8)
    m.train()
    torch.nn.functional.cross_entropy(m(x), torch.arange(6)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())
    m.eval()
    with torch.no_grad():
        whole = m(x)
        rows = torch.cat([m(x[i:i + 1]) for i in range(6)])
        scripted = torch.jit.script(m)(x)
    assert whole.shape == (6, 10)
    torch.testing.assert_close(rows, whole, atol=1e-5, rtol=1e-5)  # row-wise: Batched may serve it
    torch.testing.assert_close(scripted, whole, atol=1e-6, rtol=1e-6)


@pytest.mark.timeout(60)
def test_recalibrate_batchnorm_sets_exact_statistics():
    m = demo_model.build_model("block-lstm")
    x = torch.rand(40, 1, 8, 8)
    m.eval()
    demo_model.recalibrate_batchnorm(m, x, batch_size=len(x))
    bn = m.features[1]
    with torch.no_grad():
        f = m.features[0](x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(bn.running_mean, f.mean((0, 2, 3)), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_var, f.var((0, 2, 3)), atol=1e-5, rtol=1e-4)
    assert bn.momentum == 0.1 and not m.training and not bn.training  # settings and mode restored


def _check_ok(proc, tmp_path, rnn):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "torchops demo: OK" in out
    assert "reloaded in a fresh process" in out and "batch sizes" in out
    assert os.path.exists(tmp_path / f"digits_{rnn}.pt") and os.path.exists(tmp_path / "summary.txt")
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)  # (a few seconds of work; minutes when the 2-core machine is shared)
def test_demo_threads_short_run(tmp_path):
    proc = run_demo(tmp_path, "--rnn", "block-lstm", "--workers", "3", "--steps", "4", "--target", "0")
    out = _check_ok(proc, tmp_path, "block-lstm")
    assert "3 threads" in out
    # the AOTInductor package: checked equal to eager and served, directly and behind Batched
    assert os.path.exists(tmp_path / "digits_block-lstm.pt2")
    assert "AOTInductor: torch.export + aoti_compile_and_package" in out
    assert "serving AOTInductor " in out and "serving AOTInductor + Batched" in out
    assert "AOTInductor serving (req/s)" in out
    # the ONNX export: checked equal to eager in ONNX Runtime and served by it (a note when not installed)
    from torchops.demo.serve import onnx_unavailable
    if onnx_unavailable() is None:
        assert os.path.exists(tmp_path / "digits_block-lstm.onnx")
        assert "ONNX: torchops.onnx.export" in out and "serving ONNX Runtime" in out
        assert "ONNX Runtime (CPU)" in out
    else:
        assert "ONNX: skipped (not installed" in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_processes_short_run(tmp_path):
    proc = run_demo(tmp_path, "--rnn", "block-lstm", "--workers", "3", "--processes", "--steps", "4", "--target", "0",
                    "--no-aoti")
    out = _check_ok(proc, tmp_path, "block-lstm")
    assert "3 processes" in out
    assert "AOTInductor" not in out and not os.path.exists(tmp_path / "digits_block-lstm.pt2")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_fails_loudly_when_the_target_is_not_reached(tmp_path):
    proc = run_demo(tmp_path, "--rnn", "block-lstm", "--workers", "2", "--steps", "1", "--target", "1.0")
    assert proc.returncode != 0
    assert "demo FAILED: test accuracy" in proc.stderr
    assert "torchops demo: OK" not in proc.stdout


@pytest.mark.timeout(60)
def test_demo_rejects_bad_arguments():
    from torchops.demo.__main__ import parse_args

    for args in (["--workers", "0"], ["--target", "2"], ["--rnn", "rnn"], ["--steps", "0"], ["--processes", "--workers", "1"]):
        with pytest.raises(SystemExit) as e:
            parse_args(args)
        assert e.value.code == 2, args
    a = parse_args([])
    assert (a.rnn, a.workers, a.processes, a.device, a.target) == ("gru", 4, False, "cpu", 0.95)


@pytest.mark.timeout(60)
def test_worker_batches_cover_each_shard_once_per_pass_and_are_reproducible():
    from torchops.demo import train

    tr, _ = data.load_digits(seed=0)
    cfg = train.TrainConfig(workers=3, batch_size=32)
    a = train.worker_batches(tr, cfg, num_steps=40)
    b = train.worker_batches(tr, cfg, num_steps=40)
    assert len(a) == 3 and all(len(w) == 40 for w in a)
    for wa, wb, (sx, sy) in zip(a, b, data.shards(tr, 3)):
        assert torch.equal(wa.idx, wb.idx)
        per_pass = len(sy) // 32
        first_pass = wa.idx[:per_pass].flatten()
        assert len(set(first_pass.tolist())) == per_pass * 32  # no row twice within a pass
        x, y = wa[3]
        assert x.shape == (32, 1, 8, 8) and torch.equal(y, sy[wa.idx[3]]) and torch.equal(x, sx[wa.idx[3]])
    assert not torch.equal(a[0].idx[:5], a[1].idx[:5])  # workers shuffle independently


@pytest.mark.timeout(120)
def test_epoch_evaluator_ends_training_and_its_results_cross_processes():
    import io
    import pickle

    from torchops.demo import train

    (x, y), (tx, ty) = data.load_digits(seed=0)
    ev = train.EpochEvaluator((x[:64], y[:64]), (tx[:32], ty[:32]), per_epoch=2, total=4, target=1.01,
                              in_process=False, quiet=True)
    ev = pickle.loads(pickle.dumps(ev))  # what the parameter-server process gets with --processes
    m = demo_model.build_model("block-lstm", seed=3)
    ev(1, {"model": m, "stale_gradients": 0})
    ev(2, {"model": m, "stale_gradients": 1})  # an evaluation, target not reached: goes on
    with pytest.raises(train.TrainingDone) as e:
        ev(4, {"model": m, "stale_gradients": 2})  # last step: ends training with the results
    out = pickle.loads(pickle.dumps(e.value)).args[0]
    assert [r["step"] for r in out["history"]] == [2, 4] and out["step"] == 4 and out["stale"] == 2
    assert all(0.0 <= r["test_acc"] <= 1.0 and r["loss"] > 0 for r in out["history"])
    loaded = demo_model.build_model("block-lstm", seed=0)
    loaded.load_state_dict(torch.load(io.BytesIO(out["state"]), weights_only=True))
    for a, b in zip(loaded.state_dict().values(), m.state_dict().values()):
        assert torch.equal(a, b)
    # the target ends training early, at the first evaluation that reaches it
    ev0 = train.EpochEvaluator((x[:64], y[:64]), (tx[:32], ty[:32]), per_epoch=2, total=100, target=0.0,
                               in_process=True, quiet=True)
    with pytest.raises(train.TrainingDone) as e:
        ev0(2, {"model": m, "stale_gradients": 0})
    assert e.value.args[0]["model"] is m and e.value.args[0]["step"] == 2
