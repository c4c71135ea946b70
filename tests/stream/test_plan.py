"""The epoch plan: exact token slices, equal batch counts, bounded and reported drops."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.format.manifest import Manifest, ShardEntry
from shardtok.stream.plan import concat_window_count, epoch_plan, shard_order


def manifest_of(token_counts) -> Manifest:
    shards = tuple(
        ShardEntry(f"shard-{i:06d}.tar", 1000 + n, max(1, n // 10), n, "0" * 64)
        for i, n in enumerate(token_counts)
    )
    return Manifest("shard", np.dtype(np.int32), 1 << 20, {}, shards)


def check_plan(plan, manifest):
    counts = [s.num_tokens for s in plan.slices]
    assert sum(counts) == manifest.num_tokens
    assert max(counts) - min(counts) <= 1
    # Slices tile the virtual stream, and their pieces are exactly the permuted shards.
    assert plan.slices[0].start == 0 and plan.slices[-1].stop == manifest.num_tokens
    for a, b in zip(plan.slices, plan.slices[1:]):
        assert a.stop == b.start
    flat = [p for s in plan.slices for p in s.pieces]
    rebuilt: dict[int, list[tuple[int, int]]] = {}
    for p in flat:
        rebuilt.setdefault(p.shard, []).append((p.start, p.stop))
        assert p.file == manifest.shards[p.shard].file and p.start < p.stop
    for shard, ranges in rebuilt.items():  # each shard read whole, once, in contiguous pieces
        assert ranges[0][0] == 0 and ranges[-1][1] == manifest.shards[shard].num_tokens
        assert all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    assert set(rebuilt) == {i for i, e in enumerate(manifest.shards) if e.num_tokens}
    order = [p.shard for p in flat]
    nonempty = [i for i in plan.shard_order if manifest.shards[i].num_tokens]
    assert [k for i, k in enumerate(order) if i == 0 or order[i - 1] != k] == nonempty
    for s in plan.slices:
        assert s.index == s.rank * plan.num_workers + s.worker
        assert plan.batches_per_slice * plan.batch_size <= s.num_sequences


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    seq_len=st.integers(1, 200),
    batch=st.integers(1, 4),
    packing=st.sampled_from(["concat", "greedy"]),
)
def test_plan_properties(counts, world, workers, seq_len, batch, packing):
    manifest = manifest_of(counts)
    plan = epoch_plan(
        manifest,
        seq_len=seq_len,
        batch_size=batch,
        world_size=world,
        num_workers=workers,
        packing=packing,
    )
    check_plan(plan, manifest)
    window = seq_len + 1
    for s in plan.slices:
        if packing == "concat":
            assert s.num_sequences == s.num_tokens // window
            # The bound documented in docs/STREAMING.md.
            assert s.num_tokens - plan.tokens_read(s) < (batch + 1) * window
        else:
            assert s.num_sequences == -(-s.num_tokens // window)
    assert plan.batches_per_slice == min(s.num_sequences for s in plan.slices) // batch
    json.loads(plan.to_json())


def test_stride_counts_match_the_formula():
    plan = epoch_plan(manifest_of([1000, 3000]), seq_len=10, batch_size=2, stride=3)
    (s,) = plan.slices
    assert s.num_sequences == concat_window_count(4000, 10, 3) == (4000 - 11) // 3 + 1
    assert plan.tokens_read(s) == (plan.sequences_per_slice - 1) * 3 + 11


def test_fewer_shards_than_slices_splits_inside_a_shard():
    manifest = manifest_of([10_000])
    plan = epoch_plan(manifest, seq_len=99, batch_size=2, world_size=3, num_workers=4)
    check_plan(plan, manifest)
    assert all(len(s.pieces) == 1 for s in plan.slices)
    assert plan.batches_per_rank == 4 * plan.batches_per_slice > 0


def test_uneven_shards_still_give_equal_batches_per_rank():
    manifest = manifest_of([10, 90_000, 5, 2_000, 17_000])
    plan = epoch_plan(manifest, seq_len=127, batch_size=4, world_size=4, num_workers=2)
    check_plan(plan, manifest)
    assert len({s.num_tokens for s in plan.slices}) <= 2
    assert plan.batches_per_slice == min(s.num_sequences for s in plan.slices) // 4


def test_shard_order_is_seeded_by_seed_and_epoch_only():
    assert list(shard_order(50, 7, 3)) == list(shard_order(50, 7, 3))
    assert list(shard_order(50, 7, 3)) != list(shard_order(50, 7, 4))
    assert list(shard_order(50, 7, 3)) != list(shard_order(50, 8, 3))
    assert sorted(shard_order(50, 7, 3)) == list(range(50))


def test_plan_rejects_bad_options():
    manifest = manifest_of([100])
    with pytest.raises(ValueError, match="packing"):
        epoch_plan(manifest, seq_len=4, batch_size=1, packing="best")
    with pytest.raises(ValueError, match="stride"):
        epoch_plan(manifest, seq_len=4, batch_size=1, stride=6)
    with pytest.raises(ValueError):
        epoch_plan(manifest, seq_len=4, batch_size=0)


def test_summary_names_the_numbers_that_matter():
    plan = epoch_plan(manifest_of([5000, 7000]), seq_len=63, batch_size=2, world_size=2)
    text = plan.summary()
    assert "2 ranks x 1 workers" in text and f"{plan.batches_per_rank:,} per rank" in text
    assert "unread" in text
