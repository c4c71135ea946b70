"""ShardLoader workers exit within a second of the training process dying, whatever the signal
and the start method (issue 35: workers outlived a SIGKILLed trainer by 12-60 s).

One run of tests/helpers/orphan_harness.py serves every case: its trainers start together, each
forked from the harness after it imported torch (a spawned worker still imports it, 2-3 s of
CPU). Each trainer is signalled right after a first batch from each worker, while they wait for
credit, and left unreaped (a zombie) until they are gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "helpers" / "orphan_harness.py"
METHODS = ["fork", "forkserver", "spawn"]
SIGNALS = ["SIGKILL", "SIGTERM", "SIGINT"]
# The requirement is 1 s. The rest is slack for a loaded machine, where the harness itself may
# wait that long for a core before it sees an exit (0.55 s seen at a load average of 12 on 2
# cores; the kernel's parent-death signal takes milliseconds). The 5 s polling this replaced
# left workers alive 4-10 s after such a trainer, or for good under forkserver.
DEADLINE_S = 1.0 + 1.5

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="a child subreaper, fork and /proc are Linux"
)


@pytest.fixture(scope="module")
def runs(torch_stream_dataset, tmp_path_factory) -> dict[tuple[str, str], dict]:
    # pytest-xdist may hand this module's cases to both of its processes, and each would run
    # the harness (20-40 s of CPU, mostly spawned workers and fork servers importing torch) at
    # the same time as the other. The first to get here runs it; the other waits and reads its
    # lines. Both read the same harness run: nothing a case asserts depends on which process.
    import fcntl

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each xdist process's own
    lines = shared / "orphan-harness.jsonl"
    with open(shared / "orphan-harness.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lines.exists():
            cases = [f"{method}:{name}" for method in METHODS for name in SIGNALS]
            result = subprocess.run(
                [sys.executable, str(HARNESS), "loader", str(torch_stream_dataset), *cases],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
            lines.write_text(result.stdout)
    found = [json.loads(line) for line in lines.read_text().splitlines()]
    return {(run["method"], run["signal"]): run for run in found}


@pytest.mark.parametrize("name", SIGNALS)
@pytest.mark.parametrize("method", METHODS)
def test_workers_exit_within_a_second_of_the_trainer_dying(runs, method, name):
    run = runs[method, name]
    assert "error" not in run, run
    assert not run["left"], f"workers {run['left']} still alive 30 s after the trainer: {run}"
    # Negative when the trainer's own exit ended them (SIGINT: KeyboardInterrupt, then exit
    # handlers that terminate daemonic children).
    slowest = max(run["after_death_s"].values())
    assert slowest <= DEADLINE_S, f"a worker exited {slowest:.2f} s after the trainer: {run}"
