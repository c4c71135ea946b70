"""One weighted mix streamed in process: the seconds for N batches (8 x 2048) of two sources.

    python benchmarks/bench_mix.py 2000          # writes .bench/mix (2 x 6 M tokens) once

Each source holds 6 M synthetic tokens, so 2000 batches cross many source epochs: the figure
covers the packers' rows and every epoch's opening, and ends with one ``state_dict()``. Run it
in two trees in turn (``farm-bench --vs``) to compare them; the timed window is printed, the
process's CPU is what farm-bench counts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from shardtok.testing.synthetic import write_synthetic_dataset
from shardtok.torch import ShardStreamDataset

ROOT = Path(__file__).resolve().parent.parent / ".bench" / "mix"


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for name in "ab":
        if not (ROOT / name / "index.json").exists():
            write_synthetic_dataset(ROOT / name, num_tokens=6_000_000, vocab_size=128_000,
                                    mean_length=800, shard_size=1_000_000, frame_size=250_000)  # fmt: skip
    ds = ShardStreamDataset(
        {str(ROOT / "a"): 0.7, str(ROOT / "b"): 0.3},
        seq_len=2048, batch_size=8, seed=1, num_batches=10**6,
    )  # fmt: skip
    it = iter(ds)
    started = time.perf_counter()
    for _ in range(batches):
        next(it)
    ds.state_dict()
    print(f"{time.perf_counter() - started:.3f}")


if __name__ == "__main__":
    main()
