"""Benchmark shardtok against WebDataset, MosaicML Streaming, LitData, Megatron and a numpy memmap loader.

    python -m benchmarks.compare.run --out benchmarks/results --full    # about 40 minutes on 2 cores
    python -m benchmarks.compare.run --out /tmp/results --smoke         # tiny data, about 2 minutes

Steps: build the peers' venv (once), make the token sources (synthetic and real), write every
system's format from them (timed), measure the zstd ceiling, then read: for every repetition,
dataset and worker count, every system in an order rotated per repetition, each in a fresh
process whose tree memory is sampled from here. Writes compare.json, compare.md and PNG plots
to --out; data and formats stay in --work (.bench/compare, gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from benchmarks.compare import venv
from benchmarks.compare.checks import SourceChecker
from benchmarks.compare.data import Source, make_real, make_synthetic
from benchmarks.compare.measure import TreeMemory, load_average, machine
from benchmarks.compare.options import ReadOptions, WriteOptions
from benchmarks.compare.report import write_report
from benchmarks.compare.systems import NAMES


@dataclass(frozen=True)
class Plan:
    mode: str
    synthetic_tokens: int
    real_text_bytes: int
    real_tokenizer: str
    shard_bytes: int
    frame_bytes: int
    workers: tuple[int, ...]
    reps: int
    write_reps: int
    budget_tokens: int
    warmup_batches: int
    check_batches: int
    one_process_per_job: bool  # full: fresh process per measurement; smoke: one per system
    timeout_s: int

    def __post_init__(self) -> None:
        if not 1 <= self.check_batches <= self.warmup_batches:
            raise ValueError("checked batches are kept from the warm-up: 1 <= check <= warm-up")


FULL = Plan(
    mode="full",
    synthetic_tokens=64_000_000,  # 256 MB of int32
    real_text_bytes=160_000_000,
    real_tokenizer="llama3",
    shard_bytes=64 << 20,
    frame_bytes=1 << 20,
    workers=(0, 1, 2),
    reps=3,
    write_reps=3,
    budget_tokens=24_000_000,
    warmup_batches=20,
    check_batches=8,
    one_process_per_job=True,
    timeout_s=1200,
)

SMOKE = Plan(
    mode="smoke",
    synthetic_tokens=400_000,
    real_text_bytes=1_500_000,
    real_tokenizer="bundled",
    shard_bytes=256 << 10,
    frame_bytes=64 << 10,
    # In process and with workers: one worker runs the same DataLoader path as two, and the
    # smoke test is a sixth of the default suite's time.
    workers=(0, 2),
    reps=1,
    write_reps=1,
    budget_tokens=6 * 8 * 2048,
    warmup_batches=4,
    check_batches=4,
    one_process_per_job=False,
    timeout_s=600,
)


def rotated(names: list[str], rep: int) -> list[str]:
    k = rep % len(names)
    return names[k:] + names[:k]


class Runner:
    """Starts child processes in the peers' venv and samples their memory."""

    def __init__(self, work: Path, timeout_s: int):
        self.python = str(venv.python())
        self.logs = work / "logs"
        self.jobs = work / "jobs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self.count = 0
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(venv.REPO), os.environ.get("PYTHONPATH", "")]),
            "LITDATA_DISABLE_VERSION_CHECK": "1",
            "HF_HUB_OFFLINE": "1",
            "MPLBACKEND": "Agg",
        }

    def run(self, jobs: list[dict], tag: str) -> list[dict]:
        self.count += 1
        stem = f"{self.count:04d}-{tag}"
        jobs_path, results_path = self.jobs / f"{stem}.json", self.jobs / f"{stem}.out.json"
        jobs_path.write_text(json.dumps(jobs, indent=1))
        results_path.unlink(missing_ok=True)
        load1 = load_average()[0]
        with open(self.logs / f"{stem}.log", "w") as log:
            child = subprocess.Popen(
                [self.python, "-m", "benchmarks.compare.child", str(jobs_path), str(results_path)],
                cwd=venv.REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with TreeMemory(child.pid) as memory:
                try:
                    child.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, 9)
                    child.wait()
        done = json.loads(results_path.read_text()) if results_path.exists() else []
        for entry in done:
            entry["memory"] = memory.as_dict()
            entry["load1"] = load1
        for job in jobs[len(done) :]:
            reason = f"no result (exit status {child.returncode}); see {self.logs / stem}.log"
            done.append({"job": job, "result": {"ok": False, "error": reason}, "label": {}})
        return done


def _sources(plan: Plan, work: Path, datasets: list[str]) -> dict[str, Source]:
    data = work / "data" / plan.mode
    out = {}
    if "synthetic" in datasets:
        out["synthetic"] = make_synthetic(data / "synthetic", plan.synthetic_tokens)
    if "real" in datasets:
        cache = work / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        out["real"] = make_real(data / "real", plan.real_text_bytes, plan.real_tokenizer, cache)
    return out


def _budget(plan: Plan, source: Source, read: ReadOptions) -> int:
    """Timed batches: the plan's token budget, within 60% of one epoch after the warm-up."""
    per_batch = read.batch_size * read.seq_len
    epoch_batches = source.num_tokens // (read.batch_size * (read.seq_len + 1))
    return max(
        1, min(plan.budget_tokens // per_batch, int(0.6 * epoch_batches) - plan.warmup_batches)
    )


def run(plan: Plan, systems: list[str], datasets: list[str], work: Path, out: Path) -> dict:
    started = datetime.now(timezone.utc)
    load_start = load_average()
    print(f"[compare] {plan.mode}: venv", flush=True)
    venv.ensure(log=lambda m: print(f"[compare] {m}", flush=True))
    print(f"[compare] sources: {', '.join(datasets)}", flush=True)
    sources = _sources(plan, work, datasets)
    runner = Runner(work, plan.timeout_s)
    write = WriteOptions(shard_bytes=plan.shard_bytes, frame_bytes=plan.frame_bytes)
    read = ReadOptions()
    formats = work / "formats" / plan.mode
    source_files = {name: str(Path(s.prefix).parent / "source.json") for name, s in sources.items()}

    def fmt(dataset: str, system: str) -> str:
        return str(formats / dataset / system)

    write_jobs = []
    for rep in range(plan.write_reps):
        for system in rotated(systems, rep):
            for dataset in sources:
                write_jobs.append(
                    {
                        "kind": "write",
                        "system": system,
                        "dataset": dataset,
                        "rep": rep,
                        "source": source_files[dataset],
                        "out": fmt(dataset, system) if rep == 0 else str(work / "scratch" / system),
                        "write_options": write.to_json(),
                        "read_options": read.to_json(),
                        "prepare": rep == 0,
                    }
                )

    read_jobs = []
    for rep in range(plan.reps):
        for dataset, source in sources.items():
            for workers in plan.workers:
                options = replace(read, num_workers=workers)
                for system in rotated(systems, rep):
                    stem = f"{dataset}-{system}-w{workers}-r{rep}"
                    read_jobs.append(
                        {
                            "kind": "read",
                            "system": system,
                            "dataset": dataset,
                            "rep": rep,
                            "source": source_files[dataset],
                            "out": fmt(dataset, system),
                            "read_options": options.to_json(),
                            "warmup_batches": plan.warmup_batches,
                            "budget_batches": _budget(plan, source, options),
                            "check_batches": plan.check_batches,
                            "dump": str(runner.jobs / f"{stem}.rows.npy"),
                        }
                    )
    if plan.one_process_per_job:
        entries = _execute(runner, plan, write_jobs, "write")
        entries += _execute(runner, plan, read_jobs, "read")
    else:  # smoke: one process per system writes, then reads (imports once)
        entries = _execute(runner, plan, write_jobs + read_jobs, "write+read")
    shutil.rmtree(work / "scratch", ignore_errors=True)
    _check(entries, sources)
    ceiling_jobs = [
        {"kind": "ceiling", "dataset": d, "shards": fmt(d, "shardtok_stream")}
        for d in sources
        if "shardtok_stream" in systems
    ]
    if ceiling_jobs:
        print("[compare] ceiling", flush=True)
        entries += runner.run(ceiling_jobs, "ceiling")

    results: dict = {
        "mode": plan.mode,
        "command": "python -m benchmarks.compare.run " + shlex.join(sys.argv[1:]),
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "machine": machine(),
        "versions": venv.versions(),
        "plan": plan.__dict__,
        "write_options": write.to_json(),
        "read_options": read.to_json(),
        "systems": systems,
        "datasets": {name: s.__dict__ for name, s in sources.items()},
        "entries": entries,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(results, indent=1))
    write_report(results, out / "compare.md")
    print("[compare] plots", flush=True)
    plots = runner.run(
        [{"kind": "plots", "results": str(out / "compare.json"), "out": str(out)}], "plots"
    )
    results["entries"] += plots
    (out / "compare.json").write_text(json.dumps(results, indent=1))
    return results


def _execute(runner: Runner, plan: Plan, jobs: list[dict], phase: str) -> list[dict]:
    if plan.one_process_per_job:
        groups = [[job] for job in jobs]
    else:
        by_system: dict[str, list[dict]] = {}
        for job in jobs:
            by_system.setdefault(job["system"], []).append(job)
        groups = list(by_system.values())
    entries = []
    for i, group in enumerate(groups, 1):
        first = group[0]
        what = first["system"]
        if len(group) == 1:
            what += f" {first['dataset']} rep {first['rep']}"
            if first["kind"] == "read":
                what += f" w{first['read_options']['num_workers']}"
        started = time.perf_counter()
        done = runner.run(group, f"{phase}-{first['system']}")
        failed = sum(not e["result"]["ok"] for e in done)
        status = f"{failed} FAILED" if failed else "ok"
        print(
            f"[compare] {phase} {i}/{len(groups)} {what} ({len(group)} jobs): {status} "
            f"in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        entries += done
    return entries


def _check(entries: list[dict], sources: dict[str, Source]) -> None:
    checkers: dict[str, SourceChecker] = {}
    for entry in entries:
        job, result = entry["job"], entry["result"]
        if job["kind"] != "read" or not result["ok"]:
            continue
        dataset = job["dataset"]
        if dataset not in checkers:
            checkers[dataset] = SourceChecker(sources[dataset])
        result["checks"] = checkers[dataset].check(np.load(job["dump"]))


def report_only(out: Path, work: Path) -> int:
    results = json.loads((out / "compare.json").read_text())
    results["entries"] = [e for e in results["entries"] if e["job"]["kind"] != "plots"]
    write_report(results, out / "compare.md")
    venv.ensure(log=lambda m: print(f"[compare] {m}", flush=True))
    job = {"kind": "plots", "results": str(out / "compare.json"), "out": str(out)}
    done = Runner(work, 600).run([job], "plots")
    if not done[0]["result"]["ok"]:
        print(done[0]["result"]["error"], file=sys.stderr)
        return 1
    print(f"[compare] rewrote {out}/compare.md and {', '.join(done[0]['result']['files'])}")
    return 0


def failures(results: dict) -> list[str]:
    problems = []
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        where = f"{job['kind']} {job.get('system', '')} {job.get('dataset', '')}".strip()
        if not result["ok"]:
            problems.append(f"{where}: {result['error'].strip().splitlines()[-1]}")
        elif "checks" in result and not result["checks"]["ok"]:
            problems.append(f"{where}: batches disagree with the data: {result['checks']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare.run", description=__doc__.split("\n\n")[0]
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--full", action="store_true", help="the measured run (about 40 min)")
    mode.add_argument("--smoke", action="store_true", help="tiny data, one repetition (tests)")
    mode.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite compare.md and the plots from OUT/compare.json (after editing the report code)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--work", type=Path, default=venv.REPO / ".bench" / "compare")
    parser.add_argument("--systems", default=",".join(NAMES), help="comma-separated subset")
    parser.add_argument("--datasets", default="synthetic,real", help="synthetic,real or one")
    parser.add_argument("--workers", help="comma-separated worker counts (default 0,1,2)")
    parser.add_argument("--reps", type=int, help="read repetitions (full: 3)")
    parser.add_argument("--budget-tokens", type=int, help="timed tokens per measurement")
    parser.add_argument("--synthetic-tokens", type=int, help="size of the synthetic source")
    parser.add_argument("--real-text-bytes", type=int, help="text bytes of the real corpus")
    parser.add_argument("--real-tokenizer", choices=("llama3", "bundled"))
    args = parser.parse_args(argv)

    if args.report_only:
        return report_only(args.out, args.work.resolve())
    plan = FULL if args.full else SMOKE
    overrides = {
        "reps": args.reps,
        "budget_tokens": args.budget_tokens,
        "synthetic_tokens": args.synthetic_tokens,
        "real_text_bytes": args.real_text_bytes,
        "real_tokenizer": args.real_tokenizer,
    }
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    if args.workers:
        plan = replace(plan, workers=tuple(int(w) for w in args.workers.split(",")))
    systems = [s for s in args.systems.split(",") if s]
    for name in systems:
        if name not in NAMES:
            parser.error(f"unknown system {name!r}; known: {', '.join(NAMES)}")
    datasets = [d for d in args.datasets.split(",") if d]
    if not set(datasets) <= {"synthetic", "real"}:
        parser.error("--datasets takes synthetic, real or both")

    results = run(plan, systems, datasets, args.work.resolve(), args.out)
    problems = failures(results)
    for problem in problems:
        print(f"[compare] FAILED {problem}", file=sys.stderr)
    print(f"[compare] results in {args.out}/compare.md", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
