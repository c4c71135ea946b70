"""`shardtok stream --decode`: padding is named, never decoded as text, and a tokenizer that
cannot decode the data is refused before any batch is streamed."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.cli.main import main
from shardtok.format import DatasetWriter

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Packing keeps documents apart."]


def bundled(path, *, fingerprint: str | None = None):
    """Short documents in the bundled tokenizer (recorded as another one: `fingerprint`)."""
    from tokenizers import Tokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_PATH, load_tokenizer

    spec = load_tokenizer(BUNDLED)
    tokenizer = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    recorded = spec.as_metadata()
    if fingerprint is not None:
        recorded = {**recorded, "name": "their-tokenizer", "fingerprint": fingerprint}
    with DatasetWriter(path, vocab_size=spec.vocab_size, tokenizer=recorded) as writer:
        for text in TEXTS * 10:
            writer.add(np.array(tokenizer.encode(text).ids + [spec.eos_id]))
    return str(path), tokenizer


@pytest.mark.parametrize("packing", ["greedy", "bfd"])
@pytest.mark.parametrize("labels_format", ["shifted", "hf"])
def test_padding_is_named_not_decoded(tmp_path, capsys, packing, labels_format):
    path, tokenizer = bundled(tmp_path / "ds")
    bang = tokenizer.token_to_id("!")  # a pad id that reads as text: "!!!!" if decoded
    # whole documents (greedy and bfd never split these) leave a gap at the end of each row
    args = ["stream", path, "--seq-len", "59", "--batch-size", "2", "--packing", packing,
            "--pad-id", str(bang), "--labels-format", labels_format, "--shuffle-buffer", "0",
            "--max-batches", "1", "--decode", "2"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "quick brown fox" in out
    assert "!!" not in out
    paddings = [line for line in out.splitlines() if line.startswith("--- padding: ")]
    assert len(paddings) == 2, out
    assert paddings[0].endswith(f"tokens of pad id {bang}, none trained ---")
    assert "..58, " in paddings[0]  # it runs to the row's last input


def test_concat_rows_have_no_padding(tmp_path, capsys):
    path, _ = bundled(tmp_path / "ds")
    args = ["stream", path, "--seq-len", "20", "--batch-size", "1", "--max-batches", "1",
            "--mask-boundary-labels", "--decode", "1"]  # fmt: skip
    assert main(args) == 0
    assert "--- padding" not in capsys.readouterr().out


def test_a_tokenizer_that_cannot_decode_is_refused_before_streaming(tmp_path, capsys):
    path, _ = bundled(tmp_path / "theirs", fingerprint="sha256:" + "ab" * 32)
    args = ["stream", path, "--seq-len", "20", "--batch-size", "1", "--max-batches", "1"]
    assert main([*args, "--decode"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no plan, no batch, no statistics before the refusal
    err = captured.err.strip()
    assert "'their-tokenizer'" in err and err.endswith("pass --tokenizer PATH") and "\n" not in err
    assert main([*args, "--decode", "--tokenizer", str(tmp_path / "none")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--tokenizer: tokenizer" in captured.err
    assert "not found" in captured.err
    # named, the tokenizer decodes (with a warning that it is not the recorded one)
    from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH

    assert main([*args, "--decode", "--tokenizer", str(BUNDLED_PATH)]) == 0
    captured = capsys.readouterr()
    assert "=== batch 0 sequence 0 ===" in captured.out and "warning: " in captured.err
