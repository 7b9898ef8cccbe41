"""torchops.tf's checkpoint reader on hand-made files (tests/tf_checkpoint_writer.py) and on files written
by TensorFlow (tests/data/, made by tools/tf_port/make_goldens.py); no TensorFlow needed."""
import os
import sys

import numpy as np
import pytest
import torch

import torchops.tf as ttf
from torchops.tf import _crc32c
from torchops.tf._table import DataLossError, snappy_decompress

sys.path.insert(0, os.path.dirname(__file__))
from tf_checkpoint_writer import entry_proto, field_varint, write_checkpoint  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")

ALL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
              torch.int64, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
              torch.complex128, torch.float8_e5m2, torch.float8_e4m3fn]


def _sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    return torch.randint(lo, 100, shape, generator=g).to(dtype)


def _same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 and a.dtype != torch.bool else a,
                       b.view(torch.uint8) if b.dtype.itemsize == 1 and b.dtype != torch.bool else b)


# -- crc32c -----------------------------------------------------------------------------------------------------

def test_crc32c_known_values_and_paths_agree(monkeypatch):
    monkeypatch.setattr(_crc32c, "_ROWS", 7)  # many batches of chunks
    assert _crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert _crc32c.crc32c(b"") == 0
    data = np.random.default_rng(0).integers(0, 256, 300_001, dtype=np.uint8).tobytes()
    whole = _crc32c._raw_numpy(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    assert whole == _crc32c._raw_python(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    assert _crc32c.crc32c(data[1000:], _crc32c.crc32c(data[:1000])) == whole
    for v in (0, 1, whole, 0xFFFFFFFF):
        assert _crc32c.unmask(_crc32c.mask(v)) == v
    assert _crc32c.mask(whole) != whole


# -- round trips of hand-made checkpoints --------------------------------------------------------------------------

@pytest.mark.parametrize("big_endian", [False, True])
def test_every_dtype_scalar_and_empty(tmp_path, big_endian):
    tensors = {}
    for i, dt in enumerate(ALL_DTYPES):
        name = str(dt).replace("torch.", "")
        tensors[f"{name}/matrix"] = _sample(dt, (3, 5), i)
        tensors[f"{name}/scalar"] = _sample(dt, (), i + 50)
        tensors[f"{name}/empty"] = _sample(dt, (0, 4), i)
    prefix = write_checkpoint(str(tmp_path / "ck"), tensors, big_endian=big_endian)
    r = ttf.load_checkpoint(prefix)
    assert r.keys() == sorted(tensors)
    shapes = r.get_variable_to_shape_map()
    dtypes = r.get_variable_to_dtype_map()
    for name, t in tensors.items():
        assert shapes[name] == list(t.shape)
        assert dtypes[name] == t.dtype
        _same(r.get_tensor(name), t)
    assert ttf.list_variables(prefix) == [(k, list(tensors[k].shape)) for k in sorted(tensors)]


def test_string_tensors(tmp_path):
    tensors = {"scalar": ((), [b"hello\x00\xff"]), "matrix": ((2, 2), [b"a", b"", b"\x00", b"xyz" * 100]),
               "empty": ((0,), [])}
    r = ttf.load_checkpoint(write_checkpoint(str(tmp_path / "ck"), tensors))
    assert r.get_tensor("scalar") == b"hello\x00\xff"
    assert r.get_tensor("matrix") == [[b"a", b""], [b"\x00", b"xyz" * 100]]
    assert r.get_tensor("empty") == []
    assert r.get_variable_to_dtype_map()["matrix"] is bytes


def test_partitioned_variables_are_merged(tmp_path):
    full = _sample(torch.float32, (7, 4), 3)
    rows = [(0, 3), (3, 2), (5, 2)]
    parts = [([(s, n), (0, None)], full[s:s + n]) for s, n in rows]
    grid = torch.arange(24, dtype=torch.int64).reshape(4, 6)
    grid_parts = [([(r, 2), (c, 3)], grid[r:r + 2, c:c + 3]) for r in (0, 2) for c in (0, 3)]
    big = _sample(torch.float64, (300, 2), 4)  # slice starts >= 64 need multi-byte ordered-code numbers
    big_parts = [([(0, 100), (0, None)], big[:100]), ([(100, 200), (0, None)], big[100:])]
    prefix = write_checkpoint(str(tmp_path / "ck"), {"plain": full}, num_shards=3,
                              partitioned={"rows": ([7, 4], parts), "grid": ([4, 6], grid_parts),
                                           "big": ([300, 2], big_parts)})
    r = ttf.load_checkpoint(prefix)
    assert r.keys() == ["big", "grid", "plain", "rows"]  # slice entries are internal
    _same(r.get_tensor("rows"), full)
    _same(r.get_tensor("grid"), grid)
    _same(r.get_tensor("big"), big)
    assert r.get_variable_to_shape_map()["grid"] == [4, 6]


def test_partitioned_variable_with_missing_or_overlapping_slices(tmp_path):
    full = torch.ones(4, 2)
    r = ttf.load_checkpoint(write_checkpoint(str(tmp_path / "a"), {}, partitioned={
        "v": ([4, 2], [([(0, 2), (0, None)], full[:2])])}))
    with pytest.raises(DataLossError, match="its 1 slices hold 4 elements, the tensor has 8"):
        r.get_tensor("v")
    r = ttf.load_checkpoint(write_checkpoint(str(tmp_path / "b"), {}, partitioned={
        "v": ([4, 2], [([(0, 3), (0, None)], torch.ones(3, 2)), ([(2, 1), (0, None)], full[2:3])])}))
    with pytest.raises(DataLossError, match="cover 6 of its 8 elements, some more than once"):
        r.get_tensor("v")
    r = ttf.load_checkpoint(write_checkpoint(str(tmp_path / "c"), {}, partitioned={
        "v": ([4, 2], [([(0, 2), (0, None)], torch.ones(2, 2)), ([(2, 2), (0, None)], torch.ones(2, 2).double())])}))
    with pytest.raises(DataLossError, match=r"has dtype enum 1 and shape \[2, 2\], expected 2 and \[2, 2\]"):
        r.get_tensor("v")


def test_many_shards_many_blocks_snappy(tmp_path):
    tensors = {f"layer_{i:03d}/kernel": _sample(torch.float32, (i % 5, 3), i) for i in range(150)}
    prefix = write_checkpoint(str(tmp_path / "ck"), tensors, num_shards=12, block_size=128, snappy=True)
    assert len([f for f in os.listdir(tmp_path) if ".data-" in f]) == 12
    r = ttf.load_checkpoint(prefix)
    assert r.num_shards == 12 and r.keys() == sorted(tensors)
    for name, t in tensors.items():
        _same(r.get_tensor(name), t)


def test_snappy_decoder_copies_and_errors():
    # literal "ab", then a 1-byte-offset copy of length 4 at offset 2 (overlapping its own output)
    assert snappy_decompress(bytes([6, (1 << 2), 0x61, 0x62, 0x01, 0x02]), "t") == b"ababab"
    # a 2-byte-offset copy of length 3 at offset 1
    assert snappy_decompress(bytes([4, 0, 0x61, (2 << 2) | 2, 1, 0]), "t") == b"aaaa"
    with pytest.raises(DataLossError, match="offset"):
        snappy_decompress(bytes([6, 0x01, 0x05]), "t")
    with pytest.raises(DataLossError, match="decodes to"):
        snappy_decompress(bytes([9, (1 << 2), 0x61, 0x62]), "t")


def test_path_forms(tmp_path):
    t = torch.arange(3.0)
    write_checkpoint(str(tmp_path / "train" / "model.ckpt-7"), {"v": t})
    (tmp_path / "train" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-7"\n'
                                                   'all_model_checkpoint_paths: "model.ckpt-7"\n')
    write_checkpoint(str(tmp_path / "saved" / "variables" / "variables"), {"v": t})
    (tmp_path / "saved" / "saved_model.pb").write_bytes(b"")
    for p in (tmp_path / "train", str(tmp_path / "train" / "model.ckpt-7"),
              str(tmp_path / "train" / "model.ckpt-7.index"),
              str(tmp_path / "train" / "model.ckpt-7.data-00000-of-00001"), tmp_path / "saved",
              tmp_path / "saved" / "variables"):
        _same(ttf.load_checkpoint(p).get_tensor("v"), t)
    with pytest.raises(ttf.NotFoundError, match="no checkpoint there"):
        ttf.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(ttf.NotFoundError, match="directory without"):
        ttf.load_checkpoint(tmp_path)


# -- bad files --------------------------------------------------------------------------------------------------

@pytest.fixture
def good(tmp_path):
    tensors = {"dense/kernel": _sample(torch.float32, (4, 3)), "dense/bias": _sample(torch.float32, (3,)),
               "step": torch.tensor(5, dtype=torch.int64)}
    return write_checkpoint(str(tmp_path / "ck"), tensors, num_shards=2), tensors


def test_unknown_name_lists_close_matches(good):
    prefix, _ = good
    r = ttf.load_checkpoint(prefix)
    with pytest.raises(ttf.NotFoundError, match=r"'dense/kernal' not found.*close matches: \['dense/kernel'"):
        r.get_tensor("dense/kernal")
    with pytest.raises(ttf.NotFoundError, match="no close match"):
        r.get_tensor("zzzzzzzzzzzzzzzz")
    with pytest.raises(TypeError, match="name must be a str"):
        r.get_tensor(3)


def test_missing_shard(good):
    prefix, _ = good
    os.remove(prefix + ".data-00001-of-00002")
    with pytest.raises(ttf.NotFoundError, match=r"data shard .*data-00001-of-00002' is missing"):
        ttf.load_checkpoint(prefix)


def test_missing_index(good):
    prefix, _ = good
    os.remove(prefix + ".index")
    with pytest.raises(ttf.NotFoundError):
        ttf.load_checkpoint(prefix)


@pytest.mark.parametrize("cut", [1, 10, 47, 60, 200])
def test_truncated_index(good, cut):
    prefix, _ = good
    data = open(prefix + ".index", "rb").read()
    with open(prefix + ".index", "wb") as f:
        f.write(data[:max(len(data) - cut, 0)])
    with pytest.raises(DataLossError, match="truncated|corrupted"):
        ttf.load_checkpoint(prefix)


def test_every_corrupted_index_byte_is_detected(good):
    prefix, _ = good
    data = bytearray(open(prefix + ".index", "rb").read())
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x10
        with open(prefix + ".index", "wb") as f:
            f.write(bad)
        with pytest.raises(DataLossError):
            ttf.load_checkpoint(prefix)


def test_truncated_and_corrupted_data(good):
    prefix, tensors = good
    shard = prefix + ".data-00000-of-00002"
    data = open(shard, "rb").read()
    with open(shard, "wb") as f:
        f.write(data[:-3])
    r = ttf.load_checkpoint(prefix)
    names = [n for n in r.keys() if r._entries[n].shard_id == 0]
    assert names
    with pytest.raises(DataLossError, match="truncated"):
        for n in names:
            r.get_tensor(n)
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 1
    with open(shard, "wb") as f:
        f.write(bad)
    r = ttf.load_checkpoint(prefix)
    with pytest.raises(DataLossError, match="checksum mismatch"):
        for n in names:
            r.get_tensor(n)


def test_string_checksum(tmp_path):
    prefix = write_checkpoint(str(tmp_path / "ck"), {"s": ((2,), [b"abc", b"de"])})
    shard = prefix + ".data-00000-of-00001"
    data = bytearray(open(shard, "rb").read())
    for i, what in ((0, "length checksum"), (len(data) - 1, "data checksum")):
        bad = bytearray(data)
        bad[i] ^= 2
        open(shard, "wb").write(bad)
        with pytest.raises(DataLossError, match=what):
            ttf.load_checkpoint(prefix).get_tensor("s")


def test_unsupported_dtype_and_bad_records(tmp_path):
    def qint8(key, entry):
        return entry_proto(11, [2]) if key == b"q" else entry
    prefix = write_checkpoint(str(tmp_path / "a"), {"q": torch.zeros(2, dtype=torch.int8)}, entry_hook=qint8)
    r = ttf.load_checkpoint(prefix)
    assert r.get_variable_to_dtype_map()["q"] == "qint8"
    with pytest.raises(NotImplementedError, match="dtype qint8"):
        r.get_tensor("q")

    def wrong_size(key, entry):
        return entry + field_varint(5, 999) if key == b"v" else entry
    r = ttf.load_checkpoint(write_checkpoint(str(tmp_path / "b"), {"v": torch.zeros(2)}, entry_hook=wrong_size))
    with pytest.raises(DataLossError, match="entry size 999 bytes, expected 8"):
        r.get_tensor("v")
    with pytest.raises(DataLossError, match="no bundle header"):
        ttf.load_checkpoint(write_checkpoint(str(tmp_path / "c"), {"v": torch.zeros(2)}, header=False))
    with pytest.raises(DataLossError, match="needs a reader of version >= 5"):
        ttf.load_checkpoint(write_checkpoint(str(tmp_path / "d"), {"v": torch.zeros(2)}, version=(7, 5)))
    bad_bool = write_checkpoint(str(tmp_path / "e"), {"b": torch.tensor([2, 0], dtype=torch.uint8)},
                                entry_hook=lambda k, e: e.replace(field_varint(1, 4), field_varint(1, 10), 1))
    with pytest.raises(DataLossError, match="bool tensor"):
        ttf.load_checkpoint(bad_bool).get_tensor("b")


# -- files written by TensorFlow ----------------------------------------------------------------------------------

def test_tensorflow_written_checkpoints():
    ref = np.load(os.path.join(DATA, "tf_checkpoint_values.npz"))
    # TF 2.x object-based checkpoint with every dtype; the expected values were read back by TensorFlow
    r = ttf.load_checkpoint(os.path.join(DATA, "tf2_dtypes", "ckpt"))
    for key in ref.files:
        if not key.startswith("tf2/"):
            continue
        name = key[len("tf2/"):].replace("|", "/")
        got = r.get_tensor(name)
        want = ref[key]
        if got.dtype == torch.bfloat16:
            got = got.float()
        assert list(got.shape) == list(want.shape), name
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)
    assert r.get_tensor("string/.ATTRIBUTES/VARIABLE_VALUE") == [[b"ab", b""], [b"\x00\xff", b"xyz"]]
    assert isinstance(r.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"), bytes)
    # TF 1.x Saver, sharded, with a partitioned variable, found through the directory's `checkpoint` file
    r = ttf.load_checkpoint(os.path.join(DATA, "tf1_partitioned"))
    np.testing.assert_array_equal(r.get_tensor("part").numpy(), ref["tf1/part"])
    assert ttf.list_variables(os.path.join(DATA, "tf1_partitioned")) == [("global_step", []), ("part", [10, 3]),
                                                                          ("w", [2])]
    # a TF 2.x SavedModel directory: its variables/ bundle
    r = ttf.load_checkpoint(os.path.join(DATA, "saved_model"))
    for name in ("kernel/.ATTRIBUTES/VARIABLE_VALUE", "bias/.ATTRIBUTES/VARIABLE_VALUE"):
        want = ref["saved_model/" + name.replace("/", "|")]
        got = r.get_tensor(name)
        assert got.dtype == {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float64}[want.dtype]
        np.testing.assert_array_equal(got.numpy(), want)


@pytest.mark.slow
def test_the_readers_do_not_import_tensorflow():
    import subprocess
    code = ("import sys, os, torchops.tf as t; "
            f"t.load_checkpoint({os.path.join(DATA, 'tf1_partitioned')!r}).get_tensor('part'); "
            "import torchops.tf.keras; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'tensorflow imported'")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300)


def test_mangled_records_give_clear_errors_only(tmp_path):
    """Index records mangled at random (with valid block checksums, so the decoding itself is exercised) and
    random bytes in the decoders raise DataLossError / NotFoundError / NotImplementedError, nothing else."""
    import random
    from torchops.tf._table import _block_entries
    from torchops.tf.checkpoint import _parse_message
    allowed = (DataLossError, ttf.NotFoundError, NotImplementedError)
    rng = random.Random(0)
    tensors = {"a": torch.arange(6.0).reshape(2, 3), "s": ((2,), [b"xy", b"z"]), "h": torch.ones(3).half()}
    part = {"p": ([4, 2], [([(0, 2), (0, None)], torch.ones(2, 2)), ([(2, 2), (0, None)], torch.zeros(2, 2))])}

    def mangle(key, entry):
        entry = bytearray(entry)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(entry))
            entry[i:i + 1] = [b"", bytes([rng.randrange(256)]), bytes([entry[i], rng.randrange(256)])][rng.randrange(3)]
        return bytes(entry)

    for it in range(150):
        prefix = write_checkpoint(str(tmp_path / f"{it % 3}" / "ck"), tensors, partitioned=part, entry_hook=mangle)
        try:
            r = ttf.load_checkpoint(prefix)
        except allowed:
            continue
        r.get_variable_to_dtype_map()
        for k in r.keys():
            try:
                r.get_tensor(k)
            except allowed:
                pass
    for _ in range(2000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(0, 40)))
        for decode in (_block_entries, snappy_decompress, _parse_message):
            try:
                decode(junk, "junk")
            except DataLossError:
                pass
