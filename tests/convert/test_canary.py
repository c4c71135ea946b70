"""The tiktoken canary checked in the main process (canary.py): it finds each unit's first
document as the worker reads it, the worker takes its verdict only for that very text, and
inputs it does not read keep the worker's own canary."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import shardtok.convert.worker.unit_tokenizer as unit_tokenizer
from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.engines.pool import worker_pool
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job.failures import EncoderMismatch
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.tokenizing import tokenizer as tokmod
from shardtok.convert.tokenizing.canary import Checked, UnitCanary, canary_chars
from shardtok.errors import TokenizerMismatchError
from tests.convert.test_tiktoken import _BrokenArrayEncoding, tiktoken_style

UNIT = 1024


@pytest.fixture(scope="module")
def tt_path(tmp_path_factory) -> Path:
    return tiktoken_style(tmp_path_factory.mktemp("tt") / "tt-split")


def _lines(n: int) -> list[str]:
    """Units that open with blank lines, rejects and whitespace-only texts, then documents."""
    lines = []
    for i in range(n):
        if i % 5 == 0:
            lines += ["", "  ", '{"text": 5}', '{"text": "   "}', "{broken"]
        lines.append(json.dumps({"text": f"document {i} " + "words and more words " * (i % 9)}))
    return lines


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(_lines(120)) + "\n")
    return path


def _job(spec, corpus: Path, out: Path, **kw) -> ConvertJob:
    base = dict(
        inputs=(str(corpus),), output=str(out), tokenizer=spec, unit_size=UNIT,
        on_bad_record="skip",
    )  # fmt: skip
    return ConvertJob(**{**base, **kw})


def _run(**kw) -> RunOptions:
    return RunOptions(workers=1, progress=False, **kw)


def _refuse_worker_canary(monkeypatch):
    def refuse(encoder, text, verdict):
        raise AssertionError("the worker ran the canary: the main process's verdict was not taken")

    monkeypatch.setattr(unit_tokenizer, "_run_canary", refuse)  # forked workers inherit it


def test_the_main_process_finds_every_units_first_document(tt_path, corpus, tmp_path, monkeypatch):
    spec = load_tokenizer(str(tt_path))
    reference = convert(_job(spec, corpus, tmp_path / "ref"), _run(start_method="spawn"))
    _refuse_worker_canary(monkeypatch)
    result = convert(_job(spec, corpus, tmp_path / "out"), _run(start_method="fork"))
    assert result.units_total > 10
    assert (result.documents, result.rejected) == (reference.documents, reference.rejected)
    assert (tmp_path / "out" / "index.json").read_bytes() == (
        tmp_path / "ref" / "index.json"
    ).read_bytes()


def test_a_verdict_is_taken_only_for_the_text_the_worker_checks(tt_path, corpus, tmp_path):
    spec = load_tokenizer(str(tt_path))
    job = _job(spec, corpus, tmp_path / "out")
    (tmp_path / "out").mkdir()
    files = discover([str(corpus)])
    units = plan_units(files, UNIT, "file")
    canary = UnitCanary.for_job(spec, files, "text", "file", None)
    unit = units[0]  # opens with blank lines and rejects
    first = canary.check(unit)
    assert first is not None and first.mismatch is None
    assert first.record == 6 and len(first.text) <= canary_chars(unit)
    wrong = [
        Checked(first.piece, first.record, first.text, "made up"),  # taken: the unit fails
        Checked(first.piece, first.record + 1, first.text, "made up"),  # another record
        Checked(first.piece, first.record, first.text + "x", "made up"),  # another text
    ]
    with worker_pool(WorkerConfig(job, tuple(files)), 1) as pool:
        outcomes = [pool.submit(unit, checked).result(timeout=120) for checked in wrong]
    assert isinstance(outcomes[0], EncoderMismatch) and outcomes[0].detail == "made up"
    assert (outcomes[0].piece, outcomes[0].record) == (first.piece, first.record)
    assert all(isinstance(o, UnitResult) for o in outcomes[1:])  # the worker's own canary


def test_a_compressed_input_keeps_the_workers_canary(tt_path, tmp_path, monkeypatch):
    spec = load_tokenizer(str(tt_path))
    broken = _BrokenArrayEncoding(tokmod._LOADED_TIKTOKEN[spec.fingerprint])
    monkeypatch.setitem(tokmod._LOADED_TIKTOKEN, spec.fingerprint, broken)
    corpus = tmp_path / "c.jsonl.gz"
    texts = ["the zebra " * 70, "a" * 600, "b" * 600, "c"]  # one unit: a .gz is never cut
    corpus.write_bytes(
        gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    )
    files = discover([str(corpus)])
    assert (
        UnitCanary.for_job(spec, files, "text", "file", None).check(
            plan_units(files, UNIT, "file")[0]
        )
        is None
    )
    with pytest.raises(TokenizerMismatchError, match="record 1: tiktoken and tokenizers"):
        convert(_job(spec, corpus, tmp_path / "out", on_bad_record="error"), _run())
