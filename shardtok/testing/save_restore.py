"""The one shared save/restore check every stateful stream node is tested with.

For each midpoint k: N items uninterrupted must equal k items, ``state_dict()``, a JSON round
trip, a freshly built node, ``reset(state)`` and the remaining N - k items (exact equality,
arrays compared with ``np.array_equal``). The state must also be small: JSON of bounded size.
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


def check_save_restore(
    make_node: Callable[[], Any],
    midpoints: Iterable[int] = DEFAULT_MIDPOINTS,
    total: int | None = None,
    max_state_bytes: int = 64 << 10,
) -> list:
    """Run the check; returns the uninterrupted items. `total` None = the whole (finite) stream.

    A negative midpoint counts from the end (-1: save just before the last item).
    """
    reference_node = make_node()
    reference_node.reset(None)
    reference = take(reference_node, total)
    n = len(reference)
    checked = 0
    for k in midpoints:
        k = n + k if k < 0 else k
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
        checked += 1
    assert checked, "no midpoint was inside the stream"
    return reference
