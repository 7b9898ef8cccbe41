"""Porting TensorFlow and Keras models without TensorFlow: file readers and loaders into torchops modules.

* `list_variables(path)`, `load_checkpoint(path)`: TF checkpoints (TF 1.x `Saver`, TF 2.x `tf.train.Checkpoint`,
  SavedModel `variables/`), as `tf.train.list_variables` / `tf.train.load_checkpoint`.
* `load_keras_weights(path)`: Keras `.h5` (whole model or `save_weights`) and Keras 3 `.keras` files, as
  `{layer_name: layer.get_weights()}`.
* The `load_*` / `*_weights` converters between these tensors and the torchops modules (`torchops.tf.convert`).

Nothing read from a file is unpickled or executed. See docs/porting.md.
"""
from ._table import DataLossError
from .checkpoint import CheckpointReader, NotFoundError, list_variables, load_checkpoint
from .keras import KerasWeights, load_keras_weights
from . import convert  # noqa: E402,F401

__all__ = ["CheckpointReader", "DataLossError", "KerasWeights", "NotFoundError", "list_variables", "load_checkpoint",
           "load_keras_weights"]
