"""CRC-32C (Castagnoli), as TensorFlow's checkpoints and tables checksum their bytes, and TF's masking.

Uses the `google_crc32c` package when it is installed; otherwise a numpy implementation that checksums
many chunks of the input side by side and folds the chunk checksums together (CRC is linear over GF(2)),
so that large checkpoints are checked without a compiled extension.
"""
import functools
from typing import List

import numpy as np

try:  # optional accelerator
    import google_crc32c as _google_crc32c
except ImportError:  # pragma: no cover - depends on the environment
    _google_crc32c = None

_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_MASK_DELTA = 0xA282EAD8


def _make_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLY), table >> 1).astype(np.uint32)
    return table


_TABLE = _make_table()
_TABLE_LIST = [int(v) for v in _TABLE]


def _raw_python(state: int, data: bytes) -> int:
    """The CRC register after `data`, from `state`, without the initial/final inversion."""
    table = _TABLE_LIST
    for b in data:
        state = table[(state ^ b) & 0xFF] ^ (state >> 8)
    return state


_CHUNK = 1024  # bytes per chunk checksummed side by side
_ROWS = 4096  # chunks per batch (bounds the temporary arrays to _CHUNK * _ROWS * 4 bytes)


@functools.lru_cache(maxsize=1)
def _position_tables() -> np.ndarray:
    """[_CHUNK, 256]: the register contribution of byte value b at position k of a chunk read from state 0.

    The register is linear in the input over GF(2), so a chunk's register is the XOR of its bytes'
    contributions: one gather and one reduction per batch of chunks, instead of a loop over the bytes."""
    tables = np.empty((_CHUNK, 256), dtype=np.uint32)
    tables[-1] = _TABLE
    for k in range(_CHUNK - 2, -1, -1):  # one more zero byte after position k
        t = tables[k + 1]
        tables[k] = _TABLE[t & 0xFF] ^ (t >> 8)
    return tables


@functools.lru_cache(maxsize=1)
def _shift_tables() -> List[List[int]]:
    """Byte tables of the linear map `state -> register after _CHUNK zero bytes read from state`."""
    basis = (np.uint32(1) << np.arange(32, dtype=np.uint32)).astype(np.uint32)
    for _ in range(_CHUNK):
        basis = _TABLE[basis & 0xFF] ^ (basis >> 8)
    tables = np.zeros((4, 256), dtype=np.uint32)
    byte_values = np.arange(256, dtype=np.uint32)
    for k in range(4):
        for bit in range(8):
            tables[k] ^= np.where((byte_values >> bit) & 1, basis[8 * k + bit], 0).astype(np.uint32)
    return [t.tolist() for t in tables]


def _raw_numpy(state: int, data) -> int:
    buf = np.frombuffer(data, dtype=np.uint8)
    count = buf.size // _CHUNK
    positions = _position_tables()
    offsets = (np.arange(_CHUNK, dtype=np.int32) * 256)[None, :]
    flat = positions.ravel()
    t0, t1, t2, t3 = _shift_tables()
    for first in range(0, count, _ROWS):
        rows = buf[first * _CHUNK:min(first + _ROWS, count) * _CHUNK].reshape(-1, _CHUNK)
        regs = np.bitwise_xor.reduce(flat[offsets + rows], axis=1)
        for r in regs.tolist():  # state = shift(state) ^ chunk register
            state = (t0[state & 0xFF] ^ t1[(state >> 8) & 0xFF] ^ t2[(state >> 16) & 0xFF] ^ t3[state >> 24]) ^ r
    return _raw_python(state, bytes(buf[count * _CHUNK:]))


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of `data` (bytes-like), extending a previous value `crc` as TF's `crc32c::Extend`."""
    if _google_crc32c is not None:
        return _google_crc32c.extend(crc, bytes(data))
    state = (crc ^ 0xFFFFFFFF) & 0xFFFFFFFF
    if len(data) < 65536:
        state = _raw_python(state, bytes(data))
    else:
        state = _raw_numpy(state, data)
    return state ^ 0xFFFFFFFF


def mask(crc: int) -> int:
    """TF's masked CRC (stored checksums are masked so that CRCs of CRCs are not trivial)."""
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def unmask(masked: int) -> int:
    rot = (masked - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF
