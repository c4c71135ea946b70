"""Streaming from S3 on loopback (SeaweedFS), with and without added latency, against local disk.

    python benchmarks/bench_s3_stream.py --batches 10000 --repeat 3 --latency-ms 20,50

The first run writes the dataset, 200 M synthetic tokens (int32, zstd level 3, 338 MB in 5 shards
of 64 MiB), under .bench/s3/zstd (--tokens sets its size; --dataset reads another folder).

Packed int64 batches (8 x 2048, concat packing, default shuffle buffer) through a DataLoader
with 2 workers; each measurement runs in a fresh process, the sources interleaved (the order
rotates from one repetition to the next). Three sources: the dataset on local disk, the same
files on a SeaweedFS S3 server on 127.0.0.1, and the same server behind the test suite's fault
proxy (tests/helpers/fault_proxy.py, a TCP proxy on loopback in this process) holding every
request for a delay drawn uniformly from --latency-ms, the round trip of a distant object store.

Reported per source: tokens/s after the first batch, the time to the first batch from
iter(loader) (workers read index.json and the first shards' heads) and from before the dataset is
built (the parent reads index.json too: what a job waits for), the CPU seconds of the loader
process and its workers, and for the proxied source the number of requests it saw. The object
store and the proxy run on the same cores as the loader, so S3 figures include their CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATASET = ROOT / ".bench" / "s3" / "zstd"
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, resource, sys, time
start_all = time.perf_counter()
import torch
from torch.utils.data import DataLoader
from shardtok.torch.dataset import ShardStreamDataset
location, options, batches = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
built = time.perf_counter()
dataset = ShardStreamDataset(location, seq_len=2048, batch_size=8, storage_options=options or None)
loader = DataLoader(dataset, batch_size=None, num_workers=2, prefetch_factor=4)
start = time.perf_counter()
it = iter(loader)
first = next(it)
ttfb = time.perf_counter() - start
ttfb_job = time.perf_counter() - built
tokens, t0 = 0, time.perf_counter()
for i, batch in enumerate(it):
    tokens += batch["input_ids"].numel()
    if i + 2 >= batches:
        break
seconds = time.perf_counter() - t0
del it  # shuts the workers down, so their CPU time is counted below
cpu = sum(
    u.ru_utime + u.ru_stime
    for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
)
print(json.dumps({"ttfb": ttfb, "ttfb_job": ttfb_job, "tokens": tokens, "seconds": seconds,
                  "cpu": cpu}))
"""


# --in-process: the smoke test's mode (tests/benchmarks), CHILD run in this process with the same
# arguments, torch imported once; its figures are not comparable.
IN_PROCESS = False


def measure(location: str, options: dict, batches: int) -> dict:
    if IN_PROCESS:
        out, argv = io.StringIO(), sys.argv
        sys.argv = ["-c", location, json.dumps(options), str(batches)]
        try:
            with contextlib.redirect_stdout(out):
                exec(CHILD, {"__name__": "__main__"})
        finally:
            sys.argv = argv
        return json.loads(out.getvalue().strip().splitlines()[-1])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, location, json.dumps(options), str(batches)],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0:
        sys.exit(f"measurement of {location} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_trace(proxy, location: str, options: dict, batches: int) -> None:
    """The requests of one run, in time order: where the round trips before the first batch go."""
    start = time.monotonic()
    r = measure(location, options, batches)
    print(f"first batch {r['ttfb']:.2f} s ({r['ttfb_job']:.2f} s with the dataset's build), "
          f"{r['tokens'] / r['seconds'] / 1e6:.1f} M tokens/s")  # fmt: skip
    for at, connection, head in proxy.request_log():
        line = head.split(b"\r\n")[0].decode(errors="replace").split("?")[0]
        ranges = [h for h in head.split(b"\r\n") if h.lower().startswith(b"range:")]
        where = ranges[0].decode().split("=", 1)[1] if ranges else ""
        print(f"{at - start:7.3f} s  conn {connection:3d}  {line[:60]:60s} {where}")


def latency_range(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    low_ms, high_ms = float(low), float(high or low)
    if not 0 <= low_ms <= high_ms:
        raise argparse.ArgumentTypeError(f"expected LOW,HIGH in ms with LOW <= HIGH, got {text}")
    return low_ms / 1000, high_ms / 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--latency-ms",
        type=latency_range,
        default=(0.02, 0.05),
        help="per-request delay range of the proxied source, LOW,HIGH in ms (default 20,50)",
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        default=DATASET,
        help="a shardtok dataset folder (written if absent)",
    )
    parser.add_argument("--tokens", type=float, default=200e6, help="size of a dataset written")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="one proxied run only, printing every request it made (time, connection, range)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this process (the smoke test's mode; figures not comparable)",
    )
    args = parser.parse_args()
    global IN_PROCESS
    IN_PROCESS = args.in_process
    if not (args.dataset / "index.json").exists():
        from shardtok.testing.synthetic import write_synthetic_dataset

        manifest = write_synthetic_dataset(args.dataset, num_tokens=int(args.tokens), seed=0)
        print(
            f"wrote {args.dataset}: {manifest.num_tokens:,} tokens in {len(manifest.shards)} shards"
        )
    from tests.helpers.fault_proxy import FaultProxy
    from tests.helpers.servers import SeaweedS3

    low, high = args.latency_ms
    latency_name = f"S3 + {low * 1000:g}-{high * 1000:g} ms per request"
    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedS3(Path(tmp))
        server.start()
        proxy = None
        try:
            for path in sorted(args.dataset.iterdir()):
                if path.is_file():
                    server.put(f"bench/{path.name}", path.read_bytes())
            proxy = FaultProxy("127.0.0.1", server.ports["s3"], latency=(low, high))
            contenders = {
                "local disk": (str(args.dataset), {}),
                "S3 (SeaweedFS, loopback)": (server.url("bench"), server.storage_options()),
                latency_name: (server.url("bench"), server.storage_options(proxy.endpoint)),
            }
            if args.trace:
                print_trace(proxy, *contenders[latency_name], args.batches)
                return
            results: dict[str, list[dict]] = {name: [] for name in contenders}
            names = list(contenders)
            for rep in range(args.repeat):
                shift = rep % len(names)
                for name in names[shift:] + names[:shift]:
                    location, options = contenders[name]
                    before = proxy.delayed
                    r = measure(location, options, args.batches)
                    r["requests"] = proxy.delayed - before if name == latency_name else None
                    results[name].append(r)
                    print(
                        f"{name}: {r['tokens'] / r['seconds'] / 1e6:.1f} M tokens/s, first batch "
                        f"{r['ttfb']:.2f} s ({r['ttfb_job']:.2f} s with the dataset's build), "
                        f"{r['cpu']:.1f} CPU s"
                        + (f", {r['requests']} requests" if r["requests"] is not None else "")
                        + f" (load {os.getloadavg()[0]:.2f})",
                        flush=True,
                    )
        finally:
            if proxy is not None:
                proxy.stop()
            # its data goes with the temporary folder: no graceful shutdown (2 s) needed
            server.stop(kill=True)
    local_rate = statistics.median(r["tokens"] / r["seconds"] for r in results["local disk"])
    print(
        "\n| source | M tokens/s (median) | ratio to local | first batch from iter(loader) "
        "(s, median / worst) | first batch from building the dataset (s, median / worst) "
        "| CPU s (median) |"
    )
    print("|---|---|---|---|---|---|")
    for name, runs in results.items():
        rate = statistics.median(r["tokens"] / r["seconds"] for r in runs)
        ttfb = [r["ttfb"] for r in runs]
        job = [r["ttfb_job"] for r in runs]
        cpu = statistics.median(r["cpu"] for r in runs)
        print(
            f"| {name} | {rate / 1e6:.1f} | {rate / local_rate:.2f} | "
            f"{statistics.median(ttfb):.2f} / {max(ttfb):.2f} | "
            f"{statistics.median(job):.2f} / {max(job):.2f} | {cpu:.1f} |"
        )
    requests = [r["requests"] for r in results[latency_name]]
    print(f"\nrequests through the proxy per run: {', '.join(map(str, requests))}")
    print(
        f"load average {'/'.join(f'{x:.2f}' for x in os.getloadavg())}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )


if __name__ == "__main__":
    main()
