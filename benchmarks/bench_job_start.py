"""What starting a job costs one worker at scale: bytes read and seconds until it knows its slice.

Every (rank, worker) of a job reads the dataset's manifest and plans the epoch before its first
batch. This writes synthetic datasets of 10^4, 10^5 and 10^6 shards (the real manifests, both
index.json and index.compact, entries as a converter writes them; no shard files, which planning
never opens), then, for each, in a fresh process per measurement, times a worker of a
32,768-worker job (world size 4,096 x 8 DataLoader workers) from nothing to its own slice:
reading the manifest (``DatasetSource.manifest``) and the concat epoch plan (``epoch_plan``, its
``slice_for`` and ``batches_per_slice``). Three ways, side by side, for worker 0, a middle and
the last worker:

* ``json, every slice``: a dataset of an earlier release (index.json only), every slice of the
  plan cut, as the planner before index.compact did;
* ``json, own slice``: the same dataset, the worker's own slice only;
* ``compact``: index.compact read by range (header, then its slice's groups), own slice only.

Bytes read: index.json's size (fetched whole) or the ranges index.compact's reader fetched.

    PYTHONPATH=. python benchmarks/bench_job_start.py [--shards 10000 100000 1000000]

Writes benchmarks/results/job_start.md and job_start.png. Issue 18's fourth target: <= 1 MB
and <= 0.1 s per worker at 10^6 shards.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".bench" / "job-start"
TOKENS_PER_SHARD = 64 << 20  # about 128 MiB of uint16 tokens per shard, a common shard size
DOCS_PER_SHARD = 65_536
WORLD_SIZE, NUM_WORKERS = 4096, 8
COMMAND = "PYTHONPATH=. python benchmarks/bench_job_start.py"


MODES = ("json-all", "json-own", "compact")
MODE_LABELS = {"json-all": "index.json, every slice", "json-own": "index.json, own slice",
               "compact": "index.compact, own slice"}  # fmt: skip


def write_dataset(folder: Path, shards: int) -> Path:
    """`folder/both` (index.json and index.compact, as this release writes a dataset) and
    `folder/json` (index.json alone, a dataset of an earlier release), of `shards` entries
    (sizes vary a little, hashes are distinct)."""
    from shardtok.format.compact_manifest import COMPACT_NAME
    from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry

    both, old = folder / "both", folder / "json"
    if (old / MANIFEST_NAME).exists() and (both / COMPACT_NAME).exists():
        return folder
    entries = []
    for i in range(shards):
        tokens = TOKENS_PER_SHARD - (i * 7919) % 4096
        digest = hashlib.sha256(i.to_bytes(8, "little")).hexdigest()
        entries.append(ShardEntry(f"shard-{i:06d}.tar", 2 * tokens // 3, DOCS_PER_SHARD, tokens,
                                  digest, digest[::-1]))  # fmt: skip
    tokenizer = {"bos_id": None, "eos_id": 0, "fingerprint": None, "name": "synthetic"}
    manifest = Manifest("shard", np.dtype("uint16"), 50_000, tokenizer, tuple(entries))
    both.mkdir(parents=True, exist_ok=True)
    old.mkdir(parents=True, exist_ok=True)
    manifest.write(both)
    if (old / MANIFEST_NAME).exists():
        (old / MANIFEST_NAME).unlink()
    os.link(both / MANIFEST_NAME, old / MANIFEST_NAME)
    return folder


def child(folder: str, mode: str, rank: int, worker: int) -> None:
    """One worker's start, in this fresh process: prints a JSON line of what it cost."""
    from shardtok.dataset.source import DatasetSource
    from shardtok.stream.plan import epoch_plan

    wall, cpu = time.perf_counter(), time.process_time()
    source = DatasetSource(Path(folder) / ("both" if mode == "compact" else "json"))
    manifest = source.manifest
    parsed, parsed_cpu = time.perf_counter(), time.process_time()
    plan = epoch_plan(manifest, seq_len=2048, batch_size=8, seed=1, world_size=WORLD_SIZE,
                      num_workers=NUM_WORKERS)  # fmt: skip
    if mode == "json-all":
        plan.slices  # noqa: B018 - every slice, as the planner before index.compact cut them
    mine = plan.slice_for(rank, worker)
    batches = plan.batches_per_slice
    planned, planned_cpu = time.perf_counter(), time.process_time()
    print(json.dumps({
        "parse_s": parsed - wall, "plan_s": planned - parsed, "cpu_s": planned_cpu - cpu,
        "parse_cpu_s": parsed_cpu - cpu, "bytes": source.manifest_bytes_read,
        "pieces": len(mine.pieces), "first_shard": mine.pieces[0].shard, "batches": batches,
        "start": mine.start, "stop": mine.stop,
        "peak_rss_mb": peak_rss_mb(),
    }))  # fmt: skip


def peak_rss_mb() -> float:
    """This process's peak resident memory. Not ru_maxrss, which a child keeps from the parent
    it was forked from (the one that wrote the manifests)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(folder: Path, mode: str, rank: int, worker: int) -> dict:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.bench_job_start "
            f"import child; child({str(folder)!r}, {mode!r}, {rank}, {worker})")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


WORKERS = {"first": (0, 0), "middle": (WORLD_SIZE // 2, 0),
           "last": (WORLD_SIZE - 1, NUM_WORKERS - 1)}  # fmt: skip


def measure(folder: Path, repeats: int, modes) -> dict:
    """Best of `repeats` per (mode, worker), the modes interleaved within each repeat."""
    best: dict = {}
    for _ in range(repeats):
        for who, (rank, worker) in WORKERS.items():
            for mode in modes:
                run = run_child(folder, mode, rank, worker)
                key = (mode, who)
                if key not in best or run["parse_s"] + run["plan_s"] < (
                    best[key]["parse_s"] + best[key]["plan_s"]
                ):
                    best[key] = run
    for who in WORKERS:  # every way finds the same slice
        slices = {(best[(m, who)]["start"], best[(m, who)]["stop"], best[(m, who)]["first_shard"])
                  for m in modes}  # fmt: skip
        assert len(slices) == 1, (who, slices)
    return best


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shards = [r[0] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4))
    for mode in MODES:
        style = {"linewidth": 2.6} if mode == "compact" else {"linewidth": 1.4}
        for ax, value in zip(axes, (lambda b: b["bytes"] / 1e6,
                                    lambda b: b["parse_s"] + b["plan_s"])):  # fmt: skip
            ys = [max(value(r[1][(mode, who)]) for who in WORKERS) for r in rows]
            ax.plot(shards, ys, marker="o", label=MODE_LABELS[mode], **style)
    for ax, (target, ylabel, title) in zip(axes, (
        (1.0, "MB read (worst of 3 workers)", "bytes a worker reads before its slice"),
        (0.1, "seconds (worst of 3 workers)", "time until a worker knows its slice"),
    )):  # fmt: skip
        ax.axhline(target, color="grey", linestyle=":", linewidth=1)
        ax.annotate("target at 10^6 shards", (shards[0], target), fontsize=7, color="grey",
                    va="bottom")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("shards in the dataset")
        ax.set_ylabel(ylabel)
        ax.set_title(title + f" ({WORLD_SIZE * NUM_WORKERS:,} workers)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=WORK, help="where the manifests are written")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "job_start.md"
    )
    parser.add_argument("--plot", type=Path, help="only draw the png from a run's .json")
    args = parser.parse_args()
    if args.plot:
        saved = json.loads(args.plot.read_text())
        rows = [(n, {(m, w): b for m, w, b in best}, load) for n, best, load in saved]
        plot(rows, args.plot.with_suffix(".png"))
        return 0
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    for shards in args.shards:
        folder = write_dataset(args.work / f"{shards}", shards)
        load = os.getloadavg()
        best = measure(folder, args.repeats, MODES)
        rows.append((shards, best, load))
        for mode in MODES:
            b = best[(mode, "last")]
            print(f"{shards:>9,} shards, {MODE_LABELS[mode]:<26}: {b['bytes'] / 1e6:8.3f} MB, "
                  f"parse {b['parse_s']:.3f} s + plan {b['plan_s']:.3f} s, "
                  f"peak RSS {b['peak_rss_mb']:.0f} MB", flush=True)  # fmt: skip
    workers = WORLD_SIZE * NUM_WORKERS
    lines = [
        "## Job start: what one worker reads and spends before it knows its slice",
        "",
        f"Taken {started} on the 2-core machine (shared: wall seconds are noisy, CPU seconds "
        f"move less). Command: `{COMMAND} --shards {' '.join(map(str, args.shards))} "
        f"--repeats {args.repeats}`.",
        "",
        f"A worker of a {workers:,}-worker job (world size {WORLD_SIZE:,} x {NUM_WORKERS} "
        "DataLoader workers), concat packing, 8 x 2048 batches, seed 1: worker 0 (rank 0), a "
        f"middle one (rank {WORLD_SIZE // 2}, worker 0) and the last (rank {WORLD_SIZE - 1}, "
        f"worker {NUM_WORKERS - 1}). Each figure is the best of {args.repeats} fresh processes, "
        "the three ways interleaved (imports excluded); every way finds the same slice. "
        "*index.json, every slice*: a dataset of an earlier release planned as before "
        "index.compact (every slice cut); *index.json, own slice*: the same dataset, only the "
        "worker's slice cut; *index.compact*: the compact manifest read by range.",
        "",
        "| shards | way | worker | bytes read | read manifest (s) | plan own slice (s) | "
        "total (s) | CPU (s) | peak RSS (MB) | bytes fetched by the whole job |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for shards, best, _ in rows:
        for mode in MODES:
            for who in WORKERS:
                b = best[(mode, who)]
                lines.append(
                    f"| {shards:,} | {MODE_LABELS[mode]} | {who} | {b['bytes'] / 1e6:,.3f} MB | "
                    f"{b['parse_s']:.3f} | {b['plan_s']:.3f} | {b['parse_s'] + b['plan_s']:.3f} | "
                    f"{b['cpu_s']:.3f} | {b['peak_rss_mb']:.0f} | "
                    f"{b['bytes'] * workers / 1e9:,.1f} GB |"
                )
    loads = ", ".join(f"{r[0]:,}: {r[2][0]:.1f}/{r[2][1]:.1f}/{r[2][2]:.1f}" for r in rows)
    png = args.out.with_suffix(".png")
    figures = args.out.with_suffix(".json")
    figures.write_text(json.dumps([[n, [[m, w, b] for (m, w), b in best.items()], load]
                                   for n, best, load in rows]))  # fmt: skip
    try:
        plot(rows, png)
    except ImportError:  # matplotlib is not a dependency; the peers' venv has it
        print(
            f"no matplotlib here: plot later with `python {Path(__file__).name} --plot "
            f"{figures}` in a Python that has it",
            file=sys.stderr,
        )
    lines += [
        "",
        f"Load average before each size: {loads}.",
        "",
        f"![job-start cost against shard count]({png.name})",
        "",
        "Target (issue 18): <= 1 MB and <= 0.1 s per worker at 10^6 shards.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out} and {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
