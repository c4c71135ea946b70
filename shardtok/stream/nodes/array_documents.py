"""Documents held in memory as a document node (tests, small corpora, custom sources)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardtok.stream import state as envelope
from shardtok.stream.nodes.base import DocumentNode


class ArrayDocuments(DocumentNode):
    """Yields the given 1-D arrays in order; the state is the position."""

    KIND = "array_documents"
    FIELDS = {"position": envelope.INT}

    def __init__(self, documents: Sequence[np.ndarray]):
        super().__init__()
        self.documents = documents
        self.position = 0

    def _reset(self, state: dict | None) -> None:
        if state is None:
            self.position = 0
            return
        position = self.parse_state(state)["position"]
        self.position = envelope.check_range(
            self.KIND, "position", position, 0, len(self.documents)
        )

    def state_at(self, position: int) -> dict:
        return self._wrap(position=int(position))

    def _next(self) -> np.ndarray:
        if self.position >= len(self.documents):
            raise StopIteration
        doc = self.documents[self.position]
        self.position += 1
        return doc
