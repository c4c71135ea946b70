"""A bounded shuffle buffer with exact, token-free resume: a jittered sort of document ordinals.

Document ``i`` of the upstream (its position in the slice) gets the key ``i + W * u_i`` with
``u_i`` uniform in [0, 1) drawn from ``default_rng((*seed, i // KEY_BLOCK))``; documents are
emitted in key order. Since ``i <= key_i < i + W``, document ``i`` can be emitted as soon as
ordinal ``key_i`` has been read, so at most about ``W`` documents are ever held, and every
document moves at most ``W`` places from where it was read. (A classic random-replacement buffer
can hold a document arbitrarily long, so its state depends on the whole history.)

The output is a pure function of the ordinals, so a saved position is just the number of
documents emitted, ``k``, plus where to re-read from:

* after ``k`` emissions, every ordinal below ``k - W`` has been emitted (its key is below
  ``k - 1``, and at most ``k - 1`` ordinals have smaller keys), and no ordinal from ``k + W``
  on has been;
* so restoring re-reads ordinals ``[b, k + W)`` from a checkpoint ``b <= k - W`` (the upstream
  state saved when ordinal ``b`` was read, every ``spacing`` ordinals), sorts their keys, drops
  the ``k - b`` smallest (already emitted) and buffers the rest.

Restoring costs reading at most ``2 W + spacing`` documents; the state is four integers and the
upstream's own small state.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from shardtok.stream.node import HISTORY, DocumentNode

KEY_BLOCK = 4096
MIN_CHECKPOINT_SPACING = 1024


class ShuffleBuffer(DocumentNode):
    """Shuffles documents within a window of `window` documents (0 is not allowed here:
    leave the node out to disable shuffling)."""

    def __init__(self, upstream: DocumentNode, window: int, seed: Sequence[int]):
        super().__init__()
        if window < 1:
            raise ValueError(f"shuffle window must be at least 1, got {window}")
        self.upstream = upstream
        self.window = int(window)
        self.seed = tuple(int(s) for s in seed)
        self.spacing = max(self.window, MIN_CHECKPOINT_SPACING)
        self._heap: list[tuple[float, int, np.ndarray]] = []
        self._checkpoints: dict[int, dict] = {}
        self._key_block = -1
        self._key_values = np.empty(0)
        self._exhausted = False
        self.position = 0

    # -- keys ---------------------------------------------------------------------------
    def _key(self, ordinal: int) -> float:
        block, at = divmod(ordinal, KEY_BLOCK)
        if block != self._key_block:
            rng = np.random.default_rng((*self.seed, block))
            self._key_values = (rng.random(KEY_BLOCK) * self.window).tolist()
            self._key_block = block
        return ordinal + self._key_values[at]

    # -- reading ------------------------------------------------------------------------
    def _read_one(self) -> tuple[float, int, np.ndarray] | None:
        upstream = self.upstream
        ordinal = upstream.position
        if ordinal % self.spacing == 0 and ordinal not in self._checkpoints:
            self._checkpoints[ordinal] = upstream.state_at(ordinal)
            self._prune(ordinal)
        try:
            doc = next(upstream)
        except StopIteration:
            self._exhausted = True
            return None
        return (self._key(ordinal), ordinal, doc)

    def _prune(self, ordinal: int) -> None:
        horizon = ordinal - HISTORY - 2 * self.window - 2 * self.spacing
        for old in [c for c in self._checkpoints if c < horizon]:
            del self._checkpoints[old]

    def _next(self) -> np.ndarray:
        heap = self._heap
        while not self._exhausted and (not heap or heap[0][0] >= self.upstream.position):
            entry = self._read_one()
            if entry is not None:
                heapq.heappush(heap, entry)
        if not heap:
            raise StopIteration
        self.position += 1
        return heapq.heappop(heap)[2]

    # -- state --------------------------------------------------------------------------
    def _checkpoint_for(self, position: int) -> int:
        return max(0, (position - self.window) // self.spacing * self.spacing)

    def state_at(self, position: int) -> dict:
        if not self._started:
            self.reset(None)
        if position > self.position:
            raise ValueError(f"position {position} is ahead of the stream ({self.position})")
        base = self._checkpoint_for(position)
        if base not in self._checkpoints:
            raise ValueError(
                f"shuffle buffer cannot describe position {position}: it is more than "
                f"{HISTORY} documents back or before the point this stream was restored to"
            )
        return {"position": position, "read_from": base, "upstream": self._checkpoints[base]}

    def _reset(self, state: dict | None) -> None:
        self._heap = []
        self._checkpoints = {}
        self._exhausted = False
        if state is None:
            self.upstream.reset(None)
            self.position = start = self.upstream.position  # ordinals are upstream positions
            self._checkpoints[start] = self.upstream.state_at(start)
            return
        position, base = int(state["position"]), int(state["read_from"])
        self.upstream.reset(state["upstream"])
        if self.upstream.position != base:
            raise ValueError(
                f"upstream restored to {self.upstream.position}, shuffle state expects {base}"
            )
        self._checkpoints[base] = state["upstream"]
        entries = []
        while self.upstream.position < position + self.window:
            entry = self._read_one()
            if entry is None:
                break
            entries.append(entry)
        entries.sort(key=lambda e: (e[0], e[1]))
        self._heap = entries[position - base :]
        heapq.heapify(self._heap)
        self.position = position
