import pytest
import torch

import torchops  # noqa: F401  (loads the library once for every test module)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def pytest_collection_modifyitems(config, items):
    # Tests parametrized with device "cuda" only exist when a GPU is present (see DEVICES); tests
    # marked `cuda` need one explicitly.
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)
