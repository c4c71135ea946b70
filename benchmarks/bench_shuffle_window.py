"""What the shuffle buffer's token bound changes where a stream starts: the comparison harness's
timed window (20 batches of warm-up, then 1,464 batches of 8 x 2048), in one process.

    python benchmarks/bench_shuffle_window.py [--data DIR] [--tokens 0 4194304 ...] [--repeat 3]

For each `shuffle_tokens` value (0: documents only, the buffer before issue 18), in a fresh
process per run and interleaved: tokens/s, the tokens the reader decoded to yield the window's
tokens, the process's CPU, its minor page faults and peak RSS. The default data is the
comparison's real corpus (`python -m benchmarks.compare.run --full` writes it): 22-token
docstrings followed by files of up to 100 k tokens, one shard. Counts (decoded tokens, page
faults, RSS) do not move with the machine's load; tokens/s does.
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

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".bench" / "compare" / "formats" / "full" / "real" / "shardtok_stream"


def child(data: str, shuffle_tokens: int, warmup: int, batches: int) -> dict:
    from shardtok.stream.nodes import reader as reader_node
    from shardtok.torch import ShardLoader, ShardStreamDataset

    decoded = [0]
    take = reader_node.SliceReader._next_many

    def counted(self, count):
        docs = take(self, count)
        decoded[0] += sum(map(len, docs))
        return docs

    reader_node.SliceReader._next_many = counted
    ds = ShardStreamDataset(data, seq_len=2048, batch_size=8, seed=0, shuffle_tokens=shuffle_tokens)
    batches_it = iter(ShardLoader(ds, num_workers=0))
    for _ in range(warmup):
        next(batches_it)
    decoded[0] = 0
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    tokens = 0
    for _ in range(batches):
        tokens += next(batches_it)["input_ids"].numel()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "tokens_per_s": tokens / seconds,
        "yielded": tokens,
        "decoded": decoded[0],
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "faults": after.ru_minflt - before.ru_minflt,
        "peak_rss_mb": after.ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default=str(DEFAULT_DATA), help="a shardtok dataset folder")
    p.add_argument("--tokens", type=int, nargs="+", default=[0, 1 << 22, 1 << 24])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batches", type=int, default=1464)
    p.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._child is not None:
        print(json.dumps(child(args.data, args._child, args.warmup, args.batches)))
        return
    if not (Path(args.data) / "index.json").exists():
        sys.exit(f"{args.data}: no dataset (run `python -m benchmarks.compare.run --full` first)")
    runs: dict[int, list[dict]] = {t: [] for t in args.tokens}
    for rep in range(args.repeat):
        for t in args.tokens:
            cmd = [sys.executable, __file__, "--data", args.data, "--warmup", str(args.warmup),
                   "--batches", str(args.batches), "--_child", str(t)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            run = json.loads(done.stdout.strip().splitlines()[-1])
            runs[t].append(run)
            print(f"[{rep}] shuffle_tokens {t:>10,}: {run['tokens_per_s'] / 1e6:6.1f} M tokens/s, "
                  f"decoded {run['decoded'] / 1e6:.1f} M for {run['yielded'] / 1e6:.1f} M, "
                  f"{run['faults']:,} faults, peak RSS {run['peak_rss_mb']:.0f} MB, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    print()
    print("| shuffle_tokens | M tokens/s, median (runs) | tokens decoded / yielded | CPU ms per M "
          "tokens | minor page faults | peak RSS MB |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for t, rs in runs.items():
        rates = [r["tokens_per_s"] / 1e6 for r in rs]
        print(f"| {t:,} | {statistics.median(rates):.1f} ({', '.join(f'{x:.1f}' for x in rates)}) "
              f"| {statistics.median(r['decoded'] / r['yielded'] for r in rs):.2f} "
              f"| {statistics.median(r['cpu_s'] / r['yielded'] * 1e9 for r in rs):.1f} "
              f"| {statistics.median(r['faults'] for r in rs):,.0f} "
              f"| {statistics.median(r['peak_rss_mb'] for r in rs):.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
