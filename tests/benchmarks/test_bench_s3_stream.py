"""benchmarks/bench_s3_stream.py on a tiny dataset (SeaweedFS on loopback, the fault proxy with
latency), so the script does not rot. No figure is asserted. The measurements run --in-process (the
same CHILD code, torch imported once instead of once per source)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "bench_s3_stream.py"


def test_every_source_is_measured_and_the_proxy_adds_latency(tmp_path):
    args = ["--dataset", str(tmp_path / "ds"), "--tokens", "3e5", "--batches", "3", "--in-process"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--repeat", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    for row in ("| local disk |", "| S3 (SeaweedFS, loopback) |", "| S3 + 20-50 ms per request |"):
        assert row in done.stdout, done.stdout
    requests = done.stdout.split("requests through the proxy per run: ")[1].split()[0]
    assert int(requests) > 0  # the proxied run went through the proxy, delayed
