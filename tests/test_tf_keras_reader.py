"""torchops.tf.load_keras_weights on Keras files written by Keras (tests/data/, tools/tf_port/make_goldens.py)
and on hand-made HDF5 files (nested models, split attributes, damaged files); no TensorFlow or Keras needed."""
import os
import zipfile

import h5py
import numpy as np
import pytest

import torchops.tf as ttf

DATA = os.path.join(os.path.dirname(__file__), "data")
FILES = ["keras_model.h5", "keras_weights.h5", "keras_model.keras"]


@pytest.mark.parametrize("name", FILES)
def test_keras_written_files_give_get_weights(name):
    ref = np.load(os.path.join(DATA, "keras_model.npz"))
    w = ttf.load_keras_weights(os.path.join(DATA, name))
    assert list(w) == ["conv", "bn", "bilstm", "gru_after", "gru_before"]
    expected = {}
    for key in ref.files:
        if key.startswith("weights/"):
            _, layer, i = key.split("/")
            expected.setdefault(layer, {})[int(i)] = ref[key]
    assert set(expected) == set(w)
    for layer, tensors in w.items():
        assert len(tensors) == len(expected[layer]), layer
        for i, t in enumerate(tensors):
            np.testing.assert_array_equal(t.numpy(), expected[layer][i], err_msg=f"{layer}[{i}]")
    with pytest.raises(ttf.NotFoundError, match=r"'gru_befor' has no weights.*close matches: \['gru_before'"):
        w["gru_befor"]


@pytest.mark.parametrize("name", ["keras3_nested.keras", "keras3_nested.h5", "keras3_nested.weights.h5",
                                  "tfkeras_nested.h5"])
def test_keras_written_nested_models_are_flattened(name):
    ref = np.load(os.path.join(DATA, "keras_nested.npz"))
    ref = [ref[f"arr_{i}"] for i in range(len(ref.files))]  # model.get_weights()
    w = ttf.load_keras_weights(os.path.join(DATA, name))
    assert {k: len(v) for k, v in w.items()} == {"bi": 6, "inner_dense": 2, "inner_dense2": 2}
    flat = [t.numpy() for v in w.values() for t in v]
    assert len(flat) == len(ref)
    for got, want in zip(flat, ref):
        np.testing.assert_array_equal(got, want)


def test_nested_model_and_split_attributes(tmp_path):
    p = tmp_path / "w.h5"
    k = np.arange(6, dtype=np.float32).reshape(2, 3)
    with h5py.File(p, "w") as f:
        f.attrs["layer_names0"] = [b"dense_0"]  # Keras splits long attributes into numbered chunks
        f.attrs["layer_names1"] = [b"inner_model"]
        g = f.create_group("dense_0")
        g.attrs["weight_names"] = [b"dense_0/kernel:0"]
        g["dense_0/kernel:0"] = k
        g = f.create_group("inner_model")
        g.attrs["weight_names"] = [b"a/kernel:0", b"a/bias:0", b"b/kernel:0"]
        g["a/kernel:0"] = k
        g["a/bias:0"] = np.ones(3, np.float64)
        g["b/kernel:0"] = k.T
    w = ttf.load_keras_weights(p)
    assert list(w) == ["dense_0", "a", "b"]
    np.testing.assert_array_equal(w["b"][0].numpy(), k.T)
    assert w["a"][1].dtype.is_floating_point and w["a"][1].shape == (3,)


def test_keras3_nested_and_bidirectional_order(tmp_path):
    p = tmp_path / "m.weights.h5"
    with h5py.File(p, "w") as f:
        bi = f.create_group("layers/bidirectional")
        bi.create_group("vars").attrs["name"] = "bi"
        for i, d in enumerate(("backward_layer", "forward_layer")):  # stored alphabetically
            bi[f"{d}/cell/vars/0"] = np.full(2, i, np.float32)
        inner = f.create_group("layers/functional/layers/dense")
        inner.create_group("vars").attrs["name"] = "inner_dense"
        for i in range(11):
            inner[f"vars/{i}"] = np.full(1, i, np.float32)  # numeric, not lexicographic, order
    w = ttf.load_keras_weights(p)
    assert [float(t[0]) for t in w["bi"]] == [1.0, 0.0]  # forward first, as get_weights
    assert [float(t[0]) for t in w["inner_dense"]] == list(range(11))


def test_bad_files(tmp_path):
    with pytest.raises(ttf.NotFoundError, match="does not exist"):
        ttf.load_keras_weights(tmp_path / "missing.h5")
    (tmp_path / "text.h5").write_text("not weights")
    with pytest.raises(ttf.DataLossError, match="neither an HDF5 file nor a .keras archive"):
        ttf.load_keras_weights(tmp_path / "text.h5")
    good = open(os.path.join(DATA, "keras_weights.h5"), "rb").read()
    (tmp_path / "cut.h5").write_bytes(good[:len(good) // 2])
    with pytest.raises(ttf.DataLossError):
        ttf.load_keras_weights(tmp_path / "cut.h5")
    with h5py.File(tmp_path / "empty.h5", "w") as f:
        f["x"] = np.zeros(2)
    with pytest.raises(ttf.DataLossError, match="without Keras weights"):
        ttf.load_keras_weights(tmp_path / "empty.h5")
    with h5py.File(tmp_path / "missing_weight.h5", "w") as f:
        f.attrs["layer_names"] = [b"d"]
        f.create_group("d").attrs["weight_names"] = [b"d/kernel:0"]
    with pytest.raises(ttf.DataLossError, match="weight 'd/kernel:0' of layer 'd' is missing"):
        ttf.load_keras_weights(tmp_path / "missing_weight.h5")
    with h5py.File(tmp_path / "strings.h5", "w") as f:
        f.attrs["layer_names"] = [b"d"]
        g = f.create_group("d")
        g.attrs["weight_names"] = [b"d/kernel:0"]
        g["d/kernel:0"] = np.array([b"x"])
    with pytest.raises(NotImplementedError, match="not a numeric weight"):
        ttf.load_keras_weights(tmp_path / "strings.h5")


def test_bad_keras_archives(tmp_path):
    with zipfile.ZipFile(tmp_path / "noweights.keras", "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(ttf.DataLossError, match="without model.weights.h5"):
        ttf.load_keras_weights(tmp_path / "noweights.keras")
    data = bytearray(open(os.path.join(DATA, "keras_model.keras"), "rb").read())
    with zipfile.ZipFile(os.path.join(DATA, "keras_model.keras")) as z:
        info = z.getinfo("model.weights.h5")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    (tmp_path / "corrupt.keras").write_bytes(bytes(data))
    with pytest.raises(ttf.DataLossError):
        ttf.load_keras_weights(tmp_path / "corrupt.keras")
    (tmp_path / "cut.keras").write_bytes(bytes(data[:len(data) // 3]))
    with pytest.raises(ttf.DataLossError, match="damaged .keras archive"):
        ttf.load_keras_weights(tmp_path / "cut.keras")
