"""The benchmark process: runs jobs in the peers' venv and writes one JSON result per job.

    python -m benchmarks.compare.child JOBS.json RESULTS.json

A job is {"kind": "write" | "read" | "ceiling" | "plots", ...}. The orchestrator (run.py) starts
one fresh process per read job in full runs, so peak memory belongs to that one loader, and
samples the process tree's memory from outside. Results are rewritten after every job, so a
crash keeps what finished; a failing job records its traceback and the next one runs.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks.compare.data import Source
from benchmarks.compare.measure import cpu_seconds, disk_usage
from benchmarks.compare.options import ReadOptions, WriteOptions
from benchmarks.compare.systems import load


def run_write(job: dict) -> dict:
    started = time.perf_counter()
    system = load(job["system"])
    import_s = time.perf_counter() - started
    source = Source.load(job["source"])
    out = Path(job["out"])
    if out.exists():
        shutil.rmtree(out)
    start = time.perf_counter()
    system.write(source, out, WriteOptions(**job["write_options"]))
    write_s = time.perf_counter() - start
    stored = disk_usage(out)
    files = sum(1 for p in out.rglob("*") if p.is_file())
    prepare_s = 0.0
    if job.get("prepare") and hasattr(system, "prepare"):
        start = time.perf_counter()
        system.prepare(out, source, ReadOptions(**job["read_options"]))
        prepare_s = time.perf_counter() - start
    return {
        "import_s": import_s,
        "write_s": write_s,
        "prepare_s": prepare_s,
        "bytes": stored,
        "files": files,
        "bytes_per_token": stored / source.num_tokens,
        "write_tokens_per_s": source.num_tokens / write_s,
    }


def run_read(job: dict) -> dict:
    started = time.perf_counter()
    system = load(job["system"])
    import torch

    import_s = time.perf_counter() - started
    source = Source.load(job["source"])
    options = ReadOptions(**job["read_options"])
    shape = (options.batch_size, options.seq_len)
    kept: list[np.ndarray] = []

    def take(batch) -> torch.Tensor:
        # what a training step takes: inputs, targets and positions, each [B, S] int64
        ids, labels, positions = system.training_inputs(batch)
        for name, t in (("input_ids", ids), ("labels", labels), ("position_ids", positions)):
            if tuple(t.shape) != shape or t.dtype != torch.int64:
                raise AssertionError(
                    f"{name} of {tuple(t.shape)} {t.dtype}, expected {shape} int64"
                )
        return ids

    start = time.perf_counter()
    loader = system.loader(Path(job["out"]), source, options)
    batches = iter(loader)
    kept.append(take(next(batches)).numpy().copy())
    ttfb_s = time.perf_counter() - start
    for _ in range(job["warmup_batches"] - 1):
        ids = take(next(batches))
        if len(kept) < job["check_batches"]:
            kept.append(ids.numpy().copy())
    tokens = 0
    me = os.getpid()
    cpu_before = cpu_seconds(me)
    start = time.perf_counter()
    try:
        for _ in range(job["budget_batches"]):
            tokens += take(next(batches)).numel()
    except StopIteration:
        raise AssertionError(
            f"the loader ran dry after {tokens:,} timed tokens, {job['budget_batches']} batches "
            "were asked for: lower the budget or use more data"
        ) from None
    seconds = time.perf_counter() - start
    cpu_after = cpu_seconds(me)
    # CPU time moves much less than wall time with other work's load: the loader's own cost
    cpu_tree = sum(t - cpu_before.get(pid, 0.0) for pid, t in cpu_after.items())
    cpu_main = cpu_after[me] - cpu_before[me]
    del batches, loader
    gc.collect()
    # the parent checks these rows against the source (checks.py), after this process is gone
    np.save(job["dump"], np.concatenate(kept))
    return {
        "import_s": import_s,
        "ttfb_s": ttfb_s,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "cpu_s": cpu_tree,
        "cpu_main_s": cpu_main,
        "cpu_s_per_m_tokens": cpu_tree / tokens * 1e6,
        "batch_shape": list(shape),
    }


def _label(job: dict) -> dict:
    if "system" not in job:
        return {}
    try:
        system = load(job["system"])
    except Exception:  # an import that fails is already the job's recorded error
        return {}
    return {"label": system.LABEL, "layout": system.LAYOUT}


def run_job(job: dict) -> dict:
    kind = job["kind"]
    if kind == "write":
        return run_write(job)
    if kind == "read":
        return run_read(job)
    if kind == "ceiling":
        from benchmarks.compare.ceiling import measure_ceiling

        return measure_ceiling(Path(job["shards"]), job.get("passes", 5))
    if kind == "plots":
        from benchmarks.compare.plots import make_plots

        return {"files": make_plots(Path(job["results"]), Path(job["out"]))}
    raise ValueError(f"unknown job kind {kind!r}")


def main(argv: list[str]) -> int:
    jobs_path, results_path = Path(argv[0]), Path(argv[1])
    jobs = json.loads(jobs_path.read_text())
    results: list[dict] = []
    for job in jobs:
        try:
            result = {"ok": True, **run_job(job)}
        except Exception:
            result = {"ok": False, "error": traceback.format_exc()}
        results.append({"job": job, "result": result, "label": _label(job)})
        results_path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
