"""ShardBuilder.write: a shard spooled in memory and one spooled to a temporary file give the
same bytes, size and sha256; the fsync that runs beside the hashing still fails the write."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

import shardtok.format.shard_writer as shard_writer
from shardtok.format.shard_writer import ShardBuilder

TOKENIZER = {"name": "t", "fingerprint": "sha256:none", "eos_id": None, "bos_id": None}


def _build(masked: bool, level) -> ShardBuilder:
    rng = np.random.default_rng(7)
    builder = ShardBuilder(
        "s", np.dtype(np.uint16), 1000, level, frame_size=256, tokenizer=TOKENIZER, masked=masked
    )
    for i in range(60):
        doc = rng.integers(0, 1000, size=int(rng.integers(1, 90)))
        mask = rng.integers(0, 2, size=doc.size).astype(np.uint8) if masked else None
        builder.add(doc, ("a.jsonl", i + 1), mask)
    return builder


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("level", [None, 3])
def test_spooled_to_disk_writes_the_same_shard(tmp_path, monkeypatch, masked, level):
    in_memory = _build(masked, level)
    assert in_memory._spool.in_memory
    meta, size, sha = in_memory.write(tmp_path / "memory.tar")
    monkeypatch.setattr(shard_writer, "_SPOOL_IN_MEMORY", 300)  # a few frames, then a file
    on_disk = _build(masked, level)
    assert not on_disk._spool.in_memory
    assert not masked or not on_disk._mask_spool.in_memory
    meta2, size2, sha2 = on_disk.write(tmp_path / "disk.tar")
    data = (tmp_path / "memory.tar").read_bytes()
    assert data == (tmp_path / "disk.tar").read_bytes()
    assert (meta, size, sha) == (meta2, size2, sha2)
    assert size == len(data) and sha == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("limit", [256 << 20, 300])
def test_a_failed_fsync_fails_the_write_and_leaves_nothing(tmp_path, monkeypatch, limit):
    monkeypatch.setattr(shard_writer, "_SPOOL_IN_MEMORY", limit)
    builder = _build(False, 3)

    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        builder.write(tmp_path / "s.tar")
    assert list(tmp_path.iterdir()) == []
