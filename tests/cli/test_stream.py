"""`shardtok stream`: plan, statistics, dumps of the exact batches, decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shardtok.cli.main import run as main
from shardtok.errors import ShardtokError, UsageError
from shardtok.format import DatasetWriter
from shardtok.stream.nodes.base import take
from shardtok.stream.options import StreamOptions
from shardtok.stream.slice_stream import SliceStream
from shardtok.testing.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli")
    write_synthetic_dataset(
        path, num_tokens=30_000, vocab_size=5000, mean_length=90, shard_size=8000
    )
    return path


def test_plan_is_json(dataset, capsys):
    assert main(["stream", str(dataset), "--seq-len", "63", "--batch-size", "2", "--plan",
                 "--world-size", "3", "--num-workers", "2"]) == 0  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert len(plan["slices"]) == 6 and plan["batches_per_rank"] == 2 * plan["batches_per_slice"]


@pytest.mark.parametrize("workers", [0, 2])
def test_dump_holds_the_exact_batches(dataset, tmp_path, capsys, workers):
    out = tmp_path / "b.npz"
    args = ["stream", str(dataset), "--seq-len", "31", "--batch-size", "3", "--packing", "greedy",
            "--rank", "1", "--world-size", "2", "--num-workers", str(workers), "--max-batches", "5",
            "--dump", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["batches"] == 5 and 0.5 < stats["packing_efficiency"] <= 1
    dump = np.load(out)
    options = StreamOptions(seq_len=31, batch_size=3, packing="greedy")
    streams = [
        SliceStream(dataset, options, rank=1, world_size=2, worker=w, num_workers=max(workers, 1))
        for w in range(max(workers, 1))
    ]
    expected = [next(streams[i % len(streams)]) for i in range(5)]
    for key in ("input_ids", "labels", "position_ids", "document_ids"):
        assert np.array_equal(dump[key], np.stack([b[key] for b in expected]))
    offsets = dump["cu_seqlens_offsets"]
    for i, b in enumerate(expected):
        assert np.array_equal(dump["cu_seqlens"][offsets[i] : offsets[i + 1]], b["cu_seqlens"])
    assert json.loads(str(dump["plan"]))["packing"] == "greedy"


def test_statistics_text(dataset, capsys):
    assert main(["stream", str(dataset), "--seq-len", "31", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "M tokens/s" in out and "100.00% of slots" in out and "per rank" in out
    total = len(take(SliceStream(dataset, StreamOptions(seq_len=31, batch_size=2)), None))
    assert f"streamed {total:,} of {total:,} batches" in out


def test_decode_with_the_bundled_tokenizer(tmp_path, capsys):
    from tokenizers import Tokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_PATH, load_tokenizer

    spec = load_tokenizer(BUNDLED)
    tokenizer = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    texts = ["The quick brown fox jumps over the lazy dog.", "Packing keeps documents apart."]
    with DatasetWriter(tmp_path, vocab_size=spec.vocab_size, tokenizer=spec.as_metadata()) as w:
        for text in texts * 20:
            w.add(np.array(tokenizer.encode(text).ids + [spec.eos_id]))
    args = ["stream", str(tmp_path), "--seq-len", "40", "--batch-size", "1", "--packing", "greedy",
            "--shuffle-buffer", "0", "--max-batches", "1", "--decode", "1"]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "=== batch 0 sequence 0 ===" in out and "quick brown fox" in out
    assert "--- document 1:" in out  # a second document in the same sequence


def test_bfd_packing_and_its_window(dataset, tmp_path, capsys):
    out = tmp_path / "b.npz"
    args = ["stream", str(dataset), "--seq-len", "31", "--batch-size", "3", "--packing", "bfd",
            "--bfd-window", "7", "--max-batches", "4", "--dump", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["batches"] == 4 and 0.5 < stats["packing_efficiency"] <= 1
    options = StreamOptions(seq_len=31, batch_size=3, packing="bfd", bfd_window=7)
    expected = take(SliceStream(dataset, options), 4)
    dump = np.load(out)
    assert np.array_equal(dump["input_ids"], np.stack([b["input_ids"] for b in expected]))
    too_big = args[:9] + ["70000"]
    with pytest.raises(UsageError, match="bfd_window must be at most 65536"):
        main(too_big)


def bundled_sft_dataset(path):
    """Prompt/response pairs in the bundled tokenizer, the prompt untrained."""
    from tokenizers import Tokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED, BUNDLED_PATH, load_tokenizer

    spec = load_tokenizer(BUNDLED)
    tokenizer = Tokenizer.from_file(str(BUNDLED_PATH / "tokenizer.json"))
    with DatasetWriter(path, vocab_size=spec.vocab_size, tokenizer=spec.as_metadata(),
                       masks=True, sft={"format": "test"}) as writer:  # fmt: skip
        for i in range(30):
            prompt = tokenizer.encode(f"Question {i}: what is two plus two?\nAnswer:").ids
            answer = tokenizer.encode(" Four.").ids + [spec.eos_id]
            writer.add(np.array(prompt + answer), mask=[0] * len(prompt) + [1] * len(answer))
    return path


def test_decode_brackets_untrained_text_and_dump_holds_the_labels(tmp_path, capsys):
    data = bundled_sft_dataset(tmp_path / "sft")
    out = tmp_path / "b.npz"
    args = ["stream", str(data), "--seq-len", "40", "--batch-size", "2", "--shuffle-buffer",
            "0", "--max-batches", "2", "--decode", "1", "--dump", str(out)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "greedy packing" in text  # the default for data with loss masks
    # capsys is not a terminal: brackets, around the prompt and never around the answer.
    assert "[[Question 0: what is two plus two?\nAnswer:]] Four." in text
    assert "4 of 20 tokens trained" in text and "\x1b[" not in text
    dump = np.load(out)
    labels = dump["labels"]
    assert labels.shape == (2, 2, 40)
    assert dump["num_trained_tokens"].tolist() == [int((b != -100).sum()) for b in labels]
    trained = labels[labels != -100]
    assert 0 < len(trained) < labels.size / 3  # the prompts are not trained


def test_decode_colours_untrained_text_on_a_terminal(tmp_path, capsys, monkeypatch):
    import sys

    data = bundled_sft_dataset(tmp_path / "sft")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    args = ["stream", str(data), "--seq-len", "40", "--batch-size", "1", "--shuffle-buffer",
            "0", "--max-batches", "1", "--decode", "1"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "\x1b[2;37mQuestion 0: what is two plus two?\nAnswer:\x1b[0m Four." in text
    assert "[[" not in text


def test_overlong_option_and_statistics(tmp_path, capsys):
    data = bundled_sft_dataset(tmp_path / "sft")
    args = ["stream", str(data), "--seq-len", "9", "--batch-size", "2", "--json"]
    with pytest.raises(ShardtokError, match="600 tokens .600 of them lost to overlong='drop'"):
        main([*args, "--overlong", "drop"])  # every document is longer than a sequence
    assert main([*args, "--overlong", "truncate", "--max-batches", "3"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["overlong_documents"] == 6 and stats["overlong_tokens_dropped"] > 0
    # Truncated to their prompts, these conversations train nothing: said, not hidden.
    assert stats["trained_share"] == 0 and stats["batches_without_trained_tokens"] == 3
    assert main([*args[:-1], "--overlong", "truncate", "--max-batches", "1"]) == 0
    assert "warning: 1 batches have no trained label" in capsys.readouterr().out
