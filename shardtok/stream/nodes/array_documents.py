"""Documents held in memory as a document node (tests, small corpora, custom sources)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardtok.stream.nodes.base import DocumentNode


class ArrayDocuments(DocumentNode):
    """Yields the given 1-D arrays in order; the state is the position."""

    def __init__(self, documents: Sequence[np.ndarray]):
        super().__init__()
        self.documents = documents
        self.position = 0

    def _reset(self, state: dict | None) -> None:
        self.position = 0 if state is None else int(state["position"])

    def state_at(self, position: int) -> dict:
        return {"position": int(position)}

    def _next(self) -> np.ndarray:
        if self.position >= len(self.documents):
            raise StopIteration
        doc = self.documents[self.position]
        self.position += 1
        return doc
