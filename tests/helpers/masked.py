"""Masked (fine-tuning) data whose every token says where it comes from, for stream tests.

Token ids are global positions plus `first` (so 0 stays free for padding), and the mask bit of
a token is a fixed function of its id: a batch alone tells which document each token belongs
to, where it sits in it and whether it should be trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardtok.format import DatasetWriter
from shardtok.stream.masked import flag_untrained


@dataclass
class Known:
    """What the tokens of `lengths` documents starting at id `first` are."""

    lengths: list[int]
    first: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        total = sum(self.lengths)
        self.end = self.first + total  # ids [first, end)
        self.doc = np.full(self.end + 1, -1, dtype=np.int64)  # id -> document (-1: none)
        self.doc[self.first : self.end] = np.repeat(np.arange(len(self.lengths)), self.lengths)
        rng = np.random.default_rng(self.seed)
        # Runs of trained and untrained tokens, as conversations have (~half trained).
        runs = rng.integers(1, 6, size=total + 1)
        bits = np.repeat(np.arange(len(runs)) % 2, runs)[:total].astype(np.uint8)
        self.mask = np.zeros(self.end + 1, dtype=np.uint8)  # id -> mask bit
        self.mask[self.first : self.end] = bits

    def documents(self) -> list[np.ndarray]:
        bounds = np.cumsum([self.first, *self.lengths])
        return [np.arange(a, b, dtype=np.int32) for a, b in zip(bounds, bounds[1:])]

    def masked_documents(self) -> list[np.ndarray]:
        """The documents as the stream carries masked ones (untrained tokens flagged)."""
        return [flag_untrained(d, self.mask[d]) for d in self.documents()]

    def mine(self, ids: np.ndarray) -> np.ndarray:
        return (ids >= self.first) & (ids < self.end)

    def same_segment(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Whether ids `b` directly follow ids `a` inside one document."""
        inside = self.mine(a) & self.mine(b)
        clipped_a, clipped_b = np.where(inside, a, 0), np.where(inside, b, 0)
        return inside & (clipped_b == clipped_a + 1) & (self.doc[clipped_a] == self.doc[clipped_b])

    def write(self, path: Path, masked: bool = True, **options) -> Path:
        options = {"frame_size": 512, "shard_size": 2000, **options}
        with DatasetWriter(
            path,
            vocab_size=60_000,
            masks=masked,
            sft={"format": "test"} if masked else None,
            tokenizer={"name": "positions", "fingerprint": None, "eos_id": None, "bos_id": None},
            **options,
        ) as writer:
            for doc in self.documents():
                writer.add(doc, mask=self.mask[doc] if masked else None)
        return path


def expected_shifted_labels(
    known: list[Known], masked: list[bool], rows: np.ndarray, boundary: bool
) -> np.ndarray:
    """The shifted labels of token windows `rows` [B, S + 1] of these sources: a target is
    trained when it continues its input's document (unmasked data: any target but padding,
    unless `boundary`) and, for masked data, its mask bit is 1."""
    inputs, targets = rows[:, :-1], rows[:, 1:]
    out = np.full(inputs.shape, -100, dtype=np.int64)
    for k, m in zip(known, masked):
        row_is_mine = k.mine(rows[:, :1])  # a row comes from one source
        same = k.same_segment(inputs, targets)
        if m:
            trained = same & (k.mask[np.where(k.mine(targets), targets, 0)] == 1)
        else:
            trained = same if boundary else k.mine(targets) & k.mine(inputs)
        take = row_is_mine & trained
        out[take] = targets[take]
    return out
