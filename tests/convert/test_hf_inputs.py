"""Hugging Face `datasets` inputs: a real save_to_disk folder (tests/fixtures/hf, written by
datasets itself) converts to the same documents as its rows as JSONL; single .arrow files in
both IPC formats; a DatasetDict, a damaged state.json or a path-escaping data file name are one
line; rejects name the Arrow file and row; the bytes do not depend on the worker count."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.inputs.compressed import DamagedInputError
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.hf_folder import HFDatasetError
from shardtok.convert.inputs.records import RangeReader
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import plan_units
from shardtok.errors import BadRecordError, ShardtokError
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage import open_source
from tests.convert.test_determinism import tree_digest

pa = pytest.importorskip("pyarrow")

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
DATASET = FIXTURE / "dataset"
ROWS = [json.loads(line) for line in (FIXTURE / "rows.jsonl").read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


def run(spec, inputs, out: Path, workers: int = 1, **fields):
    fields = {"unit_size": 4096, **fields}
    return convert(
        ConvertJob(inputs=tuple(map(str, inputs)), output=str(out), tokenizer=spec, **fields),
        RunOptions(workers=workers, progress=False),
    )


def documents(out: Path) -> list[list[int]]:
    docs = []
    for shard in load_manifest(out).shards:
        reader = ShardReader(open_source(out / shard.file))
        docs += [reader.document(i).tolist() for i in range(reader.meta.num_documents)]
    return docs


def provenance(out: Path) -> list[tuple[str, int, int]]:
    rows = []
    for shard in load_manifest(out).shards:
        for p in ShardReader(open_source(out / shard.file)).meta.provenance:
            rows.append((Path(p["file"]).name, p["first_record"], p["last_record"]))
    return rows


def write_arrow(path: Path, table, batch_rows: int, file_format: bool = False) -> Path:
    opener = pa.ipc.new_file if file_format else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    return path


def texts(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    words = ["arrow", "batch", "row", "group", "stream", "token", "naïve", "東京", "🚀", "café"]
    return [f"{i}: " + " ".join(rng.choices(words, k=rng.randint(2, 60))) for i in range(n)]


def test_save_to_disk_folder_converts_like_its_rows_as_jsonl(spec, tmp_path):
    hf = run(spec, [DATASET], tmp_path / "hf")
    jsonl = run(spec, [FIXTURE / "rows.jsonl"], tmp_path / "jsonl")
    assert documents(tmp_path / "hf") == documents(tmp_path / "jsonl")
    assert hf.records_read == hf.documents == len(ROWS) == jsonl.documents
    assert hf.units_total > 4  # the batches of both files were cut into row ranges
    inputs = load_manifest(tmp_path / "hf").extra["convert"]["inputs"]
    names = [f"data-0000{i}-of-00002.arrow" for i in range(2)]
    assert [Path(i["path"]).name for i in inputs] == names  # state.json's order
    # Every row named once, by its data file and its row there (from 1).
    covered = [(f, n) for f, a, b in provenance(tmp_path / "hf") for n in range(a, b + 1)]
    assert covered == [(name, n) for name in names for n in range(1, 151)]


def test_pieces_read_every_row_once_in_order(tmp_path):
    """Row ranges of record batches, through one worker's block cache: the rows (as the SFT path
    reads them: whole records) are the dataset's, in order."""
    files = discover([str(DATASET)])
    units = plan_units(files, 3000, "file")
    assert any(p.rows is not None for u in units for p in u.pieces)
    cache, rows = BlockCache(), []
    for unit in units:
        for piece in unit.pieces:
            reader = RangeReader(files[piece.input_index], piece, "text", "file", objects=True,
                                 cache=cache)  # fmt: skip
            rows += [row for _, row in reader]
    assert rows == ROWS
    assert cache.key is None, "nothing is held once the last range of a batch is read"


@pytest.mark.parametrize("file_format", [False, True], ids=["stream", "file"])
def test_single_arrow_files(spec, tmp_path, file_format):
    rows = texts(120, seed=3)
    table = pa.table({"meta": [{"body": t} for t in rows], "text": rows})
    path = write_arrow(tmp_path / "one.arrow", table, batch_rows=25, file_format=file_format)
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    result = run(spec, [path], tmp_path / "arrow", unit_size=2048)
    run(spec, [tmp_path / "same.jsonl"], tmp_path / "jsonl", unit_size=2048)
    assert documents(tmp_path / "arrow") == documents(tmp_path / "jsonl")
    assert result.units_total > 3
    run(spec, [path], tmp_path / "nested", text_key="meta.body")
    assert documents(tmp_path / "nested") == documents(tmp_path / "jsonl")


def test_workers_one_and_two_give_the_same_bytes(spec, tmp_path):
    rows = texts(500, seed=5)
    big = write_arrow(tmp_path / "big.arrow", pa.table({"text": rows}), batch_rows=250)
    inputs = [DATASET, big]
    units = plan_units(discover(list(map(str, inputs))), 8 << 10, "file")
    ranged = [p for u in units for p in u.pieces if p.input_index == 2 and p.rows is not None]
    assert len(ranged) > 4, "each big batch is cut into several row ranges"
    options = {"unit_size": 8 << 10, "frame_size": 4 << 10, "shard_size": 16 << 10}
    run(spec, inputs, tmp_path / "w1", workers=1, **options)
    run(spec, inputs, tmp_path / "w2", workers=2, **options)
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")
    assert len(load_manifest(tmp_path / "w1").shards) > 1


def test_rejects_name_the_arrow_file_and_row(spec, tmp_path):
    rows: list = texts(40, seed=9)
    rows[2], rows[30] = "", None
    path = write_arrow(tmp_path / "r.arrow", pa.table({"text": rows}), batch_rows=8)
    result = run(spec, [path], tmp_path / "skip", unit_size=512, on_bad_record="skip")
    assert result.units_total > 3
    rejects = [json.loads(x) for x in (tmp_path / "skip" / "rejects.jsonl").read_text().split("\n")
               if x]  # fmt: skip
    assert [(r["file"], r["line"], r["reason"]) for r in rejects] == [
        (str(path), 3, "empty_document"),
        (str(path), 31, "missing_field"),
    ]
    assert result.records_read == 40 and result.documents == 38
    with pytest.raises(BadRecordError, match=r"r\.arrow, line 3: empty_document"):
        run(spec, [path], tmp_path / "error", unit_size=512)


def test_dataset_dict_is_refused_naming_its_splits(tmp_path):
    for named in (FIXTURE / "dataset_dict", FIXTURE):  # given directly, or met in a folder's walk
        with pytest.raises(HFDatasetError) as error:
            discover([str(named)])
        text = str(error.value)
        assert "DatasetDict (splits: train, test)" in text and "\n" not in text
        assert f"e.g. {FIXTURE / 'dataset_dict' / 'train'}" in text
    assert len(discover([str(FIXTURE / "dataset_dict" / "train")])) == 1
    # Splits dataset_dict.json names but the folder lacks are not suggested as paths.
    hostile = tmp_path / "dict"
    shutil.copytree(FIXTURE / "dataset_dict", hostile)
    (hostile / "dataset_dict.json").write_text('{"splits": ["../../etc", "test", "x\\ny"]}')
    with pytest.raises(HFDatasetError, match=r"\(splits: test\), not one dataset: .*e\.g\. "):
        discover([str(hostile)])
    proc = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(FIXTURE / "dataset_dict"), "-o",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("shardtok convert: error: ") and "DatasetDict" in error


def test_a_pattern_naming_a_datasets_folders_metadata_says_what_it_is():
    """`saved/*` read dataset_info.json as JSONL: "line 1: invalid_json" (the issue's symptom)."""
    for named in (DATASET / "*", FIXTURE / "dataset_dict" / "dataset_dict.json"):
        with pytest.raises(HFDatasetError, match="metadata of a Hugging Face datasets folder"):
            discover([str(named)])
    assert len(discover([str(DATASET / "*.arrow")])) == 2


def _state(files: list[str]) -> str:
    return json.dumps({"_data_files": [{"filename": f} for f in files], "_split": None})


@pytest.mark.parametrize(
    "state, message",
    [
        ("{not json", "not valid JSON"),
        ('{"_data_files": "data.arrow"}', "_data_files is not a list"),
        ('{"_data_files": [{"name": "x.arrow"}]}', "_data_files[0] has no filename"),
        (_state(["../rows.jsonl"]), "names '../rows.jsonl', not an .arrow file of this folder"),
        (_state(["../dataset_dict/train/data-00000-of-00001.arrow"]), "never a path"),
        (_state(["/etc/x.arrow"]), "never a path"),
        (_state(["data-00000-of-00002.arrow"] * 2), "twice"),
        (_state(["data-00002-of-00002.arrow"]), "lists 'data-00002-of-00002.arrow', which is not"),
        # a zero-width space: shown, or the "missing" file looks present
        (_state(["data-00000-of-00002\u200b.arrow"]), r"lists 'data-00000-of-00002\u200b.arrow'"),
        (_state([]), "an empty dataset"),
        ('{"_data_files": [], "_indices_data_files": [{"filename": "i.arrow"}]}', "indices"),
    ],
)
def test_a_damaged_state_json_is_one_line(tmp_path, state, message):
    folder = tmp_path / "ds"
    shutil.copytree(DATASET, folder)
    (folder / "state.json").write_text(state)
    with pytest.raises(HFDatasetError) as error:
        discover([str(folder)])
    text = str(error.value)
    assert message in text and "\n" not in text and "state.json" in text


def test_a_long_data_file_list_is_checked_in_linear_time(monkeypatch):
    """state.json is someone else's: checking its names for duplicates with a list's `in` took
    ~30 s for 100,000 names. Counted in comparisons, not seconds."""
    import types

    from shardtok.convert.inputs import hf_folder

    compared = 0

    class Name(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            nonlocal compared
            compared += 1
            return str.__eq__(self, other)

    names = [Name(f"data-{i:05d}.arrow") for i in range(2000)]
    doc = {"_data_files": [{"filename": n} for n in names]}
    monkeypatch.setattr(hf_folder, "json", types.SimpleNamespace(loads=lambda _: doc))
    assert hf_folder.data_files("ds", b"") == names
    assert compared < 10 * len(names)


def test_a_data_file_linking_outside_the_folder_is_not_read(tmp_path):
    folder = tmp_path / "ds"
    shutil.copytree(DATASET, folder)
    outside = tmp_path / "elsewhere.arrow"
    shutil.copy(folder / "data-00001-of-00002.arrow", outside)
    (folder / "data-00001-of-00002.arrow").unlink()
    os.symlink(outside, folder / "data-00001-of-00002.arrow")
    with pytest.raises(HFDatasetError, match="a link to a file outside the dataset folder"):
        discover([str(folder)])
    # Nor is a state.json that links out (it would be read to name the data files).
    (folder / "data-00001-of-00002.arrow").unlink()
    shutil.copy(outside, folder / "data-00001-of-00002.arrow")
    shutil.move(folder / "state.json", tmp_path / "state.json")
    os.symlink(tmp_path / "state.json", folder / "state.json")
    with pytest.raises(HFDatasetError, match=r"ds/state\.json: a link to a file outside"):
        discover([str(folder)])


def test_a_cut_or_foreign_arrow_file_is_one_line(spec, tmp_path):
    data = (DATASET / "data-00000-of-00002.arrow").read_bytes()
    cut, between, foreign = (tmp_path / f"{n}.arrow" for n in ("cut", "between", "foreign"))
    cut.write_bytes(data[: len(data) // 2])
    between.write_bytes(data[:8784])  # where the second record batch starts
    foreign.write_bytes(b'{"text": "not arrow"}\n' * 10)
    for path, message in (
        (cut, "cut short"),
        (between, "ends without its end-of-stream marker"),
        (foreign, "not an Arrow IPC message"),
    ):
        with pytest.raises(DamagedInputError) as error:
            run(spec, [path], tmp_path / path.stem)
        text = str(error.value)
        assert text.startswith(f"{path}, byte offset ") and message in text
        assert "\n" not in text


@pytest.mark.parametrize(
    "old, new, message",
    [
        (b"aaaabbbb", b"\xffaaabbbb", "Invalid UTF8"),
        (struct.pack("<3i", 0, 4, 8), struct.pack("<3i", 0, -(2**31), 8), "non-monotonic offset"),
        (b"text", b"\x80ext", "can't decode byte 0x80"),  # the schema's field name
    ],
    ids=["utf8", "offset", "field-name"],
)
def test_a_record_batch_with_damaged_bytes_is_one_line(tmp_path, old, new, message):
    """The scanner reads headers only: a body's bad string offsets or UTF-8 would reach
    to_pylist (a SystemError, or a worker killed reading outside the buffer) unless the decoded
    batch is validated; a field name that is not UTF-8 fails in pyarrow's Python layer."""
    path = write_arrow(tmp_path / "d.arrow", pa.table({"text": ["aaaa", "bbbb"]}), batch_rows=2)
    data = path.read_bytes()
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    (file,) = discover([str(path)])
    (unit,) = plan_units([file], 1 << 20, "file")
    with pytest.raises(DamagedInputError) as error:
        list(RangeReader(file, unit.pieces[0], "text", "file"))
    text = str(error.value)
    assert text.startswith(f"{path}, byte offset ") and "do not decode" in text and message in text


@pytest.fixture(scope="module")
def small_arrow(tmp_path_factory) -> bytes:
    table = pa.table({"text": texts(12, seed=2), "meta": [{"n": i} for i in range(12)]})
    return write_arrow(tmp_path_factory.mktemp("fuzz") / "s.arrow", table, 4).read_bytes()


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.data())
def test_a_damaged_arrow_file_is_one_line_or_reads(small_arrow, tmp_path, data):
    """Someone else's bytes: changed bytes, extreme lengths or offsets, a cut. Planning and
    reading either work or stop with one ShardtokError line: never another exception, a
    crash or a huge allocation (a worker's MemoryError was one before validation)."""
    damaged = bytearray(small_arrow)
    where = data.draw(st.integers(0, len(damaged) - 8))
    how = data.draw(st.sampled_from(["bytes", "int32", "int64", "cut"]))
    if how == "bytes":
        damaged[where : where + 2] = data.draw(st.binary(min_size=2, max_size=2))
    elif how == "cut":
        del damaged[where:]
    else:
        fmt, bits = ("<i", 31) if how == "int32" else ("<q", 63)
        value = data.draw(st.sampled_from([-1, -8, 2**bits - 1, -(2**bits), 1 << 30]))
        struct.pack_into(fmt, damaged, where & ~3, value)
    path = tmp_path / f"d{data.draw(st.integers(0, 10**9))}.arrow"
    path.write_bytes(bytes(damaged))
    try:
        (file,) = discover([str(path)])
        for unit in plan_units([file], 600, "file"):
            for piece in unit.pieces:
                list(RangeReader(file, piece, "text", "file"))
    except ShardtokError as error:
        assert "\n" not in str(error) and str(path) in str(error)


def test_a_save_to_disk_prefix_on_an_object_store(s3_server):  # noqa: F811
    prefix = f"hf-{uuid.uuid4().hex[:8]}"
    for path in sorted(FIXTURE.rglob("*")):
        if path.is_file() and path.parent != FIXTURE:
            s3_server.put(f"{prefix}/{path.relative_to(FIXTURE).as_posix()}", path.read_bytes())
    options = s3_server.storage_options()
    remote = discover([s3_server.url(f"{prefix}/dataset")], storage_options=options)
    local = discover([str(DATASET)])
    assert [Path(f.path).name for f in remote] == [Path(f.path).name for f in local]
    units = plan_units(local, 3000, "file")
    assert plan_units(remote, 3000, "file", storage_options=options) == units
    for unit in units[:3]:
        for piece in unit.pieces:
            records = [
                list(RangeReader(files[piece.input_index], piece, "text", "file",
                                 storage_options=o))
                for files, o in ((local, None), (remote, options))
            ]  # fmt: skip
            assert records[0] == records[1] and records[0]
    with pytest.raises(HFDatasetError, match=r"DatasetDict \(splits: train, test\)"):
        discover([s3_server.url(f"{prefix}/dataset_dict/")], storage_options=options)
