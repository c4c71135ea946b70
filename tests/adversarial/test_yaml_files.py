"""YAML from someone else (issue 36): a mix, curriculum or SFT config built to hurt (an alias
bomb, deep nesting, huge integers, long values) is one short line naming the file, never a
hang, a RecursionError or a message of megabytes; anchors that stay small still work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardtok.convert.sft.config import load_sft_config
from shardtok.errors import ShardtokError, UsageError
from shardtok.stream.mix.spec import load_mix_config
from shardtok.stream.mix.stages import load_curriculum
from tests.adversarial.helpers import peak_while
from tests.helpers.stages import write_sources

REPO = Path(__file__).resolve().parents[2]
LONGEST = 1500  # characters: a message echoes at most a few values of ~200 each


def bomb(levels: int = 9) -> str:
    """Anchors `a`..: each a list of nine aliases of the one before: `*i` stands for 9**9
    strings, though the file is a few hundred bytes (billion laughs)."""
    names = "abcdefghijklmnop"[:levels]
    lines = [f"x-{names[0]}: &{names[0]} [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for before, name in zip(names, names[1:]):
        lines.append(f"x-{name}: &{name} [" + ", ".join([f"*{before}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("yaml-sources"))


def refusal(call, *args, kind=ShardtokError) -> str:
    with pytest.raises(kind) as info:
        call(*args)
    message = str(info.value)
    assert "\n" not in message and len(message) < LONGEST, message[:2000]
    assert "looks like a bug" not in message
    return message


def run_cli(*args: str) -> subprocess.CompletedProcess:
    # The case that hung runs in its own process: a hang is a timeout here, not a stuck suite.
    return subprocess.run(
        [sys.executable, "-m", "shardtok", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> str:
    assert done.returncode in (1, 2), (done.returncode, done.stderr[:2000])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < LONGEST, done.stderr[:2000]
    assert "Traceback" not in done.stderr and "looks like a bug" not in lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_an_alias_bomb_as_dataset_path_is_refused_in_one_short_line(tmp_path, paths):
    config = tmp_path / "mix.yaml"
    config.write_text(bomb() + "dataset_path: *i\n")
    message = ""

    def load():
        nonlocal message
        message = refusal(load_mix_config, config)

    assert peak_while(load) < 16 << 20
    assert message.startswith(f"{config}, line 7:"), message  # the anchor past the bound
    assert "aliases" in message


def test_an_alias_bomb_as_seed_is_refused_not_hung(tmp_path, paths):
    config = tmp_path / "mix.yaml"
    config.write_text(bomb() + f"dataset_path: {paths[0]}\nseq_len: 15\nbatch_size: 2\nseed: *i\n")
    done = run_cli("stream", "--config", str(config), "--max-batches", "1")
    one_line_error(done, str(config), "line 7", "aliases")


def test_aliases_that_stay_small_still_work_and_a_bomb_under_them_does_not(tmp_path, paths):
    # Anchors and merge keys are how repeated stage settings are written; they are bounded by
    # what they stand for, not refused.
    config = tmp_path / "stages.yaml"
    config.write_text(
        "seq_len: 15\nbatch_size: 2\n"
        f"x-common: &common {{dataset: {{dataset_path: {paths[0]}}}, seed: 5}}\n"
        "data_stages:\n"
        "  - {name: one, start_training_step: 1, data: *common}\n"
        "  - name: two\n    start_training_step: 4\n    data: {<<: *common, seed: 6}\n"
    )
    curriculum = load_curriculum(config)
    assert [s.seed for s in curriculum.stages] == [5, 6]
    assert len(curriculum.sources) == 1
    config.write_text(bomb() + config.read_text().replace("seed: 6}", "seed: 6, x: *i}"))
    assert "aliases" in refusal(load_curriculum, config)


def test_a_value_that_contains_itself_is_refused(tmp_path, paths):
    config = tmp_path / "mix.yaml"
    config.write_text("dataset_path: &a [*a]\n")
    assert "inside its own anchor" in refusal(load_mix_config, config)


@pytest.mark.parametrize("depth", [100, 50_000])
def test_deep_nesting_is_one_line_naming_the_file(tmp_path, depth):
    config = tmp_path / "mix.yaml"
    config.write_text("dataset_path: " + "[" * depth + "]" * depth + "\n")
    message = refusal(load_mix_config, config)
    assert message.startswith(f"{config}, line 1:") and "nested deeper than 64" in message


def test_deep_nesting_through_aliases_is_refused(tmp_path):
    # Each anchor is shallow as written; written out, the last nests 100 deep (its repr or a
    # comparison would be a RecursionError).
    lines = ["x0: &x0 [a]"] + [f"x{n}: &x{n} [*x{n - 1}]" for n in range(1, 100)]
    config = tmp_path / "mix.yaml"
    config.write_text("\n".join(lines) + "\ndataset_path: *x99\n")
    assert "nests deeper than 64" in refusal(load_mix_config, config)


def test_a_deeply_nested_mix_on_the_command_line_is_not_called_a_bug(tmp_path):
    config = tmp_path / "mix.yaml"
    config.write_text("dataset_path: " + "[" * 50_000 + "]" * 50_000 + "\n")
    done = run_cli("stream", "--config", str(config), "--seq-len", "15", "--batch-size", "2")
    one_line_error(done, str(config), "nested deeper")


@pytest.mark.parametrize(
    "key, value",
    [("seed", "9" * 5000), ("num_batches", "9" * 5000), ("seed", str(2**64)),
     ("seq_len", "0x" + "f" * 5000), ("batch_size", ":".join(["59"] * 2000))],
)  # fmt: skip
def test_huge_integers_are_refused_naming_the_line(tmp_path, paths, key, value):
    config = tmp_path / "mix.yaml"
    config.write_text(f"dataset_path: {paths[0]}\nseq_len: 15\nbatch_size: 2\n{key}: {value}\n")
    message = refusal(load_curriculum, config)
    assert message.startswith(f"{config}, line 4:") and "64 bits" in message


def test_a_huge_start_step_is_refused_naming_the_line(tmp_path, paths):
    config = tmp_path / "stages.yaml"
    config.write_text(
        "seq_len: 15\nbatch_size: 2\ndata_stages:\n"
        f"  - {{name: a, data: {{dataset_path: {paths[0]}}}}}\n"
        f"  - {{name: b, start_training_step: {'9' * 100_000}, data: {{dataset_path: {paths[1]}}}}}\n"
    )
    message = refusal(load_curriculum, config)
    assert message.startswith(f"{config}, line 5:") and "64 bits" in message


def test_values_echoed_in_messages_are_shortened_with_their_length(tmp_path, paths):
    config = tmp_path / "stages.yaml"
    name = "n" * 100_000
    config.write_text(
        "data_stages:\n"
        f"  - {{name: {name}, start_training_step: 2, data: {{dataset_path: {paths[0]}}}}}\n"
    )
    message = refusal(load_curriculum, config)
    assert "... (100,000 characters)" in message and "start at step 1" in message


def test_a_bad_stream_option_names_the_config(tmp_path, paths):
    config = tmp_path / "mix.yaml"
    config.write_text(f"dataset_path: {paths[0]}\nseed: [1, 2]\n")
    assert refusal(load_curriculum, config, kind=UsageError).startswith(f"{config}: seed must")
    config.write_text(f"dataset_path: {paths[0]}\npacking: {'p' * 10_000}\n")
    message = refusal(load_curriculum, config, kind=UsageError)
    assert message.startswith(f"{config}: packing") and "(10,000 characters)" in message


@pytest.mark.parametrize(
    "value, words",
    [("5", ["5", "not a path"]), ("[[a, [b]]]", ["['b']"]), (f"{'d' * 9000}", ["9,000 characters"]),
     ("{1: 0.5}", ["1 as a dataset"])],
)  # fmt: skip
def test_a_dataset_path_of_no_shape_a_mix_has_names_the_config(tmp_path, value, words):
    config = tmp_path / "mix.yaml"
    config.write_text(f"dataset_path: {value}\n")
    message = refusal(load_mix_config, config)
    assert message.startswith(str(config)) and all(w in message for w in words), message


def test_unknown_keys_of_mixed_types_are_listed(tmp_path, paths):
    config = tmp_path / "stages.yaml"
    config.write_text(
        f"data_stages:\n  - data: {{dataset: {{dataset_path: {paths[0]}, 1: 2, b: 3}}}}\n"
    )
    assert "unknown keys [1, 'b']" in refusal(load_curriculum, config)


@pytest.mark.parametrize("stage", [0, "x"])
def test_a_stage_that_is_not_a_mapping_is_named_when_one_stage_is_picked(tmp_path, stage):
    config = tmp_path / "stages.yaml"
    config.write_text("data_stages: [1, 2]\n")
    message = refusal(lambda: load_mix_config(config, stage=stage))
    assert "data stage 0 must be a mapping" in message


def test_a_config_larger_than_the_limit_is_refused_before_it_is_parsed(tmp_path, paths):
    config = tmp_path / "mix.yaml"
    with config.open("w") as file:
        file.write(f"dataset_path: {paths[0]}\n")
        file.write(("# " + "x" * 1000 + "\n") * 9000)
    assert "longer than 8,388,608 bytes" in refusal(load_mix_config, config)


def test_an_sft_config_nested_too_deep_is_one_line(tmp_path):
    config = tmp_path / "sft.yaml"
    config.write_text("format: sharegpt\nrole_map: " + "[" * 50_000 + "]" * 50_000 + "\n")
    message = refusal(load_sft_config, config, {}, kind=UsageError)
    assert message.startswith(f"{config}: not valid YAML at line 2: nested deeper")


def test_an_alias_bomb_in_an_sft_config_is_refused_not_hung(tmp_path):
    config = tmp_path / "sft.yaml"
    # The anchors sit inside `format`, which is checked (and its value echoed) first.
    anchors = [line.split(": ", 1)[1] for line in bomb().splitlines()]
    config.write_text("format: [" + ", ".join(anchors) + "]\n")
    code = (
        "import sys\nfrom shardtok.convert.sft.config import load_sft_config\n"
        "from shardtok.errors import UsageError\n"
        "try:\n    load_sft_config(sys.argv[1], {})\n"
        "except UsageError as exc:\n    sys.exit(str(exc))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    one_line_error(done, str(config), "aliases")


def test_a_batch_too_large_to_allocate_is_a_usage_error():
    """A seq_len of 10**15 from a config would only end in a failed allocation of petabytes."""
    from shardtok.errors import UsageError
    from shardtok.stream.options import StreamOptions

    with pytest.raises(UsageError, match=r"batch_size x seq_len must be at most 134,217,728"):
        StreamOptions(seq_len=10**15, batch_size=8)
    StreamOptions(seq_len=131072, batch_size=64)  # the longest batches trained on today pass


@pytest.mark.parametrize(
    "line", ["? " + "x" * 100_000 + "\n: 1", "format: " + "y" * 100_000], ids=["key", "value"]
)
def test_an_sft_config_echoes_a_long_key_or_value_cut(tmp_path, line):
    config = tmp_path / "sft.yaml"
    config.write_text(line + "\n")
    message = refusal(load_sft_config, config, {}, kind=UsageError)
    assert "100,00" in message  # the full size is named, not shown
