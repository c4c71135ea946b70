"""benchmarks/bench_job_start.py on a small manifest, so the script does not rot. No figure is
asserted: only that a worker found its slice and the report says what it measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_job_start_benchmark_plans_a_worker_of_a_small_manifest(tmp_path):
    out = tmp_path / "job_start.md"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_job_start.py"), "--shards", "2000",
           "--repeats", "1", "--work", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "| 2,000 |" in report and "Target (issue 18)" in report
    assert (tmp_path / "work" / "2000" / "json" / "index.json").stat().st_size > 2000 * 200
    assert (tmp_path / "work" / "2000" / "both" / "index.compact").exists()
    assert "index.compact, own slice" in report
