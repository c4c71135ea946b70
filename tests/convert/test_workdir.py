"""The work folder on a local directory and on S3 (SeaweedFS): units saved and read back, damage
detected, failure markers, the cheap marker listing, and two writers of one unit at once."""

from __future__ import annotations

import json
import multiprocessing
import uuid
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import WORK_DIR_NAME, WorkDir
from shardtok.convert.worker.process import (
    EncoderMismatch,
    UnitFailure,
    init_worker,
    tokenize_unit,
)
from shardtok.storage.folder import Folder
from tests.helpers.servers import s3_server  # noqa: F401

U16 = np.dtype(np.uint16)
SFT_UNIT = {"trained_tokens": 0, "boundary_tokens": 0, "truncated_records": 0, "jq_rewrites": []}


@pytest.fixture(params=["local", "s3"])
def out(request, tmp_path) -> Folder:
    """An output folder, local or an S3 prefix of the test's own."""
    if request.param == "local":
        return Folder(tmp_path / "out")
    server = request.getfixturevalue("s3_server")
    return Folder(server.url(f"workdir/{uuid.uuid4().hex}"), server.storage_options())


def save(work: WorkDir, index: int, tokens: bytes, mask: bytes | None = None) -> UnitResult:
    """A hand-made unit of one document, saved as a worker saves it."""
    sft = None if mask is None else dict(SFT_UNIT, trained_tokens=sum(mask))
    frames = b"\7" * 5
    result = UnitResult(index, 1, len(tokens) // 2, 10, [1], 1, [], [[0, len(tokens), 5, 0]],
                        [4096, None], sft=sft)  # fmt: skip
    with work.folder.scratch() as scratch:
        for name, data in (("t", tokens), ("f", frames), ("m", mask or b"")):
            (scratch / name).write_bytes(data)
        masks = None if mask is None else (scratch / "m", zlib.crc32(mask))
        docs = np.asarray([[0, 1, len(tokens) // 2]], dtype=np.int64)
        crcs = (zlib.crc32(tokens), zlib.crc32(frames))
        work.save_unit(result, scratch / "t", scratch / "f", docs, crcs, masks)
    return result


def test_a_saved_unit_reads_back_and_damage_is_found(out):
    work = WorkDir(out)
    work.start({"plan": 1})
    tokens = np.arange(1, 7, dtype=np.uint16).tobytes()
    saved = save(work, 3, tokens)
    assert work.load_result(3, U16) == saved
    loaded, docs = work.load_unit(3, U16)
    assert loaded.tolist() == [1, 2, 3, 4, 5, 6] and docs.tolist() == [[0, 1, 6]]
    assert work.load_frames(3) == b"\7" * 5
    assert work.load_result(4, U16) is None
    assert work.unit_name(3).endswith(f"{WORK_DIR_NAME}/unit-000003.json")

    flipped = bytearray(tokens)
    flipped[-1] ^= 0x40  # same size: only the crc32 can tell
    work.folder.write_bytes("unit-000003.tokens", bytes(flipped))
    assert work.load_result(3, U16) == "unit-000003.tokens fails its crc32 check"
    assert work.load_result(3, U16, verify=False) == saved  # sizes only: cheap, but blind to this
    work.folder.write_bytes("unit-000003.tokens", tokens + b"\0\0")
    assert work.load_result(3, U16) == "unit-000003.tokens is 14 bytes, its marker says 12"
    work.folder.delete("unit-000003.docs.npy")
    assert work.load_result(3, U16).startswith("cannot be read back")
    work.discard_unit(3)
    assert work.load_result(3, U16) is None


@pytest.mark.parametrize(
    "edit, why",
    [
        ({"num_documents": -1}, "num_documents is -1, not a count"),
        ({"piece_records": []}, "piece_records is not a list of counts"),
        ({"rejects": [[1, 0, "invalid_json", "x"]], "records_read": 2}, "rejects is not a list"),
        ({"records_read": 5}, "do not add up to the records read"),
        ({"frames": [[0, 12, "5", 0]]}, "frames is not a table"),
        ({"sft": {"trained_tokens": 1}}, "sft is not the unit's fine-tuning counts"),
        ({"extra": 1}, "the marker's fields are"),
    ],
)
def test_a_marker_is_checked_field_by_field(tmp_path, edit, why):
    # Its counts and tables go straight into the accounting and the shards: a marker that is
    # not one is a damaged unit (tokenized again), never an IndexError later on.
    work = WorkDir(Folder(tmp_path / "out"))
    work.start({"plan": 1})
    save(work, 0, np.arange(1, 7, dtype=np.uint16).tobytes())
    marker = work.path / "unit-000000.json"
    marker.write_text(json.dumps(dict(json.loads(marker.read_text()), **edit)))
    found = work.load_result(0, U16, verify=False)
    assert isinstance(found, str) and found.startswith("cannot be read back") and why in found


def test_a_marker_must_have_its_plans_pieces(tmp_path):
    work = WorkDir(Folder(tmp_path / "out"))
    work.start({"plan": 1})
    saved = save(work, 0, np.arange(1, 7, dtype=np.uint16).tobytes())
    assert work.load_result(0, U16, pieces=1) == saved
    assert work.load_result(0, U16, pieces=2) == "its plan has 2 pieces and its marker 1"


def test_masks_are_checked_and_loaded(out):
    work = WorkDir(out)
    save(work, 1, b"\1\0\2\0\3\0", mask=b"\0\1\1")
    assert work.load_masks(1).tolist() == [0, 1, 1]
    assert work.load_result(1, U16, masks=True).sft["trained_tokens"] == 2
    assert work.load_result(1, U16) == "it has loss masks and this run has none"


def test_plan_and_plan_side_files(out):
    work = WorkDir(out)
    assert work.read_plan() is None and not work.exists()
    work.start({"format": "x", "job": {"inputs": ["a"]}})
    assert work.exists() and work.read_plan() == {"format": "x", "job": {"inputs": ["a"]}}
    work.write_file("tokenizer.json", b'{"model": 1}')
    assert work.read_file("tokenizer.json") == b'{"model": 1}'
    with pytest.raises(FileNotFoundError):
        work.read_file("other.json")
    for reserved in ("plan.json", "unit-000001.json", ".hidden"):
        with pytest.raises(ValueError, match="reserved"):
            work.write_file(reserved, b"x")
    work.folder.write_bytes("plan.json", b"[1, 2]")  # someone else's file: not a plan
    assert work.read_plan() is None
    save(work, 0, b"\1\0")
    work.start({"again": True})  # starting discards everything from before
    assert work.folder.list() == ["plan.json"]
    work.remove()
    assert not work.exists() and WORK_DIR_NAME not in out.list()


def test_failure_markers_round_trip_with_their_mode(out):
    work = WorkDir(out)
    bad = UnitFailure(2, 1, 17, "invalid_json", "Expecting value at character 0")
    work.save_failure(bad, stop_at_bad_record=True)
    assert work.load_failure(2) == bad
    assert work.load_failure(2, stop_at_bad_record=True) == bad
    assert work.load_failure(2, stop_at_bad_record=False) is None  # never served to skip runs
    assert work.load_failure_and_mode(2) == (bad, True)
    mismatch = EncoderMismatch(1234567, 0, 3, "ids differ at token 4")
    work.save_failure(mismatch, stop_at_bad_record=False)
    assert work.load_failure(1234567, stop_at_bad_record=False) == mismatch
    assert work.load_failure(5) is None

    name = "unit-000002.failed.json"
    good = json.loads(work.folder.read_bytes(name))
    for damage in ({"record": "17"}, {"record": -1}, {"index": 3}, {"kind": "other"},
                   {"stop_at_bad_record": 1}, {"format": "x"}, {"reason": None}):  # fmt: skip
        work.folder.write_bytes(name, json.dumps(dict(good, **damage)).encode())
        assert work.load_failure(2) is None, damage
    work.folder.write_bytes(name, b"\xff not json")
    assert work.load_failure(2) is None


def test_markers_come_from_one_listing(out):
    work = WorkDir(out)
    work.start({})
    for index in (0, 7, 1_000_000, 12_345_678):
        save(work, index, b"\1\0")
    work.save_failure(UnitFailure(9, 0, 1, "empty_document", "x"), True)
    work.save_failure(UnitFailure(7, 0, 1, "empty_document", "x"), True)  # done wins
    for stray in ("unit-0000003.json", "unit-12.json", "unit-000004.json.x", "unit-00000a.json"):
        work.folder.write_bytes(stray, b"{}")
    assert work.markers() == ({0, 7, 1_000_000, 12_345_678}, {9})
    assert work.unit_name(12_345_678).endswith("unit-12345678.json")
    save(work, 9, b"\1\0")  # a finished unit drops the failure an earlier run left
    assert not work.folder.exists("unit-000009.failed.json")
    assert work.markers()[1] == set()


def test_sweep_removes_temporaries_and_scratch_of_killed_processes(tmp_path):
    work = WorkDir(tmp_path)
    save(work, 0, b"\1\0")
    (work.path / ".unit-000001.tokens.tmp-123-abcd0123").write_bytes(b"x")
    (work.path / ".plan.json.tmp-99").write_bytes(b"x")
    (work.path / ".scratch-dead1").mkdir()
    (work.path / ".scratch-dead1" / "tokens").write_bytes(b"x")
    work.sweep_temporaries()
    assert sorted(p.name for p in work.path.iterdir()) == [
        "unit-000000.docs.npy", "unit-000000.frames", "unit-000000.json", "unit-000000.tokens",
    ]  # fmt: skip
    work.remove()
    work.sweep_trash()
    assert list(tmp_path.iterdir()) == []


# -- units written by real worker processes ---------------------------------------------------

TEXTS = [f"document {i}: " + "lorem ipsum dolor " * (i % 7 + 1) for i in range(300)]


def worker_config(
    files, out: Folder, *, stop: bool = True, storage_options: dict | None = None, **changes
) -> WorkerConfig:
    """The workers' config for `files` into `out`; `changes` are the job's fields."""
    fields = dict(
        inputs=tuple(f.path for f in files), output=out.location.url, text_key="text",
        txt_mode="file", on_bad_record="error" if stop else "skip",
        tokenizer=load_tokenizer("bundled", backend="hf"), frame_size=4096, compression_level=3,
    )  # fmt: skip
    job = ConvertJob(**{**fields, **changes})
    return WorkerConfig(job, tuple(files), storage_options or out.storage_options or None)


def tokenize_in_workers(config: WorkerConfig, units) -> list:
    """Units through tokenize_unit in a worker process, started as the runner starts them."""
    context = multiprocessing.get_context("fork")
    alive_r, alive_w = context.Pipe(duplex=False)
    try:
        with ProcessPoolExecutor(
            1, mp_context=context, initializer=init_worker, initargs=(config, alive_r, alive_w)
        ) as pool:
            return list(pool.map(tokenize_unit, units))
    finally:
        alive_r.close()
        alive_w.close()


def _write_at_once(config, unit, barrier, results, alive_r, alive_w) -> None:
    init_worker(config, alive_r, alive_w)
    barrier.wait(timeout=60)
    results.put(tokenize_unit(unit).to_json())


def unit_files(out: Folder) -> dict[str, bytes]:
    work = out.sub(WORK_DIR_NAME)
    return {n: work.read_bytes(n) for n in work.list() if n.startswith("unit-")}


def test_two_writers_of_one_unit_at_once_leave_a_valid_unit(out, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    files = discover([str(corpus)])
    (unit,) = plan_units(files, 1 << 30, "file")
    reference = Folder(tmp_path / "reference")
    tokenize_in_workers(worker_config(files, reference), [unit])

    config = worker_config(files, out)
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    alive_r, alive_w = context.Pipe(duplex=False)
    writers = [
        context.Process(
            target=_write_at_once, args=(config, unit, barrier, results, alive_r, alive_w)
        )
        for _ in range(2)
    ]
    for writer in writers:
        writer.start()
    reports = [results.get(timeout=120) for _ in writers]

    for writer in writers:
        writer.join(timeout=60)
        assert writer.exitcode == 0
    alive_r.close()
    alive_w.close()

    assert reports[0] == reports[1]
    loaded = WorkDir(out).load_result(0, U16)
    assert isinstance(loaded, UnitResult) and loaded.num_documents == len(TEXTS)
    assert unit_files(out) == unit_files(reference)
    if out.is_local:  # nothing half-written is left behind
        assert [n for n in out.sub(WORK_DIR_NAME).list() if n.startswith(".")] == []


def test_a_worker_persists_its_failure_and_a_skip_run_replaces_it(out, tmp_path):
    corpus = tmp_path / "c.jsonl"
    lines = [json.dumps({"text": t}) for t in TEXTS[:50]]
    lines[20] = '{"text": oops}'
    corpus.write_text("\n".join(lines) + "\n")
    files = discover([str(corpus)])
    units = plan_units(files, 1 << 30, "file")
    work = WorkDir(out)

    (failure,) = tokenize_in_workers(worker_config(files, out, stop=True), units)
    assert isinstance(failure, UnitFailure) and failure.record == 21
    assert work.load_failure(0, stop_at_bad_record=True) == failure
    assert work.load_failure(0, stop_at_bad_record=False) is None
    assert work.markers() == (set(), {0})
    assert not any(n.endswith(".tokens") for n in work.folder.list())  # no tokens persisted

    (result,) = tokenize_in_workers(worker_config(files, out, stop=False), units)
    assert result.rejects == [[0, 21, "invalid_json", failure.detail]]
    assert work.markers() == ({0}, set()) and work.load_failure(0) is None
    assert work.load_result(0, U16) == result


# -- the output folder around the work folder -------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, dict]:
    """A dataset converted by today's one-command convert, and its settings."""
    folder = tmp_path_factory.mktemp("finished")
    corpus = folder / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    job = ConvertJob(inputs=(str(corpus),), output=str(folder / "done"),
                     tokenizer=load_tokenizer("bundled", backend="hf"))  # fmt: skip
    result = convert(job, RunOptions(workers=1, progress=False))
    return folder / "done", result.manifest.extra["convert"]


def test_the_output_folder_states_on_local_and_s3(out, finished):
    from shardtok.convert.job.output_dir import (
        OutputDirError,
        RejectsFile,
        clear_output,
        finished_manifest,
        foreign_entries,
        prepare_output,
        remove_stale_shards,
        sweep_temporaries,
    )

    done, settings = finished
    plan = {"plan": 1}
    work, finished = prepare_output(out, "shard", plan, settings, overwrite=False)
    assert finished is None and work.read_plan() == plan and finished_manifest(out) is None
    save(work, 0, b"\1\0")
    work, _ = prepare_output(out, "shard", plan, settings, overwrite=False)
    assert work.markers()[0] == {0}  # the same plan resumes
    prepare_output(out, "shard", {"plan": 2}, settings, overwrite=False)
    assert work.markers()[0] == set()  # another plan starts over

    for name in sorted(p.name for p in done.iterdir()):  # a finished dataset, then stale bits
        out.write_bytes(name, (done / name).read_bytes())
    out.write_bytes("shard-999999.tar", b"stale")
    out.write_bytes(".shard-000000.tar.tmp-12-abcdef01", b"half")
    work.remove()
    manifest = finished_manifest(out)
    assert manifest is not None and manifest.num_documents == len(TEXTS)
    assert prepare_output(out, "shard", plan, settings, overwrite=False)[1] == manifest
    with pytest.raises(OutputDirError, match="other inputs or options"):
        prepare_output(out, "shard", plan, dict(settings, text_key="x"), overwrite=False)
    sweep_temporaries(out, "shard")
    remove_stale_shards(out, manifest)
    assert out.list() == sorted(p.name for p in done.iterdir())

    rejects = RejectsFile(out)
    rejects.write("c.jsonl", 4, "invalid_json", "Expecting value")
    rejects.commit()
    assert json.loads(out.read_bytes("rejects.jsonl"))["line"] == 4
    out.write_bytes("notes.txt", b"mine")
    assert foreign_entries(out, "shard") == ["notes.txt"]
    clear_output(out, "shard")
    assert out.list() == ["notes.txt"]  # only shardtok's own names are ever deleted
    with pytest.raises(OutputDirError, match="not empty"):
        prepare_output(out, "shard", plan, settings, overwrite=False)


def test_one_worker_writes_many_units_as_fresh_workers_write_each(tmp_path):
    """A worker's writer thread serves all its units: the files are those a fresh worker per
    unit writes, and nothing half-written is left."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    files = discover([str(corpus)])
    units = plan_units(files, 4096, "file")
    assert len(units) >= 3
    shared = Folder(tmp_path / "shared")
    results = tokenize_in_workers(worker_config(files, shared), units)
    assert all(isinstance(r, UnitResult) for r in results)
    files_of_shared = unit_files(shared)
    for unit in units:
        fresh = Folder(tmp_path / f"fresh{unit.index}")
        tokenize_in_workers(worker_config(files, fresh), [unit])
        own = unit_files(fresh)
        assert len(own) == 4
        assert own == {n: files_of_shared[n] for n in own}
    assert len(files_of_shared) == 4 * len(units)
    assert [n for n in shared.sub(WORK_DIR_NAME).list() if n.startswith(".")] == []
