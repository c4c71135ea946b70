"""`shardtok trace`: the human listing, --json, --decode, a mix config, --state, and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.cli.main import main, run
from shardtok.dataset.source import DatasetSource
from shardtok.format import DatasetWriter
from tests.helpers.provenance import assert_reproduces, shard_documents

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Packing keeps documents apart.",
    "A trace names the shard, the document and the tokens of every piece.",
]
SHAPE = ["--seq-len", "24", "--batch-size", "2", "--packing", "greedy", "--shuffle-buffer", "4"]
IN_PROCESS = ["--num-workers", "0"]  # the layout of the run traced, which a trace never guesses


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    from tokenizers import Tokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_PATH, load_tokenizer

    spec = load_tokenizer(BUNDLED)
    tokenizer = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    root = tmp_path_factory.mktemp("trace_cli")
    for name, count in (("a", 30), ("b", 20)):
        with DatasetWriter(
            root / name, vocab_size=spec.vocab_size, tokenizer=spec.as_metadata(), shard_size=300
        ) as w:
            for i in range(count):
                text = f"{TEXTS[i % 3]} ({name}{i})"
                w.add(np.array(tokenizer.encode(text).ids + [spec.eos_id]))
    config = root / "mix.yaml"
    config.write_text(f"seq_len: 24\nbatch_size: 2\ndataset_path: {{{root / 'a'}: 0.7, "
                      f"{root / 'b'}: 0.3}}\n")  # fmt: skip
    return str(root / "a"), str(config)


def test_listing_json_and_decode(datasets, capsys):
    path, _ = datasets
    args = ["trace", path, *SHAPE, "--step", "2", "--world-size", "2", "--rank", "1", *IN_PROCESS]
    assert run(args) == 0
    out = capsys.readouterr().out
    assert "step 2, rank 1 of 2: worker 0 of 1, its batch 1 (epoch 0)" in out
    assert "=== sequence 1" in out and "slots [0, " in out and "(dataset document " in out
    assert run([*args, "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["step"] == 2 and len(trace["sequences"]) == 2
    segment = trace["sequences"][0]["segments"][0]
    assert set(segment) >= {"shard", "document", "dataset_document", "tokens", "positions"}
    assert run([*args, "--decode"]) == 0
    out = capsys.readouterr().out
    assert any(text[:15] in out for text in TEXTS)
    assert run([*args, "--decode", "--json"]) == 0
    decoded = json.loads(capsys.readouterr().out)
    texts = [s["text"] for q in decoded["sequences"] for s in q["segments"]]
    assert any(text[:15] in "".join(texts) for text in TEXTS)


def test_a_mix_config_and_a_state_file(datasets, tmp_path, capsys):
    _, config = datasets
    state, dump = tmp_path / "state.json", tmp_path / "dump.npz"
    layout = ["--world-size", "2", "--rank", "1", "--num-workers", "2"]
    assert run(["stream", "--config", config, *layout, "--max-batches", "3",
                "--state-out", str(state), "--json"]) == 0  # fmt: skip
    assert run(["stream", "--config", config, *layout, "--max-batches", "7", "--dump", str(dump),
                "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    batches = np.load(dump)
    sources = [DatasetSource(p) for p in json_sources(config)]
    for step, extra in ((2, layout), (5, ["--state", str(state)]), (7, ["--state", str(state)])):
        assert run(["trace", config, "--step", str(step), *extra, "--json"]) == 0
        trace = json.loads(capsys.readouterr().out)
        batch = {k: batches[k][step - 1] for k in ("input_ids", "labels")}
        assert_reproduces(trace, batch, shard_documents(sources))
    assert trace["rank"] == 1 and trace["world_size"] == 2 and trace["state_steps"] == 3
    assert {q["source"] for q in trace["sequences"]} <= {0, 1}
    assert main(["trace", config, "--step", "3", "--state", str(state)]) == 2
    err = capsys.readouterr().err.strip()
    assert "step 3 was taken before the state" in err and "\n" not in err


def json_sources(config) -> list[str]:
    import yaml

    return list(yaml.safe_load(open(config))["dataset_path"])


def test_errors_are_one_line(datasets, tmp_path, capsys):
    path, _ = datasets
    with pytest.raises(SystemExit) as exit_status:  # argparse's own refusal: status 2, one line
        main(["trace", path, *SHAPE, "--step", "0"])
    assert exit_status.value.code == 2
    assert "--step: must be at least 1" in capsys.readouterr().err
    assert main(["trace", path, *SHAPE, "--step", "100000", *IN_PROCESS]) == 2
    err = capsys.readouterr().err.strip()
    assert "past the end of epoch 0" in err and "steps per epoch" in err and "\n" not in err
    assert main(["trace", path, "--step", "1"]) == 2
    assert "--seq-len is required" in capsys.readouterr().err
    assert main(["trace", *SHAPE, "--step", "1"]) == 2  # nothing to trace: no --config offered
    assert "error: give CONFIG_OR_DATASET or --source" in capsys.readouterr().err
    stages = tmp_path / "stages.yaml"
    stages.write_text(f"seq_len: 24\nbatch_size: 2\ndata_stages:\n"
                      f"  - data: {{dataset: {{dataset_path: {path}}}}}\n"
                      f"  - {{start_training_step: 5, data: {{dataset: {{dataset_path: {path}}}}}}}\n")  # fmt: skip
    capsys.readouterr()
    assert main(["trace", str(stages), "--step", "7", "--max-batches", "6", *IN_PROCESS]) == 2
    assert "past" in capsys.readouterr().err  # the run's last step is 6
    assert main(["trace", str(stages), "--step", "7", "--max-batches", "9", "--json",
                 *IN_PROCESS]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["part"] == {"stage": 1}  # not stage 0's mix


def test_help_teaches(capsys):
    with pytest.raises(SystemExit):
        run(["trace", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--state" in out and "--seq-len" in out


def test_decode_marks_the_untrained_tokens_of_fine_tuning_data(tmp_path, capsys):
    from tokenizers import Tokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_PATH, load_tokenizer

    spec = load_tokenizer(BUNDLED)
    tokenizer = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    with DatasetWriter(tmp_path, vocab_size=spec.vocab_size, tokenizer=spec.as_metadata(),
                       masks=True) as w:  # fmt: skip
        for i in range(12):
            prompt = tokenizer.encode(f"Question {i}: what is packing?").ids
            answer = tokenizer.encode(" Whole conversations per sequence.").ids + [spec.eos_id]
            w.add(np.array(prompt + answer), mask=[0] * len(prompt) + [1] * len(answer))
    args = ["trace", str(tmp_path), "--seq-len", "40", "--batch-size", "2", "--step", "1",
            *IN_PROCESS]  # fmt: skip
    assert run([*args, "--decode", "--json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    segment = trace["sequences"][0]["segments"][0]
    assert trace["packing"] == "greedy" and segment["untrained"] > 0
    assert "[[Question" in segment["text"] and "]] Whole conversations" in segment["text"]
