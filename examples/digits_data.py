"""The fixed split of scikit-learn's bundled handwritten digits used by the ``digits`` example.

The build script trains on :func:`load_split`'s training part; the demo and the tests score the
served model on :func:`load_holdout`, which recomputes the same 360 held-out rows every time.
Pixels are raw 0..16 grey levels as float32: the exported model scales them itself.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

HOLDOUT_SIZE = 360
SPLIT_SEED = 0
N_FEATURES = 64
N_CLASSES = 10


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, x_holdout, y_train, y_holdout)``: float32 [n, 64] pixels, int64 labels."""
    x, y = load_digits(return_X_y=True)
    x_train, x_holdout, y_train, y_holdout = train_test_split(
        x.astype(np.float32),
        y.astype(np.int64),
        test_size=HOLDOUT_SIZE,
        random_state=SPLIT_SEED,
        stratify=y,
    )
    return x_train, x_holdout, y_train, y_holdout


def load_holdout() -> tuple[np.ndarray, np.ndarray]:
    """The 360 held-out digits: ``x`` float32 [360, 64] (0..16), ``y`` int64 [360]."""
    _, x_holdout, _, y_holdout = load_split()
    return x_holdout, y_holdout
