"""benchmarks/bench_batch_assembly.py on one tiny shape, so the script does not rot. No figure
is asserted: only that every variant and caller ran, each in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_batch_assembly_benchmark_runs_every_variant(tmp_path):
    figures = tmp_path / "assembly.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_batch_assembly.py"), "--shapes",
           "2x16", "--repeat", "1", "--count", "5", "--json", str(figures)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2 x 16 | separate arrays | dropped |" in done.stdout
    rows = json.loads(figures.read_text())
    cells = {(r["variant"], r["caller"]) for r in rows}
    assert cells == {(v, c) for v in ("installed", "twins", "separate arrays")
                     for c in ("held", "dropped")}  # fmt: skip
    assert all(r["us_per_batch"] > 0 and r["faults_per_batch"] >= 0 for r in rows)
