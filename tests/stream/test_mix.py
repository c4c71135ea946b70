"""Weighted mixing: the greedy schedule, one source per sequence, source epochs, configs, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.cli.main import run as main
from shardtok.cli.stream_args import parse_source_arg
from shardtok.errors import ResumeStateError, ShardtokError, UsageError
from shardtok.index import build_blending_indices
from shardtok.stream.mix.schedule import MixSchedule
from shardtok.stream.mix.spec import load_mix_config, mix_spec
from shardtok.stream.mix.stream import MixedStream
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.testing.save_restore import check_save_restore
from tests.helpers.stages import BASES, source_of, write_sources

OPTIONS = StreamOptions(seq_len=31, batch_size=4, shuffle_buffer=16, seed=3)
# Token ids are global positions: source i owns ids [BASES[i], BASES[i] + its size).
SIZES = [20_000, 3_000, 9_000]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return write_sources(
        tmp_path_factory.mktemp("mix"), SIZES, log_mean=3.5, shard_size=1200, shard_step=500,
        frame_size=700,
    )  # fmt: skip


def test_schedule_is_the_blending_rule_and_its_true_bound():
    weights = [0.1, 0.5, 0.3, 0.1]
    schedule = MixSchedule(weights)
    expected, _ = build_blending_indices(weights, None, 5000)
    assert [schedule[s] for s in range(5000)] == expected.tolist()
    # The bound docs/MEGATRON_INDEX.md proves: never more than weight*N + 1, never n - 1 or more behind.
    # "Within 1 either way" holds for two sources only; 1:1:7 is the counterexample.
    assert [MixSchedule([1, 1, 7])[s] for s in range(4)] == [2, 0, 2, 1]
    for weights in ([0.7, 0.3], [1, 1, 7], [0.1, 0.5, 0.3, 0.1], [5, 3, 2, 1, 1]):
        schedule = MixSchedule(weights)
        shares = np.array(weights, dtype=float) / sum(weights)
        n = len(weights)
        for steps in range(1, 600):
            error = np.array(schedule.counts(steps)) - shares * steps
            assert (error <= 1 + 1e-9).all() and (error > -(n - 1)).all(), (weights, steps)
            if n == 2:
                assert (np.abs(error) <= 1 + 1e-9).all()


def test_every_sequence_comes_from_the_scheduled_source(sources):
    weights = [0.5, 0.3, 0.2]
    stream = MixedStream(mix_spec(dict(zip(sources, weights))), OPTIONS, num_batches=60)
    batches = take(stream)
    owners = [source_of(row) for b in batches for row in b["input_ids"]]
    schedule, _ = build_blending_indices(weights, None, len(owners))
    assert owners == schedule.tolist()
    shares = stream.stats()["sources"]
    assert [s["sequences"] for s in shares] == np.bincount(owners, minlength=3).tolist()


def test_a_source_that_runs_out_starts_its_next_epoch(sources):
    """Source 1 (3,000 tokens, weight 0.5) runs through several epochs; every epoch reads its
    slice's tokens once, in a fresh order."""
    spec = mix_spec({sources[0]: 0.5, sources[1]: 0.5})
    stream = MixedStream(spec, OPTIONS, num_batches=100)
    batches = take(stream)
    small = [row for b in batches for row in np.concatenate([b["input_ids"], b["labels"][:, -1:]], 1)
             if source_of(row) == 1]  # fmt: skip
    per_epoch = (SIZES[1] - 32) // 32 + 1  # concat windows of one epoch (one slice)
    epoch = stream.stats()["sources"][1]["epoch"]
    assert len(small) == 200 and epoch == 200 // per_epoch == 2
    epochs = [np.concatenate(small[e * per_epoch : (e + 1) * per_epoch]) for e in range(epoch)]
    for tokens in epochs:  # a whole epoch: every token once, the tail short of a window unread
        assert len(np.unique(tokens)) == len(tokens) == per_epoch * 32
        assert tokens.min() >= BASES[1] and tokens.max() < BASES[1] + SIZES[1]
    assert not np.array_equal(epochs[0], epochs[1])  # a fresh order each epoch


@pytest.mark.parametrize("packing", ["concat", "greedy", "bfd"])
def test_mixed_stream_save_restore_across_source_epochs(sources, packing):
    spec = mix_spec({sources[0]: 0.2, sources[1]: 0.5, sources[2]: 0.3})
    options = StreamOptions(**{**OPTIONS.to_dict(), "packing": packing, "bfd_window": 9})
    reference = check_save_restore(
        lambda: MixedStream(spec, options, worker=1, num_workers=2, num_batches=70),
        midpoints=(0, 1, 17, 40, -1),
        max_state_bytes=4096,
    )
    assert len(reference) == 70


def test_list_weights_are_proportional_to_size(sources):
    # A config's (Nanotron's) list of datasets; in Python a list names shards of one dataset.
    with pytest.raises(UsageError, match="to mix datasets pass a mapping"):
        mix_spec(sources)
    spec = mix_spec(sources, list_is_mix=True)
    assert spec.weights == SIZES
    assert spec.shares == pytest.approx([s / sum(SIZES) for s in SIZES])


def test_yaml_configs_nanotron_and_flat(sources, tmp_path):
    nanotron = tmp_path / "nanotron.yaml"
    nanotron.write_text(
        "data_stages:\n"
        "  - name: single\n    data:\n      dataset:\n"
        f"        dataset_path: {sources[0]}\n      seed: 1234\n"
        "  - name: blended\n    data:\n      dataset:\n        dataset_path:\n"
        f"          {sources[0]}: 0.8\n          {sources[1]}: 0.2\n"
        "      num_loading_workers: 0\n      seed: 1234\n"
    )
    single = load_mix_config(nanotron)
    assert [s.location for s in single.sources] == [sources[0]] and single.options == {"seed": 1234}
    blended = load_mix_config(nanotron, stage="blended")
    assert blended.weights == [0.8, 0.2]
    flat = tmp_path / "flat.yaml"
    flat.write_text("dataset_path:\n  - s0\n  - s2\nseq_len: 31\nbatch_size: 4\npacking: greedy\n")
    (tmp_path / "s0").symlink_to(sources[0])
    (tmp_path / "s2").symlink_to(sources[2])
    spec = load_mix_config(flat)  # relative paths are read from the YAML's folder
    assert spec.weights == [SIZES[0], SIZES[2]]
    assert spec.options == {"seq_len": 31, "batch_size": 4, "packing": "greedy"}
    stream = MixedStream.from_config(flat, num_batches=3, shuffle_buffer=0)
    assert len(take(stream)) == 3 and stream.options.packing == "greedy"
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset_path:\n  a: -1\n")
    with pytest.raises(ShardtokError, match="weights must be > 0"):
        load_mix_config(bad)
    with pytest.raises(ShardtokError, match="no data stage named"):
        load_mix_config(nanotron, stage="missing")


def test_source_argument_parsing():
    assert parse_source_arg("data/web:0.7") == ("data/web", 0.7)
    assert parse_source_arg("s3://bucket/web") == ("s3://bucket/web", None)
    assert parse_source_arg("s3://bucket/web:2") == ("s3://bucket/web", 2.0)


def test_cli_mix_state_out_and_in(sources, tmp_path, capsys):
    args = ["stream", "--source", f"{sources[0]}:0.6", "--source", f"{sources[1]}:0.4",
            "--seq-len", "31", "--batch-size", "4", "--num-workers", "2", "--shuffle-buffer", "16"]  # fmt: skip
    whole, first, rest = tmp_path / "whole.npz", tmp_path / "first.npz", tmp_path / "rest.npz"
    state = tmp_path / "state.json"
    assert main([*args, "--max-batches", "50", "--dump", str(whole)]) == 0
    assert (
        main([*args, "--max-batches", "21", "--dump", str(first), "--state-out", str(state)]) == 0
    )
    out = capsys.readouterr().out
    assert f"source {sources[0]}: weight 60.00%" in out and "saved the stream position" in out
    assert main([*args, "--max-batches", "29", "--dump", str(rest), "--state-in", str(state)]) == 0
    joined = np.concatenate([np.load(first)["input_ids"], np.load(rest)["input_ids"]])
    assert np.array_equal(joined, np.load(whole)["input_ids"])
    saved = json.loads(state.read_text())
    assert saved["batches"] == 21 and len(saved["workers"]) == 2
    changed = [a.replace(":0.4", ":0.5") for a in args]
    with pytest.raises(ResumeStateError, match="weight '0.4' saved, '0.5' now"):
        main([*changed, "--max-batches", "1", "--state-in", str(state)])
    assert main([*changed, "--max-batches", "1", "--state-in", str(state),
                 "--ignore-fingerprint"]) == 0  # fmt: skip


def test_cli_config_prints_shares(sources, tmp_path, capsys):
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"dataset_path:\n  {sources[0]}: 3\n  {sources[2]}: 1\nseq_len: 31\nbatch_size: 2\n"
    )
    assert main(["stream", "--config", str(config), "--max-batches", "40", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [s["sequences"] for s in stats["sources"]] == [60, 20]
    with pytest.raises(UsageError, match="a mix never ends: give --max-batches"):
        main(["stream", "--config", str(config)])
