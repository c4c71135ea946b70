"""Provenance traces: the documents a trace names, read back through the shard reader and through
export-megatron + megatron-core, reproduce the real batch of that step (concat and greedy, one
dataset and a mix with fine-tuning data, 0 and 2 workers, world size 2, after a resume)."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import ResumeStateError, UsageError
from shardtok.stream import StreamOptions, StreamSetup, mix_spec
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.provenance import trace_step
from shardtok.stream.resume.rank_state import RankState
from shardtok.stream.resume.saved import Placement
from tests.helpers.masked import Known
from tests.helpers.provenance import assert_reproduces, megatron_documents, shard_documents

RANK, WORLD = 1, 2
STEPS = 9  # streamed per case; the state is saved after SAVED of them
SAVED = 4
CASES = [("single", "concat"), ("single", "greedy"), ("mix", "concat"), ("mix", "greedy"),
         ("stages", "concat"), ("stages", "greedy"), ("restarting stages", "concat"),
         ("restarting stages", "greedy"), ("ramped stages", "concat"),
         ("resized stages", "concat"), ("resized stages", "greedy")]  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("trace")
    rng = np.random.default_rng(3)
    web = Known([int(n) for n in rng.integers(1, 120, size=160)], first=1)
    sft = Known([int(n) for n in rng.integers(2, 60, size=150)], first=20_000, seed=2)
    folders = [
        str(web.write(root / "web", masked=False, shard_size=2500)),
        str(sft.write(root / "sft", masked=True)),
    ]
    out = root / "megatron"
    out.mkdir()
    return folders, megatron_documents(folders, out)


def setup_of(folders, kind: str, packing: str) -> StreamSetup:
    options = StreamOptions(seq_len=31, batch_size=3, packing=packing, shuffle_buffer=8, seed=5)
    if kind == "single":
        return StreamSetup.single(DatasetSource(folders[0]), options)
    if kind.endswith("stages"):  # the mix starts at step 5: right after the saved state's step
        restart = kind.startswith("restarting")
        ramp = {"batch_size": 5} if kind.startswith("ramped") else {}  # the mix's own batches
        if kind.startswith("resized"):  # the mix's own window: web repacks the rest of its epoch
            ramp = {"seq_len": 15}
        stages = [
            {"data": {"dataset": {"dataset_path": folders[0]}}},
            {"start_training_step": SAVED + 1, "data": {**({"seed": 7} if restart else {}),
                **ramp, "dataset": {"dataset_path": {folders[1]: 0.5, folders[0]: 0.5}}}},
        ]  # fmt: skip
        switch = "restart" if restart else "continue"
        config = {"stage_switch": switch, "data_stages": stages}
        return StreamSetup.staged(load_curriculum(config), options)
    return StreamSetup.mixed(mix_spec({folders[0]: 0.6, folders[1]: 0.4}), options)


def stream_rank(setup: StreamSetup, workers: int):
    """This rank's batches in the loader's order, and the CLI state file after SAVED steps."""
    slots = max(workers, 1)
    streams = [setup.stream(Placement(RANK, WORLD, w, slots), epoch=0) for w in range(slots)]
    batches, state = [], None
    for t in range(STEPS):
        if t == SAVED:
            state = RankState(
                epoch=0, rank=RANK, world_size=WORLD, batches=t, next_worker=t % slots,
                workers=[s.state_dict() for s in streams], fingerprint=setup.fingerprint,
            ).to_dict()  # fmt: skip
        batches.append(next(streams[t % slots]))
    return batches, state


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("kind", "packing"), CASES)
def test_a_trace_names_the_documents_of_the_batch(data, kind, packing, workers):
    folders, megatron = data
    setup = setup_of(folders, kind, packing)
    batches, state = stream_rank(setup, workers)
    by_shards = shard_documents(list(setup.sources))
    documents = set()
    for step, saved in [(1, None), (2, None), (STEPS, None), (SAVED + 1, state), (STEPS, state)]:
        trace = trace_step(
            setup, step=step, rank=RANK, world_size=WORLD, num_workers=workers, state=saved
        )
        assert trace["worker"] == (step - 1) % max(workers, 1)
        assert trace["batch_size"] == len(batches[step - 1]["input_ids"])  # a stage's own
        assert trace["seq_len"] == batches[step - 1]["input_ids"].shape[1]
        rows = assert_reproduces(trace, batches[step - 1], by_shards)
        assert np.array_equal(rows, assert_reproduces(trace, batches[step - 1], megatron))
        documents |= {(s["source"], s["dataset_document"]) for q in trace["sequences"]
                      for s in q["segments"]}  # fmt: skip
    assert len(documents) >= 5
    sources = {q["source"] for t in range(1, STEPS + 1) for q in _trace(setup, t, workers)}
    assert sources == ({0} if kind == "single" else {0, 1})
    with pytest.raises(UsageError, match=f"step {SAVED} was taken before the state"):
        trace_step(setup, step=SAVED, rank=RANK, world_size=WORLD, num_workers=workers,
                   state=state)  # fmt: skip


def _trace(setup, step, workers):
    return trace_step(setup, step=step, rank=RANK, world_size=WORLD, num_workers=workers)[
        "sequences"
    ]


def test_steps_outside_the_stream_are_one_line_errors(data):
    folders, _ = data
    setup = setup_of(folders, "single", "concat")
    plan = setup.plan(epoch=0, world_size=WORLD, num_workers=2)
    last = plan.batches_per_rank
    trace_step(setup, step=last, rank=RANK, world_size=WORLD, num_workers=2)
    with pytest.raises(UsageError, match=f"{last:,} steps per epoch"):
        trace_step(setup, step=last + 1, rank=RANK, world_size=WORLD, num_workers=2)
    with pytest.raises(UsageError, match="count from 1"):
        trace_step(setup, step=0, rank=RANK, world_size=WORLD, num_workers=2)
    mixed = setup_of(folders, "mix", "greedy")
    with pytest.raises(UsageError, match="12 steps per rank"):
        trace_step(mixed, step=13, rank=0, world_size=1, num_workers=2, num_batches=11)
    _, state = stream_rank(mixed, 2)
    with pytest.raises(UsageError, match="rank 1 of world size 2 with 2 worker"):
        trace_step(mixed, step=9, rank=0, world_size=WORLD, num_workers=2, state=state)
    with pytest.raises(ResumeStateError, match="other data or options") as refused:
        trace_step(setup, step=9, rank=RANK, world_size=WORLD, num_workers=2, state=state)
    # a trace cannot replay other data, so it offers no way to "resume anyway"
    assert "a trace replays the run" in str(refused.value)
    assert "ignore-fingerprint" not in str(refused.value)
    broken = {**state, "next_worker": 1}
    with pytest.raises(ResumeStateError, match="round robin makes it worker 0"):
        trace_step(mixed, step=9, rank=RANK, world_size=WORLD, num_workers=2, state=broken)
    miscounted = {**state, "batches": SAVED + 2}
    with pytest.raises(ResumeStateError, match=f"its worker streams yielded {SAVED}"):
        trace_step(mixed, step=9, rank=RANK, world_size=WORLD, num_workers=2, state=miscounted)


def test_a_step_far_into_a_mix_is_refused_before_any_replay(data):
    """A mix's batches are replayed from its start: step 10**8 of a small mix would take an
    hour of replay, so it is a one-line UsageError naming the way out (a state)."""
    folders, _ = data
    setup = setup_of(folders, "mix", "concat")
    with pytest.raises(UsageError, match=r"more than a trace replays .*--state"):
        trace_step(setup, step=10**8, rank=RANK, world_size=WORLD, num_workers=0,
                   num_batches=2 * 10**8)  # fmt: skip
