"""Documents per second through the WebDataset stages vs the native stream reader, in process.

    python benchmarks/bench_webdataset.py [--tokens 8000000] [--repeat 3]

Data (written once under .bench/webdataset): synthetic text-like int32 tokens (Zipf ids, vocab
128256, log-normal document lengths) as zstd shards (level 3, 1 MiB frames, 8 MiB shards), once
with mean document length 1000 ("long") and once 100 ("short", where per-document cost shows).

Readers, each in a fresh process, timed from the first shard opened to the last document:
  native          DatasetSource.open_stream(shard).documents(): views into each decoded frame
  wds-documents   wds.WebDataset(paths).compose(shardtok.webdataset.documents())  (the default)
  wds-stream      wds.DataPipeline(wds.SimpleShardList(paths), stream_documents())
Every reader's token count is checked against the manifest. The figure is tokens per CPU-second
(all three are single-threaded); wall-clock and peak RSS (ru_maxrss) beside it. The machine's cores are shared: the load average is printed beside each figure.
Results go to benchmarks/results/webdataset.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench" / "webdataset"
RESULTS = ROOT / "benchmarks" / "results" / "webdataset.md"
READERS = ("native", "wds-documents", "wds-stream")
DATASETS = {"long": 1000.0, "short": 100.0}


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def prepare(tokens: int) -> None:
    from shardtok.testing.synthetic import write_synthetic_dataset

    for name, mean in DATASETS.items():
        out = BENCH / f"{name}-{tokens}"
        if (out / "index.json").exists():
            continue
        write_synthetic_dataset(
            out, num_tokens=tokens, vocab_size=128256, mean_length=mean, shard_size=8 << 20
        )


def child(reader: str, folder: str) -> None:
    """One timed pass in this (fresh) process; prints a JSON line."""
    import webdataset as wds

    import shardtok.webdataset as sw
    from shardtok.dataset.source import DatasetSource

    dataset = DatasetSource(folder)
    manifest = dataset.manifest
    paths = [str(Path(folder) / e.file) for e in manifest.shards]
    tokens = documents = 0
    start, cpu = time.perf_counter(), time.process_time()
    if reader == "native":
        for entry in manifest.shards:
            stream, fileobj = dataset.open_stream(entry.file)
            with fileobj:
                for doc in stream.documents():
                    tokens += len(doc)
                    documents += 1
    else:
        if reader == "wds-documents":
            pipeline = wds.WebDataset(paths, shardshuffle=False).compose(sw.documents())
        else:
            pipeline = wds.DataPipeline(wds.SimpleShardList(paths), sw.stream_documents())
        for sample in pipeline:
            tokens += len(sample["tokens"])
            documents += 1
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert tokens == manifest.num_tokens and documents == manifest.num_documents
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB
    print(
        json.dumps(
            {"tokens": tokens, "documents": documents, "seconds": seconds, "cpu": cpu, "rss": rss}
        )
    )


def measure(reader: str, folder: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--child", reader, str(folder)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("READER", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    prepare(args.tokens)
    rows = []
    for name, mean in DATASETS.items():
        folder = BENCH / f"{name}-{args.tokens}"
        runs: dict[str, list[dict]] = {r: [] for r in READERS}
        loads = []
        for _ in range(args.repeat):  # interleaved, so load changes hit every reader alike
            for reader in READERS:
                runs[reader].append(measure(reader, folder))
            loads.append(load())
        size = sum(p.stat().st_size for p in folder.glob("*.tar")) / 1e6
        native = statistics.median(r["tokens"] / r["cpu"] for r in runs["native"])
        for reader in READERS:
            cpu = sorted(r["tokens"] / r["cpu"] for r in runs[reader])
            wall = statistics.median(r["tokens"] / r["seconds"] for r in runs[reader])
            docs = statistics.median(r["documents"] / r["cpu"] for r in runs[reader])
            rows.append(
                f"| {name} (mean {mean:.0f} tokens, {size:.0f} MB zstd) | {reader} "
                f"| {statistics.median(cpu) / 1e6:.1f} ({cpu[0] / 1e6:.1f}-{cpu[-1] / 1e6:.1f}) "
                f"| {docs / 1e3:.0f} | {statistics.median(cpu) / native:.2f} | {wall / 1e6:.1f} "
                f"| {max(r['rss'] for r in runs[reader]):.0f} | {' '.join(loads)} |"
            )
            print(rows[-1], flush=True)
    write_results(args, rows)


def write_results(args, rows: list[str]) -> None:
    import platform

    import numpy
    import webdataset
    import zstandard

    lines = [
        "# WebDataset stages vs the native stream reader",
        "",
        f"Taken {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), shared "
        f"with other work; Python {platform.python_version()}, numpy {numpy.__version__}, "
        f"zstandard {zstandard.__version__}, webdataset {webdataset.__version__}.",
        "",
        f"Command: `PYTHONPATH=. python benchmarks/bench_webdataset.py --tokens {args.tokens} "
        f"--repeat {args.repeat}`",
        "",
        f"Data: {args.tokens / 1e6:.0f} M synthetic int32 tokens per dataset (vocab 128256, Zipf "
        "ids, log-normal document lengths), zstd level 3, 1 MiB frames, 8 MiB shards, local "
        "disk (page cache warm after the first run). One process per run, single-threaded, timed "
        "from the first shard opened to the last document (imports excluded); the figure is "
        "tokens per CPU-second of that process (`time.process_time()`: nothing here runs a "
        "thread, and CPU time is what shared cores leave steady), wall-clock beside it. "
        "`native` yields "
        "views into each decoded frame; the stages yield one sample dict per document with its "
        "own copy of the tokens.",
        "",
        "| data | reader | M tokens per CPU-second: median (min-max) | k docs per CPU-s "
        "| / native | M tokens/s wall (median) | peak RSS MiB | load after each round |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
