"""Reading a dataset every way that serves tokens, for the adversarial tests."""

from __future__ import annotations

import numpy as np

from shardtok.storage.dataset import DatasetSource
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.plan import Piece


def stream_tokens(path) -> list[list[int]]:
    """Every document through the stream path (SliceReader over DatasetSource)."""
    source = DatasetSource(path)
    pieces = [
        Piece(n, e.file, 0, e.num_tokens)
        for n, e in enumerate(source.manifest.shards)
        if e.num_tokens > 0
    ]
    reader = SliceReader(source, pieces, interleave=1)
    reader.reset(None)
    return [np.asarray(d).tolist() for d in reader]


def random_tokens(path) -> list[list[int]]:
    """Every document through ShardReader, opened by DatasetSource.open_random."""
    source = DatasetSource(path)
    out = []
    for entry in source.manifest.shards:
        out += [d.tolist() for d in source.open_random(entry.file).documents()]
    return out
