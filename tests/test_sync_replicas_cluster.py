"""Synchronous replicas across processes and machines (torchops.optim.run_sync_replicas).

Fast tests run every rank in one process (rank 0 in the test's thread, workers in threads) over 127.0.0.1:
exact results against a fixed schedule, refused peers, the TimeoutError naming missing ranks, checkpoints and
resuming. The slow tests launch tests/sync_replicas_torchrun.py with torchrun: 1 server + 3 workers on
127.0.0.1, the same across two network namespaces (root only), a straggler, a worker SIGKILLed and restarted
by its torchrun agent, and a SIGKILLed server that torchrun restarts from its checkpoint (with the workers
restarted too, or, under their own agent, reconnecting). All traffic goes to
127.0.0.1 or to the addresses the test gives its own namespaces; ports are picked at run time.
"""
import copy
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import torch

from torchops.optim import SyncReplicasOptimizer, run_sync_replicas
from torchops.optim import cluster

import sync_replicas_helpers as H

pytestmark = pytest.mark.timeout(300)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "sync_replicas_torchrun.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
NUM_STEPS = 8


def _assert_state_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


_free_port = cluster._free_port


@pytest.fixture
def no_torchrun_env(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCHELASTIC_RUN_ID", cluster.TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)


def _run_in_threads(world_size, num_steps, *, schedule=None, worker_ranks=None, timeout=60.0, **kw):
    """Rank 0 here, the workers (`worker_ranks`, default all) in threads; returns (rank 0's result, worker
    errors). Workers copy one template model, so that their construction cannot race rank 0's seeded one."""
    port = _free_port()
    shards = H.make_shards(world_size - 1)
    template = H.model_fn()
    errors = []
    common = dict(replicas_to_aggregate=kw.pop("replicas_to_aggregate", 2), num_steps=num_steps, schedule=schedule,
                  timeout=timeout, world_size=world_size, master_addr="127.0.0.1", master_port=port, **kw)

    def worker(rank):
        try:
            run_sync_replicas(lambda: copy.deepcopy(template), H.optimizer_fn, H.loss_fn, lambda w: shards[w],
                              rank=rank, **common)
        except BaseException as e:  # noqa: B902  (checked by the test)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(r,), daemon=True)
               for r in (worker_ranks if worker_ranks is not None else range(1, world_size))]
    for t in threads:
        t.start()
    try:
        r = run_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, lambda w: shards[w], rank=0, **common)
    finally:
        for t in threads:
            t.join(timeout)
    assert not any(t.is_alive() for t in threads)
    return r, errors


def test_tcp_fixed_schedule_equals_single_process(no_torchrun_env):
    r, errors = _run_in_threads(4, NUM_STEPS, schedule=H.rotating_schedule)
    assert not errors
    assert r.global_steps == NUM_STEPS and r.stale_gradients == 0
    assert r.contributors == [sorted(H.rotating_schedule(s)) for s in range(NUM_STEPS)]
    assert r.joins_per_worker == [1, 1, 1] and r.resumed_from == 0
    assert r.server_address.startswith("127.0.0.1:")  # the launcher's address, not every interface
    _assert_state_equal(r.state_dict, H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))


def test_missing_worker_times_out_naming_it(no_torchrun_env):
    with pytest.raises(TimeoutError, match=r"ranks not connected: \[2\]"):
        _run_in_threads(3, 2, worker_ranks=[1], timeout=2.0)


def _hello(port, world_size=3, **fields):
    """A raw peer's handshake: returns the server's answer to the hello."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        greeting = cluster._recv(s, 1 << 16)
        token = fields.pop("token", None)  # (a correct HMAC of the nonce with this token)
        hello = {"op": "hello", "proto": cluster.PROTOCOL, "rank": 1, "world_size": world_size, "run_id": "none",
                 "mac": "", **fields}
        if token is not None:
            hello["mac"] = cluster._mac(token, greeting["nonce"], hello["rank"], "none")
        cluster._send(s, hello)
        return cluster._recv(s, 1 << 16)


def test_server_admits_only_the_jobs_ranks(no_torchrun_env):
    cfg = cluster._config(0, 3, "127.0.0.1", _free_port(), None, "s3cret")
    model = H.model_fn()
    server = cluster._Server(cfg, model, SyncReplicasOptimizer(H.optimizer_fn(model.parameters()), 2, 2), 5.0)
    server.start()
    try:
        port = server.port
        assert server.listener.getsockname()[0] == "127.0.0.1"
        for fields, why in [({"world_size": 4}, "world_size 4"), ({"rank": 0}, "rank 0 is not a worker rank"),
                            ({"rank": 3}, "rank 3 is not a worker rank"), ({"run_id": "other"}, "run id 'other'"),
                            ({"mac": "00"}, "wrong job token"), ({"token": "guess"}, "wrong job token")]:
            answer = _hello(port, **fields)
            assert answer["ok"] is False and why in answer["error"], (fields, answer)
        assert _hello(port, token="s3cret")["ok"] is True
        # a message over the limit, and a payload that is not a torch.save, close the connection
        for payload in (b"\xff" * 8, b"\x00\x00\x00\x00\x00\x00\x00\x04junk"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                cluster._recv(s, 1 << 16)
                s.sendall(payload)
                assert s.recv(1) == b""
        assert server.joins == [1, 0]
    finally:
        server.close(None)


def test_config_errors(no_torchrun_env):
    with pytest.raises(ValueError, match="RANK is not set"):
        run_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, lambda w: [], replicas_to_aggregate=1, num_steps=1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\), got 3"):
        cluster._config(3, 3, "127.0.0.1", 1234, None, None)
    with pytest.raises(ValueError, match="world_size must be >= 2"):
        cluster._config(0, 1, "127.0.0.1", 1234, None, None)
    with pytest.raises(ValueError, match="master_port must be in"):
        cluster._config(0, 2, "127.0.0.1", 70000, None, None)
    with pytest.raises(ValueError, match=r"replicas_to_aggregate must be in \[1, world_size - 1 = 2\].*got 3"):
        run_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, lambda w: [], replicas_to_aggregate=3, num_steps=1,
                          rank=0, world_size=3, master_addr="127.0.0.1", master_port=1234)
    with pytest.raises(ValueError, match="checkpoint_every needs a checkpoint path"):
        run_sync_replicas(H.model_fn, H.optimizer_fn, H.loss_fn, lambda w: [], replicas_to_aggregate=1, num_steps=1,
                          checkpoint_every=2, rank=0, world_size=2, master_addr="127.0.0.1", master_port=1234)
    with pytest.raises(RuntimeError, match="cannot listen on 192.0.2.1"):  # (TEST-NET: not this host's)
        cluster._listen("192.0.2.1", 0)
    with pytest.raises(RuntimeError, match="cannot listen on no-such-host.invalid"):
        cluster._listen("no-such-host.invalid", 0)


def test_checkpoint_written_atomically_and_checked_on_load(tmp_path, monkeypatch):
    path = str(tmp_path / "ck.pt")
    cluster.save_checkpoint(path, {"format": cluster.CHECKPOINT_FORMAT, "x": torch.ones(2)})
    real_save = torch.save

    def failing_save(obj, f):
        real_save(obj, f)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        cluster.save_checkpoint(path, {"format": cluster.CHECKPOINT_FORMAT, "x": torch.zeros(2)})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temporary file left, the old checkpoint intact
    assert torch.equal(cluster.load_checkpoint(path)["x"], torch.ones(2))
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="bad.pt' cannot be read"):
        cluster.load_checkpoint(str(tmp_path / "bad.pt"))
    torch.save({"format": "other"}, str(tmp_path / "other.pt"))
    with pytest.raises(ValueError, match="format 'other'"):
        cluster.load_checkpoint(str(tmp_path / "other.pt"))


def test_optimizer_state_dict_round_trip():
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = SyncReplicasOptimizer(torch.optim.SGD([p], lr=1.0, momentum=0.5), 1, 2)
    opt.apply_gradients([torch.ones(2, dtype=torch.float64)], local_step=0, tag=1)
    opt.step(timeout=5)
    opt.apply_gradients([torch.ones(2, dtype=torch.float64)], local_step=0, tag=0)  # stale
    assert opt.last_contributors == [1] and opt.stale_by_tag == {0: 1}
    state = opt.state_dict()
    q = torch.nn.Parameter(p.detach().clone())
    again = SyncReplicasOptimizer(torch.optim.SGD([q], lr=1.0, momentum=0.5), 1, 2)
    again.load_state_dict(state)
    assert again.global_step == 1 and again.stats() == opt.stats()
    for o in (opt, again):  # the same next update (the momentum buffer came along)
        o.apply_gradients([torch.full((2,), 2.0, dtype=torch.float64)], local_step=0)  # stale for both
        o.apply_gradients([torch.full((2,), 2.0, dtype=torch.float64)], local_step=1)
        o.step(timeout=5)
    assert torch.equal(p, q) and again.stats() == opt.stats()
    with pytest.raises(ValueError, match="global_step must be an int >= 0, got -1"):
        again.load_state_dict({**state, "global_step": -1})


def test_resume_from_checkpoint_equals_uninterrupted_run(no_torchrun_env, tmp_path):
    ck = str(tmp_path / "ck.pt")
    first, errors = _run_in_threads(4, 5, schedule=H.rotating_schedule, checkpoint=ck, checkpoint_every=2)
    assert not errors and first.global_steps == 5
    # (the checkpoint holds the last step too: a finished job resumed with more steps goes on from there)
    assert cluster.load_checkpoint(ck)["sync_replicas"]["global_step"] == 5
    r, errors = _run_in_threads(4, NUM_STEPS, schedule=H.rotating_schedule, checkpoint=ck, checkpoint_every=2)
    assert not errors and r.resumed_from == 5 and r.global_steps == NUM_STEPS
    assert r.contributors == [sorted(H.rotating_schedule(s)) for s in range(NUM_STEPS)]
    _assert_state_equal(r.state_dict, H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))


# ------------------------------------------------------------------------------------------- torchrun

def _torchrun_env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TORCH_CPP_LOG_LEVEL="ERROR", OMP_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", cluster.TOKEN_ENV):
        env.pop(name, None)
    return env


def _torchrun(args, script_args, prefix=(), timeout=240):
    return subprocess.Popen([*prefix, TORCHRUN, *args, SCRIPT, *script_args], env=_torchrun_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs, timeout=240):
    outs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs


def _result(path):
    return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_torchrun_one_server_three_workers(tmp_path):
    out = str(tmp_path / "r.pt")
    _finish([_torchrun(["--nproc-per-node=4", "--master-addr=127.0.0.1", f"--master-port={_free_port()}"],
                       ["--out", out])])
    r = _result(out)
    assert r["global_steps"] == NUM_STEPS and r["stale"] == 0 and r["joins"] == [1, 1, 1]
    assert r["server_address"].startswith("127.0.0.1:")
    _assert_state_equal(r["state_dict"], H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))


@pytest.mark.slow
def test_torchrun_straggler_does_not_hold_steps(tmp_path):
    out = str(tmp_path / "r.pt")
    # Rank 3 sleeps 2 s before every push, ranks 1 and 2 0.25 s: with replicas_to_aggregate=2 of 3 the two carry
    # the 12 steps (at least 3 s, so the straggler's first push arrives, late, before the end); waiting for
    # every rank (DDP) would take at least 24 s.
    _finish([_torchrun(["--nproc-per-node=4", "--master-addr=127.0.0.1", f"--master-port={_free_port()}"],
                       ["--out", out, "--schedule", "none", "--delay", "1:0.25,2:0.25,3:2", "--steps", "12"])])
    r = _result(out)
    assert r["global_steps"] == 12 and len(r["contributors"]) == 12
    assert sum(2 in c for c in r["contributors"]) <= 2  # (a scheduling hiccup of the loaded machine may let one in)
    assert sum({0, 1} <= set(c) for c in r["contributors"]) >= 10
    assert r["stale_per_worker"][2] >= 1 and r["stale"] == sum(r["stale_per_worker"])


@pytest.mark.slow
def test_torchrun_worker_sigkill_restart_rejoins(tmp_path):
    """Rank 3 runs under its own torchrun agent (node 1 of 2, static rendezvous, --max-restarts=1), kills itself
    before its push at step 3; the step waits for its restart, which re-joins and pulls the current step: the
    server (node 0, never restarted) ends with exactly the uninterrupted run's parameters."""
    out = str(tmp_path / "r.pt")
    port = _free_port()
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={port}"]
    script = ["--out", out, "--schedule", "rejoin", "--kill-worker", "3:3"]
    outs = _finish([_torchrun([*common, "--node-rank=0", "--nproc-per-node=3"], script),
                    _torchrun([*common, "--node-rank=1", "--nproc-per-node=1", "--max-restarts=1"], script)])
    assert "exitcode: -9" in outs[1]  # (the agent saw the SIGKILL and restarted the worker)
    r = _result(out)
    assert r["restart_count"] == 0 and r["resumed_from"] == 0  # the server ran through
    assert r["joins"] == [1, 1, 2]
    assert r["contributors"] == [sorted(H.rejoin_schedule(s)) for s in range(NUM_STEPS)]
    _assert_state_equal(r["state_dict"], H.reference_run(H.make_shards(3), NUM_STEPS, H.rejoin_schedule))


@pytest.mark.slow
def test_torchrun_server_sigkill_resumes_from_checkpoint(tmp_path):
    """Rank 0 checkpoints every 2 steps and kills itself after step 5; torchrun (--max-restarts=1) restarts the
    job, rank 0 resumes from step 4, and the final parameters equal the uninterrupted run's."""
    out, ck = str(tmp_path / "r.pt"), str(tmp_path / "ck.pt")
    outs = _finish([_torchrun(["--nproc-per-node=4", "--max-restarts=1", "--master-addr=127.0.0.1",
                               f"--master-port={_free_port()}"],
                              ["--out", out, "--checkpoint", ck, "--every", "2", "--kill-server", "5"])])
    assert "exitcode: -9" in outs[0]
    r = _result(out)
    assert r["restart_count"] == 1 and r["resumed_from"] == 4 and r["global_steps"] == NUM_STEPS
    _assert_state_equal(r["state_dict"], H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))
    assert sorted(os.listdir(tmp_path)) == ["ck.pt", "r.pt"]  # (no temporary checkpoint left behind)


@pytest.mark.slow
def test_torchrun_server_restarted_alone_workers_reconnect(tmp_path):
    """Rank 0 alone under its own agent (node 0 of 2, --max-restarts=1) kills itself after step 5; the agent
    restarts it, it resumes from the step-4 checkpoint, and node 1's workers (never restarted) reconnect and
    carry the job to the uninterrupted run's parameters."""
    out, ck = str(tmp_path / "r.pt"), str(tmp_path / "ck.pt")
    common = ["--nnodes=2", "--master-addr=127.0.0.1", f"--master-port={_free_port()}"]
    script = ["--out", out, "--checkpoint", ck, "--every", "2", "--kill-server", "5"]
    outs = _finish([_torchrun([*common, "--node-rank=0", "--nproc-per-node=1", "--max-restarts=1"], script),
                    _torchrun([*common, "--node-rank=1", "--nproc-per-node=3"], script)])
    assert "exitcode: -9" in outs[0] and "exitcode" not in outs[1]
    r = _result(out)
    assert r["restart_count"] == 1 and r["resumed_from"] == 4 and r["joins"] == [2, 2, 2]
    _assert_state_equal(r["state_dict"], H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))


def _can_make_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"t52probe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=30).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return ok


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: ("host A" address, "host B" address, their names)."""
    if not _can_make_namespaces():
        pytest.skip("needs root and `ip netns add` (network namespaces)")
    tag = str(os.getpid() % 100000)
    a, b = f"tsrA{tag}", f"tsrB{tag}"
    addr_a, addr_b = "10.252.0.1", "10.252.0.2"

    def ip(*args):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        ip("netns", "add", a)
        ip("netns", "add", b)
        ip("link", "add", f"va{tag}", "type", "veth", "peer", "name", f"vb{tag}")
        ip("link", "set", f"va{tag}", "netns", a)
        ip("link", "set", f"vb{tag}", "netns", b)
        ip("-n", a, "addr", "add", f"{addr_a}/24", "dev", f"va{tag}")
        ip("-n", b, "addr", "add", f"{addr_b}/24", "dev", f"vb{tag}")
        for ns, dev in ((a, f"va{tag}"), (b, f"vb{tag}")):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield addr_a, addr_b, a, b
    finally:
        for ns in (a, b):  # (deleting a namespace deletes its end of the veth pair, and so the pair)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@pytest.mark.slow
def test_torchrun_across_two_network_namespaces(tmp_path, two_hosts):
    """Node 0 (rank 0 and worker rank 1) in namespace A, node 1 (ranks 2, 3) in namespace B: every byte
    between them crosses the veth pair to A's address, where rank 0 listens."""
    addr_a, _, ns_a, ns_b = two_hosts
    out = str(tmp_path / "r.pt")
    common = ["--nnodes=2", "--nproc-per-node=2", f"--master-addr={addr_a}", "--master-port=29400"]
    _finish([_torchrun([*common, "--node-rank=0"], ["--out", out], prefix=("ip", "netns", "exec", ns_a)),
             _torchrun([*common, "--node-rank=1"], ["--out", out], prefix=("ip", "netns", "exec", ns_b))])
    r = _result(out)
    assert r["server_address"] == f"{addr_a}:{r['server_address'].rsplit(':', 1)[1]}"
    assert r["global_steps"] == NUM_STEPS and r["joins"] == [1, 1, 1]
    _assert_state_equal(r["state_dict"], H.reference_run(H.make_shards(3), NUM_STEPS, H.rotating_schedule))
