"""benchmarks/bench_shuffle_window.py on a small dataset, so the script does not rot. No figure
is asserted: only that every setting ran and the table says what it measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from shardtok.format import DatasetWriter

REPO = Path(__file__).resolve().parents[2]


def test_the_shuffle_window_benchmark_runs_each_setting(tmp_path):
    rng = np.random.default_rng(0)
    with DatasetWriter(tmp_path / "ds", vocab_size=1000, frame_size=1 << 14) as w:
        for n in np.concatenate([rng.integers(5, 30, 400), rng.integers(500, 3000, 60)]):
            w.add(rng.integers(0, 1000, int(n)).astype(np.uint16))
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_shuffle_window.py"), "--data",
           str(tmp_path / "ds"), "--tokens", "0", "5000", "--repeat", "1", "--warmup", "1",
           "--batches", "2"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 0 |" in done.stdout and "| 5,000 |" in done.stdout
    assert "tokens decoded / yielded" in done.stdout
