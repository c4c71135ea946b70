"""The shard-cut rule planned up front (plan_shards) against DatasetWriter applying it as frames
arrive, and shards built from a plan byte-identical to the writer's."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.frames import FrameBuilder
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_plan import FramedDocs, ShardSettings, build_shard, plan_shards
from shardtok.format.shard_reader import ShardReader

VOCAB = 1000


@pytest.mark.parametrize(
    ("sizes", "shard_size", "expected"),
    [
        ([], 10, []),
        ([10, 10, 10], 20, [(0, 2), (2, 3)]),  # exactly at shard_size: cut before the next
        ([10, 9, 1, 5], 20, [(0, 3), (3, 4)]),  # one byte short: one more frame goes in
        ([50, 1, 1], 20, [(0, 1), (1, 3)]),  # larger than a shard: a shard of its own
        ([5, 50, 1], 20, [(0, 2), (2, 3)]),  # ... or with what came before it
        ([0, 0, 20, 0], 20, [(0, 3), (3, 4)]),  # empty (uncompressed, empty) frames count 0
        ([7], 1, [(0, 1)]),
    ],
)
def test_plan_shards_edge_cases(sizes, shard_size, expected):
    assert plan_shards(sizes, shard_size) == expected
    assert plan_shards(iter(sizes), shard_size) == expected  # any iterable, one pass


def _unit(rng, doc_sizes: list[int], frame_size: int, level):
    """One unit's documents, framed and encoded as a convert worker does."""
    sizes = np.asarray(doc_sizes, dtype=np.int64)
    tokens = rng.integers(0, VOCAB, size=int(sizes.sum())).astype(np.uint16)
    out = io.BytesIO()
    framer = FrameBuilder(frame_size, level, out)
    framer.add(tokens, sizes)
    frames = framer.finish()
    masks = rng.integers(0, 2, size=tokens.size).astype(np.uint8)
    files = ["a.jsonl", "b.jsonl"]
    file_of = (np.arange(sizes.size) >= sizes.size // 2).astype(np.int64)
    records = np.arange(sizes.size, dtype=np.int64) * 2 + 1  # gaps: provenance runs break
    return tokens, sizes, frames, out.getvalue(), (files, file_of, records), masks


units_strategy = st.lists(
    st.lists(st.integers(0, 60), max_size=12),  # token counts; 0 docs = an empty unit
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    units=units_strategy,
    shard_size=st.integers(1, 300),
    frame_size=st.integers(1, 120),
    level=st.sampled_from([None, 1]),
    masked=st.booleans(),
)
def test_planned_shards_equal_the_writers(
    tmp_path_factory, units, shard_size, frame_size, level, masked
):
    rng = np.random.default_rng(len(units) * 1000 + shard_size)
    made = [_unit(rng, sizes, frame_size, level) for sizes in units]
    tokenizer = {"name": "t", "fingerprint": "sha256:" + "0" * 64, "eos_id": 0, "bos_id": None}

    seq = tmp_path_factory.mktemp("seq")
    writer = DatasetWriter(
        seq, vocab_size=VOCAB, tokenizer=tokenizer, shard_size=shard_size,
        compression_level=level, frame_size=frame_size, masks=masked,
    )  # fmt: skip
    for tokens, sizes, frames, stored, provenance, masks in made:
        writer.add_frames(tokens, sizes, frames, stored, provenance, masks if masked else None)
    manifest = writer.close()

    # The same shards from a plan over the frames' stored sizes alone.
    framed = [
        FramedDocs.checked(t, s, f, b, np.dtype(np.uint16), VOCAB, p, m if masked else None)
        for t, s, f, b, p, m in made
    ]
    owner = [(u, f) for u, docs in enumerate(framed) for f in range(docs.num_frames)]
    stored_sizes = [int(framed[u].frames[f, 2]) for u, f in owner]
    plan = plan_shards(stored_sizes, shard_size)
    assert len(plan) == len(manifest.shards)
    shard = ShardSettings("shard", np.dtype(np.uint16), VOCAB, level, frame_size, tokenizer, masked)
    planned = tmp_path_factory.mktemp("plan")
    for number, (first, end) in enumerate(plan):
        parts = []
        for unit in sorted({owner[g][0] for g in range(first, end)}):
            local = [owner[g][1] for g in range(first, end) if owner[g][0] == unit]
            parts.append((framed[unit], local[0], local[-1] + 1))
        entry = build_shard(shard, number, parts, planned / shard.file(number))
        assert entry == manifest.shards[number]
        assert (planned / entry.file).read_bytes() == (seq / entry.file).read_bytes()

    # And the rule itself: each shard but the last stopped at the first frame that filled it.
    for first, end in plan[:-1]:
        assert sum(stored_sizes[first:end]) >= shard_size > sum(stored_sizes[first : end - 1])


def test_frames_at_and_over_shard_size_in_a_real_dataset(tmp_path):
    """Uncompressed one-document frames whose sizes hit shard_size exactly, and one over it."""
    sizes = [5, 5, 12, 3, 3]  # uint16: 10, 10 (= shard_size), 24 (over it), 6, 6 bytes
    rng = np.random.default_rng(0)
    tokens, sizes_arr, frames, stored, provenance, _ = _unit(rng, sizes, 1, None)
    writer = DatasetWriter(tmp_path, vocab_size=VOCAB, shard_size=20, compression_level=None,
                           frame_size=1)  # fmt: skip
    writer.add_frames(tokens, sizes_arr, frames, stored, provenance)
    writer.add_frames(tokens[:0], sizes_arr[:0], frames[:0], b"", None)  # an empty unit
    manifest = writer.close()
    assert [s.num_documents for s in manifest.shards] == [2, 1, 2]
    assert plan_shards(frames[:, 2].tolist(), 20) == [(0, 2), (2, 3), (3, 5)]
    meta = json.loads(ShardReader(tmp_path / manifest.shards[0].file).meta.to_json_bytes())
    assert meta["provenance"] == [
        {"file": "a.jsonl", "first_record": 1, "last_record": 1},
        {"file": "a.jsonl", "first_record": 3, "last_record": 3},
    ]
    assert load_manifest(tmp_path) == manifest
