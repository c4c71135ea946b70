"""The node contract every stream stage follows (in the spirit of torchdata.nodes).

A node is an iterator with two more methods:

* ``reset(state=None)``: go to the start of the stream (``None``) or to a saved point;
* ``state_dict()``: a small JSON-able dict (positions, counters, seeds; never tokens) such that a
  fresh node given ``reset(state)`` yields exactly the items that would have followed.

A state is an envelope (``shardtok.stream.state``): each node class names its ``KIND`` and its
``FIELDS`` (the keys it owns, with their types), wraps what it saves with ``_wrap`` and checks
what it is given with ``parse_state`` before using any of it.

Nodes do no I/O when constructed; the first ``__next__`` (or ``reset``) opens what they need, so a
pipeline can be built in the main process and run inside a DataLoader worker.

Document-level nodes (the reader and the shuffle buffer) add a cheap ``position`` (documents
emitted so far in this slice and epoch) and ``state_at(position)``, the state for a recent
position. Packers keep only the integer position of each document they still hold and ask for
the full state when ``state_dict()`` is called, so the hot path never builds dicts per document.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from shardtok.errors import ResumeStateError
from shardtok.stream import state as envelope

T = TypeVar("T")


class Node(Iterator[T], Generic[T]):
    """Base class: subclasses implement ``_reset``, ``_next`` and ``state_dict``."""

    KIND = "node"
    FIELDS: dict[str, str] = {}
    OPTIONAL: tuple[str, ...] = ()  # fields a state may lack (a later release added them)

    def __init__(self) -> None:
        self._started = False

    def _wrap(self, **fields: Any) -> dict:
        return envelope.wrap(self.KIND, fields)

    @classmethod
    def parse_state(cls, state: object) -> dict:
        """`state` checked against this node's kind and fields (ResumeStateError otherwise)."""
        return envelope.parse(state, cls.KIND, cls.FIELDS, cls.OPTIONAL)

    def __iter__(self) -> Node[T]:
        return self

    def __next__(self) -> T:
        if not self._started:
            self.reset(None)
        return self._next()

    def reset(self, state: dict | None = None) -> None:
        self._started = True
        self._reset(state)

    def state_dict(self) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        """Let go of what reading holds (open shards, a decode-ahead thread) once no more items
        are wanted; the state stays available and ``reset`` starts reading again. A node with
        one ``upstream`` passes it on; readers override it."""
        upstream = getattr(self, "upstream", None)
        if isinstance(upstream, Node):
            upstream.close()

    def _reset(self, state: dict | None) -> None:
        raise NotImplementedError

    def _next(self) -> T:
        raise NotImplementedError


class DocumentNode(Node[np.ndarray]):
    """A node yielding documents (1-D token arrays) that can describe recent positions."""

    position: int

    def state_at(self, position: int) -> dict:
        raise NotImplementedError

    def _next_many(self, count: int) -> list[np.ndarray]:
        """The next `count` documents, fewer only at the end (the node must be started).

        Readers override it to hand over runs of documents without a Python step each."""
        out = []
        try:
            for _ in range(count):
                out.append(self._next())
        except StopIteration:
            pass
        return out

    def state_dict(self) -> dict:
        if not self._started:
            self.reset(None)
        return self.state_at(self.position)


class PlacedStream(Node[dict]):
    """A batch stream that belongs to one (epoch, rank, world size, worker, workers) placement.

    Subclasses set those five attributes; saved states carry them and are refused elsewhere.
    """

    PLACEMENT = {k: envelope.INT for k in ("epoch", "rank", "world_size", "worker", "num_workers")}

    epoch: int
    rank: int
    world_size: int
    worker: int
    num_workers: int

    @property
    def identity(self) -> dict:
        return {
            "epoch": self.epoch,
            "rank": self.rank,
            "world_size": self.world_size,
            "worker": self.worker,
            "num_workers": self.num_workers,
        }

    # What a subclass's saved state is called, how to resume it correctly, and the key under
    # which it keeps its batcher's state.
    state_name = "stream"
    resume_hint = "restore with the same epoch, rank, world size, worker and number of workers"
    batcher_key = "batcher"
    batcher: Node[dict]

    def _reset(self, state: dict | None) -> None:
        if state is None:
            self.batcher.reset(None)
            return
        state = self.parse_state(state)
        self._check_identity(state)
        self.batcher.reset(state[self.batcher_key])

    def _check_identity(self, state: dict, **more: object) -> None:
        """Refuse a parsed `state` of another placement (or other `more` fields)."""
        mine = {**self.identity, **more}
        theirs = {k: state[k] for k in mine}
        if theirs != mine:
            raise ResumeStateError(
                f"{self.state_name} state belongs to {theirs}, this stream is {mine}: "
                + self.resume_hint
            )

    def _next(self) -> dict:
        try:
            return next(self.batcher)
        except StopIteration:
            # The planned batches are out (the reader stops short of the slice's unused tail):
            # end the decode-ahead thread and close the shards now, not at garbage collection.
            self.batcher.close()
            raise

    def close(self) -> None:
        batcher = getattr(self, "batcher", None)  # a staged stream has none before its first
        if batcher is not None:
            batcher.close()

    def locate(self, local_batch: int) -> Located:
        """Where this worker's batch `local_batch` (counted from the start of this layout's
        stream, 0-based) comes from: the placed stream that yields it, positioned at the current
        state when the batch lies in the current part, and the batches to pass over first.

        A stream of one part (an epoch's slice, a mix) is that part; streams chained from
        parts (epochs, curriculum stages) override this. Used by provenance traces, which pull
        the part's packed rows directly (``stream.batcher.upstream``)."""
        done = int(self.batcher.batches)  # type: ignore[attr-defined]
        if local_batch < done:
            raise ValueError(f"batch {local_batch} lies before this stream's position ({done})")
        return Located(self, local_batch - done)


@dataclass
class Located:
    """A placed stream positioned so that its batch number `skip` (from its position) is the
    one asked for; `part` says which part of a chained stream it is (``{"stage": 1}``,
    ``{"epoch": 3}``, or empty)."""

    stream: PlacedStream
    skip: int
    part: dict = field(default_factory=dict)


def take(node: Iterator[Any], count: int | None = None) -> list[Any]:
    """The next `count` items (all remaining ones when None)."""
    out: list[Any] = []
    if count == 0:
        return out
    for item in node:
        out.append(item)
        if count is not None and len(out) >= count:
            break
    return out
