"""Streaming from S3 on loopback (SeaweedFS) against the same dataset on local disk.

    python benchmarks/bench_stream.py prepare        # the dataset under .bench/stream/zstd (once)
    python benchmarks/bench_s3_stream.py --batches 1500 --repeat 3

Packed int64 batches (8 x 2048, concat packing, default shuffle buffer) through a DataLoader
with 2 workers; each measurement runs in a fresh process, local and S3 interleaved. Reports
tokens/s (after the first batch) and time to first batch (from iter(loader), i.e. including
reading index.json and the first shards' heads). The object store runs on the same 2 cores as
the loader, so S3 figures include the server's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / ".bench" / "stream" / "zstd"
sys.path.insert(0, str(ROOT / "tests"))

CHILD = r"""
import json, sys, time
import torch
from torch.utils.data import DataLoader
from shardtok.torch.dataset import ShardStreamDataset
location, options, batches = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
dataset = ShardStreamDataset(location, seq_len=2048, batch_size=8, storage_options=options or None)
loader = DataLoader(dataset, batch_size=None, num_workers=2, prefetch_factor=4)
start = time.perf_counter()
it = iter(loader)
first = next(it)
ttfb = time.perf_counter() - start
tokens, t0 = 0, time.perf_counter()
for i, batch in enumerate(it):
    tokens += batch["input_ids"].numel()
    if i + 2 >= batches:
        break
print(json.dumps({"ttfb": ttfb, "tokens": tokens, "seconds": time.perf_counter() - t0}))
"""


def measure(location: str, options: dict, batches: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, location, json.dumps(options), str(batches)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not (DATASET / "index.json").exists():
        sys.exit(f"no dataset at {DATASET}: run `python benchmarks/bench_stream.py prepare` first")
    from servers import SeaweedS3

    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedS3(Path(tmp))
        server.start()
        try:
            for path in sorted(DATASET.iterdir()):
                server.put(f"bench/{path.name}", path.read_bytes())
            contenders = {
                "local disk": (str(DATASET), {}),
                "S3 (SeaweedFS, loopback)": (server.url("bench"), server.storage_options()),
            }
            results: dict[str, list[dict]] = {name: [] for name in contenders}
            for rep in range(args.repeat):
                order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
                for name in order:
                    location, options = contenders[name]
                    results[name].append(measure(location, options, args.batches))
                    r = results[name][-1]
                    print(
                        f"{name}: {r['tokens'] / r['seconds'] / 1e6:.1f} M tokens/s, first batch {r['ttfb']:.2f} s "
                        f"(load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
        finally:
            server.stop()
    local_rate = statistics.median(r["tokens"] / r["seconds"] for r in results["local disk"])
    print("\n| source | M tokens/s (median) | ratio to local | first batch (s, median / worst) |")
    print("|---|---|---|---|")
    for name, runs in results.items():
        rate = statistics.median(r["tokens"] / r["seconds"] for r in runs)
        ttfb = [r["ttfb"] for r in runs]
        print(
            f"| {name} | {rate / 1e6:.1f} | {rate / local_rate:.2f} | {statistics.median(ttfb):.2f} / {max(ttfb):.2f} |"
        )
    print(
        f"\nload average {'/'.join(f'{x:.2f}' for x in os.getloadavg())}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


if __name__ == "__main__":
    main()
