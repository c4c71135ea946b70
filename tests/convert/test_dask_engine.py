"""`--engine dask` on a real distributed.LocalCluster: the bytes of `shardtok convert --workers 1`,
also when a worker process dies inside a unit task and when the driver is SIGKILLed and rerun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import distributed
import pytest

from shardtok.convert import RunOptions, convert
from shardtok.convert.engines.dask import convert_with_dask
from shardtok.convert.engines.local_cluster import local_cluster
from shardtok.convert.job import unit_status
from shardtok.convert.job.workdir import WORK_DIR_NAME
from shardtok.errors import BadRecordError
from tests.convert.test_determinism import s3_tree_digest, tree_digest, write_corpus
from tests.convert.test_determinism import small_options as options

QUIET = RunOptions(progress=False)
ONE = RunOptions(workers=1, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder / "part-a.jsonl", 600, seed=5)
    write_corpus(folder / "part-b.jsonl", 300, seed=6)
    return folder


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("ref") / "out"
    result = convert(options(corpus, out), ONE)
    assert result.units_total > 8 and len(result.manifest.shards) > 2
    return tree_digest(out)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The scheduler address of a real 2-worker LocalCluster on loopback, started the engine's
    way (in a helper process, so its nannies' environment writes stay there)."""
    with local_cluster(2) as address:
        yield address


def test_dask_engine_gives_the_bytes_of_one_worker(corpus, reference, cluster, tmp_path):
    out = tmp_path / "out"
    result = convert_with_dask(options(corpus, out), QUIET, scheduler=cluster)
    assert tree_digest(out) == reference
    assert result.units_tokenized == result.units_total > 8 and result.units_reused == 0
    assert not (out / WORK_DIR_NAME).exists()
    environ = dict(os.environ)
    again = convert_with_dask(options(corpus, out), QUIET, scheduler=cluster)
    assert again.already_complete and tree_digest(out) == reference
    assert dict(os.environ) == environ


def test_a_local_cluster_leaves_the_environment_alone(corpus, reference, tmp_path):
    environ = dict(os.environ)
    convert_with_dask(options(corpus, tmp_path / "out"), ONE)
    assert dict(os.environ) == environ
    assert tree_digest(tmp_path / "out") == reference


def test_output_on_an_object_store(corpus, reference, cluster, s3_server):
    storage = s3_server.storage_options()
    url = s3_server.url(f"dask-{uuid.uuid4().hex[:8]}/out")
    run = RunOptions(progress=False, storage_options=storage)
    convert_with_dask(options(corpus, url), run, scheduler=cluster)
    assert s3_tree_digest(url, storage) == reference


def test_a_bad_record_stops_the_dask_run_like_the_one_command_run(cluster, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_corpus(corpus / "a.jsonl", 400, seed=9)
    with open(corpus / "a.jsonl", "a") as f:
        f.write('{"text": null}\n')
    write_corpus(corpus / "b.jsonl", 300, seed=10)
    with pytest.raises(BadRecordError) as one_command:
        convert(options(corpus, tmp_path / "one"), ONE)
    with pytest.raises(BadRecordError) as engine:
        convert_with_dask(options(corpus, tmp_path / "out"), QUIET, scheduler=cluster)
    assert str(engine.value) == str(one_command.value) and "a.jsonl, line 401" in str(engine.value)
    found = unit_status.status(str(tmp_path / "out"))
    assert found.failed == 1 and found.failure == str(one_command.value) and found.exit_code == 1
    assert found.done >= found.failure_unit > 0  # every unit before it, for the file's line


def test_the_command_line_engine_flag(corpus, reference, cluster, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), "--engine",
         "dask", "--scheduler", cluster, "--unit-size", "32KiB",
         "--shard-size", "64KiB", "--frame-size", "16KiB"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "tokenized" in result.stdout and tree_digest(out) == reference


class KillOnce(distributed.WorkerPlugin):
    """Kills its worker process (os._exit) once, in the middle of the first unit task it sees
    start: when that unit's first temporary file (or, for a remote work folder, scratch folder)
    appears. `marker` makes it once per test."""

    def __init__(self, marker: str, work: str):
        self.marker = marker
        self.work = work

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing" or not str(key).startswith("run_unit-"):
            return
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        threading.Thread(target=self._kill, daemon=True).start()

    def _kill(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(
                name.startswith(".scratch-") or ".tmp-" in name for name in os.listdir(self.work)
            ):
                break
            time.sleep(0.001)
        os._exit(1)


def test_a_worker_dying_inside_a_unit_task(corpus, reference, cluster, tmp_path):
    out = tmp_path / "out"
    marker = tmp_path / "killed"
    with distributed.Client(cluster) as client:
        before = set(client.scheduler_info()["workers"])
        client.register_plugin(KillOnce(str(marker), str(out / WORK_DIR_NAME)), name="kill-once")
        try:
            convert_with_dask(options(corpus, out), QUIET, scheduler=cluster)
        finally:
            client.unregister_worker_plugin("kill-once")
        assert marker.exists(), "no worker was killed"
        client.wait_for_workers(2, timeout=60)
        # The killed worker's nanny started a new one (a new address).
        assert set(client.scheduler_info()["workers"]) != before
    assert tree_digest(out) == reference


DRIVER = textwrap.dedent(
    """
    import sys
    from shardtok.convert import ConvertJob, RunOptions, load_tokenizer
    from shardtok.convert.engines.dask import convert_with_dask

    corpus, out = sys.argv[1:]
    convert_with_dask(ConvertJob(
        inputs=(corpus,), output=out, tokenizer=load_tokenizer("bundled"), unit_size=32 << 10,
        shard_size=64 << 10, frame_size=16 << 10,
    ), RunOptions(workers=1, progress=False))
    """
)


def test_driver_killed_then_rerun(corpus, reference, cluster, tmp_path):
    out = tmp_path / "out"
    work = out / WORK_DIR_NAME
    # Its own session, so that its local cluster's processes die with it.
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(corpus), str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (work.is_dir() and len(list(work.glob("unit-*.json"))) >= 2):
            assert proc.poll() is None, f"the driver ended first: {proc.communicate()[1]}"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = len(list(work.glob("unit-*.json")))
    assert not (out / "index.json").exists()

    result = convert_with_dask(options(corpus, out), QUIET, scheduler=cluster)
    assert result.units_reused >= done and result.units_reused + result.units_tokenized == (
        result.units_total
    )
    assert tree_digest(out) == reference


def test_dask_is_optional():
    code = textwrap.dedent(
        """
        import sys
        import shardtok.convert, shardtok.convert.job.phases, shardtok.convert.job.unit_status
        import shardtok.convert.engines.dask
        import shardtok.cli.main
        assert "dask" not in sys.modules and "distributed" not in sys.modules, "dask imported"
        sys.modules["distributed"] = None  # as if it were not installed
        from shardtok.cli.main import main
        sys.exit(main(["convert", "in.jsonl", "-o", "out", "--engine", "dask"]))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "shardtok convert: error: --engine dask needs dask's distributed scheduler: "
        "pip install 'shardtok[dask]'"
    )
