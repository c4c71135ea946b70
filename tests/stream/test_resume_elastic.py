"""Elastic resume: finish an epoch with another world size or number of workers.

Tokens are their global positions, so coverage is exact: the batches yielded before the save
(old layout) plus those after (new layout) hold every token of the epoch at most once, and for
concat exactly once except the reported leftover.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream.options import StreamOptions
from shardtok.stream.remainder import ElasticStream
from shardtok.stream.resume.merge import merge_states
from shardtok.testing.save_restore import check_save_restore
from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardStreamDataset, dataset_states

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
OPTIONS = dict(seq_len=31, batch_size=3, shuffle_buffer=20, seed=9, bfd_window=16)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("elastic")
    lengths = [int(n) for n in np.random.default_rng(2).integers(1, 150, size=260)]
    lengths[40] = 2000  # a document longer than several sequences
    write_synthetic_dataset(
        path, lengths=lengths, vocab_size=1 << 24, unique_tokens=True, first_token=1,
        shard_size=2600, frame_size=700,
    )  # fmt: skip
    return str(path), sum(lengths)


def tokens_of(batches) -> np.ndarray:
    """Real tokens of each row (inputs plus the last target); 0 is padding (ids start at 1)."""
    rows = [np.concatenate([b["input_ids"], b["labels"][:, -1:]], axis=1) for b in batches]
    flat = np.concatenate([r.ravel() for r in rows]) if rows else np.empty(0, np.int64)
    return flat[flat > 0]


def run_old_layout(path, packing, world, workers, steps):
    """`steps` batches on every rank of the old layout; returns batches and every worker state."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    batches, states = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rank in range(world):
            ds = ShardStreamDataset(path, **OPTIONS, packing=packing, rank=rank, world_size=world)
            loader = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
            it = iter(loader)
            for _ in range(steps):
                batches.append(
                    {
                        k: v.numpy().copy()
                        for k, v in next(it).items()
                        if isinstance(v, torch.Tensor)
                    }
                )
            states += dataset_states(loader.state_dict())
            del it, loader
    return batches, json.loads(json.dumps(states))  # as a checkpoint file would hold them


def run_new_layout(path, packing, merged, world, workers):
    from torch.utils.data import DataLoader

    batches, counts = [], []
    for rank in range(world):
        ds = ShardStreamDataset(path, **OPTIONS, packing=packing, rank=rank, world_size=world)
        ds.load_state_dict(merged)
        mine = [{k: v.numpy() for k, v in b.items() if isinstance(v, torch.Tensor)}
                for b in DataLoader(ds, batch_size=None, num_workers=workers)]  # fmt: skip
        counts.append(len(mine))
        batches += mine
    return batches, counts


@pytest.mark.parametrize(
    "packing, old, new",
    [
        ("concat", (2, 2), (3, 0)),
        ("concat", (1, 0), (2, 2)),
        ("greedy", (2, 2), (1, 0)),
        ("greedy", (1, 2), (3, 1)),
        ("bfd", (2, 2), (1, 0)),
        ("bfd", (1, 2), (3, 1)),
    ],
)
def test_another_layout_finishes_the_epoch_without_repeat_or_skip(dataset, packing, old, new):
    path, total = dataset
    before, states = run_old_layout(path, packing, *old, steps=5)
    merged = merge_states(states)
    after, counts = run_new_layout(path, packing, merged, *new)
    assert len(set(counts)) == 1 and counts[0] > 0  # every new rank: the same batch count
    seen = np.concatenate([tokens_of(before), tokens_of(after)])
    assert len(np.unique(seen)) == len(seen), "a token was read twice"
    assert seen.max() <= total
    world, workers = new
    plan = ElasticStream(
        DatasetSource(path), StreamOptions(**OPTIONS, packing=packing), merged["elastic"],
        epoch=0, rank=0, world_size=world, worker=0, num_workers=max(workers, 1),
    ).plan  # fmt: skip
    missing = total - len(seen)
    if packing == "concat":  # exactly the reported leftover is unread
        assert missing == plan.tokens_unread
    else:  # greedy, bfd: the sequences its padding displaced are not yielded (as in any epoch)
        padding = sum(b["input_ids"].size + len(b["input_ids"]) for b in after) - len(
            tokens_of(after)
        )
        slices = world * max(workers, 1)
        assert plan.tokens_unread <= missing <= padding + slices * OPTIONS["batch_size"] * 32


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_remainder_streams_save_and_restore(dataset, packing):
    path, _ = dataset
    _, states = run_old_layout(path, packing, 2, 2, steps=3)
    elastic = merge_states(states)["elastic"]
    options = StreamOptions(**OPTIONS, packing=packing)
    check_save_restore(
        lambda: ElasticStream(
            DatasetSource(path),
            options,
            elastic,
            epoch=0,
            rank=1,
            world_size=3,
            worker=0,
            num_workers=1,
        ),  # fmt: skip
        midpoints=(0, 1, 4, -1),
    )


def test_merge_refuses_what_it_cannot_resume(dataset, tmp_path):
    path, _ = dataset
    _, states = run_old_layout(path, "concat", 2, 2, steps=3)
    with pytest.raises(ResumeStateError, match=r"slices \[2\].*missing"):
        merge_states(states[:2] + states[3:])
    with pytest.raises(ResumeStateError, match="twice"):
        merge_states(states + states[:1])
    with pytest.raises(ResumeStateError, match="different epochs"):
        merge_states([*states[:3], {**states[3], "epoch": 1}])
    single = ShardStreamDataset(path, **OPTIONS, rank=0, world_size=3)
    with pytest.raises(ResumeStateError, match="merge_states"):  # an old state, a new layout
        single.load_state_dict(states[0])
        next(iter(single))
    other = tmp_path / "other"
    write_synthetic_dataset(other, num_tokens=20_000, vocab_size=1000, mean_length=50)
    mix_state = ShardStreamDataset(
        {path: 1, str(other): 1}, **OPTIONS, num_batches=4, allow_mixed_tokenizers=True
    )
    next(iter(mix_state))
    merged_mix = merge_states([mix_state.state_dict()])
    with pytest.raises(ResumeStateError, match="2 sources saved, 1 now"):
        ShardStreamDataset(path, **OPTIONS).load_state_dict(merged_mix)
    with pytest.raises(ResumeStateError, match="cannot resume a single dataset"):
        ShardStreamDataset(path, **OPTIONS).load_state_dict(merged_mix, strict=False)


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory, dataset):
    """The dataset above (ids from 1) and a smaller one with ids from 10,000,000."""
    path = tmp_path_factory.mktemp("elastic_mix_b")
    lengths = [int(n) for n in np.random.default_rng(3).integers(1, 90, size=120)]
    write_synthetic_dataset(
        path, lengths=lengths, vocab_size=1 << 24, unique_tokens=True, first_token=10_000_000,
        shard_size=1500, frame_size=700,
    )  # fmt: skip
    return [dataset[0], str(path)], [dataset[1], sum(lengths)]


@pytest.mark.parametrize("packing", ["concat", "greedy"])
def test_a_mix_finishes_its_source_epochs_in_another_layout(two_sources, packing):
    """Old: 1 rank x 2 workers; new: 3 ranks x 1 worker. Per source, the tokens read before the
    save plus the new workers' remainder sequences hold no token twice and (concat) all but at
    most a window per new slice of the old workers' current epochs."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    paths, totals = two_sources
    mix = dict(zip(paths, [0.6, 0.4]))
    ds = ShardStreamDataset(mix, **OPTIONS, packing=packing, num_batches=40)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader)
        before = [
            {k: v.numpy().copy() for k, v in next(it).items() if isinstance(v, torch.Tensor)}
            for _ in range(7)
        ]
        merged = merge_states(json.loads(json.dumps(dataset_states(loader.state_dict()))))
        del it, loader
    epochs = {e["epoch"] for per_slice in merged["elastic_mix"]["sources"] for e in per_slice}
    assert epochs == {0}  # every old worker is in its first epoch of both sources
    seen = tokens_of(before)
    options = StreamOptions(**OPTIONS, packing=packing)
    from shardtok.stream.mix.spec import mix_spec
    from shardtok.stream.mix.stream import MixedStream

    spec = mix_spec(mix)
    remainder: list[list[np.ndarray]] = [[], []]
    for rank in range(3):
        stream = MixedStream(spec, options, rank=rank, world_size=3, elastic=merged["elastic_mix"])
        for i, source in enumerate(stream.mixer.sources):
            while True:
                row = np.empty(source.window, dtype=np.int64)
                starts, length = source.next_into(row)
                if not source.in_remainder:  # this one already belongs to the next epoch
                    assert source.epoch == 1
                    break
                remainder[i].append(row[:length])
    for i, (low, high) in enumerate(((1, 10_000_000), (10_000_000, 1 << 24))):
        mine = seen[(seen >= low) & (seen < high)]
        got = np.concatenate([mine, *remainder[i]])
        assert len(np.unique(got)) == len(got), f"source {i}: a token read twice"
        missing = totals[i] - len(got)
        if packing == "concat":
            assert 0 <= missing < 3 * 32, f"source {i}: {missing} tokens skipped"
        else:
            assert missing == 0, f"source {i}: {missing} tokens skipped"  # greedy flushes all
    # the same through the torch dataset: 3 new ranks yield their batches, one source per row
    new = ShardStreamDataset(mix, **OPTIONS, packing=packing, num_batches=5, rank=2, world_size=3)
    new.load_state_dict(merged)
    again = ShardStreamDataset(mix, **OPTIONS, packing=packing, num_batches=5, rank=2, world_size=3)
    again.load_state_dict(new.state_dict())  # saved before its first batch: still the remainder
    first, second = list(new), list(again)
    assert len(first) == 5
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, second))


def test_an_elastic_mix_saves_and_restores(two_sources):
    paths, _ = two_sources
    from torchdata.stateful_dataloader import StatefulDataLoader

    from shardtok.stream.mix.spec import mix_spec
    from shardtok.stream.mix.stream import MixedStream

    mix = dict(zip(paths, [0.5, 0.5]))
    ds = ShardStreamDataset(mix, **OPTIONS, num_batches=40)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader)
        for _ in range(5):
            next(it)
        merged = merge_states(dataset_states(loader.state_dict()))
        del it, loader
    check_save_restore(
        lambda: MixedStream(
            mix_spec(mix),
            StreamOptions(**OPTIONS),
            rank=1,
            world_size=2,
            num_batches=30,
            elastic=merged["elastic_mix"],
        ),  # fmt: skip
        midpoints=(0, 3, 17, -1),
    )


def test_cli_finishes_an_epoch_with_another_layout(dataset, tmp_path, capsys):
    """Two ranks x 2 workers save after 5 batches each; one process (1 worker) continues from
    both files: every token at most once, and all but what does not fill a last batch."""
    from shardtok.cli.main import run as main

    path, total = dataset
    common = ["stream", path, "--seq-len", "31", "--batch-size", "3", "--shuffle-buffer", "20",
              "--seed", "9"]  # fmt: skip
    dumps = []
    for rank in range(2):
        dump, state = tmp_path / f"r{rank}.npz", tmp_path / f"r{rank}.json"
        assert main([*common, "--rank", str(rank), "--world-size", "2", "--num-workers", "2",
                     "--max-batches", "5", "--dump", str(dump), "--state-out", str(state)]) == 0  # fmt: skip
        dumps.append(dump)
    rest = tmp_path / "rest.npz"
    assert main([*common, "--state-in", str(tmp_path / "r0.json"),
                 "--state-in", str(tmp_path / "r1.json"), "--dump", str(rest)]) == 0  # fmt: skip
    capsys.readouterr()

    def tokens(npz) -> np.ndarray:
        data = np.load(npz)
        return np.concatenate([data["input_ids"], data["labels"][..., -1:]], axis=-1).ravel()

    seen = np.concatenate([tokens(d) for d in [*dumps, rest]])
    assert len(np.unique(seen)) == len(seen)
    assert 0 <= total - len(seen) < (3 + 1) * 32  # (batch_size + 1) windows, as any epoch
    with pytest.raises(ResumeStateError, match="missing"):  # one rank's file is not enough
        main([*common, "--state-in", str(tmp_path / "r0.json"), "--max-batches", "1"])


@pytest.mark.parametrize("kind", ["single", "epochs", "mix"])
def test_a_trace_refuses_a_state_streamed_on_from_a_merge(two_sources, kind):
    """Such streams count batches from the merge without its step: no step can be placed
    (epochs: one epoch's states merged, then run on into further epochs with num_batches)."""
    from shardtok.stream import StreamSetup, mix_spec
    from shardtok.stream.provenance import trace_step
    from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved

    paths, _ = two_sources
    options = StreamOptions(**OPTIONS)
    if kind == "mix":
        setup = StreamSetup.mixed(mix_spec(dict(zip(paths, [0.5, 0.5]))), options)
    else:
        setup = StreamSetup.single(DatasetSource(paths[0]), options)
    count = 40 if kind == "mix" else None
    states = []
    for worker in range(2):
        stream = setup.stream(Placement(0, 1, worker, 2), epoch=0, num_batches=count)
        for _ in range(3):
            next(stream)
        states.append(WorkerState(0, Placement(0, 1, worker, 2), stream.state_dict(),
                                  setup.fingerprint).to_dict())  # fmt: skip
    merged = parse_saved(merge_states(states))
    count = 40 if kind == "epochs" else count
    stream = setup.stream(Placement(0, 1, 0, 1), epoch=0, resume=merged, num_batches=count)
    next(stream)
    state = WorkerState(0, Placement(0, 1, 0, 1), stream.state_dict(), setup.fingerprint)
    with pytest.raises(ResumeStateError, match="elastic resume"):
        trace_step(setup, step=9, rank=0, world_size=1, num_workers=0, num_batches=count,
                   state=state.to_dict())  # fmt: skip
