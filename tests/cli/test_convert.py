"""The convert / sample-corpus command lines, size parsing, and the work-unit plan."""

from __future__ import annotations

import argparse
import json

import pytest

from shardtok.cli import convert as cli
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import auto_unit_size, plan_units


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shardtok")
    sub = p.add_subparsers(dest="command")
    cli.add_parser(sub)
    cli.add_sample_corpus_parser(sub)
    return p


@pytest.mark.parametrize(
    "text, size",
    [
        ("64MB", 64 * 10**6),
        ("64MiB", 64 << 20),
        ("1GiB", 1 << 30),
        ("1048576", 1 << 20),
        ("1.5k", 1500),
        ("512KiB", 512 << 10),
    ],
)
def test_parse_size(text, size):
    assert cli.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "MB", "12XB", "-5MB", "0"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_size(text)


def test_compression_levels():
    assert cli.parse_compression("none") is None and cli.parse_compression("0") is None
    assert cli.parse_compression("19") == 19
    with pytest.raises(argparse.ArgumentTypeError):
        cli.parse_compression("23")


def test_help_teaches_with_an_example(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["convert", "--help"])
    text = capsys.readouterr().out
    assert "examples:" in text and "shardtok convert corpus.jsonl --output data/" in text
    assert "--on-bad-record" in text and "rejects.jsonl" in text


def test_defaults():
    args = parser().parse_args(["convert", "in.jsonl", "-o", "out"])
    assert (args.tokenizer, args.text_key, args.workers, args.on_bad_record) == (
        "bundled",
        "text",
        0,
        "error",
    )
    assert (args.shard_size, args.compression_level, args.append_eos, args.prepend_bos) == (
        64 << 20,
        3,
        True,
        False,
    )
    args = parser().parse_args(
        ["convert", "in.jsonl", "-o", "out", "--no-append-eos", "--compression-level", "none"]
    )
    assert args.append_eos is False and args.compression_level is None
    assert args.cache_dir is None, "nothing is cached unless asked"


def test_cache_dir_keeps_the_gate_verdict(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a few words"}\n')
    cache = tmp_path / "cache"
    argv = ["convert", str(corpus), "-o", str(tmp_path / "out"), "-q", "--workers", "1"]
    args = parser().parse_args([*argv, "--cache-dir", str(cache)])
    assert args.run(args) == 0
    # The bundled tokenizer fails the merge checks; the refusal is what gets cached.
    assert len(list((cache / "tiktoken-gate").glob("sha256-*.json"))) == 1


def test_sample_corpus_then_convert_through_run(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    args = parser().parse_args(["sample-corpus", str(corpus), "--max-size", "200KB"])
    assert args.run(args) == 0
    first = corpus.read_bytes()
    assert 150_000 < len(first) <= 200_000
    records = [json.loads(line) for line in first.splitlines()]
    assert all(r["text"].strip() and r["source"] for r in records)
    assert args.run(args) == 0 and corpus.read_bytes() == first, "the corpus is deterministic"

    out = tmp_path / "data"
    args = parser().parse_args(
        ["convert", str(corpus), "-o", str(out), "--workers", "2", "--compression-level", "0"]
    )
    assert args.run(args) == 0
    summary = capsys.readouterr().out
    assert f"{len(records):,} read = {len(records):,} written + 0 rejected" in summary
    assert (out / "index.json").exists() and (out / "shard-000000.tar").exists()


def test_main_reports_errors(tmp_path, capsys):
    from shardtok.cli import main

    assert (
        main(["convert", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "out"), "-q"]) == 1
    )
    assert "does not exist" in capsys.readouterr().err


def _plan(tmp_path, files: dict[str, bytes], unit_size: int, txt_mode: str = "file"):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    inputs = discover([str(tmp_path / n) for n in files])
    return inputs, plan_units(inputs, unit_size, txt_mode)


def test_units_cover_every_byte_at_line_starts(tmp_path):
    data = b"".join(b"x" * (i % 37) + b"\n" for i in range(500)) + b"no final newline"
    inputs, units = _plan(tmp_path, {"a.jsonl": data}, unit_size=1000)
    pieces = [p for u in units for p in u.pieces]
    assert pieces[0].start == 0 and pieces[-1].end == len(data)
    for before, after in zip(pieces, pieces[1:], strict=False):
        assert before.end == after.start and data[after.start - 1 : after.start] == b"\n"
    assert all(u.nbytes >= 1000 for u in units[:-1]) and len(units) > 5


def test_small_files_share_units_and_whole_files_stay_whole(tmp_path):
    files = {f"{i}.jsonl": b'{"text": "t"}\n' * 3 for i in range(10)}
    files["big.txt"] = b"line\n" * 1000
    inputs, units = _plan(tmp_path, files, unit_size=100)
    # 42-byte files share units; a unit is closed at the first line start past 100 bytes.
    first = units[0].pieces
    assert [(p.input_index, p.start, p.end) for p in first] == [(0, 0, 42), (1, 0, 42), (2, 0, 28)]
    assert all(
        100 <= u.nbytes < 100 + 14
        for u in units
        if not any(inputs[p.input_index].kind == "txt" for p in u.pieces)
    )
    big = [p for u in units for p in u.pieces if inputs[p.input_index].path.endswith("big.txt")]
    assert len(big) == 1 and (big[0].start, big[0].end) == (0, 5000)  # one document per .txt file
    _, by_line = _plan(tmp_path, {"big.txt": b"line\n" * 1000}, unit_size=100, txt_mode="lines")
    assert len(by_line) == 50


def test_auto_unit_size_bounds():
    assert auto_unit_size(0) == 256 << 10
    assert auto_unit_size(64 << 20) == 1 << 20
    assert auto_unit_size(1 << 40) == 16 << 20


def test_sample_corpus_skips_whitespace_only_docstrings():
    import ast

    from shardtok.convert.inputs.sample_corpus import _docstrings

    tree = ast.parse(
        '"""Module doc."""\ndef f():\n    """    """\nclass C:\n    def g(self):\n        """Real text."""\n'
    )
    assert list(_docstrings(tree, "m")) == [("m", "Module doc."), ("m.C.g", "Real text.")]
