"""Curriculum stages through the torch adapter: ``from_config`` runs every stage, ShardLoader
resumes exactly right before and after a stage boundary, elastic resume, one stage alone."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream.factory import StreamSetup
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.resume.merge import merge_states
from shardtok.stream.resume.saved import Placement, parse_saved
from shardtok.torch import ShardLoader, ShardStreamDataset
from tests.helpers.stages import OPTIONS, config, write_config, write_sources

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
STEPS = 10


@pytest.fixture(scope="module")
def stages_yaml(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_stages")
    paths = write_sources(root)
    return write_config(root / "stages.yaml", config(paths)), paths


def arrays(batch: dict) -> dict:
    return {k: v.numpy().copy() for k, v in batch.items() if isinstance(v, torch.Tensor)}


def assert_same(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for t, (a, b) in enumerate(zip(got, expected)):
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert np.array_equal(a[key], b[key]), (t, key)


def test_loader_resumes_exactly_at_a_stage_boundary(stages_yaml):
    path, _ = stages_yaml
    dataset = ShardStreamDataset.from_config(path, num_batches=STEPS)
    assert dataset.curriculum is not None and len(dataset.curriculum.stages) == 3
    loader = ShardLoader(dataset, num_workers=2)
    whole, states = [], {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader:
            whole.append(arrays(batch))
            if len(whole) in (6, 7):  # stage 'code' begins at step 7 (0-based 6)
                states[len(whole)] = loader.state_dict()
        assert len(whole) == STEPS
        for k, state in states.items():
            again = ShardLoader(ShardStreamDataset.from_config(path, num_batches=STEPS), 2)
            again.load_state_dict(state)
            assert_same(whole[:k] + [arrays(b) for b in again], whole)
    # in process (no workers): the dataset's own state, and the same batches a 1-worker rank has
    single = ShardStreamDataset.from_config(path, num_batches=STEPS)
    it = iter(single)
    first = [arrays(next(it)) for _ in range(7)]
    rest = ShardStreamDataset.from_config(path, num_batches=STEPS)
    rest.load_state_dict(single.state_dict())
    curriculum = load_curriculum(path)
    setup = StreamSetup.staged(curriculum, StreamOptions(**curriculum.options))
    expected = take(setup.stream(Placement(0, 1, 0, 1), epoch=0, num_batches=STEPS))
    assert_same(first + [arrays(b) for b in rest], expected)


def test_merged_stages_resume_in_a_loader_with_other_workers(stages_yaml):
    """Two ranks save after 5 steps (inside stage 'blend'); one rank with 2 workers continues."""
    path, _ = stages_yaml
    states = []
    for rank in range(2):
        old = ShardStreamDataset.from_config(path, num_batches=STEPS, rank=rank, world_size=2)
        it = iter(old)
        for _ in range(5):
            next(it)
        states.append(old.state_dict())
    merged = merge_states(states)
    assert merged["kind"] == "merged_stages" and (merged["stage"], merged["step"]) == (1, 5)
    new = ShardStreamDataset.from_config(path, num_batches=6)
    new.load_state_dict(merged)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [arrays(b) for b in ShardLoader(new, num_workers=2)]
    setup = new.setup
    streams = [setup.stream(Placement(0, 1, w, 2), epoch=0, num_batches=3,
                            resume=parse_saved(merged)) for w in range(2)]  # fmt: skip
    assert_same(got, [next(streams[t % 2]) for t in range(6)])


def test_one_stage_and_stage_alone_are_plain_mixes(stages_yaml, tmp_path):
    path, paths = stages_yaml
    with pytest.raises(UsageError, match="curriculum stages need num_batches"):
        ShardStreamDataset.from_config(path)
    staged = ShardStreamDataset.from_config(path, num_batches=4)
    next(iter(staged))
    state = staged.state_dict()
    alone = ShardStreamDataset.from_config(path, stage="code", num_batches=4)
    assert alone.curriculum is None and alone.options.seed == 77
    with pytest.raises(ResumeStateError, match="saved for 3 curriculum stages, now one"):
        alone.load_state_dict(state)
    with pytest.raises(ResumeStateError, match="cannot resume one dataset or mix"):
        alone.load_state_dict(merge_states([state]), strict=False)
    one = config(paths)
    one["data_stages"] = [{**one["data_stages"][2], "start_training_step": 1}]
    one_stage = ShardStreamDataset.from_config(write_config(tmp_path / "one.yaml", one),
                                               num_batches=4)  # fmt: skip
    assert one_stage.curriculum is None and one_stage.mix is not None
    spec = load_curriculum(one).stages[0].mix
    today = MixedStream(spec, StreamOptions(**{**OPTIONS, "seed": 77}), num_batches=4)
    assert_same([arrays(b) for b in one_stage], take(today))
    assert one_stage.state_dict()["stream"]["kind"] == "mixed_stream"


def test_a_loader_streams_each_stage_in_its_own_length_and_resumes(stages_yaml, tmp_path):
    """Stage 'blend' packs 31-token rows, 'code' 7-token ones: 2 workers (batches in shared
    memory where their size fits) give the in-process batches, and resume exactly across."""
    _, paths = stages_yaml
    data = config(paths, "continue")
    data["data_stages"][1]["data"]["seq_len"] = 31
    data["data_stages"][2]["data"]["seq_len"] = 7
    path = write_config(tmp_path / "lengths.yaml", data)
    curriculum = load_curriculum(path)
    setup = StreamSetup.staged(curriculum, StreamOptions(**curriculum.options))
    streams = [setup.stream(Placement(0, 1, w, 2), epoch=0, num_batches=STEPS // 2)
               for w in range(2)]  # fmt: skip
    expected = [next(streams[t % 2]) for t in range(STEPS)]
    assert [b["input_ids"].shape[1] for b in expected] == [15] * 3 + [31] * 3 + [7] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = ShardLoader(ShardStreamDataset.from_config(path, num_batches=STEPS), 2)
        got, state = [], None
        for batch in loader:
            got.append(arrays(batch))
            if len(got) == 5:
                state = loader.state_dict()
        assert_same(got, expected)
        again = ShardLoader(ShardStreamDataset.from_config(path, num_batches=STEPS), 2)
        again.load_state_dict(state)
        assert_same(got[:5] + [arrays(b) for b in again], expected)
