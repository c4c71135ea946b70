"""Checks on the first batches each loader returned, against the source documents.

- every id lies in the vocabulary;
- no id occurs more often than the data holds it (the multiset of the batches is within the data's);
- every document lying whole inside a window (between two EOS tokens) is, token for token, a
  document of the source. Whatever a system does (shuffling, packing, worker splits), concat
  packing cuts windows from an order of whole documents, so this holds for all of them.
"""

from __future__ import annotations

import hashlib

import numpy as np

from benchmarks.compare.data import Source


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int64).tobytes(), digest_size=16).digest()


class SourceChecker:
    def __init__(self, source: Source):
        from shardtok.format import MegatronPair

        pair = MegatronPair(source.prefix)
        self.eos = source.eos_id
        self.vocab = source.vocab_size
        self.counts = np.bincount(np.asarray(pair.tokens), minlength=self.vocab)
        self.documents = {_digest(pair[i]) for i in range(len(pair))}

    def check(self, rows: np.ndarray) -> dict:
        out: dict = {"rows": int(len(rows)), "whole_documents": 0, "unknown_documents": 0}
        out["in_vocabulary"] = bool(rows.min() >= 0 and rows.max() < self.vocab)
        out["multiset_within_data"] = out["in_vocabulary"] and bool(
            (np.bincount(rows.ravel(), minlength=self.vocab) <= self.counts).all()
        )
        for row in rows:
            ends = np.flatnonzero(row == self.eos)
            for a, b in zip(ends[:-1], ends[1:]):
                out["whole_documents"] += 1
                out["unknown_documents"] += _digest(row[a + 1 : b + 1]) not in self.documents
        out["ok"] = out["multiset_within_data"] and out["unknown_documents"] == 0
        return out
