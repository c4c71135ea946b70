"""Convert with damaged inputs, damaged work, killed parents, rivals, full disks and overwrites:
every refusal is one line naming the path (exit 1, no traceback), and nothing is lost silently."""

from __future__ import annotations

import errno
import gzip
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
_BOUND_S = 60.0  # generous bound for conditions we wait on; never asserted as a duration


def cli(*args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardtok", *map(str, args)],
        env=ENV, capture_output=True, text=True, timeout=300, **kwargs,
    )  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> str:
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def dataset_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    with open(path, "w") as f:
        for _ in range(3000):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))
            f.write(json.dumps({"text": text}) + "\n")
    return path


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The corpus converted once, undisturbed: what the disturbed runs must equal."""
    out = tmp_path_factory.mktemp("reference") / "out"
    result = cli("convert", corpus, "-o", out, "-q")
    assert result.returncode == 0, result.stderr
    return out


# -- 8: damaged inputs and damaged work are never used silently --------------------------------


def _truncated(kind: str, data: bytes, folder: Path) -> Path:
    if kind == "gz":
        packed = gzip.compress(data, mtime=0)
        cut = packed[: len(packed) // 2]
    elif kind == "zst":
        import zstandard

        packed = zstandard.ZstdCompressor().compress(data)
        cut = packed[: len(packed) // 2]
    else:  # several zstd frames, cut a few bytes into the last one: earlier frames are whole
        import zstandard

        compressor = zstandard.ZstdCompressor(write_checksum=True)
        frames = [compressor.compress(data[i : i + 40_000]) for i in range(0, len(data), 40_000)]
        cut = b"".join(frames[:-1]) + frames[-1][:7]
    path = folder / f"cut.jsonl.{'gz' if kind == 'gz' else 'zst'}"
    path.write_bytes(cut)
    return path


@pytest.mark.parametrize("kind", ["gz", "zst", "zst-frames"])
@pytest.mark.parametrize("mode", ["error", "skip"])
def test_truncated_compressed_input_is_refused_with_file_and_offset(tmp_path, corpus, kind, mode):
    path = _truncated(kind, corpus.read_bytes(), tmp_path)
    out = tmp_path / "out"
    result = cli("convert", path, "-o", out, "-q", "--on-bad-record", mode)
    one_line_error(result, path.name, f"byte offset {path.stat().st_size}", "cut short")
    assert not (out / "index.json").exists()


@pytest.mark.parametrize("suffix", [".tokens", ".frames", ".docs.npy"])
def test_damaged_work_unit_is_redone_and_output_identical(tmp_path, corpus, suffix):
    out = tmp_path / "out"
    args = ("convert", corpus, "-o", out, "-q", "--unit-size", "64KiB", "--keep-work")
    assert cli(*args).returncode == 0
    clean = dataset_files(out)
    unit = out / ".shardtok-work" / f"unit-000001{suffix}"
    data = bytearray(unit.read_bytes())
    data[-5] ^= 0x40  # past any header: a silent bit flip, same size
    unit.write_bytes(bytes(data))
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "unit-000001" in warnings[0], result.stderr
    assert dataset_files(out) == clean


def test_damaged_or_foreign_parquet_is_one_line_naming_it(tmp_path, corpus):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    whole = tmp_path / "whole.parquet"
    pq.write_table(pa.table({"text": texts}), whole, row_group_size=500)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(corpus.read_bytes()[:5000])
    for path in (cut, fake):
        one_line_error(cli("convert", path, "-o", tmp_path / path.stem, "-q"), path.name, "Parquet")


# -- 9: process hygiene ---------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="child subreaper and /proc are Linux")
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_exit_when_the_parent_is_killed(tmp_path, corpus, method):
    # The harness kills convert as soon as its first worker exists, then waits (bounded) for
    # every process convert left behind to exit; several tries, since the race is narrow.
    harness = REPO / "tests" / "helpers" / "orphan_harness.py"
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        result = subprocess.run(
            [sys.executable, str(harness), method, str(corpus), str(out)],
            env=ENV, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def test_second_convert_into_the_same_folder_is_refused(tmp_path, corpus, reference):
    out = tmp_path / "out"
    lock = out / ".shardtok-lock"
    first = subprocess.Popen(
        [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), "-q"],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Holding the first one still once it holds the lock makes the overlap certain.
        _wait_for(lambda: lock.exists() and lock.read_text().startswith("pid "), "the lock")
        first.send_signal(signal.SIGSTOP)
        one_line_error(
            cli("convert", corpus, "-o", out, "-q"), str(out), "in use", f"pid {first.pid}"
        )
    finally:
        first.send_signal(signal.SIGCONT)
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert dataset_files(out) == dataset_files(reference)


_FULL_DISK = """
import errno, os, sys
from shardtok.cli.main import main
from shardtok.storage.folder import Folder

def full(self, name, local):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

Folder.put_file = full  # where a worker publishes a unit's files; forked workers inherit it
sys.exit(main(sys.argv[1:]))
"""


def test_disk_full_is_one_line_and_the_rerun_completes(tmp_path, corpus, reference):
    # A real OSError(ENOSPC), raised where a worker persists a unit (a write through a file
    # object, which carries no file name) and sent back to the main process: what convert
    # reports is checked, not how the kernel gets there.
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, "convert", str(corpus), "-o", str(out), "-q"],
        env=ENV, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    one_line_error(result, str(out), os.strerror(errno.ENOSPC), "free some space")
    assert cli("convert", corpus, "-o", out, "-q").returncode == 0
    assert dataset_files(out) == dataset_files(reference)


def _limit_file_size():
    # Real failing writes from the kernel: EFBIG past RLIMIT_FSIZE (SIGXFSZ ignored, so the
    # write returns the error instead of killing the process). ENOSPC takes the same path.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="POSIX file size limits")
def test_a_write_the_kernel_refuses_is_one_line(tmp_path, corpus):
    result = cli("convert", corpus, "-o", tmp_path / "out", "-q", preexec_fn=_limit_file_size)
    one_line_error(result, str(tmp_path / "out"), os.strerror(errno.EFBIG))


def test_output_naming_a_file_is_one_line(tmp_path, corpus):
    target = tmp_path / "taken.txt"
    target.write_text("mine")
    one_line_error(cli("convert", corpus, "-o", target, "-q"), str(target), "is a file")
    assert target.read_text() == "mine"


# -- 10: overwrites ---------------------------------------------------------------------------


def test_import_megatron_refuses_an_existing_dataset_unless_overwrite(tmp_path, corpus, reference):
    half = tmp_path / "half.jsonl"
    half.write_text("".join(corpus.read_text().splitlines(keepends=True)[:1000]))
    assert cli("convert", half, "-o", tmp_path / "b", "-q").returncode == 0
    for name, dataset in (("a", reference), ("b", tmp_path / "b")):
        assert cli("export-megatron", dataset, tmp_path / "mg" / name).returncode == 0
    out = tmp_path / "imported"
    assert cli("import-megatron", tmp_path / "mg" / "a", out).returncode == 0
    before = dataset_files(out)
    one_line_error(cli("import-megatron", tmp_path / "mg" / "b", out), str(out), "--overwrite")
    assert dataset_files(out) == before
    result = cli("import-megatron", tmp_path / "mg" / "b", out, "--overwrite")
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "index.json").read_text())["num_documents"] == 1000
    assert "--overwrite" in cli("import-megatron", "--help").stdout
