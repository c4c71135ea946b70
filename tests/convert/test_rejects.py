"""Bad records: each kind is rejected with file, line and reason, and every record is accounted for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.errors import BadRecordError
from shardtok.format.manifest import load_manifest

GOOD = json.dumps({"text": "a good document"}).encode()

# (line bytes, reason) for every kind of bad JSONL record.
BAD_LINES = [
    (b'{"text": "unterminated', "invalid_json"),
    (b'{"other": "no text field"}', "missing_field"),
    (b'["not", "an", "object"]', "missing_field"),
    (b'{"text": 42}', "not_a_string"),
    (b'{"text": ["a", "list"]}', "not_a_string"),
    (b'{"text": null}', "missing_field"),
    (b'{"text": "bad byte \xff here"}', "invalid_utf8"),
    (b'{"text": "lone surrogate \\ud800"}', "invalid_utf8"),
    (b'{"text": ""}', "empty_document"),
    (b'{"text": "  \\n\\t "}', "empty_document"),
]


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


def run(spec, inputs, out: Path, **options):
    opts = {"unit_size": 256, **options}
    run = RunOptions(workers=opts.pop("workers", 1), progress=False)
    return convert(
        ConvertJob(inputs=tuple(map(str, inputs)), output=str(out), tokenizer=spec, **opts), run
    )


def corpus_with_bad_lines() -> tuple[bytes, list[tuple[int, str]]]:
    """Good lines around every bad one; returns the data and the expected (line, reason) rejects."""
    lines, expected = [], []
    for bad, reason in BAD_LINES:
        lines += [GOOD, GOOD, bad]
        expected.append((len(lines), reason))
    lines.append(GOOD)
    return b"\n".join(lines) + b"\n", expected


def test_skip_logs_and_counts_every_kind(tmp_path, spec):
    data, expected = corpus_with_bad_lines()
    (tmp_path / "c.jsonl").write_bytes(data)
    result = run(spec, [tmp_path / "c.jsonl"], tmp_path / "out", on_bad_record="skip")
    rejects = [
        json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    ]
    assert [(r["line"], r["reason"]) for r in rejects] == expected
    assert all(r["file"] == str(tmp_path / "c.jsonl") and r["detail"] for r in rejects)

    total = data.count(b"\n")
    extra = load_manifest(tmp_path / "out").extra
    assert extra["records_read"] == result.records_read == total
    assert extra["documents_written"] == result.documents == total - len(BAD_LINES)
    assert extra["records_rejected"] == len(BAD_LINES)
    by_reason: dict[str, int] = {}
    for _, reason in BAD_LINES:
        by_reason[reason] = by_reason.get(reason, 0) + 1
    assert extra["rejected_by_reason"] == by_reason == result.rejected
    assert result.manifest.num_documents == result.documents
    summary = result.summary()
    assert (
        f"{total:,} read = {total - len(BAD_LINES):,} written + {len(BAD_LINES)} rejected"
        in summary
    )


@pytest.mark.parametrize("bad, reason", BAD_LINES)
def test_error_mode_stops_with_file_line_and_reason(tmp_path, spec, bad, reason):
    (tmp_path / "c.jsonl").write_bytes(b"\n".join([GOOD] * 30 + [bad] + [GOOD] * 5) + b"\n")
    with pytest.raises(BadRecordError) as caught:
        run(spec, [tmp_path / "c.jsonl"], tmp_path / "out")
    assert caught.value.path == str(tmp_path / "c.jsonl")
    assert caught.value.line == 31
    assert caught.value.reason.startswith(reason)
    assert not (tmp_path / "out" / "index.json").exists()


def test_error_reports_the_first_bad_record_of_the_input(tmp_path, spec):
    # Several units hold bad records; with two workers a later unit may fail first, yet the
    # error is always the earliest one in input order.
    lines = [GOOD] * 200
    for n in (57, 120, 180):
        lines[n - 1] = b"{broken"
    (tmp_path / "c.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(BadRecordError) as caught:
        run(spec, [tmp_path / "c.jsonl"], tmp_path / "out", workers=2)
    assert caught.value.line == 57
    # The failed units' token and frame files were removed, not left as temporaries.
    work = tmp_path / "out" / WORK_DIR_NAME
    assert sorted(p.name for p in work.glob("unit-*.failed.json"))
    assert not [p.name for p in work.iterdir() if p.name.startswith(".")]


def test_txt_rejects(tmp_path, spec):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("fine")
    (folder / "b.txt").write_bytes(b"\xfe\xff broken")
    (folder / "c.txt").write_text("   \n")
    (tmp_path / "lines.txt").write_bytes(b"one\n\xc3\x28 bad\nthree\n")
    result = run(spec, [folder], tmp_path / "files", on_bad_record="skip")
    assert result.rejected == {"invalid_utf8": 1, "empty_document": 1} and result.documents == 1
    result = run(
        spec, [tmp_path / "lines.txt"], tmp_path / "lines", on_bad_record="skip", txt_mode="lines"
    )
    rejects = (tmp_path / "lines" / "rejects.jsonl").read_text()
    assert json.loads(rejects)["line"] == 2 and result.documents == 2


def test_parquet_rejects(tmp_path, spec):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": ["ok", None, "", "fine", "  "], "n": [1, 2, 3, 4, 5]})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=2)
    result = run(spec, [tmp_path / "c.parquet"], tmp_path / "out", on_bad_record="skip")
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [
        (2, "missing_field"),
        (3, "empty_document"),
        (5, "empty_document"),
    ]
    assert result.documents == 2 and result.records_read == 5
    result = run(
        spec, [tmp_path / "c.parquet"], tmp_path / "nokey", on_bad_record="skip", text_key="body"
    )
    assert result.rejected == {"missing_field": 5} and result.manifest.num_documents == 0


def test_every_record_rejected_gives_an_empty_dataset(tmp_path, spec):
    (tmp_path / "c.jsonl").write_bytes(b'{"text": ""}\n{"x": 1}\n')
    result = run(spec, [tmp_path / "c.jsonl"], tmp_path / "out", on_bad_record="skip")
    assert result.manifest.num_documents == 0 and result.records_read == 2
    assert load_manifest(tmp_path / "out").shards == ()


def test_fixing_the_input_after_an_error_and_rerunning_just_works(tmp_path, spec):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"\n".join([GOOD] * 40 + [b"{broken"] + [GOOD] * 40) + b"\n")
    with pytest.raises(BadRecordError):
        run(spec, [path], tmp_path / "out")
    path.write_bytes(b"\n".join([GOOD] * 81) + b"\n")
    result = run(spec, [path], tmp_path / "out")
    assert result.documents == 81 and result.units_reused == 0
