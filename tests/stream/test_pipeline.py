"""Whole streams over real shard datasets: coverage, equal batch counts, boundaries, resume."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError, ResumeStateError, ShardtokError
from shardtok.format.manifest import Manifest
from shardtok.stream.nodes.base import take
from shardtok.stream.nodes.reader import SliceReader, round_robin_consumed
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.save_restore import check_save_restore
from shardtok.testing.synthetic import write_synthetic_dataset

VOCAB = 1 << 24


def uneven_lengths(seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    lengths = list(rng.integers(1, 120, size=300))
    for at, n in ((20, 3000), (150, 1700), (260, 5000)):  # a few documents bigger than a shard
        lengths[at] = n
    return [int(n) for n in lengths]


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    """Unique tokens (token id = global position), shards of very different sizes: three runs
    of documents written with different shard sizes into one dataset."""
    path = tmp_path_factory.mktemp("uneven")
    lengths = uneven_lengths()
    entries, at = [], 0
    for part, (count, shard_size) in enumerate(((100, 300), (120, 40_000), (80, 2000))):
        run = lengths[at : at + count]
        part_manifest = write_synthetic_dataset(
            path, lengths=run, vocab_size=VOCAB, unique_tokens=True, shard_size=shard_size,
            frame_size=700, name=f"part{part}", first_token=sum(lengths[:at]),
        )  # fmt: skip
        entries += part_manifest.shards
        at += count
    manifest = Manifest(
        "uneven", part_manifest.dtype, VOCAB, part_manifest.tokenizer, tuple(entries)
    )
    manifest.write(path)
    sizes = [s.num_tokens for s in manifest.shards]
    assert len(sizes) >= 8 and max(sizes) > 20 * min(sizes), sizes
    return path, manifest, np.cumsum([0] + lengths)[:-1]


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("one")
    lengths = [int(n) for n in np.random.default_rng(1).integers(1, 200, size=150)]
    manifest = write_synthetic_dataset(
        path, lengths=lengths, vocab_size=VOCAB, unique_tokens=True, shard_size=1 << 30,
        frame_size=2000,
    )  # fmt: skip
    assert len(manifest.shards) == 1
    return path, manifest, np.cumsum([0] + lengths)[:-1]


def run_all(path, options, world, workers, epoch=0):
    out = {}
    for rank in range(world):
        for worker in range(workers):
            stream = SliceStream(
                path, options, epoch=epoch, rank=rank, world_size=world,
                worker=worker, num_workers=workers,
            )  # fmt: skip
            out[rank, worker] = (stream, take(stream, None))
    return out


def rows(batch):
    """Each row's seq_len + 1 window tokens and its number of real (non-padding) tokens."""
    window = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)
    for b in range(len(window)):
        ignored = np.flatnonzero(batch["labels"][b] == -100)
        real = int(ignored[0]) + 1 if len(ignored) else window.shape[1]
        yield window[b], real


def slice_values(manifest, slice_plan) -> np.ndarray:
    """Token ids (= global positions) a slice's pieces cover."""
    bases = np.cumsum([0] + [s.num_tokens for s in manifest.shards])
    return np.concatenate(
        [np.arange(bases[p.shard] + p.start, bases[p.shard] + p.stop) for p in slice_plan.pieces]
    )


def piece_starts(manifest, slice_plan) -> set[int]:
    """Token ids where a piece begins (a document cut by a slice boundary restarts there)."""
    bases = np.cumsum([0] + [s.num_tokens for s in manifest.shards])
    return {int(bases[p.shard] + p.start) for p in slice_plan.pieces}


def check_structure(batch, starts_set, packing):
    """position_ids, document_ids and cu_seqlens agree with where documents really start."""
    seq_len = batch["input_ids"].shape[1]
    flat_starts = []
    for b, (window, real) in enumerate(rows(batch)):
        expected = [0] + [t for t in range(1, seq_len) if t < real and window[t] in starts_set]
        if real < seq_len:
            expected.append(real)  # the padding segment
        doc = batch["document_ids"][b]
        got = [0] + [t for t in range(1, seq_len) if doc[t] != doc[t - 1]]
        assert got == expected, (b, got[:8], expected[:8], window[got[:8]], window[expected[:8]])
        assert list(doc[got]) == list(range(len(got)))
        bounds = got + [seq_len]
        for a, c in zip(bounds, bounds[1:]):
            assert np.array_equal(batch["position_ids"][b, a:c], np.arange(c - a))
        flat_starts += [b * seq_len + t for t in got]
        assert np.array_equal(
            batch["input_ids"][b, : min(real, seq_len)], window[: min(real, seq_len)]
        )
        assert np.array_equal(batch["labels"][b, : real - 1], window[1:real])
        assert (batch["labels"][b, real - 1 :] == -100).all() or real == seq_len + 1
        if packing != "concat":
            assert (batch["input_ids"][b, real:] == 0).all()
    cu = batch["cu_seqlens"]
    assert cu.dtype == np.int32 and list(cu) == flat_starts + [len(batch["input_ids"]) * seq_len]
    assert batch["max_seqlen"] == int(np.diff(cu).max())


@pytest.mark.parametrize("shuffle", [0, 50])
@pytest.mark.parametrize("world,workers", [(2, 3), (1, 1), (3, 2)])
def test_concat_covers_the_epoch_once_with_equal_batches(uneven, shuffle, world, workers):
    path, manifest, doc_starts = uneven
    options = StreamOptions(seq_len=63, batch_size=3, shuffle_buffer=shuffle, interleave=3)
    results = run_all(path, options, world, workers)
    counts = {len(batches) for _, batches in results.values()}
    plan = next(iter(results.values()))[0].plan
    assert counts == {plan.batches_per_slice} and plan.batches_per_slice > 0
    seen = []
    for (rank, worker), (_, batches) in results.items():
        slice_plan = plan.slice_for(rank, worker)
        allowed = set(slice_values(manifest, slice_plan).tolist())
        starts = {int(v) for v in doc_starts} | piece_starts(manifest, slice_plan)
        mine = np.concatenate([w for b in batches for w, _ in rows(b)])
        assert set(mine.tolist()) <= allowed
        seen.append(mine)
        for batch in batches:
            check_structure(batch, starts, "concat")
    seen = np.concatenate(seen)
    assert len(np.unique(seen)) == len(seen), "a token was read twice"
    assert len(seen) == manifest.num_tokens - plan.tokens_unread


@pytest.mark.parametrize("packing", ["greedy", "bfd"])
@pytest.mark.parametrize("shuffle", [0, 40])
def test_padded_packing_covers_without_duplicates_and_keeps_documents_whole(
    uneven, shuffle, packing
):
    path, manifest, doc_starts = uneven
    options = StreamOptions(
        seq_len=95, batch_size=2, packing=packing, shuffle_buffer=shuffle, lookahead=3,
        bfd_window=7,
    )  # fmt: skip
    results = run_all(path, options, 2, 2)
    plan = next(iter(results.values()))[0].plan
    assert {len(b) for _, b in results.values()} == {plan.batches_per_slice}
    lengths = np.diff(np.append(doc_starts, manifest.num_tokens))
    whole = {int(s): int(n) for s, n in zip(doc_starts, lengths) if n <= 96}
    seen = []
    for (rank, worker), (stream, batches) in results.items():
        slice_plan = plan.slice_for(rank, worker)
        allowed = slice_values(manifest, slice_plan)
        starts = {int(v) for v in doc_starts} | piece_starts(manifest, slice_plan)
        # Documents longer than a sequence are cut every seq_len + 1 tokens from their start.
        bases = np.cumsum([0] + [e.num_tokens for e in manifest.shards])
        ends = {int(bases[p.shard] + p.stop) for p in slice_plan.pieces}
        edges = sorted(starts | ends | {manifest.num_tokens})
        for a, b in zip(edges, edges[1:]):
            starts |= set(range(a + 96, b, 96))
        for batch in batches:
            check_structure(batch, starts, packing)
            for window, real in rows(batch):
                seen.append(window[:real])
                for t in range(real):  # a document that fits is never split
                    n = whole.get(int(window[t]))
                    if (
                        n is not None
                        and window[t] >= allowed[0]
                        and window[t] + n <= allowed[-1] + 1
                    ):
                        assert np.array_equal(
                            window[t : t + n], np.arange(window[t], window[t] + n)
                        )
        stats = stream.stats()
        assert 0.5 < stats["packing_efficiency"] <= 1.0
    seen = np.concatenate(seen)
    assert len(np.unique(seen)) == len(seen)


def test_fewer_shards_than_ranks_times_workers(one_shard):
    path, manifest, doc_starts = one_shard
    options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=16)
    results = run_all(path, options, 2, 4)
    plan = next(iter(results.values()))[0].plan
    assert all(len(s.pieces) == 1 for s in plan.slices)
    assert {len(b) for _, b in results.values()} == {plan.batches_per_slice}
    seen = np.concatenate([w for _, bs in results.values() for b in bs for w, _ in rows(b)])
    assert len(np.unique(seen)) == len(seen) == manifest.num_tokens - plan.tokens_unread


@pytest.mark.parametrize(
    "options",
    [
        StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=0),
        StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=37, interleave=2, stride=17),
        StreamOptions(seq_len=47, batch_size=3, packing="greedy", shuffle_buffer=25),
        StreamOptions(seq_len=47, batch_size=1, packing="greedy", mask_boundary_labels=True),
    ],
    ids=["concat", "concat-shuffle-stride", "greedy-shuffle", "greedy-masked"],
)
def test_slice_stream_save_restore(uneven, options):
    path = uneven[0]
    check_save_restore(
        lambda: SliceStream(path, options, epoch=1, rank=1, world_size=2),
        midpoints=(0, 1, 2, 9, 30, 77, -2, -1),
    )


@pytest.mark.parametrize("interleave", [1, 3])
def test_slice_reader_save_restore(uneven, interleave):
    path, manifest, _ = uneven
    source = DatasetSource(path)
    from shardtok.stream.plan import epoch_plan

    plan = epoch_plan(manifest, seq_len=8, batch_size=1, world_size=2, seed=3)
    pieces = plan.slice_for(1, 0).pieces
    docs = check_save_restore(
        lambda: SliceReader(source, pieces, interleave), midpoints=(0, 1, 5, 40, 99, 150, -1)
    )
    assert sum(len(d) for d in docs) == plan.slice_for(1, 0).num_tokens


def test_round_robin_consumed_matches_a_simulation():
    counts = [5, 1, 3, 0, 7]
    order = []  # piece of every round-robin step
    remaining = list(counts)
    while any(remaining):
        for i, r in enumerate(remaining):
            if r:
                order.append(i)
                remaining[i] -= 1
    for ordinal in range(len(order) + 1):
        taken, resume = round_robin_consumed(counts, ordinal)
        assert taken == [order[:ordinal].count(i) for i in range(len(counts))]
        if ordinal < len(order):  # the rotation continues with the right piece
            candidates = [i for i in range(resume, len(counts)) if taken[i] < counts[i]]
            first_next = candidates[0] if candidates else None
            if first_next is None:
                first_next = next(i for i in range(len(counts)) if taken[i] < counts[i])
            assert first_next == order[ordinal]


def test_state_of_another_slice_is_refused(uneven):
    options = StreamOptions(seq_len=31, batch_size=2)
    a = SliceStream(uneven[0], options, rank=0, world_size=2)
    next(a)
    b = SliceStream(uneven[0], options, rank=1, world_size=2)
    with pytest.raises(ResumeStateError, match="rank"):
        b.reset(a.state_dict())


def digest(path, options, epoch, rank, world) -> str:
    h = hashlib.sha256()
    for batch in SliceStream(path, options, epoch=epoch, rank=rank, world_size=world):
        for key in sorted(batch):
            h.update(key.encode() + np.ascontiguousarray(batch[key]).tobytes())
    return h.hexdigest()


def test_deterministic_across_runs_and_processes(uneven):
    path = str(uneven[0])
    options = StreamOptions(seq_len=31, batch_size=2, shuffle_buffer=30, packing="greedy")
    here = digest(path, options, 2, 1, 2)
    assert here == digest(path, options, 2, 1, 2)
    assert here != digest(path, options, 3, 1, 2)
    code = (
        "import json;"
        "from tests.stream.test_pipeline import digest;"
        "from shardtok.stream.options import StreamOptions;"
        f"print(digest({path!r}, StreamOptions(**json.loads({json.dumps(json.dumps(options.to_dict()))})), 2, 1, 2))"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == here


def test_dataset_source_pickles_without_its_cache(uneven):
    source = DatasetSource(uneven[0])
    assert source.manifest.num_tokens == uneven[1].num_tokens
    clone = pickle.loads(pickle.dumps(source))
    assert clone.location == source.location and clone._manifest is None


def test_manifest_that_lies_about_a_shard_is_an_error(uneven, tmp_path):
    import shutil

    path = tmp_path / "lying"
    shutil.copytree(uneven[0], path)
    doc = json.loads((path / "index.json").read_text())
    doc["shards"][0]["num_tokens"] += 5
    doc["num_tokens"] += 5
    (path / "index.json").write_text(json.dumps(doc))
    options = StreamOptions(seq_len=15, batch_size=1, shuffle_buffer=0)
    with pytest.raises(CorruptShardError, match="not of one write"):  # index.compact is stale
        SliceStream(path, options)
    (path / "index.compact").unlink()  # as a dataset of an earlier release has it
    with pytest.raises(CorruptShardError, match="manifest says"):
        for worker in range(4):
            take(SliceStream(path, options, worker=worker, num_workers=4), None)


def test_dataset_too_small_for_the_job_is_a_clear_error(one_shard):
    with pytest.raises(ShardtokError, match="fewer ranks"):
        SliceStream(one_shard[0], StreamOptions(seq_len=4000, batch_size=8), world_size=4)
