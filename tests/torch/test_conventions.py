"""PyTorch habits that must not misfire silently: a DataLoader that batches on its own, a
state asked of the main process after workers streamed, a trace without its layout."""

from __future__ import annotations

from itertools import islice

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardtok.errors import ResumeStateError, UsageError
from shardtok.torch import ShardLoader, ShardStreamDataset
from tests.helpers.masked import Known

KNOWN = Known([int(n) for n in np.random.default_rng(5).integers(2, 40, size=120)], first=1)
OPTIONS = dict(seq_len=32, shuffle_buffer=16, seed=1)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(KNOWN.write(tmp_path_factory.mktemp("conventions") / "ds", masked=False))


# -- DataLoader(ds, batch_size=N) -------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_batching_whole_batches_again_is_refused_in_one_line(path, workers):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    batches = iter(DataLoader(ds, batch_size=8, num_workers=workers))
    with pytest.raises(UsageError) as raised:
        next(batches)
    last = str(raised.value).splitlines()[-1]  # a worker's error comes with torch's preamble
    # torch ends its workers at `del`; left to a later collection, it waits 5 s for each, in
    # whichever test that is. The exception's traceback holds torch's frames, and they the
    # iterator, in a cycle only a collection breaks: drop it, and `del` frees the iterator.
    raised.value.__traceback__ = None
    del batches, raised
    assert "DataLoader(ds, batch_size=None" in last and "without batch_size" in last


@pytest.mark.parametrize("workers", [0, 2])
def test_without_batch_size_the_dataloader_batches_sequences(path, workers):
    # 24 sequences a rank, all taken: torch's workers end with them (a DataLoader iterator
    # left early waits up to 5 s per worker when it is collected, in whichever test that is).
    ds = ShardStreamDataset(path, labels_format="shifted", num_batches=24, **OPTIONS)
    batches = list(DataLoader(ds, batch_size=4, num_workers=workers))
    rows = _round_robin(path, max(workers, 1), count=6)
    assert sum(len(b["input_ids"]) for b in batches) == len(rows) == 24
    flat = {k: torch.cat([b[k] for b in batches]) for k in ("input_ids", "labels", "position_ids")}
    for key in flat:
        assert torch.equal(flat[key], torch.cat([r[key] for r in rows])), key
    first = batches[0]
    assert first["input_ids"].shape == (4, 32) and first["use_cache"] is False
    assert torch.equal(first["shift_labels"], first["labels"])
    assert first["num_trained_tokens"].shape == (4,)
    assert "cu_seqlens" not in first  # a whole batch's; per sequence it cannot be collated


def _round_robin(path, workers, count, batch_size=4):
    """The rows of the first `count` batches a DataLoader with `workers` workers yields: each
    worker batches its own rows, and the loader takes their batches in turn."""
    batches = []
    for w in range(workers):
        ds = ShardStreamDataset(path, batch_size=1, labels_format="shifted", **OPTIONS)
        ds._worker_slot = (w, workers)
        rows = list(islice(ds, count * batch_size))
        batches.append([rows[i : i + batch_size] for i in range(0, len(rows), batch_size)])
    out = []
    for i in range(max(map(len, batches))):
        out += [row for each in batches if i < len(each) for row in each[i]]
    return out[: count * batch_size]


def test_sequences_need_their_label_format_named(path):
    with pytest.raises(UsageError, match="labels_format='hf' for Hugging Face"):
        ShardStreamDataset(path, **OPTIONS)


def test_shard_loader_refuses_a_dataset_of_sequences(path):
    ds = ShardStreamDataset(path, labels_format="hf", **OPTIONS)
    with pytest.raises(UsageError, match="give the ShardStreamDataset batch_size"):
        ShardLoader(ds, num_workers=2)


def test_sequences_resume_exactly(path):
    ds = ShardStreamDataset(path, labels_format="hf", **OPTIONS)
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    state = ds.state_dict()
    rest = list(it)
    again = ShardStreamDataset(path, labels_format="hf", **OPTIONS)
    again.load_state_dict(state)
    got = list(again)
    assert len(got) == len(rest) and head
    for a, b in zip(got, rest):
        assert torch.equal(a["input_ids"], b["input_ids"])


# -- ds.state_dict() in the main process ------------------------------------------------------


def _peek(ds):
    return next(iter(DataLoader(ds, batch_size=None)))


def test_state_after_a_peek_then_loader_workers_is_refused(path):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    _peek(ds)
    for _ in zip(range(3), ShardLoader(ds, num_workers=2)):
        pass
    with pytest.raises(ResumeStateError, match="position lives in the workers"):
        ds.state_dict()


def test_state_after_a_peek_then_dataloader_workers_is_refused(path):
    # A few batches, all taken: torch's workers then end at once (a DataLoader iterator left
    # early waits up to 5 s per worker at its shutdown).
    ds = ShardStreamDataset(path, batch_size=4, num_batches=6, **OPTIONS)
    _peek(ds)
    assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == 6
    with pytest.raises(ResumeStateError, match="position lives in the workers"):
        ds.state_dict()


def test_state_after_workers_then_in_process_iteration_is_exact(path):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    for _ in zip(range(3), ShardLoader(ds, num_workers=2)):
        pass
    it = iter(ds)
    next(it), next(it)
    state = ds.state_dict()
    want = next(it)
    again = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    again.load_state_dict(state)
    assert torch.equal(next(iter(again))["input_ids"], want["input_ids"])


def test_state_loaded_after_workers_is_the_position(path):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    it = iter(ds)
    next(it)
    saved = ds.state_dict()
    for _ in zip(range(3), ShardLoader(ds, num_workers=2)):
        pass
    ds.load_state_dict(saved)
    assert ds.state_dict() == saved


# -- trace ------------------------------------------------------------------------------------


def test_trace_refuses_to_guess_the_worker_count(path):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    with pytest.raises(UsageError, match="pass num_workers=K as in training"):
        ds.trace(3)


def test_trace_learns_the_worker_count_from_a_loader_state(path):
    ds = ShardStreamDataset(path, batch_size=4, **OPTIONS)
    loader = ShardLoader(ds, num_workers=2)
    batches = []
    for step, batch in enumerate(loader, start=1):
        batches.append(batch["input_ids"].clone())
        if step == 2:
            state = loader.state_dict()
        if step == 5:
            break
    trace = ds.trace(5, state=state)
    assert trace["num_workers"] == 2
    assert trace == ds.trace(5, num_workers=2, state=state)
