"""Fuzzing mix and curriculum YAML: whatever is put in a valid config's place or done to its
text, loading it gives a valid config or one short line of ShardtokError naming the file, with
bounded memory; never another exception, a RecursionError or a message of megabytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.errors import CorruptShardError, ShardtokError, StorageError
from shardtok.stream.mix.spec import load_mix_config
from shardtok.stream.mix.stages import load_curriculum
from shardtok.stream.options import StreamOptions
from tests.adversarial.helpers import peak_while
from tests.adversarial.test_yaml_files import LONGEST, bomb
from tests.helpers.stages import write_sources

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is never a fluke
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# A valid three-stage curriculum with a slot for each value a mutation may replace.
TEMPLATE = """\
{anchors}seq_len: {seq_len}
batch_size: {batch_size}
shuffle_buffer: 8
seed: {seed}
data_stages:
  - name: {name}
    start_training_step: {start}
    data:
      dataset:
        dataset_path: {path}
  - name: blend
    start_training_step: 4
    data:
      seed: {stage_seed}
      dataset:
        dataset_path:
          {weighted}: {weight}
          {p1}: 0.5
  - name: code
    start_training_step: 7
    data:
      dataset: {{dataset_path: [{p1}, {p2}]}}
"""

# What a mutation may put in a slot: values of every YAML kind, and the ones built to hurt.
HOSTILE = [
    "*i", "&r [*r]", "[" * 500 + "]" * 500, "9" * 5000, str(2**64), "-" + str(2**63),
    "0x" + "f" * 400, ":".join(["59"] * 300), "1.0e400", ".nan", "-.inf", "0", "-1", "true",
    "null", "~", "[]", "{}", "''", "x" * 20_000, "!!binary aGVsbG8=", "!!set {a, b}",
    "!!omap [a: 1]", "2001-12-14t21:59:43.10-05:00", "!!python/object:os.system x",
    "!!str 5", "!!int x", "*undefined", "[a, [b, [c]]]", "{a: {b: [1, 2]}}", "{<<: *i}",
    "'a\\x00'", '"\\x00\\u2028"', "|\n  block\n", "? [1]\n", "[1, 2", "{a: 1",
]  # fmt: skip
SLOTS = ("seq_len", "batch_size", "seed", "name", "start", "path", "stage_seed", "weighted",
         "weight", "p1", "p2")  # fmt: skip


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("fuzz-yaml"))


def valid(paths) -> dict[str, str]:
    return {"anchors": bomb(), "seq_len": "15", "batch_size": "2", "seed": "3",
            "name": "warmup", "start": "1", "path": paths[0], "stage_seed": "77",
            "weighted": paths[0], "weight": "0.5", "p1": paths[1], "p2": paths[2]}  # fmt: skip


def slot_values(paths):
    scalar = st.one_of(
        st.sampled_from(HOSTILE),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.text(st.characters(codec="utf-8"), max_size=30).map(lambda t: repr(t)),
        st.sampled_from(paths),
    )
    return st.dictionaries(st.sampled_from(SLOTS), scalar, max_size=3)


# Text edits: (where, as a fraction of the text; characters to delete; what to insert).
EDITS = st.lists(
    st.tuples(
        st.floats(0, 1),
        st.integers(0, 8),
        st.text(st.sampled_from("[]{}:,-&*!|>'\"#?\n\t 0123456789ab\\%@`"), max_size=4),
    ),
    max_size=3,
)


def mutated(paths, slots: dict[str, str], edits) -> str:
    text = TEMPLATE.format(**{**valid(paths), **slots})
    for where, cut, insert in edits:
        at = int(where * len(text))
        text = text[:at] + insert + text[at + cut :]
    return text


def check(load, config: Path) -> None:
    try:
        loaded = load(config)
    except ShardtokError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < LONGEST, message[:3000]
        # Errors of a dataset it names (a path edited into one that is not there) name it.
        assert str(config) in message or isinstance(exc, (StorageError, CorruptShardError))
        return
    options = loaded.options if hasattr(loaded, "options") else {}
    try:  # a valid config: its options together may still disagree (stride and seq_len)
        StreamOptions(**{"seq_len": 15, "batch_size": 2, **options})
    except ShardtokError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < LONGEST, str(exc)[:3000]


def test_the_template_is_a_valid_curriculum(tmp_path, paths):
    config = tmp_path / "stages.yaml"
    config.write_text(mutated(paths, {}, []) + "x-bomb: *i\n")  # a bomb left unused
    with pytest.raises(ShardtokError, match="aliases"):
        load_curriculum(config)
    config.write_text(mutated(paths, {"anchors": ""}, []))
    assert [s.name for s in load_curriculum(config).stages] == ["warmup", "blend", "code"]


@FUZZ
@given(data=st.data())
def test_any_mutation_is_a_valid_config_or_one_short_line(tmp_path, paths, data):
    slots = data.draw(slot_values(paths))
    if data.draw(st.booleans()):
        slots["anchors"] = ""  # without the bomb's anchors: other paths through the loader
    text = mutated(paths, slots, data.draw(EDITS))
    config = tmp_path / "stages.yaml"
    config.write_text(text)
    stage = data.draw(st.sampled_from([0, 2, "blend", "none"]))
    for load in (load_curriculum, lambda c: load_mix_config(c, stage=stage)):
        assert peak_while(lambda load=load: check(load, config)) < 64 << 20
