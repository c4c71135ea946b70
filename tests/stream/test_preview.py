"""The mix preview (`shardtok stream --config mix.yaml --plan --max-batches N`): its sequences,
source epochs and unread parts are what streaming N batches per rank really gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.cli.main import main, run
from shardtok.stream import MixedStream, StreamOptions, StreamSetup, mix_spec
from shardtok.stream.mix.source import SourceSequences
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.preview import format_preview, mix_preview
from shardtok.stream.resume.saved import Placement
from shardtok.testing.synthetic import write_synthetic_dataset

BASES = [1, 1_000_000, 2_000_000]  # source i owns token ids from BASES[i] on
SIZES = [6_000, 1_500, 3_000]
OPTIONS = StreamOptions(seq_len=31, batch_size=4, shuffle_buffer=16, seed=3)
N, WORLD = 25, 2


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("preview")
    paths = []
    for i, (base, size) in enumerate(zip(BASES, SIZES)):
        lengths = np.random.default_rng(i).integers(1, 90, size=size)
        lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), size))]
        write_synthetic_dataset(
            root / f"s{i}", lengths=lengths.tolist(), vocab_size=3_000_000, unique_tokens=True,
            first_token=base, shard_size=900, frame_size=500,
        )  # fmt: skip
        paths.append(str(root / f"s{i}"))
    return paths


def owners(batch) -> np.ndarray:
    return np.searchsorted(BASES, np.asarray(batch["input_ids"])[:, 0], side="right") - 1


def streamed(streams_of_rank, steps: int, num_sources: int):
    """Per source: sequences over `steps` rank steps of every rank, and per (rank, worker) each
    source's epoch and the sequences served in it (from the source's own state)."""
    sequences = np.zeros(num_sources, dtype=int)
    where = []
    for streams in streams_of_rank:
        for t in range(steps):
            sequences += np.bincount(owners(next(streams[t % len(streams)])), minlength=num_sources)
        for stream in streams:
            states = [s.state_dict() for s in stream.mixer.sources]
            where.append([SourceSequences.progress(s)[:2] for s in states])
    return sequences, where


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mix_preview_counts_what_the_stream_serves(sources, workers):
    spec = mix_spec(dict(zip(sources, [0.5, 0.3, 0.2])))
    preview = mix_preview(spec, OPTIONS, max_batches=N, world_size=WORLD, num_workers=workers)
    (stage,) = preview["stages"]
    assert preview["exact"] and stage["steps"] == [1, N] and stage["batches_per_rank"] == N
    slots = max(workers, 1)
    setup = StreamSetup.mixed(spec, OPTIONS)
    ranks = [[setup.stream(Placement(r, WORLD, w, slots), epoch=0) for w in range(slots)]
             for r in range(WORLD)]  # fmt: skip
    sequences, where = streamed(ranks, N, 3)
    rows = stage["sources"]
    assert [r["sequences"] for r in rows] == sequences.tolist()
    assert [r["sequences_per_rank"] * WORLD for r in rows] == sequences.tolist()
    assert [r["tokens"] for r in rows] == (sequences * OPTIONS.seq_len).tolist()
    for i, row in enumerate(rows):
        epochs = [w[i][0] for w in where]
        assert row["last_epoch"] == max(epochs)
        # concat: an epoch's slice serves its plan's sequences exactly; the rest is unread
        emitted = [w[i][1]["emitted"] for w in where]
        plans = {e: setup_plan(spec, i, e, slots) for e in set(epochs)}
        caps = [plans[e].slices[s].num_sequences for s, e in enumerate(epochs)]
        assert row["unread_sequences"] == sum(caps) - sum(emitted)
        assert row["epochs"] == pytest.approx(np.mean([e + n / c for e, n, c in
                                                       zip(epochs, emitted, caps)]))  # fmt: skip
    assert rows[1]["last_epoch"] >= 1  # the small source runs through epochs


def setup_plan(spec, index, epoch, slots):
    from shardtok.stream.build import plan_for, resolved
    from shardtok.stream.mix.source import with_source_seed

    options = with_source_seed(resolved(OPTIONS, spec.sources), index)
    return plan_for(spec.sources[index], options, epoch=epoch, world_size=WORLD, num_workers=slots)


def test_a_curriculum_preview_counts_each_stage_from_its_start(sources, tmp_path):
    config = tmp_path / "stages.yaml"
    config.write_text(
        f"seq_len: 31\nbatch_size: 4\nshuffle_buffer: 16\nseed: 3\nstage_switch: restart\n"
        f"data_stages:\n"
        f"  - name: web\n    data: {{dataset: {{dataset_path: {sources[0]}}}}}\n"
        f"  - name: blend\n    start_training_step: 8\n    data:\n      seed: 9\n"
        f"      dataset: {{dataset_path: {{{sources[0]}: 0.6, {sources[2]}: 0.4}}}}\n"
    )
    curriculum = load_curriculum(config)
    preview = mix_preview(curriculum, OPTIONS, max_batches=N, world_size=WORLD, num_workers=2)
    first, second = preview["stages"]
    assert (first["steps"], second["steps"]) == ([1, 7], [8, N])
    assert (first["batches_per_rank"], second["batches_per_rank"]) == (7, N - 7)
    # Each stage is a fresh mix stream per worker: its own local batches, its own seed.
    counts = np.zeros(3, dtype=int)
    for k, stage in enumerate(curriculum.stages):
        for w in range(2):
            begins = curriculum.local_begins(0, w, 2)
            end = begins[1] if k == 0 else -(-(N - w) // 2)
            for r in range(WORLD):
                stream = MixedStream(
                    stage.mix, curriculum.options_for(k, OPTIONS), rank=r, world_size=WORLD,
                    worker=w, num_workers=2, num_batches=end - begins[k],
                    source_ids=curriculum.source_ids(k),
                )  # fmt: skip
                for batch in stream:
                    counts += np.bincount(owners(batch), minlength=3)
    assert first["sources"][0]["sequences"] + second["sources"][0]["sequences"] == counts[0]
    assert second["sources"][1]["sequences"] == counts[2] and counts[1] == 0
    assert [r["id"] for r in second["sources"]] == [0, 1]
    text = format_preview(preview)
    assert "stage 1 'blend' (from step 8): steps 8..25" in text and "yields 26" in text
    # The web source starts again in stage 1; with its own seed 9 in another order, with the
    # shared seed (and the same place in the mix) in the very same order.
    (note,) = preview["notes"]
    assert "stage 1 'blend' starts" in note and "in another order" in note
    (tmp_path / "same.yaml").write_text(config.read_text().replace("      seed: 9\n", ""))
    same = load_curriculum(tmp_path / "same.yaml")
    (note,) = mix_preview(same, OPTIONS, max_batches=N, world_size=WORLD)["notes"]
    assert "in the same order" in note and "its own seed" in note


def test_the_cli_preview(sources, tmp_path, capsys):
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"seq_len: 31\nbatch_size: 4\nshuffle_buffer: 16\nseed: 3\n"
        f"dataset_path: {{{sources[0]}: 0.5, {sources[1]}: 0.3, {sources[2]}: 0.2}}\n"
    )
    args = ["stream", "--config", str(config), "--plan", "--world-size", "2", "--num-workers", "2"]
    assert run([*args, "--max-batches", str(N), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    spec = mix_spec(dict(zip(sources, [0.5, 0.3, 0.2])))
    expected = mix_preview(spec, OPTIONS, max_batches=N, world_size=WORLD, num_workers=2)
    assert [r["sequences"] for r in printed["stages"][0]["sources"]] == [
        r["sequences"] for r in expected["stages"][0]["sources"]
    ]
    assert run([*args, "--max-batches", str(N)]) == 0
    out = capsys.readouterr().out
    assert "sequences/rank" in out and "unread of the epoch in progress" in out
    assert main(args) == 2
    assert "give --max-batches N" in capsys.readouterr().err
