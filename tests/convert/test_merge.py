"""merge_units: the shards, rejects.jsonl and index.json that the one-command run writes, byte for
byte, from the same work folder, whatever runs the shard tasks; and the first failure, or a
missing or damaged unit, said the way the one-command run says it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job.merge import UnitsNotReadyError, merge_units
from shardtok.convert.job.workdir import WORK_DIR_NAME, WorkDir
from shardtok.convert.sft.config import load_sft_config
from shardtok.convert.sft.setup import prepare_sft
from shardtok.errors import BadRecordError
from tests.helpers.sft_data import special_tokenizer, write_jsonl

WORDS = [
    "".join(p)
    for p in zip(["ka", "lo", "mi", "tre", "sha", "dun", "ve", "or"] * 8, ["zu", "en", "ast"] * 22)
]
# The work folder and output folder on a Folder, with failure markers (helper IO's branch).
IO_LANDED = hasattr(WorkDir, "save_failure")
BAD = ['{"text": ""}', '{"txt": "typo"}', '{"text": 42', '{"text": "  "}']
ONE = RunOptions(workers=1, progress=False)
KEEP = dataclasses.replace(ONE, keep_work=True)  # the reference runs keep their work folder


@pytest.fixture(scope="module")
def spec():
    return load_tokenizer("bundled")


def write_corpus(path: Path, n_docs: int, seed: int, bad_every: int = 0) -> Path:
    """Pseudo-English JSONL; every `bad_every`-th line a bad record (0: none)."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n_docs):
        if bad_every and i % bad_every == bad_every - 1:
            lines.append(BAD[i % len(BAD)])
        else:
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 120))))
            lines.append(json.dumps({"text": text, "id": i}))
    path.write_text("\n".join(lines) + "\n")
    return path


def reference(spec, inputs, out: Path, **fields) -> tuple[ConvertJob, object]:
    """The one-command run (one worker) that also keeps its work folder for the merge."""
    job = ConvertJob(inputs=tuple(map(str, inputs)), output=str(out), tokenizer=spec, **fields)
    return job, convert(job, KEEP)


def merge(job: ConvertJob, work_of: Path, out: Path, **kwargs):
    """merge_units over the work folder in `work_of` into `out`, with `job`'s settings."""
    files = discover(list(job.inputs), exclude_dir=str(work_of))
    units = plan_units(files, job.unit_size, job.txt_mode)
    kwargs.setdefault("progress", False)
    return merge_units(
        dataclasses.replace(job, output=str(out)), files, units, WorkDir(work_of), **kwargs
    )


def dataset_files(out: Path) -> dict[str, bytes]:
    """Everything in the output folder but the work folder (so leftovers would show too)."""
    return {
        p.name: p.read_bytes()
        for p in sorted(out.iterdir())
        if p.name != WORK_DIR_NAME and not p.is_dir()
    } | {p.name + "/": b"" for p in out.iterdir() if p.is_dir() and p.name != WORK_DIR_NAME}


def work_digest(out: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / WORK_DIR_NAME).iterdir())
    }


def assert_same(ref_result, ref: Path, merged, out: Path) -> None:
    assert dataset_files(out) == dataset_files(ref)
    assert merged.manifest == ref_result.manifest
    assert merged.records_read == ref_result.records_read
    assert merged.documents == ref_result.documents
    assert merged.rejected == ref_result.rejected
    assert merged.sft_counts == ref_result.sft
    assert merged.stored_token_bytes == ref_result.stored_token_bytes
    assert (merged.rejects_path is None) == (ref_result.rejects_path is None)
    if merged.rejects_path is not None:
        assert Path(merged.rejects_path) == out / "rejects.jsonl"


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    docs=st.tuples(st.integers(1, 120), st.integers(0, 60)),
    unit_size=st.sampled_from([700, 3000, 1 << 16]),
    shard_size=st.integers(1, 40_000),
    frame_size=st.sampled_from([64, 1000, 16_384]),
    level=st.sampled_from([None, 1, 3]),
    skip=st.booleans(),
)
def test_merge_writes_the_one_command_bytes(
    spec, docs, unit_size, shard_size, frame_size, level, skip
):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bad_every = 7 if skip else 0
        inputs = [
            write_corpus(root / "a.jsonl", docs[0], seed=docs[0], bad_every=bad_every),
            write_corpus(root / "b.jsonl", docs[1], seed=docs[1] + 1000, bad_every=bad_every),
        ]
        job, ref_result = reference(
            spec, inputs, root / "ref", unit_size=unit_size, shard_size=shard_size,
            frame_size=frame_size, compression_level=level,
            on_bad_record="skip" if skip else "error",
        )  # fmt: skip
        work = work_digest(root / "ref")
        for jobs in (1, 2):
            merged = merge(job, root / "ref", root / f"jobs{jobs}", jobs=jobs)
            assert_same(ref_result, root / "ref", merged, root / f"jobs{jobs}")
        assert work_digest(root / "ref") == work


def test_skip_mode_rejects_and_an_empty_rejects_file(spec, tmp_path):
    bad = write_corpus(tmp_path / "bad.jsonl", 200, seed=1, bad_every=9)
    job, ref_result = reference(spec, [bad], tmp_path / "ref", unit_size=2000,
                                 shard_size=4000, on_bad_record="skip")  # fmt: skip
    assert ref_result.records_rejected > 10
    merged = merge(job, tmp_path / "ref", tmp_path / "out", jobs=2)
    assert_same(ref_result, tmp_path / "ref", merged, tmp_path / "out")

    clean = write_corpus(tmp_path / "clean.jsonl", 50, seed=2)
    job, ref_result = reference(spec, [clean], tmp_path / "ref2", unit_size=2000,
                                 on_bad_record="skip")  # fmt: skip
    merged = merge(job, tmp_path / "ref2", tmp_path / "out2")
    assert (tmp_path / "out2" / "rejects.jsonl").read_bytes() == b""
    assert_same(ref_result, tmp_path / "ref2", merged, tmp_path / "out2")


def test_merge_under_error_mode_raises_the_first_bad_record_like_the_one_command_run(
    spec, tmp_path
):
    # Units persisted under skip list their rejects; merged under error mode, the first one in
    # input order stops the merge -- with the line the one-command run names.
    a = write_corpus(tmp_path / "a.jsonl", 80, seed=3)
    b = write_corpus(tmp_path / "b.jsonl", 90, seed=4, bad_every=31)
    job, _ = reference(spec, [a, b], tmp_path / "ref", unit_size=1500, on_bad_record="skip")
    with pytest.raises(BadRecordError) as one_command:
        convert(dataclasses.replace(job, output=str(tmp_path / "fresh"), on_bad_record="error"),
                ONE)  # fmt: skip
    assert "b.jsonl, line 31: " in str(one_command.value)
    error_job = dataclasses.replace(job, on_bad_record="error")
    with pytest.raises(BadRecordError) as merged:
        merge(error_job, tmp_path / "ref", tmp_path / "out", jobs=2)
    assert str(merged.value) == str(one_command.value)
    assert not (tmp_path / "out" / "index.json").exists()


def test_the_failure_marker_of_a_stopped_run_is_raised_as_that_run_raised_it(spec, tmp_path):
    if not IO_LANDED:
        pytest.skip("this work folder records no failures yet (IO's failure markers)")
    a = write_corpus(tmp_path / "a.jsonl", 120, seed=5)
    b = write_corpus(tmp_path / "b.jsonl", 90, seed=6, bad_every=40)
    job = ConvertJob(inputs=(str(a), str(b)), output=str(tmp_path / "ref"), tokenizer=spec,
                      unit_size=1500)  # fmt: skip
    with pytest.raises(BadRecordError) as one_command:
        convert(job, ONE)
    assert "b.jsonl, line 40: " in str(one_command.value)
    with pytest.raises(BadRecordError) as merged:
        merge(job, tmp_path / "ref", tmp_path / "out")
    assert str(merged.value) == str(one_command.value)


def test_a_missing_or_damaged_unit_is_named_and_sent_back_to_run_units(spec, tmp_path):
    data = write_corpus(tmp_path / "a.jsonl", 150, seed=7)
    job, _ = reference(spec, [data], tmp_path / "ref", unit_size=1500)
    work = WorkDir(tmp_path / "ref")
    Path(work.unit_name(3)).unlink()
    tokens = Path(work.unit_name(1)).with_suffix(".tokens")
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(UnitsNotReadyError) as caught:
        merge(job, tmp_path / "ref", tmp_path / "out", jobs=2)
    message = str(caught.value)
    assert "\n" not in message
    assert work.unit_name(1) in message and "unit-000001.tokens is " in message
    assert "1 other unit too" in message and "shardtok convert run-units" in message
    assert not Path(work.unit_name(1)).exists()  # discarded: run-units redoes it
    with pytest.raises(UnitsNotReadyError, match="unit-000001.json is not finished"):
        merge(job, tmp_path / "ref", tmp_path / "out")
    assert not (tmp_path / "out" / "index.json").exists()


def flip_bit(path: Path, at: int) -> None:
    """Damage that keeps the size: only a crc32 check sees it."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("reframe", [False, True])
def test_a_same_size_bit_flip_is_caught_by_the_shard_tasks(spec, tmp_path, reframe):
    # Sizes pass the first pass; the crc32 of the bytes each task loads does not. Re-encoded
    # units (other frame settings) are checked where they are re-encoded.
    data = write_corpus(tmp_path / "a.jsonl", 150, seed=7)
    job, _ = reference(spec, [data], tmp_path / "ref", unit_size=1500, shard_size=2000)
    work = WorkDir(tmp_path / "ref")
    flip_bit(Path(work.unit_name(2)).with_suffix(".tokens"), 5)
    # The last byte of .docs.npy is data (the array still parses); re-encoding reads no .frames.
    flip_bit(Path(work.unit_name(4)).with_suffix(".docs.npy" if reframe else ".frames"), -1)
    if reframe:
        job = dataclasses.replace(job, frame_size=300)
    with pytest.raises(UnitsNotReadyError) as caught:
        merge(job, tmp_path / "ref", tmp_path / "out", jobs=2)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{work.unit_name(2)} is damaged (unit-000002.tokens fails its crc32 check" in message
    assert "(1 other unit too)" in message and "shardtok convert run-units" in message
    assert not Path(work.unit_name(2)).exists() and not Path(work.unit_name(4)).exists()
    assert Path(work.unit_name(3)).exists()  # intact units stay done
    assert not (tmp_path / "out" / "index.json").exists()


def test_units_of_other_frame_settings_are_re_encoded_without_touching_the_work_folder(
    spec, tmp_path
):
    data = write_corpus(tmp_path / "a.jsonl", 200, seed=8)
    old, _ = reference(spec, [data], tmp_path / "ref", unit_size=3000, frame_size=1000,
                       compression_level=3, shard_size=3000)  # fmt: skip
    work = work_digest(tmp_path / "ref")
    new = dataclasses.replace(old, frame_size=300, compression_level=None, shard_size=5000)
    merged = {jobs: merge(new, tmp_path / "ref", tmp_path / f"jobs{jobs}", jobs=jobs)
              for jobs in (1, 2)}  # fmt: skip
    assert work_digest(tmp_path / "ref") == work
    # The one-command run with the new settings, resuming the same work (re-encoding inline).
    ref_result = convert(new, KEEP)
    for jobs in (1, 2):
        assert_same(ref_result, tmp_path / "ref", merged[jobs], tmp_path / f"jobs{jobs}")
    assert ref_result.units_reused == ref_result.units_total


def test_sft_masks_and_stats(tmp_path):
    tok = special_tokenizer(tmp_path / "tok")
    spec = load_tokenizer(str(tok), append_eos=False, backend="hf")
    (tmp_path / "sft.yaml").write_text("format: sharegpt\ntemplate: chatml\n")
    sft = prepare_sft(load_sft_config(tmp_path / "sft.yaml", {}), spec, tok)
    records = [
        {"conversations": [{"from": "human", "value": f"Question {i}? " * (1 + i % 5)},
                           {"from": "gpt", "value": f"Answer {i}. " * (1 + i % 9)}]}
        for i in range(60)
    ]  # fmt: skip
    records[17] = {"conversations": "not a list"}
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    job, ref_result = reference(spec, [data], tmp_path / "ref", sft=sft, on_bad_record="skip",
                                 unit_size=1024, frame_size=512, shard_size=2048)  # fmt: skip
    assert ref_result.manifest.masked and ref_result.records_rejected == 1
    merged = merge(job, tmp_path / "ref", tmp_path / "out", jobs=2)
    assert_same(ref_result, tmp_path / "ref", merged, tmp_path / "out")
    assert merged.sft_counts["trained_tokens"] == merged.manifest.trained_tokens > 0


def test_spawned_pool_and_stale_shards(spec, tmp_path):
    data = write_corpus(tmp_path / "a.jsonl", 120, seed=9)
    job, ref_result = reference(spec, [data], tmp_path / "ref", unit_size=2000, shard_size=3000)
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-000999.tar").write_bytes(b"from an earlier, longer attempt")
    (out / "notes.txt").write_text("not ours")
    merged = merge(job, tmp_path / "ref", out, jobs=2, start_method="spawn")
    assert not (out / "shard-000999.tar").exists()
    (out / "notes.txt").unlink()
    assert_same(ref_result, tmp_path / "ref", merged, out)


def test_tasks_through_a_caller_given_map(spec, tmp_path):
    """What an engine passes: every task goes through map_tasks, with picklable items only."""
    import pickle

    data = write_corpus(tmp_path / "a.jsonl", 100, seed=10)
    job, ref_result = reference(spec, [data], tmp_path / "ref", unit_size=2000, shard_size=3000)
    seen = []

    def map_tasks(fn, items):
        seen.append((fn.__name__, len(items)))
        return [fn(pickle.loads(pickle.dumps(item))) for item in items]

    merged = merge(job, tmp_path / "ref", tmp_path / "out", map_tasks=map_tasks)
    assert_same(ref_result, tmp_path / "ref", merged, tmp_path / "out")
    assert [name for name, _ in seen] == ["load_batch", "write_shard"]
    assert seen[1][1] == len(ref_result.manifest.shards) > 2
    shutil.rmtree(tmp_path / "out")


def test_remote_output_on_s3(spec, tmp_path, s3_server):
    """Shards by plain PUTs, rejects.jsonl and index.json last, into an object-store prefix."""
    if not IO_LANDED:
        pytest.skip("needs IO's Folder-capable output_dir (remove_stale_shards on a Folder)")

    from shardtok.storage.folder import Folder

    data = write_corpus(tmp_path / "a.jsonl", 150, seed=11, bad_every=13)
    job, ref_result = reference(spec, [data], tmp_path / "ref", unit_size=2000,
                                 shard_size=3000, on_bad_record="skip")  # fmt: skip
    url = s3_server.url("merge-out")
    folder = Folder(url, s3_server.storage_options())
    folder.write_bytes("shard-000999.tar", b"stale")
    files = discover(list(job.inputs), exclude_dir=str(tmp_path / "ref"))
    units = plan_units(files, job.unit_size, job.txt_mode)
    merged = merge_units(dataclasses.replace(job, output=url), files, units,
                         WorkDir(tmp_path / "ref"), jobs=2, progress=False,
                         storage_options=s3_server.storage_options())  # fmt: skip
    expected = dataset_files(tmp_path / "ref")
    assert folder.list() == sorted(expected)
    assert {name: folder.read_bytes(name) for name in folder.list()} == expected
    assert merged.manifest == ref_result.manifest
    assert merged.rejects_path == folder.display_of("rejects.jsonl")
