"""Synchronous replicas across processes and machines: `run_sync_replicas`, for jobs launched by torchrun (or any
launcher that sets torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`).

Rank 0 is the parameter server and chief (the master model, its optimizer, the accumulators, the chief loop and
the checkpoints); ranks 1..WORLD_SIZE-1 are workers (worker index = rank - 1). Workers pull parameters and push
gradients over one TCP connection each. Messages are length-prefixed `torch.save` payloads read back with
`torch.load(weights_only=True)`, so a peer can send tensors and plain values but never code (unlike
`torch.distributed.rpc`, which unpickles arbitrary calls). A worker that connects presents its rank, the world
size and the run id (and, with a job token, an HMAC of the server's nonce); anything else is refused. A
restarted worker simply connects again. See docs/accumulator.md ("Training across machines").
"""
import functools
import hashlib
import hmac
import io
import os
import secrets
import signal
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from .sync_replicas import SyncReplicasOptimizer, SyncReplicasResult, _worker_loop

__all__ = ["run_sync_replicas"]

PROTOCOL = "torchops.sync_replicas/1"
CHECKPOINT_FORMAT = "torchops.sync_replicas.checkpoint/1"
TOKEN_ENV = "TORCHOPS_SYNC_REPLICAS_TOKEN"
_HELLO_LIMIT = 64 * 1024           # bytes a peer may send before it is admitted
_HELLO_SECONDS = 10.0              # and the time it gets to do so
_WORKER_FRAME_LIMIT = 1 << 40      # what a worker accepts from the server it chose to connect to


class _Refused(Exception):
    """The peer broke the protocol or is not one of the job's ranks."""


# ----------------------------------------------------------------------------------------------- wire

def _send(sock: socket.socket, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getbuffer()
    sock.sendall(struct.pack(">Q", len(data)))
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            raise ConnectionError("the peer closed the connection")
        got += k
    return buf


def _recv(sock: socket.socket, limit: int) -> Any:
    (n,) = struct.unpack(">Q", _recv_exact(sock, 8))
    if n > limit:
        raise _Refused(f"a message of {n} bytes exceeds the limit of {limit} bytes")
    try:
        return torch.load(io.BytesIO(_recv_exact(sock, n)), weights_only=True, map_location="cpu")
    except (ConnectionError, OSError):
        raise
    except Exception as e:  # (whatever a malformed payload makes the unpickler raise)
        raise _Refused(f"unreadable message ({type(e).__name__}: {e})") from None


def _peer_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # A peer whose host vanished (no FIN) is noticed in about half a minute instead of hours.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def _mac(token: str, nonce: str, rank: int, run_id: str) -> str:
    return hmac.new(token.encode(), f"{nonce}|{rank}|{run_id}".encode(), hashlib.sha256).hexdigest()


# --------------------------------------------------------------------------------------------- config

@dataclass
class _Config:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    bind_address: str
    run_id: str
    token: str
    agent_store: bool  # torchrun's agent hosts a TCPStore at MASTER_ADDR:MASTER_PORT


def _config(rank, world_size, master_addr, master_port, bind_address, token) -> _Config:
    def env(name, value, conv):
        if value is not None:
            return value
        if name not in os.environ:
            raise ValueError(f"run_sync_replicas: {name} is not set (run under torchrun, or pass "
                             f"{name.lower()}=...)")
        try:
            return conv(os.environ[name])
        except ValueError:
            raise ValueError(f"run_sync_replicas: {name} must be an integer, got {os.environ[name]!r}") from None

    rank = env("RANK", rank, int)
    world_size = env("WORLD_SIZE", world_size, int)
    master_addr = env("MASTER_ADDR", master_addr, str)
    master_port = env("MASTER_PORT", master_port, int)
    if not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"run_sync_replicas: world_size must be >= 2 (a parameter server and a worker), got "
                         f"{world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"run_sync_replicas: rank must be in [0, {world_size}), got {rank!r}")
    if not isinstance(master_port, int) or not 0 < master_port < 65536:
        raise ValueError(f"run_sync_replicas: master_port must be in [1, 65535], got {master_port!r}")
    if not master_addr:
        raise ValueError("run_sync_replicas: master_addr must be a host name or address, got ''")
    if token is None:
        token = os.environ.get(TOKEN_ENV, "")
    return _Config(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port,
                   bind_address=bind_address or master_addr, run_id=os.environ.get("TORCHELASTIC_RUN_ID", "none"),
                   token=token, agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


def _store(cfg: _Config, timeout: float):
    from torch.distributed import TCPStore

    return TCPStore(cfg.master_addr, cfg.master_port, is_master=False, timeout=timedelta(seconds=timeout),
                    wait_for_workers=False)


def _key(cfg: _Config, what: str) -> str:
    return f"torchops/sync_replicas/{cfg.run_id}/{what}"


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on `host` (an address or a name resolved to this host's addresses) only."""
    errors = []
    try:
        addrs = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        addrs, errors = [], [f"{host}: {e}"]
    for family, kind, proto, _, addr in addrs:
        s = socket.socket(family, kind, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
            s.listen(128)
            s.settimeout(0.2)  # (the accept loop polls its stop flag)
            return s
        except OSError as e:
            errors.append(f"{addr[0]}: {e}")
            s.close()
    raise RuntimeError(f"run_sync_replicas: rank 0 cannot listen on {host}:{port} ({'; '.join(errors)}); rank 0 "
                       f"must run on the host MASTER_ADDR names (torchrun: --master-addr, node rank 0), or pass "
                       f"bind_address")


# ------------------------------------------------------------------------------------------ checkpoints

def save_checkpoint(path: str, state: Dict[str, Any]) -> None:
    """torch.save to a temporary file next to `path`, fsync, then rename over `path`: a reader (or a crash)
    sees the old checkpoint or the new one, never half of one."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_checkpoint(path: str) -> Dict[str, Any]:
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:
        raise RuntimeError(f"run_sync_replicas: checkpoint {path!r} cannot be read ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        got = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"run_sync_replicas: checkpoint {path!r} is not a {CHECKPOINT_FORMAT!r} checkpoint "
                         f"(format {got!r})")
    return state


# ---------------------------------------------------------------------------------------------- server

class _Server:
    """Rank 0: accepts the workers' connections (one thread each) and runs the chief loop in the caller."""

    def __init__(self, cfg: _Config, model: nn.Module, opt: SyncReplicasOptimizer, timeout: float):
        self.cfg, self.model, self.opt, self.timeout = cfg, model, opt, timeout
        self.num_workers = cfg.world_size - 1
        n = self.num_workers
        self.pushes, self.stale, self.joins = [0] * n, [0] * n, [0] * n
        self.contributors: List[List[int]] = []
        self.peers: Dict[int, Dict[str, Any]] = {}  # worker -> {"sock", "pid", "host"} of its live connection
        self.byes: set = set()
        self.cond = threading.Condition()
        self.stopping = False
        param_bytes = sum(p.numel() * p.element_size() for p in opt.params)
        # (a push carries one gradient per parameter, in any float dtype up to 8 bytes per element)
        self.frame_limit = 8 * sum(p.numel() for p in opt.params) + 64 * len(opt.params) + (1 << 20) + param_bytes
        port = 0 if cfg.agent_store else cfg.master_port
        self.listener = _listen(cfg.bind_address, port)
        host, self.port = self.listener.getsockname()[:2]
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.threads: List[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept_loop, name="sync-replicas-accept", daemon=True)

    def start(self) -> None:
        self.acceptor.start()

    # ------------------------------------------------------------------------------ connections
    def _accept_loop(self) -> None:
        while not self.stopping:
            try:
                sock, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            sock.settimeout(None)
            t = threading.Thread(target=self._serve, args=(sock,), name="sync-replicas-conn", daemon=True)
            self.threads = [x for x in self.threads if x.is_alive()] + [t]
            t.start()

    def _handshake(self, sock: socket.socket) -> int:
        nonce = secrets.token_hex(16)
        _send(sock, {"proto": PROTOCOL, "nonce": nonce})
        hello = _recv(sock, _HELLO_LIMIT)
        if not isinstance(hello, dict) or hello.get("op") != "hello" or hello.get("proto") != PROTOCOL:
            raise _Refused(f"expected a {PROTOCOL} hello")
        rank, world, run_id = hello.get("rank"), hello.get("world_size"), hello.get("run_id")
        why = None
        if world != self.cfg.world_size:
            why = f"world_size {world!r} is not this job's {self.cfg.world_size}"
        elif run_id != self.cfg.run_id:
            why = f"run id {run_id!r} is not this job's {self.cfg.run_id!r}"
        elif not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank < self.cfg.world_size:
            why = f"rank {rank!r} is not a worker rank of this job (1..{self.cfg.world_size - 1})"
        elif self.cfg.token and not hmac.compare_digest(
                str(hello.get("mac", "")), _mac(self.cfg.token, nonce, rank, self.cfg.run_id)):
            why = f"rank {rank}: wrong job token ({TOKEN_ENV})"
        if why is not None:
            _send(sock, {"ok": False, "error": f"refused by the parameter server: {why}"})
            raise _Refused(why)
        w = rank - 1
        with self.cond:
            old = self.peers.get(w)
            if old is not None:  # a restarted worker whose old connection is not known dead yet
                _shutdown(old["sock"])
            self.peers[w] = {"sock": sock, "pid": hello.get("pid"), "host": hello.get("host")}
            self.joins[w] += 1
            self.byes.discard(w)
            self.cond.notify_all()
        _send(sock, {"ok": True, "step": self.opt.global_step})
        return w

    def _serve(self, sock: socket.socket) -> None:
        w = None
        try:
            _tune(sock)
            sock.settimeout(_HELLO_SECONDS)  # (a silent peer cannot hold a thread)
            w = self._handshake(sock)
            sock.settimeout(None)
            while self._request(sock, w):
                pass
        except Exception:  # (a broken or refused peer loses its connection, nothing else)
            pass
        finally:
            with self.cond:
                if w is not None and self.peers.get(w, {}).get("sock") is sock:
                    del self.peers[w]
                self.cond.notify_all()
            sock.close()

    def _request(self, sock: socket.socket, w: int) -> bool:
        msg = _recv(sock, self.frame_limit)
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "pull":
            reply = self._pull(sock, msg.get("after"))
            if reply is None:
                return False
            _send(sock, reply)
            return True
        if op == "push":
            step, grads, then = msg.get("step"), msg.get("grads"), msg.get("then_pull_after")
            if not isinstance(step, int) or not isinstance(grads, list) or not all(
                    g is None or isinstance(g, Tensor) for g in grads):
                raise _Refused("push: expected an int step and a list of tensors (or None)")
            stale_before = self.opt.stale_by_tag.get(w, 0)
            try:
                accepted = self.opt.apply_gradients(grads, local_step=step, tag=w)
            except (ValueError, TypeError, RuntimeError) as e:
                _send(sock, {"error": f"push refused: {e}"})
                return False
            with self.cond:
                if accepted:
                    self.pushes[w] += 1
                    self.stale[w] += self.opt.stale_by_tag.get(w, 0) - stale_before
            if then is None:
                _send(sock, {"ok": True})
                return True
            # push-then-pull: the worker's next pull rides on this request (one round trip per step)
            reply = self._pull(sock, then)
            if reply is None:
                return False
            _send(sock, {"ok": True, "pull": reply})
            return True
        if op == "bye":
            with self.cond:
                self.byes.add(w)
                self.cond.notify_all()
            return False
        raise _Refused(f"unknown request {op!r}")

    def _pull(self, sock: socket.socket, after) -> Optional[Dict[str, Any]]:
        """The parameters once the step is past `after`; None if the peer went away meanwhile."""
        if not isinstance(after, int):
            raise _Refused(f"pull: after must be an int, got {after!r}")
        while True:
            try:
                step, params, done = self.opt.pull(after, timeout=0.5)
                return {"step": step, "params": [p.cpu() for p in params], "done": done}
            except TimeoutError:
                if _peer_closed(sock):
                    return None

    # ------------------------------------------------------------------------------------ chief
    def _missing(self, step: int, err: TimeoutError) -> str:
        with self.cond:
            connected = set(self.peers)
        fresh = set(self.opt.pending_tags())
        gone = [w + 1 for w in range(self.num_workers) if w not in connected]
        quiet = [w + 1 for w in sorted(connected) if w not in fresh]
        return (f"run_sync_replicas: step {step + 1} got {len(fresh)} of the {self.opt.replicas_to_aggregate} fresh "
                f"gradients it needs within {self.timeout} s; ranks not connected: {gone}; ranks connected without "
                f"a gradient for this step: {quiet} ({err})")

    def kill_worker(self, w: int) -> None:
        with self.cond:
            peer = self.peers.get(w)
        if peer is None:
            return
        if peer.get("host") != socket.gethostname() or not isinstance(peer.get("pid"), int):
            raise RuntimeError(f"kill_worker({w}): worker {w} runs on {peer.get('host')!r}, not on this host")
        try:
            os.kill(peer["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass

    def checkpoint_state(self) -> Dict[str, Any]:
        with self.cond:
            counts = {"pushes": list(self.pushes), "stale": list(self.stale), "joins": list(self.joins),
                      "contributors": [list(c) for c in self.contributors]}
        return {"format": CHECKPOINT_FORMAT, "model": self.model.state_dict(), "sync_replicas": self.opt.state_dict(),
                "server": counts}

    def restore(self, state: Dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["sync_replicas"])
        counts = state.get("server", {})
        n = self.num_workers
        for name in ("pushes", "stale", "joins"):
            v = counts.get(name)
            if isinstance(v, list) and len(v) == n:
                setattr(self, name, [int(x) for x in v])
        self.contributors = [list(c) for c in counts.get("contributors", [])][:self.opt.global_step]

    def run_chief(self, num_steps: int, on_step, checkpoint: Optional[str], checkpoint_every: int) -> None:
        while self.opt.global_step < num_steps:
            before = self.opt.global_step
            try:
                step = self.opt.step(timeout=self.timeout)
            except TimeoutError as e:
                raise TimeoutError(self._missing(before, e)) from None
            with self.cond:
                self.contributors.append(sorted(self.opt.last_contributors))
            if checkpoint and checkpoint_every and (step % checkpoint_every == 0 or step == num_steps):
                save_checkpoint(checkpoint, self.checkpoint_state())
            if on_step is not None:
                s = self.opt.stats()
                with self.cond:
                    connected = sorted(self.peers)
                on_step(step, {"stale_gradients": s["dropped_stale"], "applied_gradients": s["applied"],
                               "pushes": s["pushes"], "model": self.model, "kill_worker": self.kill_worker,
                               "contributors": list(self.contributors[-1]), "connected": connected})

    def close(self, store) -> None:
        """Ends training: pending pulls answer done, the live workers say bye (bounded wait), then every
        connection and the listener close."""
        self.opt.close()
        if store is not None:
            try:
                store.set(_key(self.cfg, "done"), "1")
            except Exception:
                pass
        with self.cond:
            self.cond.wait_for(lambda: set(self.peers) <= self.byes, min(self.timeout, 30.0))
            peers = [p["sock"] for p in self.peers.values()]
        self.stopping = True
        for s in peers:
            _shutdown(s)
        self.acceptor.join(5)
        self.listener.close()
        for t in list(self.threads):
            t.join(5)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------- worker

class _Client:
    """A worker's connection to the parameter server; reconnects (a restarted server) until `timeout`."""

    def __init__(self, cfg: _Config, timeout: float):
        self.cfg, self.timeout = cfg, timeout
        self.sock: Optional[socket.socket] = None
        self.fresh = False  # connected since the last pull: pull the current step, whatever was seen before
        self.prefetched: Optional[Dict[str, Any]] = None  # a pull answered with the last push
        self.store = None

    def _server_address(self):
        if not self.cfg.agent_store:
            return (self.cfg.master_addr, self.cfg.master_port), False
        if self.store is None:
            self.store = _store(self.cfg, self.timeout)
        if self.store.check([_key(self.cfg, "done")]):
            return None, True
        if not self.store.check([_key(self.cfg, "server")]):
            return None, False
        host, port = self.store.get(_key(self.cfg, "server")).decode().rsplit("\n", 1)
        return (host, int(port)), False

    def connect(self) -> bool:
        """True once admitted; False when the job is over (the server said so through the launcher's store)."""
        deadline = time.monotonic() + self.timeout
        last_error = "no address published yet"
        while True:
            addr = None
            try:
                addr, done = self._server_address()
                if done:
                    return False
                if addr is not None:
                    self._admit(addr)
                    return True
            except _Refused:
                raise
            except (OSError, ConnectionError, RuntimeError) as e:  # (not up yet, or restarting)
                last_error = f"{type(e).__name__}: {e}"
                self.drop()
                self.store = None
            if time.monotonic() > deadline:
                raise TimeoutError(f"run_sync_replicas: rank {self.cfg.rank} could not reach the parameter server "
                                   f"({addr or (self.cfg.master_addr, self.cfg.master_port)}) within {self.timeout} s "
                                   f"({last_error})")
            time.sleep(0.2)

    def _admit(self, addr) -> None:
        sock = socket.create_connection(addr, timeout=_HELLO_SECONDS)
        try:
            _tune(sock)
            greeting = _recv(sock, _HELLO_LIMIT)
            if not isinstance(greeting, dict) or greeting.get("proto") != PROTOCOL:
                raise _Refused(f"{addr} does not speak {PROTOCOL}")
            nonce = str(greeting.get("nonce", ""))
            _send(sock, {"op": "hello", "proto": PROTOCOL, "rank": self.cfg.rank, "world_size": self.cfg.world_size,
                         "run_id": self.cfg.run_id, "pid": os.getpid(), "host": socket.gethostname(),
                         "mac": _mac(self.cfg.token, nonce, self.cfg.rank, self.cfg.run_id) if self.cfg.token else ""})
            welcome = _recv(sock, _HELLO_LIMIT)
            if not isinstance(welcome, dict) or not welcome.get("ok"):
                err = welcome.get("error") if isinstance(welcome, dict) else welcome
                raise _Refused(f"run_sync_replicas: rank {self.cfg.rank}: {err}")
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        self.sock, self.fresh = sock, True

    def call(self, msg: Dict[str, Any]) -> Dict[str, Any]:
        _send(self.sock, msg)
        return _recv(self.sock, _WORKER_FRAME_LIMIT)

    def drop(self) -> None:
        self.prefetched = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _run_worker(cfg: _Config, model_fn, loss_fn, data_fn, schedule, worker_delay, timeout) -> None:
    w = cfg.rank - 1
    client = _Client(cfg, timeout)
    if not client.connect():
        return
    data = data_fn(w)
    if len(data) == 0:
        raise ValueError(f"run_sync_replicas: data_fn({w}) returned no batches")
    model = model_fn()

    def pull(_, last):
        while True:
            if client.sock is None and not client.connect():
                return last, None, True
            r, client.prefetched = client.prefetched, None
            if r is not None:
                return r["step"], r["params"], r["done"]
            try:
                r = client.call({"op": "pull", "after": -1 if client.fresh else last})
            except (OSError, ConnectionError):
                client.drop()  # the server went away: wait for it to come back (a restarted job resumes)
                continue
            client.fresh = False
            return r["step"], r["params"], r["done"]

    def push(_, step, grads):
        if client.sock is None:
            return
        try:
            r = client.call({"op": "push", "step": step, "grads": [None if g is None else g.cpu() for g in grads],
                             "then_pull_after": step})
        except (OSError, ConnectionError):
            client.drop()  # (the gradient is lost with the connection; the next pull reconnects)
            return
        if "error" in r:
            raise RuntimeError(f"run_sync_replicas: rank {cfg.rank}: {r['error']}")
        client.prefetched = r.get("pull")

    try:
        _worker_loop(w, model, loss_fn, data, pull, push, schedule, worker_delay, lambda: True)
        if client.sock is not None:
            try:
                _send(client.sock, {"op": "bye"})
            except OSError:
                pass
    finally:
        client.drop()


# ------------------------------------------------------------------------------------------ entry point

def run_sync_replicas(model_fn: Callable[[], nn.Module], optimizer_fn: Callable[[Any], torch.optim.Optimizer],
                      loss_fn: Callable[[nn.Module, Any], Tensor], data_fn: Callable[[int], Sequence[Any]], *,
                      replicas_to_aggregate: int, num_steps: int,
                      checkpoint: Optional[str] = None, checkpoint_every: int = 0,
                      on_step: Optional[Callable[[int, Dict[str, Any]], None]] = None,
                      worker_delay=None, schedule: Optional[Callable[[int], Sequence[int]]] = None,
                      timeout: float = 120.0, rank: Optional[int] = None, world_size: Optional[int] = None,
                      master_addr: Optional[str] = None, master_port: Optional[int] = None,
                      bind_address: Optional[str] = None, token: Optional[str] = None
                      ) -> Optional[SyncReplicasResult]:
    """Synchronous replicas across processes and machines; every rank of the job calls it.

    Rank 0 is the parameter server and chief, ranks 1..world_size-1 the workers (worker w = rank - 1).
    `rank`, `world_size`, `master_addr`, `master_port` default to torchrun's `RANK`, `WORLD_SIZE`,
    `MASTER_ADDR`, `MASTER_PORT`. Under torchrun (its agent hosts a store at MASTER_ADDR:MASTER_PORT) rank 0
    listens on a free port of `bind_address` and publishes it in that store; otherwise it listens on
    `bind_address:master_port`. `bind_address` defaults to `master_addr`: rank 0 never listens on every
    interface unless `bind_address="0.0.0.0"` (or "::") is passed.

    * `model_fn()`, `optimizer_fn(params)`, `loss_fn(model, batch)`, `worker_delay`, `schedule`, `on_step`:
      as `train_sync_replicas`; `data_fn(w)` returns worker w's sequence of batches (at global step s it uses
      batch `s % len`). `on_step(step, info)` runs on rank 0; `info` also has "contributors" (the workers this
      step aggregated) and "connected".
    * `checkpoint`, `checkpoint_every`: rank 0 writes the model, the optimizer state, the global step and the
      counts to `checkpoint` every `checkpoint_every` steps and at the last one (a temporary file renamed over
      it); when the file exists at start, rank 0 resumes from it (a torchrun restart of the whole job).
    * A worker that disconnects (killed) is dropped; the step goes on while `replicas_to_aggregate` workers
      are left. A worker that connects again (restarted) pulls the current parameters and contributes from
      the current step. Stale pushes are dropped and counted. Rank 0 raises `TimeoutError` naming the missing
      ranks when a step does not get enough fresh gradients within `timeout` seconds.
    * `token` (default: the `TORCHOPS_SYNC_REPLICAS_TOKEN` environment variable): when set, a worker must
      prove it knows it (HMAC of a nonce) to be admitted.

    Returns the `SyncReplicasResult` on rank 0, None on the workers.
    """
    cfg = _config(rank, world_size, master_addr, master_port, bind_address, token)
    if not 1 <= replicas_to_aggregate <= cfg.world_size - 1:
        raise ValueError(f"replicas_to_aggregate must be in [1, world_size - 1 = {cfg.world_size - 1}] (the workers), "
                         f"got {replicas_to_aggregate}")
    if not isinstance(num_steps, int) or num_steps < 0:
        raise ValueError(f"num_steps must be an int >= 0, got {num_steps!r}")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"checkpoint_every must be an int >= 0, got {checkpoint_every!r}")
    if checkpoint_every and not checkpoint:
        raise ValueError("checkpoint_every needs a checkpoint path")
    if cfg.rank != 0:
        _run_worker(cfg, model_fn, loss_fn, data_fn, schedule, worker_delay, timeout)
        return None

    t0 = time.monotonic()
    model = model_fn()
    opt = SyncReplicasOptimizer(optimizer_fn(model.parameters()), replicas_to_aggregate, cfg.world_size - 1)
    server = _Server(cfg, model, opt, timeout)
    resumed = 0
    if checkpoint and os.path.exists(checkpoint):
        server.restore(load_checkpoint(checkpoint))
        resumed = opt.global_step
    store = None
    if cfg.agent_store:
        store = _store(cfg, timeout)
        host = cfg.master_addr if cfg.bind_address in ("0.0.0.0", "::", "") else cfg.bind_address
        store.set(_key(cfg, "server"), f"{host}\n{server.port}")
    server.start()
    try:
        server.run_chief(num_steps, on_step, checkpoint, checkpoint_every)
    finally:
        server.close(store)
    s = opt.stats()
    return SyncReplicasResult(model=model, state_dict={k: v.detach().clone() for k, v in model.state_dict().items()},
                              global_steps=s["global_step"], stale_gradients=s["dropped_stale"],
                              applied_gradients=s["applied"], pushes_per_worker=list(server.pushes),
                              seconds=time.monotonic() - t0, contributors=[list(c) for c in server.contributors],
                              stale_per_worker=list(server.stale), joins_per_worker=list(server.joins),
                              resumed_from=resumed, server_address=server.address)


# --------------------------------------------------------------------- train_sync_replicas(mode="processes")

def _shard(shards, w: int):
    return shards[w]


def _spawned(rank: int, world_size: int, port: int, model_fn, optimizer_fn, loss_fn, data_shards,
             replicas_to_aggregate, num_steps, on_step, worker_delay, schedule, timeout, results) -> None:
    torch.set_num_threads(1)
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # (these processes are not torchrun's)
    kw = dict(replicas_to_aggregate=replicas_to_aggregate, num_steps=num_steps, on_step=on_step,
              worker_delay=worker_delay, schedule=schedule, timeout=timeout, rank=rank, world_size=world_size,
              master_addr="127.0.0.1", master_port=port, token="")
    if rank != 0:
        run_sync_replicas(model_fn, optimizer_fn, loss_fn, functools.partial(_shard, data_shards), **kw)
        return
    error, r = None, None
    try:
        r = run_sync_replicas(model_fn, optimizer_fn, loss_fn, functools.partial(_shard, data_shards), **kw)
    except BaseException as e:  # noqa: B902  (carried to the caller)
        error = e
    payload = None
    if r is not None:
        buf = io.BytesIO()
        torch.save(r.state_dict, buf)
        r.model, r.state_dict = None, {}
        payload = (buf.getvalue(), r)
    try:
        results.put((payload, error))
    except Exception as e:  # e.g. an unpicklable exception
        results.put((payload, RuntimeError(repr(error) + f" ({e!r})")))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_processes(model_fn, optimizer_fn, loss_fn, data_shards, num_workers, replicas_to_aggregate, num_steps,
                   on_step, worker_delay, schedule, timeout) -> SyncReplicasResult:
    import queue as queue_mod

    import torch.multiprocessing as mp

    t0 = time.monotonic()
    ctx = mp.get_context("spawn")
    port = _free_port()
    results = ctx.Queue()
    procs = [ctx.Process(target=_spawned, args=(rank, num_workers + 1, port, model_fn, optimizer_fn, loss_fn,
                                                data_shards, replicas_to_aggregate, num_steps, on_step, worker_delay,
                                                schedule, timeout, results), daemon=True)
             for rank in range(num_workers + 1)]
    ps, workers = procs[0], procs[1:]
    try:
        for p in procs:
            p.start()
        # Bound: start-up, then at most `timeout` per step (the chief's own bound), then shutdown.
        deadline = time.monotonic() + 2 * timeout + num_steps * timeout
        got = None
        while got is None:
            try:
                got = results.get(timeout=0.5)
            except queue_mod.Empty:
                if not ps.is_alive():
                    raise RuntimeError(f"train_sync_replicas: the parameter-server process died (exit code "
                                       f"{ps.exitcode}) without a result") from None
                if time.monotonic() > deadline:
                    raise TimeoutError("train_sync_replicas: no result from the parameter-server process in time")
        payload, error = got
        end = time.monotonic() + min(timeout, 30.0)
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            if p.pid is not None:
                p.join(10)
    if error is not None:
        raise error
    state_bytes, r = payload
    r.model = model_fn()
    r.model.load_state_dict(torch.load(io.BytesIO(state_bytes), weights_only=True))
    r.state_dict = {k: v.detach().clone() for k, v in r.model.state_dict().items()}
    r.worker_exitcodes = [p.exitcode for p in workers]
    r.seconds = time.monotonic() - t0
    return r
