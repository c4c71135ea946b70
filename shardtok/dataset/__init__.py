"""A dataset: a folder or URL prefix holding shards and their manifest (``index.json``, and
``index.compact`` at scale), or a subset of its shards named by a list, a brace pattern or a
glob. ``DatasetSource`` is what every reader of a dataset takes: the stream, the memmap path,
the torch adapters, the command line and the WebDataset stages.

It stands on ``storage`` (bytes at a location, which knows nothing of shards) and ``format``
(the shard and manifest bytes), and under everything that reads datasets.
"""

from shardtok.dataset.source import DatasetSource

__all__ = ["DatasetSource"]
