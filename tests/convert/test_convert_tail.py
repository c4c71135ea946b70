"""What the one-command convert does around its units: tokenizer.json written beside them
(after the workers are forked), the stored byte count known without reading the shards back,
and the work folder gone once the dataset is complete."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

import shardtok.convert.engines.local as runner
import shardtok.convert.engines.pool as pool_module
from shardtok.convert import RunOptions, convert
from shardtok.convert.job.output_lock import OutputIOError
from shardtok.convert.job.plan_file import load_plan
from shardtok.convert.job.planning import stored_token_bytes
from shardtok.convert.job.workdir import WORK_DIR_NAME, WorkDir
from shardtok.format.manifest import load_manifest
from tests.convert.test_determinism import small_options, write_corpus

ONE = RunOptions(workers=1, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    write_corpus(path, 300, seed=3)
    return path


def test_stored_bytes_are_the_shards_frames(corpus, tmp_path):
    out = tmp_path / "out"
    result = convert(small_options(corpus, out), ONE)
    manifest = load_manifest(out)
    assert len(manifest.shards) >= 2
    assert result.stored_token_bytes == stored_token_bytes(str(out), manifest)
    assert not (out / WORK_DIR_NAME).exists()


def test_kept_work_folder_has_the_tokenizer_file(corpus, tmp_path):
    out = tmp_path / "out"
    job = small_options(corpus, out)
    convert(job, RunOptions(workers=2, progress=False, keep_work=True))
    tokenizer = out / WORK_DIR_NAME / "tokenizer.json"
    assert tokenizer.read_bytes() == job.tokenizer.backend_json.encode("utf-8")
    assert len(load_plan(WorkDir(str(out))).units) > 4  # the phases can read the job


def test_no_thread_runs_when_the_workers_are_forked(corpus, tmp_path, monkeypatch):
    seen = []
    original = pool_module.UnitPool.__init__

    def counting(self, *args, **kwargs):
        seen.append(sorted(t.name for t in threading.enumerate()))
        original(self, *args, **kwargs)

    monkeypatch.setattr(pool_module.UnitPool, "__init__", counting)
    before = sorted(t.name for t in threading.enumerate())
    convert(small_options(corpus, tmp_path / "out"), ONE)
    assert seen == [before]  # the tokenizer.json thread starts after the fork


def test_a_failed_tokenizer_file_is_one_line(corpus, tmp_path, monkeypatch):
    def full(workdir, spec):
        raise OSError(errno.ENOSPC, "No space left on device", str(workdir.path / "tokenizer.json"))

    monkeypatch.setattr(runner, "write_tokenizer_file", full)
    out = tmp_path / "out"
    with pytest.raises(OutputIOError, match="tokenizer.json: No space left on device"):
        convert(small_options(corpus, out), ONE)
    assert not (out / "index.json").exists()
    assert (out / WORK_DIR_NAME / "plan.json").exists()  # the finished units stay for a rerun
    monkeypatch.undo()
    convert(small_options(corpus, out), ONE)
    assert (out / "index.json").exists()
