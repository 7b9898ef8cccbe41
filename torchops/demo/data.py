"""Data: scikit-learn's bundled 8x8 handwritten digits (1797 images, shipped inside the wheel, no download),
split train/test with a fixed seed, and sharded across workers."""
from typing import List, Tuple

import torch
from torch import Tensor

Split = Tuple[Tensor, Tensor]


def require_sklearn():
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError as e:
        raise SystemExit("torchops.demo needs scikit-learn for its bundled digits dataset: "
                         "pip install -r requirements-demo.txt") from e


def load_digits(seed: int = 0, test_fraction: float = 0.2) -> Tuple[Split, Split]:
    """((x_train, y_train), (x_test, y_test)); x is float32 [N, 1, 8, 8] in [0, 1], y int64 [N]."""
    require_sklearn()
    from sklearn.datasets import load_digits as sk_digits

    data = sk_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def shards(train: Split, num_shards: int) -> List[Split]:
    """Worker k gets every num_shards-th image starting at k (disjoint, sizes differ by at most one)."""
    x, y = train
    return [(x[k::num_shards].clone(), y[k::num_shards].clone()) for k in range(num_shards)]
