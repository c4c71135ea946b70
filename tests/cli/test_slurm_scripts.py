"""The Slurm scripts docs/DISTRIBUTED.md ships (docs/slurm/) run as written: each array task as Slurm
would start it (bash, with the SLURM_* variables Slurm sets), then the merge job. No Slurm here,
so `sbatch` itself is not run; everything the scripts do is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.cli.test_convert_phases import SHARD, UNIT, run
from tests.convert.test_determinism import tree_digest, write_corpus

SLURM = Path(__file__).resolve().parents[2] / "docs" / "slurm"


def sbatch_task(script: str, out: Path, bin_dir: Path, **slurm: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    env.update({f"SLURM_{k.upper()}": str(v) for k, v in slurm.items()})
    return subprocess.run(
        ["bash", str(SLURM / script), str(out)], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def test_the_documented_array_and_merge_jobs_give_the_one_command_bytes(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(corpus, 400, seed=5)
    reference = tmp_path / "ref"
    run(str(corpus), "-o", str(reference), "--workers", "1", *UNIT, *SHARD)

    # The scripts call `shardtok`: this interpreter's, whether or not its script is installed.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "shardtok").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shardtok "$@"\n')
    (bin_dir / "shardtok").chmod(0o755)

    out = tmp_path / "out"
    run("plan", str(corpus), "-o", str(out), *UNIT, *SHARD)
    # An array submitted as --array=1-3 (ids need not start at 0): ranks 0, 1, 2 of 3.
    array = {"array_task_min": 1, "array_task_count": 3, "cpus_per_task": 1}
    first = sbatch_task("convert-units.sbatch", out, bin_dir, array_task_id=1, **array)
    assert first.returncode == 0, first.stderr

    # The merge job before the other tasks ran: status stops it with exit 3, nothing merged.
    early = sbatch_task("convert-merge.sbatch", out, bin_dir, cpus_per_task=1)
    assert early.returncode == 3, early.stderr
    assert not (out / "index.json").exists()

    for task_id in (2, 3):
        done = sbatch_task("convert-units.sbatch", out, bin_dir, array_task_id=task_id, **array)
        assert done.returncode == 0, done.stderr
    merged = sbatch_task("convert-merge.sbatch", out, bin_dir, cpus_per_task=1)
    assert merged.returncode == 0, merged.stderr
    assert tree_digest(out) == tree_digest(reference)
