"""Comparing batches of numpy arrays exactly (the stream's own batches, before torch)."""

from __future__ import annotations

import numpy as np


def same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], np.ndarray):
                np.testing.assert_array_equal(x[key], y[key], err_msg=key)
            else:
                assert x[key] == y[key], key


def copies(stream) -> list[dict]:
    """The stream's batches, each array copied (a batch may view memory used again)."""
    return [
        {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in b.items()} for b in stream
    ]
