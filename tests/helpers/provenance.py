"""Checking a provenance trace against real batches: its documents, read back two ways (the
shard reader, and export-megatron + megatron-core's IndexedDataset), must give the batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.format.megatron_io import export_megatron
from shardtok.stream.batch import IGNORE_INDEX


def shard_documents(sources: list[DatasetSource]):
    """read(segment) -> the whole document the segment names, through the shard reader."""
    readers: dict = {}

    def read(segment: dict) -> np.ndarray:
        key = (segment["source"], segment["shard"])
        if key not in readers:
            readers[key] = sources[segment["source"]].open_random(segment["shard"])
        return readers[key].document(segment["document"])

    return read


def megatron_documents(folders: list[str], out: Path):
    """read(segment) through export-megatron's pair of each source, indexed by
    ``dataset_document`` (megatron-core's IndexedDataset reads it)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    indexed = []
    for i, folder in enumerate(folders):
        prefix = out / f"source{i}"
        export_megatron(folder, prefix)
        indexed.append(IndexedDataset(str(prefix)))
    return lambda segment: indexed[segment["source"]][segment["dataset_document"]]


def rows_of(trace: dict, read) -> np.ndarray:
    """The batch's token windows (``seq_len + 1`` slots per sequence) the trace names."""
    window = trace["seq_len"] + 1
    rows = np.full((trace["batch_size"], window), -1, dtype=np.int64)
    for seq in trace["sequences"]:
        covered = 0
        for segment in seq["segments"]:
            a, b = segment["positions"]
            begin, end = segment["tokens"]
            assert a == covered and end - begin == b - a, segment
            rows[seq["row"], a:b] = np.asarray(read(segment))[begin:end]
            covered = b
        if seq["padding"] is not None:
            assert seq["padding"] == [covered, window]
            rows[seq["row"], covered:] = trace["pad_id"]
        else:
            assert covered == window
    return rows


def assert_reproduces(trace: dict, batch: dict, read) -> np.ndarray:
    """The trace's documents give the batch: input_ids exactly, every trained label too."""
    rows = rows_of(trace, read)
    ids, labels = np.asarray(batch["input_ids"]), np.asarray(batch["labels"])
    assert np.array_equal(rows[:, :-1], ids)
    trained = labels != IGNORE_INDEX
    assert np.array_equal(labels[trained], rows[:, 1:][trained])
    if "source_ids" in batch:
        assert [s["source"] for s in trace["sequences"]] == np.asarray(batch["source_ids"]).tolist()
    return rows
