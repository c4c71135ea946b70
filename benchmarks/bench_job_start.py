"""What starting a job costs one worker at scale: bytes read and seconds until it knows its slice.

Every (rank, worker) of a job reads the dataset's ``index.json`` and plans the epoch before its
first batch. This writes synthetic manifests of 10^4, 10^5 and 10^6 shards (the real format,
entries as a converter writes them; no shard files, which planning never opens), then, for each,
in a fresh process per measurement, times a worker of a 32,768-worker job (world size 4,096 x 8
DataLoader workers) from nothing to its own slice: reading and parsing ``index.json``
(``DatasetSource.manifest``) and the concat epoch plan (``epoch_plan``). Bytes read is the
manifest's size: every worker of every rank fetches it whole.

    PYTHONPATH=. python benchmarks/bench_job_start.py [--shards 10000 100000 1000000]

Writes benchmarks/results/job_start.md. This is the baseline of issue 18's fourth target
(<= 1 MB and <= 0.1 s per worker at 10^6 shards).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "job-start"
TOKENS_PER_SHARD = 64 << 20  # about 128 MiB of uint16 tokens per shard, a common shard size
DOCS_PER_SHARD = 65_536
WORLD_SIZE, NUM_WORKERS = 4096, 8
COMMAND = "PYTHONPATH=. python benchmarks/bench_job_start.py"


def write_manifest(folder: Path, shards: int) -> Path:
    """A valid index.json of `shards` entries (sizes vary a little, hashes are distinct)."""
    path = folder / "index.json"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i in range(shards):
        tokens = TOKENS_PER_SHARD - (i * 7919) % 4096
        digest = hashlib.sha256(i.to_bytes(8, "little")).hexdigest()
        entries.append({
            "bytes": 2 * tokens // 3, "file": f"shard-{i:06d}.tar", "meta_sha256": digest[::-1],
            "num_documents": DOCS_PER_SHARD, "num_tokens": tokens, "sha256": digest,
        })  # fmt: skip
    doc = {
        "dtype": "uint16", "extra": {}, "format": "shardtok-dataset", "format_version": 1,
        "name": "shard", "num_documents": DOCS_PER_SHARD * shards,
        "num_tokens": sum(e["num_tokens"] for e in entries), "shards": entries,
        "tokenizer": {"bos_id": None, "eos_id": 0, "fingerprint": None, "name": "synthetic"},
        "vocab_size": 50_000,
    }  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


def child(folder: str, rank: int, worker: int) -> None:
    """One worker's start, in this fresh process: prints a JSON line of what it cost."""
    from shardtok.storage.dataset import DatasetSource
    from shardtok.stream.plan import epoch_plan

    start = time.perf_counter()
    manifest = DatasetSource(folder).manifest
    parsed = time.perf_counter()
    plan = epoch_plan(manifest, seq_len=2048, batch_size=8, seed=1, world_size=WORLD_SIZE,
                      num_workers=NUM_WORKERS)  # fmt: skip
    mine = plan.slices[rank * NUM_WORKERS + worker]
    planned = time.perf_counter()
    print(json.dumps({
        "parse_s": parsed - start, "plan_s": planned - parsed, "pieces": len(mine.pieces),
        "batches": plan.batches_per_slice,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))  # fmt: skip


def measure(folder: Path, repeats: int) -> list[dict]:
    runs = []
    for repeat in range(repeats):
        rank, worker = (repeat * 977) % WORLD_SIZE, repeat % NUM_WORKERS
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.bench_job_start import child; child({str(folder)!r}, {rank}, {worker})"  # fmt: skip
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True)  # fmt: skip
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=WORK, help="where the manifests are written")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "job_start.md"
    )
    args = parser.parse_args()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for shards in args.shards:
        folder = args.work / f"{shards}"
        size = write_manifest(folder, shards).stat().st_size
        load = os.getloadavg()
        runs = measure(folder, args.repeats)
        best = min(runs, key=lambda r: r["parse_s"] + r["plan_s"])
        rows.append((shards, size, best, load))
        print(f"{shards:>9,} shards: index.json {size / 1e6:.1f} MB, parse {best['parse_s']:.2f} s, "
              f"plan {best['plan_s']:.2f} s, peak RSS {best['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
    lines = [
        "## Job start: what one worker reads and spends before it knows its slice",
        "",
        f"Taken {started} on the 2-core machine. Command: `{COMMAND} --shards "
        f"{' '.join(map(str, args.shards))} --repeats {args.repeats}`.",
        "",
        f"A worker of a {WORLD_SIZE * NUM_WORKERS:,}-worker job (world size {WORLD_SIZE:,} x "
        f"{NUM_WORKERS} DataLoader workers), concat packing, 8 x 2048 batches; each figure is the "
        f"best of {args.repeats} fresh processes (imports excluded). Bytes read = `index.json`, "
        "which every worker of every rank fetches whole.",
        "",
        "| shards | bytes read per worker | parse index.json (s) | plan the epoch (s) | "
        "peak RSS (MB) | bytes fetched by the whole job | load before |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    workers = WORLD_SIZE * NUM_WORKERS
    for shards, size, best, load in rows:
        lines.append(
            f"| {shards:,} | {size / 1e6:.1f} MB | {best['parse_s']:.2f} | {best['plan_s']:.2f} | "
            f"{best['peak_rss_mb']:.0f} | {size * workers / 1e9:,.0f} GB | "
            f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} |"
        )
    lines += [
        "",
        "Target (issue 18): <= 1 MB and <= 0.1 s per worker at 10^6 shards.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
