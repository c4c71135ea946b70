"""Every input format converts, and decoding the shards gives back exactly the input texts."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import zstandard

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.errors import ShardtokError
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage import open_source

TEXTS = [
    "Hello, world.",
    "  leading spaces and trailing tabs\t\t",
    "multi\nline\n\ndocument with a blank line",
    "unicode: naïve café — 東京 🚀 \u00a0nbsp",
    'quotes "double" and \\backslash\\ and {"json": 1}',
    "x",
    "def f(x):\n    return x ** 2  # code is text too\n",
] + [f"document number {i} says {'word ' * (i % 13)}end." for i in range(40)]

ONE_LINE_TEXTS = [t for t in TEXTS if "\n" not in t]


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


@pytest.fixture(scope="module")
def decode(spec):
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(spec.backend_json)
    return lambda ids: backend.decode(ids.tolist(), skip_special_tokens=False)


def run(spec, inputs, out: Path, workers: int = 1, **fields):
    fields = {"unit_size": 512, **fields}
    return convert(
        ConvertJob(inputs=tuple(map(str, inputs)), output=str(out), tokenizer=spec, **fields),
        RunOptions(workers=workers, progress=False),
    )


def documents(out: Path) -> list[np.ndarray]:
    manifest = load_manifest(out)
    docs = []
    for shard in manifest.shards:
        docs.extend(ShardReader(open_source(out / shard.file)).documents())
    return docs


def decoded_texts(out: Path, decode, eos: int) -> list[str]:
    texts = []
    for doc in documents(out):
        assert doc[-1] == eos, "every document ends with EOS"
        texts.append(decode(doc[:-1]))
    return texts


def jsonl_bytes(texts, key="text") -> bytes:
    return b"".join((json.dumps({key: t, "id": i}) + "\n").encode() for i, t in enumerate(texts))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_variants_round_trip(tmp_path, spec, decode, suffix):
    data = jsonl_bytes(TEXTS)
    if suffix.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif suffix.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path = tmp_path / f"corpus{suffix}"
    path.write_bytes(data)
    result = run(spec, [path], tmp_path / "out")
    assert decoded_texts(tmp_path / "out", decode, spec.eos_id) == TEXTS
    assert result.documents == result.records_read == len(TEXTS)
    # Plain files are cut into several units at line starts; compressed ones are one unit each.
    assert (result.units_total > 1) == (suffix in (".jsonl", ".json"))


def test_round_trip_through_transformers_decode(tmp_path, spec):
    from transformers import AutoTokenizer

    from shardtok.convert.tokenizing.tokenizer import BUNDLED_PATH

    tok = AutoTokenizer.from_pretrained(str(BUNDLED_PATH), local_files_only=True)
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes(TEXTS))
    run(spec, [tmp_path / "c.jsonl"], tmp_path / "out")
    texts = [tok.decode(doc[:-1].tolist()) for doc in documents(tmp_path / "out")]
    assert texts == TEXTS


def test_provenance_names_file_lines_across_units(tmp_path, spec):
    # Blank lines count as lines but are not records, so line numbers stay those of the file.
    lines = jsonl_bytes(TEXTS).split(b"\n")
    data = b"\n".join(lines[:3] + [b"", b"   "] + lines[3:])
    (tmp_path / "c.jsonl").write_bytes(data)
    result = run(spec, [tmp_path / "c.jsonl"], tmp_path / "out", unit_size=300)
    assert result.units_total > 3
    provenance = []
    for shard in load_manifest(tmp_path / "out").shards:
        provenance.extend(ShardReader(open_source(tmp_path / "out" / shard.file)).meta.provenance)
    expected_lines = [1, 2, 3] + list(range(6, 6 + len(TEXTS) - 3))
    covered = [n for p in provenance for n in range(p["first_record"], p["last_record"] + 1)]
    assert covered == expected_lines
    assert {p["file"] for p in provenance} == {str(tmp_path / "c.jsonl")}


def test_nested_text_key(tmp_path, spec, decode):
    data = b"".join(
        (json.dumps({"meta": {"body": {"content": t}}, "text": "decoy"}) + "\n").encode()
        for t in TEXTS
    )
    (tmp_path / "c.jsonl").write_bytes(data)
    run(spec, [tmp_path / "c.jsonl"], tmp_path / "out", text_key="meta.body.content")
    assert decoded_texts(tmp_path / "out", decode, spec.eos_id) == TEXTS


def test_parquet_row_groups_and_nested_column(tmp_path, spec, decode):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "text": TEXTS,
            "nested": [{"inner": t} for t in TEXTS],
            "n": list(range(len(TEXTS))),
        }
    )
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=7)
    result = run(spec, [tmp_path / "c.parquet"], tmp_path / "flat")
    assert decoded_texts(tmp_path / "flat", decode, spec.eos_id) == TEXTS
    # At this unit size every row group is larger than a unit, so it is cut into row ranges.
    assert result.units_total > -(-len(TEXTS) // 7)
    run(spec, [tmp_path / "c.parquet"], tmp_path / "nested", text_key="nested.inner")
    assert decoded_texts(tmp_path / "nested", decode, spec.eos_id) == TEXTS


def test_txt_one_document_per_file(tmp_path, spec, decode):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        (folder / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    run(spec, [folder], tmp_path / "out")
    assert decoded_texts(tmp_path / "out", decode, spec.eos_id) == TEXTS


def test_txt_one_document_per_line(tmp_path, spec, decode):
    # CRLF endings and blank separator lines: documents are the non-blank lines, without "\r".
    body = "\r\n".join(ONE_LINE_TEXTS[:5]) + "\r\n\r\n" + "\n".join(ONE_LINE_TEXTS[5:])
    (tmp_path / "c.txt").write_bytes(body.encode("utf-8"))
    result = run(spec, [tmp_path / "c.txt"], tmp_path / "out", txt_mode="lines")
    assert decoded_texts(tmp_path / "out", decode, spec.eos_id) == ONE_LINE_TEXTS
    assert result.records_read == len(ONE_LINE_TEXTS)


def test_folder_and_glob_mix_in_sorted_order(tmp_path, spec, decode):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    chunks = [TEXTS[0:10], TEXTS[10:20], TEXTS[20:30], TEXTS[30:]]
    (data / "b.jsonl").write_bytes(jsonl_bytes(chunks[1]))
    (data / "a.jsonl").write_bytes(jsonl_bytes(chunks[0]))
    (data / "sub" / "c.jsonl.gz").write_bytes(gzip.compress(jsonl_bytes(chunks[2]), mtime=0))
    (data / "notes.md").write_text("not an input")
    other = tmp_path / "other"
    other.mkdir()
    (other / "y.jsonl").write_bytes(jsonl_bytes(chunks[3][5:]))
    (other / "x.jsonl").write_bytes(jsonl_bytes(chunks[3][:5]))
    result = run(spec, [data, str(other / "*.jsonl")], tmp_path / "out", workers=2)
    assert decoded_texts(tmp_path / "out", decode, spec.eos_id) == TEXTS
    paths = [i["path"] for i in result.manifest.extra["convert"]["inputs"]]
    assert [Path(p).name for p in paths] == [
        "a.jsonl",
        "b.jsonl",
        "c.jsonl.gz",
        "x.jsonl",
        "y.jsonl",
    ]


def test_bos_and_no_eos(tmp_path, spec):
    (tmp_path / "c.jsonl").write_bytes(jsonl_bytes(TEXTS[:5]))
    bos_spec = load_tokenizer("bundled", append_eos=False, prepend_bos=True)
    run(bos_spec, [tmp_path / "c.jsonl"], tmp_path / "out")
    with_eos = documents(tmp_path / "out")
    run(spec, [tmp_path / "c.jsonl"], tmp_path / "plain")
    for bos_doc, eos_doc in zip(with_eos, documents(tmp_path / "plain"), strict=True):
        assert bos_doc[0] == bos_spec.bos_id and eos_doc[-1] == spec.eos_id
        assert np.array_equal(bos_doc[1:], eos_doc[:-1])


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: None, "does not exist"),
        (lambda p: p.with_suffix(".csv").write_text("a,b\n"), "unknown input format"),
    ],
)
def test_bad_inputs_are_named(tmp_path, spec, setup, message):
    target = tmp_path / "input.csv"
    setup(target)
    with pytest.raises(ShardtokError, match=message):
        run(spec, [target], tmp_path / "out")


def test_corrupt_compressed_input_names_the_file(tmp_path, spec):
    data = gzip.compress(jsonl_bytes(TEXTS), mtime=0)
    (tmp_path / "c.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardtokError, match=r"c\.jsonl\.gz, byte offset \d+: the file ends inside"):
        run(spec, [tmp_path / "c.jsonl.gz"], tmp_path / "out")


def test_output_folder_inside_an_input_folder_is_not_read(tmp_path, spec, decode):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_bytes(jsonl_bytes(TEXTS))
    run(spec, [data], data / "out", on_bad_record="skip")
    again = run(
        spec, [data], data / "out", on_bad_record="skip"
    )  # index.json must not become input
    assert again.already_complete
    assert decoded_texts(data / "out", decode, spec.eos_id) == TEXTS
