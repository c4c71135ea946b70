"""Planning one worker's slice from shard groups: the same plan as every slice cut, the same
stream as before up to GROUP_LIMIT shards, the same from index.json and index.compact."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.format import shard_groups
from shardtok.format.compact_manifest import COMPACT_NAME
from shardtok.index.slices import cut_ranges
from shardtok.stream.options import StreamOptions
from shardtok.stream.plan import SHARD_ORDER_STREAM, epoch_plan, sequence_count, shard_order
from shardtok.stream.resume.fingerprint import check_fingerprint, stream_fingerprint
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset
from tests.stream.test_plan import check_plan, manifest_of

LAYOUTS = st.tuples(st.integers(1, 4), st.integers(1, 3))


def legacy_pieces(manifest, seed, epoch, count):
    """The plan of releases before shard groups: a permutation of every shard, cut."""
    order = np.random.default_rng((seed, epoch, SHARD_ORDER_STREAM)).permutation(
        len(manifest.shards)
    )
    sizes = [manifest.shards[i].num_tokens for i in order]
    return [
        [(int(order[j]), lo, hi) for j, lo, hi in parts] for _, _, parts in cut_ranges(sizes, count)
    ]


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3000), min_size=1, max_size=14),
    layout=LAYOUTS,
    seed=st.integers(0, 5),
)
def test_up_to_the_group_limit_the_plan_is_the_earlier_releases(counts, layout, seed):
    manifest = manifest_of(counts)
    world, workers = layout
    plan = epoch_plan(manifest, seq_len=9, batch_size=1, seed=seed, epoch=1, world_size=world,
                      num_workers=workers)  # fmt: skip
    legacy = legacy_pieces(manifest, seed, 1, world * workers)
    for s in range(world * workers):
        mine = plan.slice_for(*divmod(s, workers))
        assert [(p.shard, p.start, p.stop) for p in mine.pieces] == legacy[s]


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 3000), min_size=1, max_size=30),
    limit=st.integers(1, 6),
    layout=LAYOUTS,
    packing=st.sampled_from(["concat", "greedy"]),
)
def test_grouped_slices_tile_the_epoch_and_each_is_found_alone(counts, limit, layout, packing):
    world, workers = layout
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shard_groups, "GROUP_LIMIT", limit)
        manifest = manifest_of(counts)

        def plan():
            return epoch_plan(manifest, seq_len=17, batch_size=2, seed=3, world_size=world,
                              num_workers=workers, packing=packing)  # fmt: skip

        every = plan()
        check_plan(every, manifest)  # the slices, cut one by one, tile the permuted stream
        assert sorted(every.shard_order) == list(range(len(counts)))
        assert list(every.shard_order) == list(shard_order(len(counts), 3, 0))
        least = min(s.num_sequences for s in every.slices) // 2
        for s in range(world * workers):  # a fresh plan per worker, as each process has
            alone = plan()
            assert alone.slice_for(*divmod(s, workers)) == every.slices[s]
            assert alone.batches_per_slice == least
        assert (
            sequence_count(every.total_tokens // (world * workers), packing, 17, 18) // 2 == least
        )


def test_groups_spread_over_the_dataset_and_change_with_the_epoch(monkeypatch):
    monkeypatch.setattr(shard_groups, "GROUP_LIMIT", 10)
    order = shard_order(100, seed=1, epoch=0)
    assert sorted(order) == list(range(100))
    runs = order.reshape(10, 10)  # a group's ten shards follow one another
    assert all(len({int(i) % 10 for i in run}) == 1 for run in runs)
    assert [sorted(run) for run in runs] != [
        sorted(run) for run in shard_order(100, 1, 1).reshape(10, 10)
    ] or (list(order) != list(shard_order(100, 1, 1)))
    assert list(order) != list(shard_order(100, 2, 0))


@pytest.fixture
def small(tmp_path):
    folder = tmp_path / "ds"
    write_synthetic_dataset(folder, num_tokens=60_000, mean_length=300, shard_size=20_000,
                            frame_size=4096, seed=3)  # fmt: skip
    return folder


def regroup(folder, limit, monkeypatch) -> None:
    """Rewrite the dataset's manifests as if GROUP_LIMIT were `limit` (so a few shards group)."""
    from dataclasses import replace

    manifest = DatasetSource(folder).dataset_manifest
    manifest = replace(manifest, shards=tuple(manifest.shards))
    monkeypatch.setattr(shard_groups, "GROUP_LIMIT", limit)
    monkeypatch.setattr("shardtok.stream.resume.fingerprint.GROUP_LIMIT", limit)
    manifest.write(folder)


def batches(folder, worker, num_workers):
    options = StreamOptions(seq_len=63, batch_size=2, shuffle_buffer=8, seed=5)
    stream = SliceStream(DatasetSource(folder), options, worker=worker, num_workers=num_workers)
    return [b["input_ids"].copy() for b in stream]


@pytest.mark.parametrize("limit", [None, 3])
def test_index_compact_and_index_json_stream_the_same_tokens(small, tmp_path, monkeypatch, limit):
    if limit is not None:
        regroup(small, limit, monkeypatch)
    old = tmp_path / "earlier-release"
    shutil.copytree(small, old)
    (old / COMPACT_NAME).unlink()
    compact = DatasetSource(small)
    assert len(compact.manifest.shards) > 3
    assert type(compact.manifest.shards).__name__ == "ShardTable"
    for worker in range(3):
        a, b = batches(small, worker, 3), batches(old, worker, 3)
        assert len(a) == len(b) > 0
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_state_of_an_earlier_release_is_refused_where_the_order_changed(small, monkeypatch):
    options = StreamOptions(seq_len=63, batch_size=2)
    source = DatasetSource(small)
    before = stream_fingerprint([source], None, options)  # what earlier releases saved
    assert "shard_order" not in before["sources"][0]
    regroup(small, 2, monkeypatch)
    now = stream_fingerprint([DatasetSource(small)], None, options)
    assert now["sources"][0]["shard_order"] == "grouped-v2"
    with pytest.raises(ResumeStateError, match="shard_order None saved, 'grouped-v2' now"):
        check_fingerprint(before, now)
