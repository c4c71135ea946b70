"""Ctrl-C during `shardtok convert`, as a terminal sends it (SIGINT to the whole foreground
process group): whenever it lands (imports, worker start-up, tokenizing, assembly) it is one line
on stderr and exit 130, never a traceback from the command or from a worker, and running the same
command again gives the bytes of an uninterrupted conversion.

Each case waits for a condition it can see from outside (numpy mapped into the process, the
workers existing, a unit or a shard published) and sends the signal at once; the assertions hold
wherever after that the signal lands. The corpus is big enough that none of these conditions
comes near the end of the job, and a run that ended before the signal fails, never passes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.orphan_harness import _descendants as descendants
from tests.helpers.orphan_harness import _workers as convert_workers

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="process groups and /proc as a terminal and Linux have them"
)

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
_BOUND_S = 120.0  # generous bound for what we wait on; never asserted as a duration
# Small units and shards: ~37 units and ~10 shards, so every condition below comes early.
OPTIONS = ["-q", "--workers", "2", "--unit-size", "16KiB", "--shard-size", "16KiB"]

# The CLI under another start method for the workers (convert has no option for it).
_WITH_START_METHOD = """
import multiprocessing, sys
from shardtok.convert.engines import pool
pool.mp_context = lambda start_method: multiprocessing.get_context(sys.argv[1])
from shardtok.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(3000)
    ]
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    lines, size = [], 0
    while size < 600_000:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))
        lines.append(json.dumps({"text": text}) + "\n")
        size += len(lines[-1])
    path.write_text("".join(lines))
    return path


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("reference") / "out"
    done = subprocess.run(
        _command(corpus, out), env=ENV, capture_output=True, text=True, timeout=_BOUND_S
    )
    assert done.returncode == 0, done.stderr
    return _dataset(out)


def _command(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "shardtok", "convert", str(corpus), "-o", str(out), *OPTIONS]


def _dataset(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _as_from_a_terminal() -> None:
    # A command typed at a terminal takes Ctrl-C; one started in the background by a
    # non-interactive shell (as this suite may be) inherits SIGINT ignored, and so would convert.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(command: list[str]) -> subprocess.Popen:
    # A session of its own: its process group is what a terminal's Ctrl-C would reach.
    return subprocess.Popen(
        command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=_as_from_a_terminal,
    )  # fmt: skip


def _ctrl_c_when(proc: subprocess.Popen, condition, what: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not condition():
        assert proc.poll() is None, f"convert ended before {what}: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.002)
    assert proc.poll() is None, f"convert ended before the signal ({what})"
    os.killpg(proc.pid, signal.SIGINT)


def _assert_interrupted(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=_BOUND_S)
    assert proc.returncode == 130, (proc.returncode, stderr)
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "interrupted" in lines[0], stderr
    assert stdout == "", stdout
    return lines[0]


def _rerun_gives(corpus: Path, out: Path, reference: dict[str, bytes]) -> None:
    done = subprocess.run(
        _command(corpus, out), env=ENV, capture_output=True, text=True, timeout=_BOUND_S
    )
    assert done.returncode == 0, done.stderr
    assert _dataset(out) == reference


def _shards(out: Path) -> set[tuple[str, int]]:
    # (name, inode): a shard is published by a rename, so a shard written again is a new inode.
    found = set()
    for shard in out.glob("shard-*.tar"):
        try:
            found.add((shard.name, shard.stat().st_ino))
        except FileNotFoundError:  # replaced meanwhile
            continue
    return found


def _mapped(pid: int, needle: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return needle in f.read()
    except OSError:  # gone: the caller sees it exit
        return False


def _workers(main: int) -> list[int]:
    """The processes below `main` that tokenize: not the resource tracker nor the fork server."""
    return convert_workers(main, descendants(main))


def test_ctrl_c_during_imports_tokenizing_and_assembly_then_the_rerun(corpus, reference, tmp_path):
    out = tmp_path / "out"
    work = out / ".shardtok-work"

    # Imports: numpy is mapped while the commands' modules are still being imported (a few
    # tenths of a second of them are left).
    proc = _start(_command(corpus, out))
    _ctrl_c_when(proc, lambda: _mapped(proc.pid, "/numpy/"), "numpy to be imported")
    _assert_interrupted(proc)

    # Tokenizing: a unit is published, and the workers are on the next ones.
    proc = _start(_command(corpus, out))
    _ctrl_c_when(proc, lambda: any(work.glob("unit-*.json")), "a finished unit")
    line = _assert_interrupted(proc)
    assert line.startswith("shardtok convert: interrupted"), line

    # Assembly: this run publishes a shard (the shards are written from unit 0 again) while
    # the units left are tokenized. The last shard alone, once every unit is in, lasts a few
    # milliseconds: too short to aim at from outside.
    before = _shards(out)
    proc = _start(_command(corpus, out))
    _ctrl_c_when(proc, lambda: _shards(out) - before, "a shard of this run")
    line = _assert_interrupted(proc)
    assert line.startswith("shardtok convert: interrupted"), line

    _rerun_gives(corpus, out, reference)


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ctrl_c_while_the_workers_start_then_the_rerun(corpus, reference, tmp_path, method):
    # Under spawn and forkserver a worker imports the conversion layer for about a second
    # before it runs any of our code: a Ctrl-C then must not reach it as a KeyboardInterrupt.
    # (fork, the default on Linux, is the case above: a forked worker's start-up is a few
    # microseconds of it.)
    out = tmp_path / "out"
    proc = _start([sys.executable, "-c", _WITH_START_METHOD, method, *_command(corpus, out)[3:]])
    _ctrl_c_when(proc, lambda: len(_workers(proc.pid)) >= 2, "the workers to exist")
    line = _assert_interrupted(proc)
    assert line.startswith("shardtok convert: interrupted"), line
    _rerun_gives(corpus, out, reference)
