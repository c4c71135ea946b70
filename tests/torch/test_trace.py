"""``ShardStreamDataset.trace``: the step's documents are the batch a DataLoader / ShardLoader
yields, from the start or from a loader's (or a dataset's) saved state."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.errors import UsageError
from shardtok.torch import ShardLoader, ShardStreamDataset
from shardtok.torch.loader.saved import loader_state
from tests.helpers.masked import Known
from tests.helpers.provenance import assert_reproduces, shard_documents

OPTIONS = dict(seq_len=31, batch_size=3, shuffle_buffer=8, seed=7)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("trace_torch")
    rng = np.random.default_rng(8)
    web = Known([int(n) for n in rng.integers(1, 100, size=150)], first=1)
    sft = Known([int(n) for n in rng.integers(2, 50, size=120)], first=30_000, seed=3)
    return [
        str(web.write(root / "web", masked=False, shard_size=2500)),
        str(sft.write(root / "sft", masked=True)),
    ]


def test_a_mix_through_a_shard_loader_and_its_state(folders):
    dataset = ShardStreamDataset(
        {folders[0]: 0.5, folders[1]: 0.5}, num_batches=8, rank=1, world_size=2, **OPTIONS
    )
    read = shard_documents(dataset.sources)
    loader = ShardLoader(dataset, num_workers=2)
    batches, state = [], None
    for step, batch in enumerate(loader, start=1):
        batches.append(batch)
        if step == 3:
            state = loader.state_dict()
    assert len(batches) == 8
    for step in (1, 2, 8):
        assert_reproduces(dataset.trace(step, num_workers=2), batches[step - 1], read)
    for step in (4, 7):
        trace = dataset.trace(step, num_workers=2, state=state)
        assert trace["state_steps"] == 3 and trace["worker"] == (step - 1) % 2
        assert_reproduces(trace, batches[step - 1], read)
    with pytest.raises(UsageError, match="taken before the state"):
        dataset.trace(3, num_workers=2, state=state)


def test_one_dataset_in_process_from_its_own_state(folders):
    dataset = ShardStreamDataset(folders[1], rank=0, world_size=2, packing="greedy", **OPTIONS)
    read = shard_documents(dataset.sources)
    batches, state = [], None
    for step, batch in enumerate(dataset, start=1):
        batches.append(batch)
        if step == 2:
            state = dataset.state_dict()
    assert_reproduces(dataset.trace(len(batches), num_workers=0), batches[-1], read)
    trace = dataset.trace(4, state=state)
    assert trace["state_steps"] == 2
    assert_reproduces(trace, batches[3], read)
    # what ShardLoader(dataset, num_workers=0).state_dict() holds: the same position
    assert dataset.trace(4, state=loader_state(0, 0, [state])) == trace
