"""The convert worker pool (pool.UnitPool): each worker tokenizes its next unit while its
writer thread persists the last one and sends its outcome. Same bytes under every start
method; a worker that dies fails its units (never a hang), and a rerun resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.engines.pool import worker_pool
from shardtok.convert.inputs.files import discover
from shardtok.convert.inputs.units import plan_units
from shardtok.convert.job.failures import UnitFailure
from shardtok.convert.job.spec import WorkerConfig
from shardtok.convert.job.unit_result import UnitResult
from shardtok.convert.job.workdir import WORK_DIR_NAME
from tests.convert.test_determinism import tree_digest, write_corpus

UNIT = 16 << 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pool") / "c.jsonl"
    write_corpus(path, 400, seed=3)
    return path


def pool_job(corpus: Path, out: Path) -> ConvertJob:
    return ConvertJob(
        inputs=(str(corpus),), output=str(out), tokenizer=load_tokenizer("bundled"),
        unit_size=UNIT, shard_size=64 << 10, frame_size=8 << 10,
    )  # fmt: skip


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    result = convert(pool_job(corpus, out), RunOptions(workers=1, progress=False))
    assert result.units_total > 6, "the test needs many units"
    return tree_digest(out)


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
@pytest.mark.parametrize("workers", [1, 3])
def test_same_bytes_under_every_start_method(corpus, reference, tmp_path, start_method, workers):
    out = tmp_path / "out"
    run = RunOptions(workers=workers, progress=False, start_method=start_method)
    result = convert(pool_job(corpus, out), run)
    assert result.units_tokenized == result.units_total
    assert tree_digest(out) == reference


@pytest.mark.parametrize("start_method", ["fork", "forkserver", "spawn"])
def test_outcomes_come_back_for_every_unit_and_a_bad_record_stays_with_its_unit(
    tmp_path, start_method
):
    """Units run back to back in one worker: a bad record ends its own unit only, and the
    units after it (tokenized while it was concluded) are whole."""
    corpus = tmp_path / "c.jsonl"
    write_corpus(corpus, 200, seed=4)
    lines = corpus.read_text().splitlines()
    lines[60] = '{"text": oops}'
    corpus.write_text("\n".join(lines) + "\n")
    job = pool_job(corpus, tmp_path / "out")
    (tmp_path / "out").mkdir()
    files = discover([str(corpus)])
    units = plan_units(files, UNIT, "file")
    with worker_pool(WorkerConfig(job, tuple(files)), 1, start_method) as pool:
        outcomes = [f.result(timeout=120) for f in [pool.submit(u) for u in units]]
    failed = [o for o in outcomes if isinstance(o, UnitFailure)]
    assert len(failed) == 1 and failed[0].record > 0
    assert all(isinstance(o, UnitResult) for o in outcomes if o is not failed[0])
    assert [o.index for o in outcomes] == [u.index for u in units]
    assert sum(o.records_read for o in outcomes if isinstance(o, UnitResult)) > 150


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_worker_fails_its_units_and_the_pool_never_hangs(corpus, tmp_path, start_method):
    job = pool_job(corpus, tmp_path / "out")
    (tmp_path / "out").mkdir()
    files = discover([str(corpus)])
    units = plan_units(files, UNIT, "file")
    with worker_pool(WorkerConfig(job, tuple(files)), 1, start_method) as pool:
        futures = [pool.submit(u) for u in units]
        os.kill(pool._workers[0].process.pid, signal.SIGKILL)
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=120))
            except BrokenProcessPool as exc:
                outcomes.append(exc)
        assert isinstance(outcomes[-1], BrokenProcessPool)
        assert "ended abruptly" in str(outcomes[-1])
        assert all(isinstance(o, (UnitResult, BrokenProcessPool)) for o in outcomes)
        with pytest.raises(BrokenProcessPool):
            pool.submit(units[0]).result(timeout=10)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        # A thread (the tokenizer-file writer, say) may end between the listing and the read.
        with contextlib.suppress(FileNotFoundError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _is_python(pid: int) -> bool:
    try:
        return "python" in Path(f"/proc/{pid}/cmdline").read_text()
    except FileNotFoundError:  # gone already
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_worker_killed_mid_run_then_rerun_resumes_identically(corpus, reference, tmp_path):
    """Only the worker dies (the main process lives on): the run stops with one line, and a
    rerun reuses the units that were finished and gives the same bytes."""
    out = tmp_path / "out"
    args = [
        sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out),
        "--workers", "1", "--unit-size", "16KiB", "--shard-size", "64KiB",
        "--frame-size", "8KiB", "--tokenizer", "bundled",
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list((out / WORK_DIR_NAME).glob("unit-*.json"))) < 3:
            assert proc.poll() is None, "the run finished before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        workers = [c for c in _children(proc.pid) if _is_python(c)]
        for worker in workers:
            os.kill(worker, signal.SIGKILL)
    finally:
        _, stderr = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("every unit was done before the worker could be killed")
    assert proc.returncode == 1
    assert "ended abruptly" in stderr and "Traceback" not in stderr and "bug" not in stderr
    finished = len(list((out / WORK_DIR_NAME).glob("unit-*.json")))
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{finished:,} reused from an interrupted run" in rerun.stdout
    assert tree_digest(out) == reference
    assert json.loads((out / "index.json").read_text())["num_documents"] > 0
