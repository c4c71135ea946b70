"""benchmarks/bench_memmap.py on tiny data, so the script does not rot. No figure is asserted:
only that every contender ran and the report says what it measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_memmap_benchmark_runs_every_contender(tmp_path):
    figures = tmp_path / "memmap.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_memmap.py"), "--tokens", "300000",
           "--batches", "5", "--warmup", "2", "--reps", "2", "--workers", "0,2",
           "--work", str(tmp_path / "work"), "--json", str(figures)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Loaders, 2 workers" in done.stdout and "BatchPlan" in done.stdout
    results = json.loads(figures.read_text())
    assert set(results) == {"command", "builders", "loaders_w0", "loaders_w2"}
    assert len(results["builders"]) == 2 and len(results["loaders_w2"]) == 2
    for part in ("builders", "loaders_w0", "loaders_w2"):
        for figures_of in results[part].values():
            assert figures_of["m_tokens_per_s"] > 0 and figures_of["us_per_batch"] > 0
