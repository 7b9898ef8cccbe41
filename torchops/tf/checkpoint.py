"""TensorFlow checkpoints without TensorFlow: `list_variables`, `load_checkpoint` and its reader.

Reads the tensor-bundle format that TF 1.x `tf.train.Saver` (V2), TF 2.x `tf.train.Checkpoint` and
SavedModels (`variables/`) write: `<prefix>.index`, a table mapping tensor names to `BundleEntryProto`
records (dtype, shape, shard, offset, size, CRC-32C, slices), and `<prefix>.data-NNNNN-of-MMMMM` shards
holding the raw bytes. The protobuf records are decoded here field by field; nothing in a file is
unpickled or executed. Every checksum is verified.
"""
import difflib
import math
import os
import re
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from ._crc32c import crc32c, unmask
from ._table import DataLossError, read_table, read_varint

__all__ = ["CheckpointReader", "DataLossError", "NotFoundError", "list_variables", "load_checkpoint"]


class NotFoundError(KeyError, ValueError):
    """A tensor name (or file) that is not there; the message lists close matches (a KeyError for lookups
    by name, a ValueError for a bad argument)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


# TF DataType enum -> (name, torch dtype, item size). String tensors are returned as Python bytes.
_DTYPES = {
    1: ("float32", torch.float32, 4), 2: ("float64", torch.float64, 8), 3: ("int32", torch.int32, 4),
    4: ("uint8", torch.uint8, 1), 5: ("int16", torch.int16, 2), 6: ("int8", torch.int8, 1),
    8: ("complex64", torch.complex64, 8), 9: ("int64", torch.int64, 8), 10: ("bool", torch.bool, 1),
    14: ("bfloat16", torch.bfloat16, 2), 17: ("uint16", torch.uint16, 2), 18: ("complex128", torch.complex128, 16),
    19: ("float16", torch.float16, 2), 22: ("uint32", torch.uint32, 4), 23: ("uint64", torch.uint64, 8),
    24: ("float8_e5m2", torch.float8_e5m2, 1), 25: ("float8_e4m3fn", torch.float8_e4m3fn, 1),
}
_DT_STRING = 7
_UNSUPPORTED = {0: "DT_INVALID", 11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 16: "quint16",
                20: "resource", 21: "variant", 26: "float8_e4m3fnuz", 27: "float8_e4m3b11fnuz",
                28: "float8_e5m2fnuz", 29: "int4", 30: "uint4", 31: "int2", 32: "uint2"}
_TENSOR_BUNDLE_VERSION = 1  # the newest bundle format version this reader understands (TF's kTensorBundleVersion)


# -- protobuf wire format -------------------------------------------------------------------------------------

def _parse_message(buf: bytes, what: str) -> Dict[int, list]:
    """field number -> list of values (ints for varint/fixed fields, bytes for length-delimited ones)."""
    fields: Dict[int, list] = {}
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = read_varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos, what)
        elif wire == 2:
            length, pos = read_varint(buf, pos, what)
            if pos + length > n:
                raise DataLossError(f"{what}: truncated protobuf field {field}")
            value, pos = buf[pos:pos + length], pos + length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > n:
                raise DataLossError(f"{what}: truncated protobuf field {field}")
            value, pos = int.from_bytes(buf[pos:pos + size], "little"), pos + size
        else:
            raise DataLossError(f"{what}: unsupported protobuf wire type {wire} (field {field})")
        fields.setdefault(field, []).append(value)
    return fields


def _int64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _last(fields: Dict[int, list], field: int, default: int = 0) -> int:
    """An integer field's value (protobuf: the last occurrence of a scalar field wins)."""
    values = fields.get(field)
    if not values:
        return default
    if not isinstance(values[-1], int):
        raise DataLossError(f"protobuf field {field} should be an integer, found a length-delimited value")
    return values[-1]


def _messages(fields: Dict[int, list], field: int) -> List[bytes]:
    """A message (or bytes) field's occurrences."""
    values = fields.get(field, [])
    if any(not isinstance(v, bytes) for v in values):
        raise DataLossError(f"protobuf field {field} should be a message, found an integer")
    return values


def _parse_shape(buf: bytes, what: str) -> List[int]:
    fields = _parse_message(buf, what)
    if _last(fields, 3):
        raise DataLossError(f"{what}: tensor shape of unknown rank")
    shape = [_int64(_last(_parse_message(d, what), 1)) for d in _messages(fields, 2)]
    if any(d < 0 for d in shape):
        raise DataLossError(f"{what}: invalid tensor shape {shape}")
    return shape


def _parse_slice(buf: bytes, shape: List[int], what: str) -> List[Tuple[int, Optional[int]]]:
    """TensorSliceProto -> [(start, length or None for the full extent)] per dimension."""
    extents = []
    for e in _messages(_parse_message(buf, what), 1):
        f = _parse_message(e, what)
        extents.append((_int64(_last(f, 1)), _int64(_last(f, 2)) if 2 in f else None))
    if len(extents) != len(shape):
        raise DataLossError(f"{what}: slice of rank {len(extents)} for a tensor of shape {shape}")
    for d, (start, length) in enumerate(extents):
        stop = shape[d] if length is None else start + length
        if start < 0 or stop > shape[d] or stop < start:
            raise DataLossError(f"{what}: slice extent [{start}, {stop}) outside dimension {d} of size {shape[d]}")
    return extents


class _Entry:
    __slots__ = ("dtype", "shape", "shard_id", "offset", "size", "crc32c", "slices")

    def __init__(self, buf: bytes, what: str):
        try:
            self._parse(buf, what)
        except DataLossError as e:
            raise e if str(e).startswith(what) else DataLossError(f"{what}: {e}") from None

    def _parse(self, buf: bytes, what: str) -> None:
        f = _parse_message(buf, what)
        self.dtype = _last(f, 1)
        self.shape = _parse_shape(_messages(f, 2)[-1], what) if 2 in f else []
        self.shard_id = _last(f, 3)
        self.offset = _int64(_last(f, 4))
        self.size = _int64(_last(f, 5))
        self.crc32c = _last(f, 6)
        self.slices = [_parse_slice(s, self.shape, what) for s in _messages(f, 7)]


# -- TF's "ordered code" keys of tensor slices (saved_tensor_slice_util's EncodeTensorNameSlice) ----------------

def _ordered_num(v: int) -> bytes:
    body = v.to_bytes((v.bit_length() + 7) // 8, "big") if v else b""
    return bytes([len(body)]) + body


def _escape(s: bytes) -> bytes:
    out = bytearray()
    for b in s:
        out += b"\x00\xff" if b == 0 else b"\xff\x00" if b == 0xFF else bytes([b])
    return bytes(out)


_HEADER_BITS = [(0, 0), (0x80, 0), (0xC0, 0), (0xE0, 0), (0xF0, 0), (0xF8, 0), (0xFC, 0), (0xFE, 0), (0xFF, 0),
                (0xFF, 0x80), (0xFF, 0xC0)]
_BITS_TO_LENGTH = [1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5,
                   5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 10]


def _ordered_signed(v: int) -> bytes:
    x = ~v if v < 0 else v
    if x < 64:
        return bytes([(0x80 ^ v) & 0xFF])
    length = _BITS_TO_LENGTH[x.bit_length()]
    buf = bytearray((b"\xff\xff" if v < 0 else b"\x00\x00") + (v & (2 ** 64 - 1)).to_bytes(8, "big"))
    begin = buf[10 - length:]
    begin[0] ^= _HEADER_BITS[length][0]
    begin[1] ^= _HEADER_BITS[length][1]
    return bytes(begin)


def slice_key(name: str, extents: List[Tuple[int, Optional[int]]]) -> bytes:
    """The table key under which the bundle stores one slice of a partitioned tensor."""
    key = _ordered_num(0) + _escape(name.encode()) + b"\x00\x01" + _ordered_num(len(extents))
    for start, length in extents:
        key += _ordered_signed(start) + _ordered_signed(-1 if length is None else length)
    return key


# -- paths ---------------------------------------------------------------------------------------------------

def _checkpoint_state(directory: str) -> Optional[str]:
    """`model_checkpoint_path` of a directory's `checkpoint` file (a text CheckpointState proto)."""
    path = os.path.join(directory, "checkpoint")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        m = re.search(r'^\s*model_checkpoint_path\s*:\s*"((?:[^"\\]|\\.)*)"', f.read(), re.M)
    if m is None:
        raise DataLossError(f"{path}: no model_checkpoint_path in the checkpoint state file")
    prefix = m.group(1).encode().decode("unicode_escape")
    return prefix if os.path.isabs(prefix) else os.path.join(directory, prefix)


def resolve_prefix(path: Union[str, os.PathLike]) -> str:
    """The checkpoint prefix of `path`: a prefix, its `.index` or a data shard, a directory with a
    `checkpoint` file, or a SavedModel directory (its `variables/variables`)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        state = _checkpoint_state(path)
        if state is not None:
            return state
        variables = os.path.join(path, "variables", "variables")
        if os.path.isfile(variables + ".index"):
            return variables
        if os.path.isfile(os.path.join(path, "variables.index")):
            return os.path.join(path, "variables")
        raise NotFoundError(f"path {path!r} is a directory without a 'checkpoint' file, a SavedModel's "
                            f"variables/variables.index or a variables.index")
    if path.endswith(".index"):
        return path[:-len(".index")]
    m = re.match(r"^(.*)\.data-\d{5}-of-\d{5}$", path)
    if m:
        return m.group(1)
    if os.path.isfile(path + ".index"):
        return path
    raise NotFoundError(f"path {path!r}: no checkpoint there (expected {path + '.index'!r}, a directory with a "
                        f"'checkpoint' file, or a SavedModel directory)")


def data_filename(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


# -- the reader ----------------------------------------------------------------------------------------------

def close_matches(name: str, names, what: str) -> str:
    matches = difflib.get_close_matches(name, list(names), n=5, cutoff=0.5)
    return f"{what}; close matches: {matches}" if matches else f"{what}; no close match"


class CheckpointReader:
    """A TensorFlow checkpoint, read without TensorFlow (TF's `tf.train.load_checkpoint` reader)."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.prefix = resolve_prefix(path)
        index = self.prefix + ".index"
        if not os.path.isfile(index):
            raise NotFoundError(f"checkpoint index {index!r} does not exist")
        with open(index, "rb") as f:
            table = read_table(f.read(), index)
        if b"" not in table:
            raise DataLossError(f"{index}: no bundle header entry: not a TensorFlow V2 checkpoint index")
        header = _parse_message(table.pop(b""), f"{index} header")
        self.num_shards = _last(header, 1)
        big_endian = _last(header, 2) == 1
        version = _parse_message(_messages(header, 3)[-1], f"{index} version") if 3 in header else {}
        if _last(version, 2) > _TENSOR_BUNDLE_VERSION or _TENSOR_BUNDLE_VERSION in version.get(3, []):
            raise DataLossError(f"{index}: checkpoint format version {_last(version, 1)} needs a reader of version "
                                f">= {_last(version, 2)}; this reader is version {_TENSOR_BUNDLE_VERSION}")
        self._byteorder = ">" if big_endian else "<"
        self._entries: Dict[str, _Entry] = {}
        self._slices: Dict[bytes, _Entry] = {}
        for key, value in table.items():
            if key.startswith(b"\x00"):
                self._slices[key] = _Entry(value, f"{index} slice entry")
            else:
                name = key.decode("utf-8", errors="surrogateescape")
                self._entries[name] = _Entry(value, f"{index} entry {name!r}")
        shards = {e.shard_id for e in list(self._entries.values()) + list(self._slices.values())
                  if not e.slices and e.size > 0}
        if any(not 0 <= s < max(self.num_shards, 1) for s in shards):
            raise DataLossError(f"{index}: entries name shard ids {sorted(shards)} but the header has "
                                f"{self.num_shards} shards")
        self._shard_sizes = {}
        for s in sorted(shards):
            name = data_filename(self.prefix, s, self.num_shards)
            if not os.path.isfile(name):
                raise NotFoundError(f"checkpoint data shard {name!r} is missing ({self.num_shards} shards expected "
                                    f"for prefix {self.prefix!r})")
            self._shard_sizes[s] = os.path.getsize(name)

    def keys(self) -> List[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    has_tensor = __contains__

    def get_variable_to_shape_map(self) -> Dict[str, List[int]]:
        return {k: list(self._entries[k].shape) for k in self.keys()}

    def get_variable_to_dtype_map(self) -> Dict[str, Union[torch.dtype, type]]:
        """name -> torch dtype (`bytes` for string tensors; TF's name as a str for dtypes torch lacks)."""
        return {k: self._dtype(self._entries[k].dtype) for k in self.keys()}

    @staticmethod
    def _dtype(code: int):
        if code in _DTYPES:
            return _DTYPES[code][1]
        if code == _DT_STRING:
            return bytes
        return _UNSUPPORTED.get(code, f"DataType {code}")

    def _entry(self, name: str) -> _Entry:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if name not in self._entries:
            raise NotFoundError(close_matches(name, self._entries, f"tensor {name!r} not found in checkpoint "
                                                                   f"{self.prefix!r}"))
        return self._entries[name]

    def get_tensor(self, name: str):
        """The tensor `name` as a `torch.Tensor` (string tensors: `bytes`, or nested lists of bytes)."""
        entry = self._entry(name)
        if not entry.slices:
            return self._read(entry, name)
        if entry.dtype == _DT_STRING:
            raise DataLossError(f"tensor {name!r}: partitioned string tensors are not supported")
        dtype = self._torch_dtype(entry, name)
        parts, total = [], 0
        for extents in entry.slices:  # every slice entry is checked before the full tensor is allocated
            key = slice_key(name, extents)
            if key not in self._slices:
                raise DataLossError(f"tensor {name!r}: the entry of its slice {extents} is missing from the index")
            index = tuple(slice(start, dim if length is None else start + length)
                          for (start, length), dim in zip(extents, entry.shape))
            shape = [s.stop - s.start for s in index]
            if self._slices[key].shape != shape or self._slices[key].dtype != entry.dtype:
                raise DataLossError(f"tensor {name!r}: the entry of slice {extents} has dtype enum "
                                    f"{self._slices[key].dtype} and shape {self._slices[key].shape}, expected "
                                    f"{entry.dtype} and {shape}")
            parts.append((extents, index, self._slices[key]))
            total += math.prod(shape)
        numel = math.prod(entry.shape)
        if total != numel:
            raise DataLossError(f"tensor {name!r}: its {len(entry.slices)} slices hold {total} elements, the tensor "
                                f"has {numel}")
        out = torch.empty(entry.shape, dtype=dtype)
        covered = np.zeros(entry.shape, dtype=np.int8)
        for extents, index, slice_entry in parts:
            part = self._read(slice_entry, f"{name} slice {extents}")
            out[index] = part
            covered[index] += 1
        if covered.size and not (covered == 1).all():  # as many elements as the tensor, so overlaps leave gaps
            raise DataLossError(f"tensor {name!r}: its {len(entry.slices)} slices cover {(covered > 0).sum()} of its "
                                f"{covered.size} elements, some more than once")
        return out

    def _torch_dtype(self, entry: _Entry, name: str) -> torch.dtype:
        if entry.dtype not in _DTYPES:
            what = _UNSUPPORTED.get(entry.dtype, f"DataType enum {entry.dtype}")
            raise NotImplementedError(f"tensor {name!r} has dtype {what}, which torchops.tf cannot read "
                                      f"(supported: {sorted(v[0] for v in _DTYPES.values())} and string)")
        return _DTYPES[entry.dtype][1]

    def _raw(self, entry: _Entry, name: str, verify: bool = True) -> bytes:
        if entry.size == 0:
            return b""
        shard = data_filename(self.prefix, entry.shard_id, self.num_shards)
        if entry.offset < 0 or entry.offset + entry.size > self._shard_sizes.get(entry.shard_id, -1):
            raise DataLossError(f"tensor {name!r}: bytes [{entry.offset}, {entry.offset + entry.size}) lie past the "
                                f"end of {shard!r} ({self._shard_sizes.get(entry.shard_id)} bytes): truncated file")
        with open(shard, "rb") as f:
            f.seek(entry.offset)
            raw = f.read(entry.size)
        if len(raw) != entry.size:
            raise DataLossError(f"tensor {name!r}: {shard!r} is truncated")
        if verify:
            self._verify(entry, name, crc32c(raw))
        return raw

    def _verify(self, entry: _Entry, name: str, actual: int) -> None:
        if actual != unmask(entry.crc32c):
            shard = data_filename(self.prefix, entry.shard_id, self.num_shards)
            raise DataLossError(f"tensor {name!r}: data checksum mismatch in {shard!r} (stored "
                                f"{unmask(entry.crc32c):#010x}, computed {actual:#010x}): the file is corrupted")

    def _read(self, entry: _Entry, name: str):
        numel = math.prod(entry.shape)
        if entry.dtype == _DT_STRING:
            return self._read_strings(entry, name, numel)
        dtype = self._torch_dtype(entry, name)
        itemsize = _DTYPES[entry.dtype][2]
        if entry.size != numel * itemsize:
            raise DataLossError(f"tensor {name!r}: entry size {entry.size} bytes, expected {numel * itemsize} for "
                                f"{_DTYPES[entry.dtype][0]} {entry.shape}")
        raw = self._raw(entry, name)
        if numel == 0:
            return torch.empty(entry.shape, dtype=dtype)
        if self._byteorder == ">" and itemsize > 1:
            width = itemsize // 2 if entry.dtype in (8, 18) else itemsize  # complex: swap each part
            raw = np.frombuffer(raw, dtype=f">u{width}").astype(f"<u{width}").tobytes()
        t = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(entry.shape)
        if dtype == torch.bool and bool((t.view(torch.uint8) > 1).any()):
            raise DataLossError(f"tensor {name!r}: bool tensor holds bytes other than 0 and 1")
        return t

    def _read_strings(self, entry: _Entry, name: str, numel: int):
        # The checksum covers the lengths as fixed-width integers (not their varint bytes), the masked
        # checksum of those lengths, then the string bytes.
        raw = self._raw(entry, name, verify=False)
        lengths, pos, crc = [], 0, 0
        for _ in range(numel):
            n, pos = read_varint(raw, pos, f"tensor {name!r}")
            lengths.append(n)
            crc = crc32c(n.to_bytes(4 if n <= 0xFFFFFFFF else 8, "little"), crc)
        if numel:
            if pos + 4 > len(raw) or unmask(int.from_bytes(raw[pos:pos + 4], "little")) != crc:
                raise DataLossError(f"tensor {name!r}: string length checksum mismatch: the file is corrupted")
            crc = crc32c(raw[pos:pos + 4], crc)
            pos += 4
        if len(raw) < pos + sum(lengths):
            raise DataLossError(f"tensor {name!r}: string data truncated")
        self._verify(entry, name, crc32c(raw[pos:], crc) if raw else 0)
        values = []
        for n in lengths:
            if pos + n > len(raw):
                raise DataLossError(f"tensor {name!r}: string data truncated")
            values.append(raw[pos:pos + n])
            pos += n
        if not entry.shape:
            return values[0]
        return np.array(values, dtype=object).reshape(entry.shape).tolist() if numel else \
            np.empty(entry.shape, dtype=object).tolist()


def load_checkpoint(path: Union[str, os.PathLike]) -> CheckpointReader:
    """A reader for the checkpoint at `path` (TF's `tf.train.load_checkpoint`)."""
    return CheckpointReader(path)


def list_variables(path: Union[str, os.PathLike]) -> List[Tuple[str, List[int]]]:
    """`[(name, shape)]` of every tensor in the checkpoint, sorted by name (TF's `tf.train.list_variables`)."""
    reader = CheckpointReader(path)
    return [(k, v) for k, v in reader.get_variable_to_shape_map().items()]
