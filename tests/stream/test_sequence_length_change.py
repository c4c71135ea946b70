"""A resume with another sequence length: the remainder rule cuts the rows anew from what the old
ones left, so no token is served twice and none is lost beyond the leftover the plan reports.
Every token id is unique within its source (tests/helpers/stages.py)."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import mix_spec
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, WorkerState, parse_saved
from tests.helpers.stages import BASES, SIZES, write_sources

BASE = dict(batch_size=2, shuffle_buffer=8, seed=3)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("seq_len"))


def real_tokens(batches, source=None, padded=False) -> np.ndarray:
    """The tokens the batches trained on (inputs and each row's last target; with `padded`,
    greedy's padding, id 0, dropped, and token 0 with it), of `source` when given."""
    out = []
    for batch in batches:
        rows = np.concatenate([batch["input_ids"], batch["labels"][:, -1:]], axis=1)
        for row, owner in zip(rows, batch["source_ids"]):
            if source is None or owner == source:
                out.append(row[row > 0] if padded else row)
    return np.concatenate(out)


def saved_states(setup, steps, world=1, workers=1):
    """Every (rank, worker)'s batches and dataset state after `steps` steps of each rank."""
    batches, states = [], []
    for rank in range(world):
        streams = [setup.stream(Placement(rank, world, w, workers), epoch=0) for w in
                   range(workers)]  # fmt: skip
        batches += [next(streams[t % workers]) for t in range(steps)]
        states += [WorkerState(0, Placement(rank, world, w, workers), s.state_dict(),
                               setup.fingerprint).to_dict() for w, s in enumerate(streams)]  # fmt: skip
    return batches, states


@pytest.mark.parametrize("packing", ["concat", "greedy"])
@pytest.mark.parametrize(("old", "new"), [(15, 31), (31, 7)])
def test_one_dataset_goes_on_with_rows_of_the_new_length(paths, packing, old, new):
    """The states of 2 ranks x 1 worker, resumed by 1 rank x 2 workers with another seq_len:
    the tokens before and after hold none twice, and concat accounts for every token."""
    before_setup = StreamSetup.single(
        DatasetSource(paths[0]), StreamOptions(seq_len=old, packing=packing, **BASE)
    )
    before, states = saved_states(before_setup, 5, world=2)
    merged = parse_saved(merge_states(states))
    assert merged.layout["was"] == {"seq_len": old, "stride": None, "batch_size": 2}
    after_setup = StreamSetup.single(
        DatasetSource(paths[0]), StreamOptions(seq_len=new, packing=packing, **BASE)
    )
    after_setup.check_saved(merge_states(states))  # the fingerprint lets the length change
    after, unread = [], 0
    for w in range(2):
        stream = after_setup.stream(Placement(0, 1, w, 2), epoch=0, resume=merged)
        rows = list(stream)
        assert rows and {b["input_ids"].shape[1] for b in rows} == {new}
        after += rows
        unread = stream.plan.tokens_unread
    padded = packing == "greedy"
    seen = np.concatenate([real_tokens(before, padded=padded), real_tokens(after, padded=padded)])
    assert len(np.unique(seen)) == len(seen), "a token twice"
    if packing == "concat":  # every token: read before, after, or the reported leftover
        assert len(seen) + unread == SIZES[0]
    else:  # greedy also leaves its padding surplus of sequences unread, as in any epoch
        assert len(seen) > 0.9 * SIZES[0]


def test_a_mix_goes_on_with_rows_of_the_new_length(paths):
    spec = mix_spec({paths[0]: 0.6, paths[1]: 0.4})
    old = StreamSetup.mixed(spec, StreamOptions(seq_len=15, packing="concat", **BASE))
    before, states = saved_states(old, 6, workers=2)
    new = StreamSetup.mixed(spec, StreamOptions(seq_len=23, packing="concat", **BASE))
    merged = new.check_saved(merge_states(states))
    after = []
    for w in range(3):
        stream = new.stream(Placement(0, 1, w, 3), epoch=0, resume=merged, num_batches=30)
        after += list(stream)
    assert {b["input_ids"].shape[1] for b in after} == {23}
    for source in (0, 1):
        seen = np.concatenate([real_tokens(before, source), real_tokens(after, source)])
        seen = seen[(seen >= BASES[source]) & (seen < BASES[source] + SIZES[source])]
        assert len(np.unique(seen)) == len(seen), f"source {source}: a token twice"


def test_one_workers_state_with_another_length_names_the_way(paths):
    """A state of one worker among several cannot cut the rows anew alone: the refusal names
    the call that takes every worker's state."""
    old = StreamSetup.single(DatasetSource(paths[0]), StreamOptions(seq_len=15, **BASE))
    _, states = saved_states(old, 3, world=2)
    new = StreamSetup.single(DatasetSource(paths[0]), StreamOptions(seq_len=31, **BASE))
    with pytest.raises(ResumeStateError, match=r"option seq_len: 15 saved, 31 now \(a resume"):
        new.check_saved(states[0])


def test_the_cli_continues_every_ranks_file_with_another_length(paths, tmp_path):
    """`shardtok stream --state-in` with both ranks' files, a new --seq-len and --batch-size:
    the batches the merged state streams, no token twice."""
    from shardtok.cli.main import main

    common = ["stream", paths[0], "--shuffle-buffer", "8", "--seed", "3"]
    for rank in range(2):
        assert main([*common, "--seq-len", "15", "--batch-size", "2", "--rank", str(rank),
                     "--world-size", "2", "--max-batches", "5",
                     "--state-out", str(tmp_path / f"r{rank}.json")]) == 0  # fmt: skip
    rest = tmp_path / "rest.npz"
    assert main([*common, "--seq-len", "31", "--batch-size", "3", "--max-batches", "6",
                 "--state-in", str(tmp_path / "r0.json"), "--state-in", str(tmp_path / "r1.json"),
                 "--dump", str(rest)]) == 0  # fmt: skip
    old = StreamSetup.single(DatasetSource(paths[0]), StreamOptions(seq_len=15, **BASE))
    before, states = saved_states(old, 5, world=2)
    new = StreamSetup.single(
        DatasetSource(paths[0]), StreamOptions(seq_len=31, **{**BASE, "batch_size": 3})
    )
    stream = new.stream(
        Placement(0, 1, 0, 1), epoch=0, resume=new.check_saved(merge_states(states))
    )
    expected = [next(stream) for _ in range(6)]
    got = np.load(rest)["input_ids"]
    assert got.shape == (6, 3, 31)
    assert np.array_equal(got, np.stack([b["input_ids"] for b in expected]))
    seen = np.concatenate([real_tokens(before), real_tokens(expected)])
    assert len(np.unique(seen)) == len(seen)
