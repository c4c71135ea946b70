"""The comparison benchmark's smoke mode, end to end, so the harness does not rot.

Runs `python -m benchmarks.compare.run --smoke`: builds (or reuses) the peers' venv in
.bench/peers-venv (pip needs PyPI the first time: about two minutes), writes tiny synthetic and
real token data into every system's format, reads it back in process and with 2 DataLoader workers,
and checks what came out. No figure is asserted: speed is the full run's business.

Marked `peers`: the default suite skips it (it would download the peers' packages); `.ci/run`
runs it after the default suite with `pytest --peers tests/benchmarks/test_smoke.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SYSTEMS = {
    "shardtok_stream",
    "shardtok_memmap",
    "webdataset_tar",
    "mosaic_mds",
    "litdata_tokens",
    "megatron_gpt",
    "numpy_memmap",
}
DATASETS = {"synthetic", "real"}
WORKERS = {0, 2}  # the smoke plan's (benchmarks/compare/run.py SMOKE)


def _run_smoke(tmp_path: Path) -> tuple[dict, Path, subprocess.CompletedProcess]:
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.compare.run", "--smoke", "--out", str(out),
           "--work", str(tmp_path / "work")]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert (out / "compare.json").exists(), done.stdout[-4000:] + done.stderr[-4000:]
    return json.loads((out / "compare.json").read_text()), out, done


@pytest.mark.peers
def test_smoke_runs_every_system_and_the_batches_match_the_data(tmp_path):
    results, out, done = _run_smoke(tmp_path)
    entries = results["entries"]
    errors = [
        f"{e['job']['kind']} {e['job'].get('system')} {e['job'].get('dataset')}: {e['result']['error']}"
        for e in entries
        if not e["result"]["ok"]
    ]
    assert not errors, "\n".join(errors)
    assert done.returncode == 0, done.stderr[-4000:]
    assert set(results["systems"]) == SYSTEMS
    assert set(results["datasets"]) == DATASETS

    # writes: one per system and dataset, with what each format must cost on disk
    writes = {(e["job"]["system"], e["job"]["dataset"]): e["result"] for e in entries if e["job"]["kind"] == "write"}  # fmt: skip
    assert set(writes) == {(s, d) for s in SYSTEMS for d in DATASETS}
    for dataset, source in results["datasets"].items():
        itemsize = {"int32": 4, "uint16": 2}[source["dtype"]]
        assert writes[("numpy_memmap", dataset)]["bytes"] == source["num_tokens"] * itemsize
        # zstd must beat the raw token bytes; the tar/MDS/chunk formats hold at least them
        assert writes[("shardtok_stream", dataset)]["bytes_per_token"] < itemsize
        for system in SYSTEMS - {"shardtok_stream"}:
            assert writes[(system, dataset)]["bytes_per_token"] >= itemsize
    assert results["datasets"]["synthetic"]["dtype"] == "int32"
    assert results["datasets"]["real"]["dtype"] == "uint16"  # the bundled 8k tokenizer

    # reads: every (system, dataset, workers) once, full int64 batches, checked against the data
    reads = [e for e in entries if e["job"]["kind"] == "read"]
    cells = {(e["job"]["system"], e["job"]["dataset"], e["job"]["read_options"]["num_workers"]) for e in reads}  # fmt: skip
    assert cells == {(s, d, w) for s in SYSTEMS for d in DATASETS for w in WORKERS}
    assert len(reads) == len(cells)
    for e in reads:
        job, result = e["job"], e["result"]
        assert result["batch_shape"] == [8, 2048]
        assert result["tokens"] == job["budget_batches"] * 8 * 2048
        assert result["tokens_per_s"] > 0 and result["ttfb_s"] > 0
        assert result["cpu_s"] >= result["cpu_main_s"] >= 0
        checks = result["checks"]
        assert checks["rows"] == job["check_batches"] * 8
        assert checks["in_vocabulary"] and checks["multiset_within_data"], (job, checks)
        assert checks["whole_documents"] > 0 and checks["unknown_documents"] == 0, (job, checks)
        assert e["memory"]["peak_rss"] >= e["memory"]["peak_uss"] > 0

    # the ceiling decoded exactly the tokens shardtok stored
    ceilings = {e["job"]["dataset"]: e["result"] for e in entries if e["job"]["kind"] == "ceiling"}
    for dataset, source in results["datasets"].items():
        assert ceilings[dataset]["tokens"] == source["num_tokens"]
        assert ceilings[dataset]["uncompressed_bytes"] == writes[("numpy_memmap", dataset)]["bytes"]

    report = (out / "compare.md").read_text()
    assert "Smoke run" in report and "## Headline" in report
    for name in ("compare-throughput.png", "compare-memory.png", "compare-cpu.png"):
        png = (out / name).read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) < 300_000
