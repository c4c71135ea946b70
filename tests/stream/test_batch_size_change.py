"""A resume with another batch size: every worker continues the same rows, in batches of the
new size (the rule in docs/RESUME.md, "Changing the layout at a resume")."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.spec import mix_spec
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.saved import Placement
from shardtok.torch import ShardStreamDataset
from tests.helpers.stages import write_sources

BASE = dict(seq_len=15, shuffle_buffer=8, seed=3)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("batch_size"))


def rows(batches) -> np.ndarray:
    return np.concatenate(
        [np.concatenate([b["input_ids"], b["labels"][:, -1:]], 1) for b in batches]
    )


def stream(setup, worker=0, workers=1, resume=None, num_batches=None):
    out = setup.stream(
        Placement(0, 1, worker, workers), epoch=0, resume=resume, num_batches=num_batches
    )
    return out


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
@pytest.mark.parametrize("kind", ["epoch", "epochs", "mix"])
@pytest.mark.parametrize(("before", "after"), [(2, 5), (6, 4)])
def test_the_rows_go_on_in_batches_of_the_new_size(paths, packing, kind, before, after):
    """k batches of `before` rows, a state, batches of `after` rows: the rows of the run that
    never stopped, and an epoch ends where its rows run out (0 workers, and each of 2)."""
    data = DatasetSource(paths[0]) if kind != "mix" else mix_spec({paths[0]: 0.6, paths[1]: 0.4})
    num_batches = {"epoch": None, "epochs": 200, "mix": 60}[kind]
    first = StreamSetup.of(data, StreamOptions(batch_size=before, packing=packing, **BASE))
    second = StreamSetup.of(data, StreamOptions(batch_size=after, packing=packing, **BASE))
    for worker, workers in [(0, 1), (1, 2)]:
        whole = list(stream(first, worker, workers, num_batches=num_batches))
        k = 7
        head = stream(first, worker, workers, num_batches=num_batches)
        taken = [next(head) for _ in range(k)]
        state = head.state_dict()
        tail = stream(second, worker, workers, resume=state, num_batches=num_batches)
        rest = list(tail)
        assert {len(b["input_ids"]) for b in rest} == {after}
        got, want = rows(taken + rest), rows(whole)
        n = min(len(got), len(want))
        if kind != "mix":  # an epoch's rows end where the smallest slice's do
            planned = first.plan(epoch=0, world_size=1, num_workers=workers).min_sequences
            n = k * before + (planned - k * before) // after * after
        if kind == "epoch":
            assert len(got) == n and len(tail) == k + (planned - k * before) // after
        else:  # num_batches counts batches (steps), whatever their size
            assert len(rest) == num_batches - k
        same = min(n, len(want))
        if kind != "mix":  # a batch size that fits the epoch's rows better reads more of it
            same = min(n, planned // before * before)
        assert np.array_equal(got[:same], want[:same])
        if kind == "epochs":  # then the next epoch, in batches of the new size from its start
            nxt = second.stream(Placement(0, 1, worker, workers), epoch=1)
            following = rows([next(nxt) for _ in range(3)])
            assert np.array_equal(got[n : n + len(following)], following)


def test_a_dataset_resumes_with_another_batch_size(paths):
    """ShardStreamDataset.load_state_dict takes a state saved with another batch size."""
    ds = ShardStreamDataset(paths[1], batch_size=4, **BASE)
    batches = iter(ds)
    taken = [next(batches) for _ in range(5)]
    state = ds.state_dict()
    whole = list(ShardStreamDataset(paths[1], batch_size=4, **BASE))
    bigger = ShardStreamDataset(paths[1], batch_size=6, **BASE)
    bigger.load_state_dict(state)
    rest = list(bigger)
    got = np.concatenate([b["input_ids"].numpy() for b in taken + rest])
    want = np.concatenate([b["input_ids"].numpy() for b in whole])
    n = min(len(got), len(want))
    assert n >= len(want) - 6 and np.array_equal(got[:n], want[:n])
