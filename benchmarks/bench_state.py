"""What a saved position costs: microseconds per `SliceStream.state_dict()`, the call a
ShardLoader worker makes after every batch.

    python benchmarks/bench_state.py [--dir .bench/stream/zstd] [--calls 20000]
"""

from __future__ import annotations

import argparse
import time

from shardtok.stream import SliceStream, StreamOptions


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dir", default=".bench/stream/zstd", help="a dataset (bench_stream prepare)")
    p.add_argument("--calls", type=int, default=20_000)
    args = p.parse_args()
    stream = SliceStream(args.dir, StreamOptions(seq_len=2048, batch_size=8))
    for _ in range(50):
        next(stream)
    start = time.perf_counter()
    for _ in range(args.calls):
        stream.state_dict()
    print(f"{(time.perf_counter() - start) / args.calls * 1e6:.2f} us per state_dict()")


if __name__ == "__main__":
    main()
