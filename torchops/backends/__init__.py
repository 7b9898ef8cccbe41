"""Which implementation of each kernel slot runs: torchops' route table, modelled on ``torch.backends.cudnn``.

Every op family lists, per kernel slot, an ordered list of routes (e.g. ``cudnn_rnn.cuda.cudnn`` before
``cudnn_rnn.cuda.loops``). A route runs a case when it is enabled and covers it; otherwise the next one does,
and the last route of a slot (its fallback) covers every case. A route is on by default only once it is
*verified*: it has passed the test suite on its device. ``TORCHOPS_ROUTES="<id>=on|off,..."`` sets the
defaults when the library loads; :func:`set_enabled` and :func:`flags` switch routes at run time (process-wide,
from any thread, as ``torch.backends.cudnn.flags`` does). ``torch.backends.cudnn.flags(enabled=False)`` still
turns every cuDNN route off, and ``torch.backends.mkldnn.flags(enabled=False)`` the oneDNN one.

The same controls are ops, so TorchScript and libtorch programs can use them:
``torch.ops.torchops._route_list()``, ``_route_set(id, on)``, ``_route_enabled(id)``, ``_route_hits(id)``.
"""
import contextlib
import threading
from typing import Dict, Iterator, List, Optional

import torch

from . import cpu  # noqa: F401

__all__ = ["routes", "is_enabled", "set_enabled", "flags", "prefer", "hits", "format_routes", "cpu"]

_FIELDS = ("id", "family", "slot", "device", "name", "isa", "verified", "on", "default", "fallback", "hits",
           "covers")
_lock = threading.Lock()


def _ops():
    return torch.ops.torchops


def routes(family: Optional[str] = None, device: Optional[str] = None) -> List[Dict]:
    """Every route, in each slot's order of preference, as dicts with the keys ``id`` (``family.device.name``),
    ``family``, ``slot``, ``device``, ``name``, ``isa`` (the CPU capability it needs, or None), ``verified``
    (where it passed the suite, or None), ``enabled`` (on, and within the CPU capability in use), ``on``,
    ``default`` (on by default), ``fallback`` (covers every case; cannot be turned off), ``hits`` (times it ran
    in this process) and ``covers``."""
    out = []
    for record in _ops()._route_list():
        values = record.split("\t", len(_FIELDS) - 1)
        r = dict(zip(_FIELDS, values))
        r["isa"] = r["isa"] or None
        r["verified"] = r["verified"] or None
        for k in ("on", "default", "fallback"):
            r[k] = r[k] == "1"
        r["hits"] = int(r["hits"])
        r["enabled"] = bool(_ops()._route_enabled(r["id"]))
        if (family is None or r["family"] == family) and (device is None or r["device"] == device):
            out.append(r)
    return out


def is_enabled(route: str) -> bool:
    """Whether ``route`` (``family.device.name``) is on and within the CPU capability in use."""
    return bool(_ops()._route_enabled(route))


def set_enabled(route: str, enabled: bool) -> None:
    """Turns a route on or off for the whole process. A ValueError names an unknown route (listing the known
    ones) or a slot's fallback being turned off."""
    _ops()._route_set(route, bool(enabled))


def hits(route: str) -> int:
    """How many times ``route`` ran in this process (per op call; capability routes per kernel call)."""
    return int(_ops()._route_hits(route))


@contextlib.contextmanager
def flags(settings: Optional[Dict[str, bool]] = None, **by_name: bool) -> Iterator[None]:
    """Turns routes on or off inside a ``with`` block and restores them after it, e.g.
    ``with torchops.backends.flags({"cudnn_rnn.cuda.cudnn": True}): ...``. Like ``torch.backends.cudnn.flags``
    the setting is process-wide; changes are atomic, so other threads see either value."""
    wanted = dict(settings or {})
    wanted.update(by_name)
    with _lock:
        saved = {}
        try:
            for route, on in wanted.items():
                if route not in saved:
                    saved[route] = _route_on(route)
                set_enabled(route, on)
        except BaseException:
            for route, on in saved.items():
                set_enabled(route, on)
            raise
    try:
        yield
    finally:
        with _lock:
            for route, on in saved.items():
                set_enabled(route, on)


def prefer(route: str):
    """A ``flags`` context in which ``route`` runs every case it covers: it is on and the routes before it in its
    slot are off (e.g. ``prefer("cudnn_rnn.cpu.loops")`` runs the time loops instead of oneDNN)."""
    rs = routes()
    me = next((r for r in rs if r["id"] == route), None)
    if me is None:
        set_enabled(route, True)  # raises the ValueError that lists the known routes
    settings = {}
    for r in rs:
        if (r["family"], r["slot"], r["device"]) != (me["family"], me["slot"], me["device"]):
            continue
        if r["id"] == route:
            if not r["fallback"]:
                settings[route] = True
            break
        settings[r["id"]] = False
    return flags(settings)


def _route_on(route: str) -> bool:
    for r in routes():
        if r["id"] == route:
            return r["on"]
    set_enabled(route, True)  # raises the ValueError that lists the known routes
    raise AssertionError("unreachable")


def _default_text(r: Dict) -> str:
    if r["id"].startswith("rnn.cpu.packed_"):
        return "on, off on Intel CPUs"  # (the default follows the CPU's vendor, see docs/building.md)
    return "on" if r["default"] else "off"


def format_routes(rows: Optional[List[Dict]] = None, markdown: bool = False) -> str:
    """The route table as plain text (what ``python -m torchops.info`` prints), or as the Markdown rows of
    docs/building.md's table (``markdown=True``)."""
    rows = routes() if rows is None else rows
    if markdown:
        return "\n".join(f"| `{r['id']}` | {r['slot']} | {_default_text(r)} | {r['covers']} | "
                         f"{r['verified'] or 'never run on its device'} |" for r in rows)
    head = ("route", "slot", "capability", "enabled", "default", "verified")
    table = [head] + [(r["id"], r["slot"], r["isa"] or "-", "yes" if r["enabled"] else "no",
                       "on" if r["default"] else "off", r["verified"] or "never run on its device") for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table)
