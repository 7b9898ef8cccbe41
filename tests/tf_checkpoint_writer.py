"""A minimal writer of TensorFlow's checkpoint format for the reader's tests (hand-made files).

It writes what TF's BundleWriter writes (table blocks with restart points, masked CRC-32C trailers, the
footer; BundleHeaderProto and BundleEntryProto records; raw little-endian data shards), plus the variants
TF can read but does not write by default (snappy blocks, big-endian data, many shards), and hooks to break
files on purpose.
"""
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from torchops.tf._crc32c import crc32c, mask
from torchops.tf.checkpoint import _DTYPES, data_filename, slice_key

TORCH_TO_TF = {v[1]: k for k, v in _DTYPES.items()}
DT_STRING = 7


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def field_varint(field: int, v: int) -> bytes:
    return varint(field << 3) + varint(v)


def field_bytes(field: int, b: bytes) -> bytes:
    return varint((field << 3) | 2) + varint(len(b)) + b


def field_fixed32(field: int, v: int) -> bytes:
    return varint((field << 3) | 5) + v.to_bytes(4, "little")


def shape_proto(shape: Sequence[int]) -> bytes:
    return b"".join(field_bytes(2, field_varint(1, d)) for d in shape)


def slice_proto(extents) -> bytes:
    out = b""
    for start, length in extents:
        e = field_varint(1, start) if start else b""
        if length is not None:
            e += field_varint(2, length)
        out += field_bytes(1, e)
    return out


def entry_proto(dtype: int, shape, shard_id=0, offset=0, size=0, crc=0, slices=()) -> bytes:
    out = field_varint(1, dtype) + field_bytes(2, shape_proto(shape))
    if slices:
        return out + b"".join(field_bytes(7, slice_proto(s)) for s in slices)
    if shard_id:
        out += field_varint(3, shard_id)
    if offset:
        out += field_varint(4, offset)
    if size:
        out += field_varint(5, size)
    return out + field_fixed32(6, crc)


def snappy_literal(data: bytes) -> bytes:
    """Snappy encoding of `data`: a literal, then (to exercise back-references) copies where bytes repeat."""
    out = bytearray(varint(len(data)))
    i = 0
    while i < len(data):
        # a 2-byte-offset copy of the previous 4 bytes when they repeat
        if i >= 4 and data[i:i + 4] == data[i - 4:i]:
            out += bytes([((4 - 1) << 2) | 2]) + (4).to_bytes(2, "little")
            i += 4
            continue
        j = i + 1
        while j < len(data) and j - i < 60 and not (j >= 4 and data[j:j + 4] == data[j - 4:j]):
            j += 1
        out += bytes([((j - i - 1) << 2)]) + data[i:j]
        i = j
    return bytes(out)


def _block(entries: List[Tuple[bytes, bytes]], restart_interval: int = 16) -> bytes:
    out, restarts, prev = bytearray(), [], b""
    for n, (key, value) in enumerate(entries):
        shared = 0
        if n % restart_interval == 0:
            restarts.append(len(out))
        else:
            while shared < min(len(prev), len(key)) and prev[shared] == key[shared]:
                shared += 1
        out += varint(shared) + varint(len(key) - shared) + varint(len(value)) + key[shared:] + value
        prev = key
    if not restarts:
        restarts = [0]
    for r in restarts:
        out += r.to_bytes(4, "little")
    return bytes(out + len(restarts).to_bytes(4, "little"))


def table_bytes(items: Dict[bytes, bytes], block_size: int = 4096, snappy: bool = False) -> bytes:
    out = bytearray()

    def put(block: bytes) -> bytes:
        kind = 0
        if snappy:
            block, kind = snappy_literal(block), 1
        handle = varint(len(out)) + varint(len(block))
        trailer = bytes([kind]) + mask(crc32c(block + bytes([kind]))).to_bytes(4, "little")
        out.extend(block + trailer)
        return handle

    index, pending, size = [], [], 0
    for key in sorted(items):
        pending.append((key, items[key]))
        size += len(key) + len(items[key])
        if size >= block_size:
            index.append((pending[-1][0], put(_block(pending))))
            pending, size = [], 0
    if pending or not index:
        index.append((pending[-1][0] if pending else b"", put(_block(pending))))
    meta = put(_block([]))
    index_handle = put(_block(index))
    footer = meta + index_handle
    footer += b"\x00" * (40 - len(footer))
    magic = 0xDB4775248B80FB57
    footer += (magic & 0xFFFFFFFF).to_bytes(4, "little") + (magic >> 32).to_bytes(4, "little")
    return bytes(out + footer)


def _string_data(values: List[bytes]) -> Tuple[bytes, int]:
    lengths = b"".join(varint(len(v)) for v in values)
    crc = 0
    for v in values:
        crc = crc32c(len(v).to_bytes(4, "little"), crc)
    length_crc = mask(crc).to_bytes(4, "little")
    crc = crc32c(length_crc, crc)
    body = b"".join(values)
    return lengths + length_crc + body, crc32c(body, crc)


def _tensor_data(t, big_endian: bool) -> Tuple[int, List[int], bytes, int]:
    if isinstance(t, tuple):  # (shape, [bytes]) string tensor
        shape, values = t
        data, crc = _string_data(list(values)) if values else (b"", 0)
        return DT_STRING, list(shape), data, crc
    t = t.contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    if t.dtype == torch.bool:
        raw = t.to(torch.uint8).numpy().tobytes()
    if big_endian and t.element_size() > 1:
        width = t.element_size() // 2 if t.is_complex() else t.element_size()
        raw = np.frombuffer(raw, dtype=f"<u{width}").astype(f">u{width}").tobytes()
    return TORCH_TO_TF[t.dtype], list(t.shape), raw, crc32c(raw)


def write_checkpoint(prefix: str, tensors: Dict[str, object], partitioned: Optional[Dict[str, tuple]] = None,
                     num_shards: int = 1, block_size: int = 4096, snappy: bool = False, big_endian: bool = False,
                     header: bool = True, version: Tuple[int, int] = (1, 0), entry_hook=None) -> str:
    """Writes `tensors` ({name: torch.Tensor or (shape, [bytes])}) and `partitioned`
    ({name: (full_shape, [(extents, tensor)])}, extents [(start, length or None)]) at `prefix`, spreading the
    tensors round-robin over `num_shards` data files. `entry_hook(key, entry_bytes) -> bytes` edits records."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    shards = [bytearray() for _ in range(num_shards)]
    items: Dict[bytes, bytes] = {}
    pieces = [(name.encode(), name, t) for name, t in tensors.items()]
    for name, (full_shape, parts) in (partitioned or {}).items():
        dtype = None
        for extents, t in parts:
            dtype, _, _, _ = _tensor_data(t, big_endian)
            pieces.append((slice_key(name, extents), None, t))
        items[name.encode()] = entry_proto(dtype, full_shape, slices=[e for e, _ in parts])
    for n, (key, _, t) in enumerate(pieces):
        shard = n % num_shards
        dtype, shape, raw, crc = _tensor_data(t, big_endian)
        offset = len(shards[shard])
        shards[shard] += raw
        items[key] = entry_proto(dtype, shape, shard, offset, len(raw), mask(crc))
    if entry_hook is not None:
        items = {k: entry_hook(k, v) for k, v in items.items()}
    if header:
        version_proto = field_varint(1, version[0]) + (field_varint(2, version[1]) if version[1] else b"")
        items[b""] = field_varint(1, num_shards) + (field_varint(2, 1) if big_endian else b"") + \
            field_bytes(3, version_proto)
    for i, data in enumerate(shards):
        with open(data_filename(prefix, i, num_shards), "wb") as f:
            f.write(bytes(data))
    with open(prefix + ".index", "wb") as f:
        f.write(table_bytes(items, block_size=block_size, snappy=snappy))
    return prefix
