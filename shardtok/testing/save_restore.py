"""The one shared save/restore check every stateful stream node, dataset and loader is tested with.

For each midpoint k: N items uninterrupted must equal k items, ``state_dict()``, a JSON round
trip, a freshly built node, ``reset(state)`` and the remaining N - k items (exact equality,
arrays compared with ``np.array_equal``). The state must also be small: JSON of bounded size.
A restore at the very end of the stream (k = N) is always checked, and so is what comes after:
the restored object's next epoch (``next_epoch``) must equal the uninterrupted one's.

Datasets and loaders (an iterator per epoch, ``state_dict``/``load_state_dict``, ``set_epoch``)
take part through ``EpochRunner``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from shardtok.stream.nodes.base import take
from shardtok.stream.sequence import PackedSequence

DEFAULT_MIDPOINTS = (0, 1, 2, 7, 16, 33, -2, -1)


def assert_items_equal(a: Any, b: Any, where: str = "item") -> None:
    """Deep exact equality for arrays, packed sequences, dicts, lists and scalars."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        assert a_arr.dtype == b_arr.dtype, f"{where}: dtype {a_arr.dtype} != {b_arr.dtype}"
        assert np.array_equal(a_arr, b_arr), f"{where}: arrays differ"
    elif isinstance(a, PackedSequence):
        assert isinstance(b, PackedSequence), f"{where}: {type(b)} is not a PackedSequence"
        assert_items_equal(a.tokens, b.tokens, where + ".tokens")
        assert a.starts == b.starts, f"{where}: starts {a.starts} != {b.starts}"
        assert a.length == b.length, f"{where}: length {a.length} != {b.length}"
        assert (a.mask is None) == (b.mask is None), f"{where}: a mask on one side only"
        if a.mask is not None:
            assert_items_equal(a.mask, b.mask, where + ".mask")
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b), f"{where}: keys differ"
        for key in a:
            assert_items_equal(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_items_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def restart_epoch(node: Any) -> None:
    """A node's next epoch: nodes take their epoch at construction, so it is the same one."""
    node.reset(None)


def check_save_restore(
    make_node: Callable[[], Any],
    midpoints: Iterable[int] = DEFAULT_MIDPOINTS,
    total: int | None = None,
    max_state_bytes: int = 64 << 10,
    next_epoch: Callable[[Any], None] | None = restart_epoch,
    next_epoch_items: int = 8,
) -> list:
    """Run the check; returns the uninterrupted items. `total` None = the whole (finite) stream.

    A negative midpoint counts from the end (-1: save just before the last item); the end
    itself is always checked. For a finite stream, `next_epoch` (None: skip) moves an exhausted
    node to its next epoch, whose first `next_epoch_items` items must match the uninterrupted
    node's after every restore.
    """
    reference_node = make_node()
    reference_node.reset(None)
    reference = take(reference_node, total)
    n = len(reference)
    follow = next_epoch is not None and total is None
    if follow:
        assert take(reference_node, 1) == []
        next_epoch(reference_node)  # type: ignore[misc]
        following = take(reference_node, next_epoch_items)
    checked = 0
    points = sorted({n + k if k < 0 else k for k in midpoints} | {n})
    for k in points:
        if not 0 <= k <= n:
            continue
        node = make_node()
        node.reset(None)
        first = take(node, k)
        state_json = json.dumps(node.state_dict())
        assert len(state_json) <= max_state_bytes, f"state after {k} items: {len(state_json)} bytes"
        fresh = make_node()
        fresh.reset(json.loads(state_json))
        rest = take(fresh, n - k)
        assert len(first) + len(rest) == n, f"midpoint {k}: {len(first)} + {len(rest)} != {n}"
        if total is None:  # a finite stream must also end at the same place
            assert take(fresh, 1) == [], f"midpoint {k}: restored stream runs past the end"
        assert_items_equal(first + rest, reference, f"midpoint {k}")
        if follow:
            next_epoch(fresh)  # type: ignore[misc]
            after = take(fresh, next_epoch_items)
            assert_items_equal(after, following, f"midpoint {k}, next epoch")
        checked += 1
    assert checked, "no midpoint was inside the stream"
    return reference


class EpochRunner:
    """A dataset or loader seen as a node: ``reset(state)`` loads `state` (None: a fresh start)
    and begins an epoch, iteration yields its batches as numpy copies (a loader may reuse a
    batch's memory once the next one is taken), ``state_dict()`` is the object's own, and
    ``next_epoch()`` sets the following epoch and begins it."""

    def __init__(self, obj: Any, dataset: Any = None):
        self.obj = obj
        self.dataset = obj if dataset is None else dataset  # what set_epoch is called on
        self._it: Any = None

    def reset(self, state: dict | None) -> None:
        if state is not None:
            self.obj.load_state_dict(state)
        self._it = iter(self.obj)

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._it is None:
            self.reset(None)
        batch = next(self._it)
        return {k: np.array(_as_numpy(v), copy=True) for k, v in batch.items()}

    def state_dict(self) -> dict:
        return self.obj.state_dict()

    def next_epoch(self) -> None:
        self.dataset.set_epoch(self.dataset.epoch + 1)
        self._it = iter(self.obj)


def _as_numpy(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") else value
