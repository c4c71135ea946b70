"""A Parquet row group larger than a unit is cut into row ranges that workers share: the same
bytes for any worker count, the same documents as JSONL, rows named as the file's; a worker
decodes a row group once for all its ranges; plans of the previous version are resumed (or
started over when their units differ) and newer ones refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.engines import ranks
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.records import RangeReader
from shardtok.convert.inputs.table_pieces import BlockCache
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job import phases, unit_status
from shardtok.convert.job.plan_file import PlanError
from shardtok.convert.job.workdir import WORK_DIR_NAME
from tests.convert.test_determinism import tree_digest
from tests.convert.test_hf_inputs import documents, provenance, texts

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

UNIT = 8 << 10
SMALL = {"unit_size": UNIT, "frame_size": 4 << 10, "shard_size": 16 << 10}


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


@pytest.fixture(scope="module")
def rows() -> list:
    rows: list = texts(600, seed=11)
    rows[450] = ""  # a reject deep inside a later row range
    return rows


@pytest.fixture(scope="module")
def corpus(rows, tmp_path_factory) -> Path:
    """The same rows as a Parquet file of one row group, and as JSONL."""
    folder = tmp_path_factory.mktemp("parquet")
    table = pa.table({"text": rows, "n": list(range(len(rows)))})
    pq.write_table(table, folder / "one.parquet", row_group_size=len(rows))
    with open(folder / "same.jsonl", "w") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in rows)
    return folder


def options(spec, inputs, out: Path, **kw) -> tuple[ConvertJob, RunOptions]:
    base = {"workers": 1, "progress": False, "on_bad_record": "skip", **SMALL, **kw}
    run = {k: base.pop(k) for k in ("workers", "progress", "keep_work") if k in base}
    job = ConvertJob(inputs=tuple(map(str, inputs)), output=str(out), tokenizer=spec, **base)
    return job, RunOptions(**run)


def test_one_row_group_is_cut_into_row_ranges(corpus, tmp_path):
    files = discover([str(corpus / "one.parquet")])
    units = plan_units(files, UNIT, "file")
    pieces = [p for u in units for p in u.pieces]
    assert len(units) > 5 and all(p.row_group == 0 for p in pieces)
    # Contiguous ranges covering every row once; each unit's bytes close to the unit size.
    assert [p.rows[0] for p in pieces] == [0] + [p.rows[1] for p in pieces[:-1]]
    assert pieces[-1].rows[1] == 600
    assert all(UNIT <= u.nbytes < 2 * UNIT for u in units[:-1])
    # Row groups that fit in a unit stay whole, as before.
    pq.write_table(pq.read_table(corpus / "one.parquet"), tmp_path / "many.parquet",
                   row_group_size=20)  # fmt: skip
    many = plan_units(discover([str(tmp_path / "many.parquet")]), UNIT, "file")
    assert all(p.rows is None for u in many for p in u.pieces)


def test_workers_share_a_row_group_with_the_same_bytes(spec, corpus, tmp_path):
    one = corpus / "one.parquet"
    convert(*options(spec, [one], tmp_path / "w1", workers=1))
    w2 = convert(*options(spec, [one], tmp_path / "w2", workers=2))
    assert tree_digest(tmp_path / "w1") == tree_digest(tmp_path / "w2")
    assert w2.units_total > 5 and w2.records_read == 600 and w2.documents == 599
    convert(*options(spec, [corpus / "same.jsonl"], tmp_path / "jsonl"))
    assert documents(tmp_path / "w1") == documents(tmp_path / "jsonl")
    # Rows are the file's, 1-based, across ranges: row 451 is the reject, and is not a document.
    covered = [n for _, a, b in provenance(tmp_path / "w1") for n in range(a, b + 1)]
    assert covered == [n for n in range(1, 601) if n != 451]
    (reject,) = [json.loads(x) for x in (tmp_path / "w1" / "rejects.jsonl").read_text().split("\n")
                 if x]  # fmt: skip
    assert (reject["file"], reject["line"], reject["reason"]) == (str(one), 451, "empty_document")


class CountingCache(BlockCache):
    loads = 0

    def get(self, key, load):
        def counted():
            self.loads += 1
            return load()

        return super().get(key, counted)


def test_a_worker_decodes_a_row_group_once_for_its_ranges(corpus, rows):
    files = discover([str(corpus / "one.parquet")])
    units = plan_units(files, UNIT, "file")
    cache = CountingCache()
    read = []
    for unit in units:
        for piece in unit.pieces:
            read += [
                value for _, value in RangeReader(files[0], piece, "text", "file", cache=cache)
            ]
    assert cache.loads == 1 and cache.key is None  # let go after the group's last range
    assert [v for v in read if isinstance(v, str)] == [t for t in rows if t]


def _as_version_1(out: Path) -> None:
    """Rewrite the plan in `out` as the previous version wrote it (pieces without rows)."""
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    for unit in doc["job"]["units"]:
        assert all(piece[4] is None for piece in unit[2])
        unit[2] = [piece[:4] for piece in unit[2]]
    doc["version"] = 1
    del doc["fingerprint"]["plan"]  # (version 1 had no digest of its units)
    plan.write_text(json.dumps(doc))


def test_a_version_1_work_folder_is_resumed(spec, corpus, tmp_path):
    inputs = [corpus / "same.jsonl"]
    out = tmp_path / "out"
    convert(*options(spec, inputs, out, keep_work=True))
    reference = {k: v for k, v in tree_digest(out).items() if not k.startswith(WORK_DIR_NAME)}
    (out / "index.json").unlink()  # an unfinished conversion with every unit done
    _as_version_1(out)
    assert unit_status.status(str(out)).complete  # the phases read it
    result = convert(*options(spec, inputs, out, keep_work=True))
    assert result.units_reused == result.units_total > 5
    doc = json.loads((out / WORK_DIR_NAME / "plan.json").read_text())
    assert doc["version"] == 2
    shutil.rmtree(out / WORK_DIR_NAME)
    assert tree_digest(out) == reference


def test_a_version_1_plan_of_a_whole_row_group(spec, corpus, tmp_path, capsys, caplog):
    """The previous version planned a row group as one unit: the phases still run that plan
    as written; the one-command convert, whose units now differ, starts over."""
    one = corpus / "one.parquet"
    out = tmp_path / "out"
    phases.plan(*options(spec, [one], out))
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    doc["version"] = 1
    del doc["fingerprint"]["plan"]  # (version 1 had no digest of its units)
    doc["job"]["units"] = [[0, one.stat().st_size, [[0, 0, 0, 0]]]]
    plan.write_text(json.dumps(doc))
    assert ranks.run_units(str(out), 0, 1, progress=False).tokenized == 1
    phases.merge(str(out), progress=False)
    convert(*options(spec, [one], tmp_path / "now"))
    assert documents(out) == documents(tmp_path / "now")

    (out / "index.json").unlink()
    (out / WORK_DIR_NAME).mkdir()
    plan.write_text(json.dumps(doc))
    result = convert(*options(spec, [one], out))
    assert result.units_reused == 0 and result.units_total > 5
    said = capsys.readouterr().err + caplog.text
    assert "of plan version 1 (this release plans version 2); starting over" in said


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p.__setitem__(4, [5, 5]), "rows stop must be >= 6"),
        (lambda p: p.__setitem__(4, [0]), "rows must be null or [first, stop]"),
        (lambda p: p.pop(), "must be [input, start, end, row group, rows]"),
    ],
)
def test_a_tampered_row_range_is_refused(spec, corpus, tmp_path, edit, message):
    out = tmp_path / "out"
    phases.plan(*options(spec, [corpus / "one.parquet"], out))
    plan = out / WORK_DIR_NAME / "plan.json"
    doc = json.loads(plan.read_text())
    edit(doc["job"]["units"][0][2][0])
    plan.write_text(json.dumps(doc))
    with pytest.raises(PlanError) as error:
        unit_status.status(str(out))
    assert message in str(error.value) and "\n" not in str(error.value)
