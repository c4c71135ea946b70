"""Cost of the memmap path's frame checks (crc32 of each frame on first touch in a process).

    python benchmarks/bench_stream.py prepare          # once: .bench/stream/plain (uncompressed)
    python benchmarks/bench_memmap_check.py [--batches 2000]

Gathers shuffled GPT samples (8 x 2049 tokens a batch, as the memmap loaders do) in this
process, three ways over the same memmaps: without checks, with checks from a cold start
(every frame is crc32-checked when first touched), and with checks once every frame has been
checked (the steady state of a long run). Pages are warmed first so disk speed does not count.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import ConcatTokens, open_local_tokens

PLAIN = Path(__file__).resolve().parent.parent / ".bench" / "stream" / "plain"
SEQ_LEN, BATCH = 2048, 8


def run(samples: GPTSamples, order: np.ndarray, batches: int) -> float:
    t0 = time.perf_counter()
    for b in range(batches):
        samples.gather(order[b * BATCH : (b + 1) * BATCH].tolist())
    return batches * BATCH * (SEQ_LEN + 1) / (time.perf_counter() - t0) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=2000)
    args = parser.parse_args()
    checked, sizes = open_local_tokens(PLAIN)
    plain = ConcatTokens(checked.arrays)  # the same memmaps, no FrameCheck
    for a in plain.arrays:
        a.sum()  # page cache warm: measure the check, not the disk
    order = np.random.default_rng(0).permutation(len(GPTSamples(plain, sizes, SEQ_LEN)))
    batches = min(args.batches, len(order) // BATCH)
    results = {}
    for label, tokens in (("no check", plain), ("check, cold", checked), ("check, warm", checked)):
        samples = GPTSamples(tokens, sizes, SEQ_LEN)
        results[label] = run(samples, order, batches)
    frames = len(checked.check.starts)
    print(f"{PLAIN}: {len(checked):,} tokens, {frames} frames; {batches} batches of {BATCH}")
    for label, rate in results.items():
        print(f"  {label:12s} {rate:8.1f} M tokens/s")


if __name__ == "__main__":
    main()
