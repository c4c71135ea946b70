"""Output bytes are the same for any worker count and after SIGKILL + rerun; unit size moves
only frame boundaries."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job.output_dir import OutputDirError
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.format.manifest import load_manifest
from shardtok.format.shard_reader import ShardReader
from shardtok.storage import open_source

UNIT = "32KiB"
SHARD = ("--shard-size", "64KiB", "--frame-size", "16KiB")


def write_corpus(path: Path, n_docs: int, seed: int = 0) -> None:
    """Deterministic pseudo-English JSONL (no stdlib scan: it must be quick)."""
    rng = np.random.default_rng(seed)
    syllables = ["ka", "lo", "mi", "tre", "sha", "dun", "ve", "or", "pli", "zu", "en", "ast"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)]
    with open(path, "w") as out:
        for i in range(n_docs):
            length = int(rng.integers(5, 400))
            text = " ".join(rng.choice(words, size=length)) + "."
            out.write(json.dumps({"text": text, "id": i}) + "\n")


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def s3_tree_digest(url: str, storage_options: dict) -> dict[str, str]:
    """tree_digest of everything under an s3:// prefix."""
    import fsspec

    fs = fsspec.filesystem("s3", **storage_options)
    prefix = url.removeprefix("s3://").rstrip("/")
    return {
        key[len(prefix) + 1 :]: hashlib.sha256(fs.cat_file(key)).hexdigest()
        for key in sorted(fs.find(prefix, withdirs=False))
    }


def cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shardtok", "convert", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "part-a.jsonl", 600, seed=1)
    write_corpus(folder / "part-b.jsonl", 300, seed=2)
    return folder


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    """An uninterrupted single-worker run through the CLI."""
    out = tmp_path_factory.mktemp("ref") / "out"
    proc = cli(str(corpus), "-o", str(out), "--workers", "1", "--unit-size", UNIT, *SHARD)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    digest = tree_digest(out)
    assert len([f for f in digest if f.endswith(".tar")]) > 3, "the test needs several shards"
    assert not (out / WORK_DIR_NAME).exists()
    return digest


def small_options(corpus: Path, out, **kw) -> ConvertJob:
    """A job that cuts a small corpus into many units, frames and shards (`kw` override)."""
    base = dict(
        inputs=(str(corpus),), output=str(out), tokenizer=load_tokenizer("bundled"),
        unit_size=32 << 10, shard_size=64 << 10, frame_size=16 << 10,
    )  # fmt: skip
    return ConvertJob(**{**base, **kw})


def _documents(out: Path) -> list[list[int]]:
    manifest = load_manifest(out)
    docs = []
    for shard in manifest.shards:
        reader = ShardReader(open_source(out / shard.file))
        docs += [reader.document(i).tolist() for i in range(reader.meta.num_documents)]
    return docs


def test_two_workers_give_identical_bytes(corpus, reference, tmp_path):
    result = convert(small_options(corpus, tmp_path / "w2"), RunOptions(workers=2, progress=False))
    assert tree_digest(tmp_path / "w2") == reference
    assert result.units_reused == 0 and result.units_tokenized == result.units_total > 4


def test_frames_end_at_unit_boundaries_so_unit_size_only_moves_frames(corpus, tmp_path):
    """Workers compress their own unit, so a frame never spans two units: another unit size
    gives the same documents and tokens, cut into different frames."""
    small, large = tmp_path / "u32k", tmp_path / "u1m"
    run = RunOptions(workers=2, progress=False)
    convert(small_options(corpus, small), run)
    convert(small_options(corpus, large, unit_size=1 << 20), run)
    assert _documents(small) == _documents(large)
    assert load_manifest(small).num_tokens == load_manifest(large).num_tokens
    # With 32 KiB units, some frames close early (at a unit's end) and the first document of
    # every unit opens a frame.
    units = plan_units(discover([str(corpus)]), 32 << 10, "file")
    assert len(units) > 4
    frame_sizes = [
        f.uncompressed_size
        for shard in load_manifest(small).shards
        for f in ShardReader(open_source(small / shard.file)).meta.frames
    ]
    assert min(frame_sizes[:-1]) < (16 << 10) // 2
    assert tree_digest(small) != tree_digest(large)


def test_rerun_with_another_compression_level_reencodes_persisted_frames(corpus, tmp_path):
    """Units persisted at one level are reused under another: the assembler re-encodes their
    frames, and the result equals a fresh run at that level."""
    out = tmp_path / "out"
    two = RunOptions(workers=2, progress=False)
    convert(
        small_options(corpus, out, compression_level=3), dataclasses.replace(two, keep_work=True)
    )
    (out / "index.json").unlink()  # now an unfinished conversion with every unit done
    result = convert(small_options(corpus, out, compression_level=9), two)
    assert result.units_reused == result.units_total
    convert(
        small_options(corpus, tmp_path / "fresh", compression_level=9),
        RunOptions(workers=1, progress=False),
    )
    assert tree_digest(out) == tree_digest(tmp_path / "fresh")


def test_sigkill_then_rerun_is_identical_and_reuses_finished_units(corpus, reference, tmp_path):
    out = tmp_path / "out"
    args = (str(corpus), "-o", str(out), "--workers", "1", "--unit-size", UNIT, *SHARD)
    units = out / WORK_DIR_NAME
    proc = cli(*args, start_new_session=True)
    try:
        # Kill the whole process group (main + worker) once a few units are on disk.
        deadline = time.monotonic() + 120
        while len(list(units.glob("unit-*.json"))) < 4:
            assert proc.poll() is None, "the run finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    finished = len(list(units.glob("unit-*.json")))
    assert not (out / "index.json").exists()

    rerun = cli(*args)
    stdout, stderr = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, stderr
    assert f"{finished:,} reused from an interrupted run" in stdout
    total = int(stdout.split("work units")[1].split(":")[0])
    assert finished < total, "the kill came after every unit was done"
    assert f"{total - finished:,} tokenized" in stdout
    assert tree_digest(out) == reference

    # The same command once more: the job is recognised as done and nothing changes.
    again = cli(*args)
    stdout, _ = again.communicate(timeout=120)
    assert again.returncode == 0 and "nothing to do" in stdout
    assert tree_digest(out) == reference


def test_refuses_to_mix_with_other_content(corpus, tmp_path):
    spec = load_tokenizer("bundled")
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    job = ConvertJob(inputs=(str(corpus / "part-b.jsonl"),), output=str(out), tokenizer=spec)
    run = RunOptions(progress=False)
    with pytest.raises(OutputDirError, match="not empty"):
        convert(job, run)
    (out / "precious.txt").unlink()
    convert(job, run)
    other = ConvertJob(inputs=(str(corpus / "part-a.jsonl"),), output=str(out), tokenizer=spec)
    with pytest.raises(OutputDirError, match="already holds a dataset"):
        convert(other, run)
    (out / "shard-000099.tar").write_bytes(b"stale shard of an older, longer run")
    result = convert(other, dataclasses.replace(run, overwrite=True))
    assert sorted(p.name for p in out.iterdir()) == [
        "index.compact",
        "index.json",
        "shard-000000.tar",
    ]
    assert result.manifest.extra["convert"]["inputs"][0]["path"].endswith("part-a.jsonl")
