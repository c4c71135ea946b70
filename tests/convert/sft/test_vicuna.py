"""The reference note's Vicuna record with the note's own YAML, through `shardtok convert`.

The trained tokens must decode to exactly the `gpt` turns, each with its closing separator, plus
the final `</s>`; `role`, `instruction`, the human turns and `<s>` are never trained.
"""

from __future__ import annotations

import json

import pytest

from shardtok.cli.main import main
from tests.helpers.sft_data import (
    NOTE_YAML,
    VICUNA,
    decode,
    documents,
    special_tokenizer,
    trained_runs,
    write_jsonl,
)

GPT_TURNS = [m["value"] for m in VICUNA["conversations"] if m["from"] == "gpt"]
HUMAN_TURNS = [m["value"] for m in VICUNA["conversations"] if m["from"] == "human"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vicuna")
    tokenizer = special_tokenizer(root / "tok")
    data = write_jsonl(root / "vicuna.jsonl", [VICUNA])
    return root, tokenizer, data


def convert(setup, yaml_text: str, name: str, *extra: str) -> tuple:
    root, tokenizer, data = setup
    config = root / f"{name}.yaml"
    config.write_text(yaml_text)
    out = root / name
    argv = ["convert", str(data), "-o", str(out), "--tokenizer", str(tokenizer)]
    status = main([*argv, "--sft", str(config), "--workers", "1", "--quiet", *extra])
    assert status == 0
    return out, documents(out)


def test_trained_tokens_are_the_gpt_turns_and_the_final_eos(setup, capsys):
    out, docs = convert(setup, NOTE_YAML, "note")
    assert len(docs) == 1
    tokens, mask = docs[0]
    tokenizer = setup[1]
    runs = trained_runs(tokenizer, tokens, mask)
    assert runs == [GPT_TURNS[0] + "\n", GPT_TURNS[1] + "\n", GPT_TURNS[2] + "\n</s>"]
    untrained = decode(tokenizer, tokens[mask == 0])
    assert untrained == (
        "<s>" + VICUNA["role"] + "\n" + VICUNA["instruction"] + "\n"
        + "".join(h + "\n" for h in HUMAN_TURNS)
    )  # fmt: skip
    assert decode(tokenizer, tokens).startswith("<s>" + VICUNA["role"])
    # The note's pattern needs the [] jq wants; the rewrite is said once, naming both forms.
    err = capsys.readouterr().err
    assert err.count("warning: jq pattern") == 1
    assert """'.conversations | select(.from == "human")'""" in err
    assert '.conversations[] | select(.from == "human")' in err
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["trained_tokens"] == int(mask.sum())
    assert manifest["sft"]["format"] == "jq"
    assert manifest["sft"]["loss_masking_jq_patterns"][0] == (
        '.conversations | select(.from == "human")'
    )
    assert manifest["extra"]["sft_stats"]["trained_tokens"] == int(mask.sum())


def test_the_bracket_form_gives_the_same_masks_without_a_note(setup, capsys):
    _, written = convert(setup, NOTE_YAML, "as_written")
    capsys.readouterr()
    fixed = NOTE_YAML.replace(".conversations | select", ".conversations[] | select")
    _, docs = convert(setup, fixed, "brackets")
    assert "jq pattern" not in capsys.readouterr().err
    assert [t.tolist() for t, _ in docs] == [t.tolist() for t, _ in written]
    assert [m.tolist() for _, m in docs] == [m.tolist() for _, m in written]


def test_train_on_input_trains_all_but_bos(setup):
    _, docs = convert(setup, NOTE_YAML, "all", "--train-on-input")
    tokens, mask = docs[0]
    runs = trained_runs(setup[1], tokens, mask)
    assert mask[0] == 0 and mask[1:].all()
    assert runs[0].endswith("to ask.\n</s>") and runs[0].startswith(VICUNA["role"])
