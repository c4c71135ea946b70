"""FrameBuilder + DatasetWriter.add_frames: frames encoded elsewhere reach the shards unchanged.

convert's workers frame and compress their own unit; the writer only appends the frames. Fed
the same documents as one block, that must give exactly the bytes of per-document `add`.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.frames import FrameBuilder, FrameEncoder
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage import open_source

FRAME = 4 << 10
SHARD = 12 << 10


def documents(seed: int, n: int = 300) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Mostly small documents, some larger than a frame (they get a frame of their own).
    sizes = np.where(
        rng.random(n) < 0.05, rng.integers(FRAME // 2, FRAME * 2, n), rng.integers(1, 300, n)
    )
    return [rng.integers(0, 1000, s).astype(np.uint16) for s in sizes]


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def writer(out: Path, level: int | None) -> DatasetWriter:
    return DatasetWriter(out, vocab_size=1000, shard_size=SHARD, frame_size=FRAME,
                         compression_level=level)  # fmt: skip


def add_block(w: DatasetWriter, docs: list[np.ndarray], level: int | None, first_record: int):
    tokens = np.concatenate(docs)
    sizes = np.array([len(d) for d in docs])
    out = io.BytesIO()
    framer = FrameBuilder(FRAME, level, out)
    for a in range(0, len(docs), 37):  # fed in batches, as a worker does
        framer.add(np.concatenate(docs[a : a + 37]), sizes[a : a + 37])
    frames = framer.finish()
    records = np.arange(first_record, first_record + len(docs))
    w.add_frames(
        tokens, sizes, frames, out.getbuffer(), (["in.jsonl"], np.zeros_like(records), records)
    )
    return frames


@pytest.mark.parametrize("level", [3, None])
def test_one_block_of_frames_equals_per_document_add(tmp_path, level):
    docs = documents(0)
    with writer(tmp_path / "add", level) as w:
        for i, doc in enumerate(docs):
            w.add(doc, provenance=("in.jsonl", i))
    with writer(tmp_path / "frames", level) as w:
        add_block(w, docs, level, 0)
    assert len(load_manifest(tmp_path / "add").shards) > 3
    assert digest(tmp_path / "add") == digest(tmp_path / "frames")


def test_blocks_start_new_frames_and_shards_roll_over_between_frames(tmp_path):
    docs = documents(1)
    with writer(tmp_path / "out", 3) as w:
        first = add_block(w, docs[:100], 3, 0)
        add_block(w, docs[100:], 3, 100)
    manifest = load_manifest(tmp_path / "out")
    starts, read = [], []
    base = 0
    for shard in manifest.shards:
        reader = ShardReader(open_source(tmp_path / "out" / shard.file))
        starts += [base + f.first_document for f in reader.meta.frames]
        read += [reader.document(i) for i in range(reader.meta.num_documents)]
        base += reader.meta.num_documents
        assert reader.meta.provenance[0]["file"] == "in.jsonl"
    assert 100 in starts  # the second block opened a frame
    assert [s for s in starts if s < 100] == first[:, 0].tolist()  # kept as the framer cut them
    assert all(np.array_equal(a, b) for a, b in zip(read, docs)) and len(read) == len(docs)
    assert sum(s.num_documents for s in manifest.shards) == len(docs) and len(manifest.shards) > 3


def test_add_frames_refuses_inconsistent_input(tmp_path):
    docs = documents(2, 20)
    tokens, sizes = np.concatenate(docs), np.array([len(d) for d in docs])
    out = io.BytesIO()
    framer = FrameBuilder(FRAME, 3, out)
    framer.add(tokens, sizes)
    frames = framer.finish()
    w = writer(tmp_path / "out", 3)
    with pytest.raises(ValueError, match="sizes add up to"):
        w.add_frames(tokens, sizes + 1, frames, out.getbuffer())
    with pytest.raises(ValueError, match="does not add up to the stored bytes"):
        w.add_frames(tokens, sizes, frames, out.getbuffer()[:-1])
    bad = frames.copy()
    bad[0, 1] += 2
    with pytest.raises(ValueError, match="its documents are not"):
        w.add_frames(tokens, sizes, bad, out.getbuffer())
    with pytest.raises(ValueError, match="1-D uint16"):
        w.add_frames(tokens.astype(np.int32), sizes, frames, out.getbuffer())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        w.add_frames(tokens + 1000, sizes, frames, out.getbuffer())
    with pytest.raises(ValueError, match="sizes cover"):
        FrameBuilder(FRAME, 3, io.BytesIO()).add(tokens, sizes[:-1])


def test_a_shared_frame_encoder_gives_the_bytes_of_a_fresh_one():
    """convert's workers reuse one FrameEncoder per level for all their units."""
    docs = documents(3, 120)
    tokens, sizes = np.concatenate(docs), np.array([len(d) for d in docs])
    shared = FrameEncoder(3)
    outputs = []
    for encoder in (None, shared, shared):
        out = io.BytesIO()
        framer = FrameBuilder(FRAME, 3, out, encoder)
        framer.add(tokens, sizes)
        outputs.append((framer.finish().tolist(), out.getvalue()))
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0][0]) > 3
    with pytest.raises(ValueError, match="of level 3 given for level 1"):
        FrameBuilder(FRAME, 1, io.BytesIO(), shared)
