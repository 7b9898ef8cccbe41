"""Keras weight files without Keras: `load_keras_weights(path) -> {layer_name: layer.get_weights()}`.

Reads, with h5py, Keras 2 / tf.keras HDF5 files (`model.save("m.h5")`, `model.save_weights("w.h5")`, Keras 3's
legacy `.h5`) and Keras 3 `.keras` archives (a zip holding `config.json` and `model.weights.h5`) or their
`.weights.h5` files. Only datasets are read: nothing is unpickled, and a config naming Lambda layers or custom
objects is never evaluated (config.json is parsed as JSON only, for the layer order).
"""
import io
import json
import os
import re
import zipfile
from typing import Dict, List, Union

import numpy as np
import torch

from ._table import DataLossError
from .checkpoint import NotFoundError, close_matches

__all__ = ["load_keras_weights", "KerasWeights"]


class KerasWeights(dict):
    """`{layer_name: [torch.Tensor, ...]}` in the model's layer order; a missing name lists close matches."""

    def __missing__(self, name):
        raise NotFoundError(close_matches(name, self.keys(), f"layer {name!r} has no weights in this file"))


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - h5py is a test requirement
        raise ImportError("torchops.tf.load_keras_weights needs h5py (pip install h5py)") from e
    return h5py


def _attr_list(group, name: str) -> List[str]:
    """A string-list attribute, also when Keras split a large one into `name0`, `name1`, ..."""
    if name in group.attrs:
        values = group.attrs[name]
    elif f"{name}0" in group.attrs:
        values, i = [], 0
        while f"{name}{i}" in group.attrs:
            values.extend(group.attrs[f"{name}{i}"])
            i += 1
    else:
        return None
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.asarray(values).reshape(-1)]


def _tensor(dataset, what: str) -> torch.Tensor:
    try:
        a = np.asarray(dataset[()])
    except Exception as e:  # h5py raises OSError/KeyError subclasses on damaged files
        raise DataLossError(f"{what}: cannot read the dataset ({e}): the file is truncated or corrupted") from e
    if a.dtype.kind not in "biufc":
        raise NotImplementedError(f"{what}: dataset of dtype {a.dtype} is not a numeric weight")
    return torch.from_numpy(np.ascontiguousarray(a))


def _nested_models(f) -> Dict[str, set]:
    """{nested model name: names of its layers} from a whole-model file's `model_config` (JSON, never evaluated)."""
    raw = f.attrs.get("model_config")
    if raw is None:
        return {}
    try:
        config = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except ValueError:
        return {}
    layers = config.get("config", {}).get("layers", []) if isinstance(config, dict) and \
        isinstance(config.get("config"), dict) else []
    return {layer["config"]["name"]: set(_config_order(layer)) for layer in layers
            if isinstance(layer, dict) and isinstance(layer.get("config"), dict)
            and isinstance(layer["config"].get("layers"), list) and isinstance(layer["config"].get("name"), str)}


def _legacy_h5(f, what: str) -> KerasWeights:
    """Keras 2 / tf.keras layout: `layer_names` on the weights group, `weight_names` on each layer's group."""
    root = f["model_weights"] if "model_weights" in f and _attr_list(f, "layer_names") is None else f
    layer_names = _attr_list(root, "layer_names")
    nested = _nested_models(f)
    out = KerasWeights()
    for layer in layer_names:
        if layer not in root:
            raise DataLossError(f"{what}: layer group {layer!r} listed in layer_names is missing")
        g = root[layer]
        names = _attr_list(g, "weight_names") or []
        tensors = []
        for n in names:
            if n not in g:
                raise DataLossError(f"{what}: weight {n!r} of layer {layer!r} is missing")
            tensors.append((n, _tensor(g[n], f"{what}: {layer}/{n}")))
        if not tensors:
            continue
        if layer in nested:  # a nested model: flatten to its layers, the first of its names' parts that is one
            for n, t in tensors:
                inner = next((part for part in n.split("/") if part in nested[layer]), n.split("/")[0])
                out.setdefault(inner, []).append(t)
        elif all(n.startswith(layer + "/") for n, _ in tensors):
            out[layer] = [t for _, t in tensors]
        else:  # save_weights of a nested model (no config): its weights carry its layers' names
            for n, t in tensors:
                out.setdefault(n.split("/")[0], []).append(t)
    return out


def _child_order(names: List[str]) -> List[str]:
    """Keras 3 saves a layer's sub-objects by attribute; get_weights lists a Bidirectional's forward layer first."""
    first = [n for n in ("forward_layer", "backward_layer") if n in names]
    return first + sorted((n for n in names if n not in first and n != "vars"), key=_natural)


def _natural(s: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def _collect(g, what: str) -> List[torch.Tensor]:
    tensors = []
    if "vars" in g:
        v = g["vars"]
        for k in sorted(v.keys(), key=int):
            tensors.append(_tensor(v[k], f"{what}/vars/{k}"))
    for child in _child_order(list(g.keys())):
        if child == "layers":
            continue
        tensors += _collect(g[child], f"{what}/{child}")
    return tensors


def _keras3_layers(layers_group, what: str, out: KerasWeights) -> None:
    for key in layers_group.keys():
        g = layers_group[key]
        if "layers" in g:  # a nested model: flatten to its layers' names
            _keras3_layers(g["layers"], f"{what}/{key}", out)
        name = key
        if "vars" in g and "name" in g["vars"].attrs:
            name = g["vars"].attrs["name"]
            name = name.decode() if isinstance(name, bytes) else str(name)
        tensors = _collect(g, f"{what}/{key}")
        if tensors:
            out[name] = tensors


def _config_order(config: dict) -> List[str]:
    names = []
    for layer in config.get("config", {}).get("layers", []) if isinstance(config.get("config"), dict) else []:
        cfg = layer.get("config", {})
        names.append(cfg.get("name"))
        if isinstance(cfg.get("layers"), list):
            names += _config_order(layer)
    return [n for n in names if isinstance(n, str)]


def _keras3_h5(f, what: str, config=None) -> KerasWeights:
    out = KerasWeights()
    if "layers" in f:
        _keras3_layers(f["layers"], what, out)
    if config:
        order = {n: i for i, n in enumerate(_config_order(config))}
        out = KerasWeights(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))
    return out


def _read_h5(source, what: str, config=None) -> KerasWeights:
    h5py = _h5py()
    try:
        f = h5py.File(source, "r")
    except OSError as e:
        raise DataLossError(f"{what}: not a readable HDF5 file ({e}): truncated, corrupted or not Keras weights") from e
    with f:
        try:
            if _attr_list(f, "layer_names") is not None or (
                    "model_weights" in f and _attr_list(f["model_weights"], "layer_names") is not None):
                return _legacy_h5(f, what)
            if "layers" in f or "vars" in f:
                return _keras3_h5(f, what, config)
        except (KeyError, OSError, RuntimeError) as e:
            if isinstance(e, (DataLossError, NotImplementedError)):
                raise
            raise DataLossError(f"{what}: damaged Keras weights file ({e})") from e
    raise DataLossError(f"{what}: HDF5 file without Keras weights (no layer_names attribute, no layers group)")


def load_keras_weights(path: Union[str, os.PathLike]) -> KerasWeights:
    """`{layer_name: [torch.Tensor, ...]}` with each list in `layer.get_weights()` order (a Bidirectional's
    forward weights, then its backward ones; a nested model's layers under their own names), in the model's
    layer order. Layers without weights are left out. `.h5` (Keras 2, tf.keras, Keras 3 legacy), `.weights.h5`
    and `.keras` files; the whole file is read and checked before anything is returned."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise NotFoundError(f"Keras weights file {path!r} does not exist")
    with open(path, "rb") as fh:
        magic = fh.read(8)
    if magic.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
                if "model.weights.h5" not in names:
                    raise DataLossError(f"{path}: .keras archive without model.weights.h5 (it holds {names})")
                config = None
                if "config.json" in names:
                    try:
                        config = json.loads(z.read("config.json"))
                    except ValueError as e:
                        raise DataLossError(f"{path}: config.json is not valid JSON ({e})") from e
                data = z.read("model.weights.h5")  # zipfile checks each member's CRC-32
        except zipfile.BadZipFile as e:
            raise DataLossError(f"{path}: damaged .keras archive ({e})") from e
        return _read_h5(io.BytesIO(data), f"{path}:model.weights.h5", config if isinstance(config, dict) else None)
    if magic != b"\x89HDF\r\n\x1a\n":
        raise DataLossError(f"{path}: neither an HDF5 file nor a .keras archive (starts with {magic!r})")
    return _read_h5(path, path)
