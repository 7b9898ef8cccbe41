"""TensorFlow's immutable sorted table (`.index` files): LevelDB's table format, read-only.

A file is a sequence of blocks, each followed by a 5-byte trailer (compression type, masked CRC-32C of the
block and the type byte), then a 48-byte footer holding the block handles of the meta-index and the index
block and a magic number. Blocks hold prefix-compressed entries followed by restart offsets; the index
block maps separator keys to the handles of the data blocks. Blocks may be snappy-compressed (TF writes
them uncompressed, but its reader accepts both).
"""
from typing import Dict, List, Tuple

from ._crc32c import crc32c, unmask

_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48
_TRAILER_SIZE = 5
_NO_COMPRESSION, _SNAPPY = 0, 1


class DataLossError(RuntimeError):
    """A file is truncated or corrupted (TensorFlow raises `DataLossError` for the same files)."""


def read_varint(buf, pos: int, what: str, limit: int = None) -> Tuple[int, int]:
    """A base-128 varint at `buf[pos:]` -> (value, next position)."""
    end = len(buf) if limit is None else limit
    result = shift = 0
    while True:
        if pos >= end:
            raise DataLossError(f"{what}: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise DataLossError(f"{what}: varint longer than 10 bytes")


def snappy_decompress(data: bytes, what: str) -> bytes:
    """Snappy's raw block format (a varint length, then literals and back-references)."""
    size, pos = read_varint(data, 0, what)
    out = bytearray()
    n = len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            length = tag >> 2
            if length >= 60:
                nbytes = length - 59
                if pos + nbytes > n:
                    raise DataLossError(f"{what}: truncated snappy literal length")
                length = int.from_bytes(data[pos:pos + nbytes], "little")
                pos += nbytes
            length += 1
            if pos + length > n:
                raise DataLossError(f"{what}: truncated snappy literal")
            out += data[pos:pos + length]
            pos += length
            continue
        if kind == 1:
            if pos + 1 > n:
                raise DataLossError(f"{what}: truncated snappy copy")
            length = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            nbytes = 2 if kind == 2 else 4
            if pos + nbytes > n:
                raise DataLossError(f"{what}: truncated snappy copy")
            length = (tag >> 2) + 1
            offset = int.from_bytes(data[pos:pos + nbytes], "little")
            pos += nbytes
        if offset == 0 or offset > len(out):
            raise DataLossError(f"{what}: snappy copy offset {offset} outside the {len(out)} bytes decoded")
        for _ in range(length):  # copies may overlap their own output
            out.append(out[-offset])
        if len(out) > size:
            break
    if len(out) != size:
        raise DataLossError(f"{what}: snappy data decodes to {len(out)} bytes, its header says {size}")
    return bytes(out)


def _read_block(data: bytes, handle: Tuple[int, int], what: str) -> bytes:
    offset, size = handle
    if offset + size + _TRAILER_SIZE > len(data) - _FOOTER_SIZE:
        raise DataLossError(f"{what}: block [{offset}, {offset + size}) runs past the end of the file "
                            f"({len(data)} bytes): the file is truncated or corrupted")
    contents = data[offset:offset + size + 1]
    stored = int.from_bytes(data[offset + size + 1:offset + size + _TRAILER_SIZE], "little")
    if crc32c(contents) != unmask(stored):
        raise DataLossError(f"{what}: block checksum mismatch at offset {offset}: the file is corrupted")
    kind = contents[-1]
    if kind == _NO_COMPRESSION:
        return contents[:-1]
    if kind == _SNAPPY:
        return snappy_decompress(contents[:-1], what)
    raise DataLossError(f"{what}: unknown block compression type {kind} (expected 0 none or 1 snappy)")


def _block_entries(block: bytes, what: str) -> List[Tuple[bytes, bytes]]:
    if len(block) < 4:
        raise DataLossError(f"{what}: block of {len(block)} bytes is too short")
    num_restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 * (1 + num_restarts)
    if limit < 0:
        raise DataLossError(f"{what}: block claims {num_restarts} restart points in {len(block)} bytes")
    entries, pos, key = [], 0, b""
    while pos < limit:
        shared, pos = read_varint(block, pos, what, limit)
        unshared, pos = read_varint(block, pos, what, limit)
        value_len, pos = read_varint(block, pos, what, limit)
        if shared > len(key) or pos + unshared + value_len > limit:
            raise DataLossError(f"{what}: bad block entry at offset {pos}")
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        entries.append((key, block[pos:pos + value_len]))
        pos += value_len
    return entries


def _decode_handle(buf: bytes, pos: int, what: str) -> Tuple[Tuple[int, int], int]:
    offset, pos = read_varint(buf, pos, what)
    size, pos = read_varint(buf, pos, what)
    return (offset, size), pos


def read_table(data: bytes, what: str) -> Dict[bytes, bytes]:
    """All key -> value entries of a table file's contents, every block checksum verified."""
    if len(data) < _FOOTER_SIZE:
        raise DataLossError(f"{what}: {len(data)} bytes is too short for a TensorFlow table (footer is "
                            f"{_FOOTER_SIZE} bytes): the file is truncated or not a checkpoint index")
    footer = data[-_FOOTER_SIZE:]
    magic = int.from_bytes(footer[40:44], "little") | (int.from_bytes(footer[44:48], "little") << 32)
    if magic != _MAGIC:
        raise DataLossError(f"{what}: bad table magic number {magic:#x} (expected {_MAGIC:#x}): the file is "
                            f"truncated, corrupted or not a checkpoint index")
    meta_handle, pos = _decode_handle(footer, 0, what)
    index_handle, pos = _decode_handle(footer, pos, what)
    if pos > 40 or any(footer[pos:40]):  # TF pads the handles with zeros to 40 bytes
        raise DataLossError(f"{what}: corrupted table footer (its padding is not zero)")
    _block_entries(_read_block(data, meta_handle, what), what)  # TF stores no meta blocks; checked all the same
    out: Dict[bytes, bytes] = {}
    for _, handle_bytes in _block_entries(_read_block(data, index_handle, what), what):
        handle, _ = _decode_handle(handle_bytes, 0, what)
        for key, value in _block_entries(_read_block(data, handle, what), what):
            out[key] = value
    return out
