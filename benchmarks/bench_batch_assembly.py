"""Assembling one concat batch from its documents' pieces, in one process: µs and page faults
per batch.

What it isolates is the batch step the in-process stream's main thread runs for every batch
(`assemble_contiguous_batch`: inputs, labels, positions, document numbers, cu_seqlens), for
several batch shapes and both ways a training loop can hold its batches:

* ``held``: the previous batch is still referenced while the next is built (``for batch in
  loader``);
* ``dropped``: the previous batch is gone first (a loop that moves it to the GPU and rebinds).

Each shape is measured with the library as installed (compiled kernels, one block per batch),
with the kernels' Python/numpy twins, and with the arrays allocated one by one (the layout
before issue 18's last step), so the difference each makes is printed side by side. Every cell
runs in a fresh process: glibc moves its heap thresholds with what a process allocated before.

    python benchmarks/bench_batch_assembly.py --repeat 5
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial

import numpy as np

from shardtok.stream import batch, segments
from shardtok.stream.batch import allocate_arrays, assemble_contiguous_batch

SHAPES = ((8, 2048), (16, 2048), (8, 8192), (32, 4096))
VARIANTS = ("installed", "twins", "separate arrays")


def separate_arrays(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """The arrays of a batch, one allocation each."""
    shape = (batch_size, seq_len)
    return {
        "input_ids": np.empty(shape, dtype=np.int64),
        "labels": np.empty(shape, dtype=np.int64),
        "position_ids": np.empty(shape, dtype=np.int64),
        "document_ids": np.empty(shape, dtype=np.int32),
        "cu_seqlens": np.empty(batch_size * seq_len + 1, dtype=np.int32),
        "source_ids": np.empty(batch_size, dtype=np.int64),
    }


@contextmanager
def twins():
    """The kernels' Python/numpy twins instead of the kernels."""
    saved = segments._segments_kernel, segments._contiguous_kernel, batch._contiguous_kernel
    segments._segments_kernel = segments._contiguous_kernel = batch._contiguous_kernel = None
    try:
        yield
    finally:
        segments._segments_kernel, segments._contiguous_kernel, batch._contiguous_kernel = saved


def measure(build: Callable[[], dict], count: int, hold: bool) -> tuple[float, float]:
    """(µs per batch, minor page faults per batch) over `count` batches."""
    kept = build() if hold else None
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    for _ in range(count):
        if hold:
            kept = build()
        else:
            build()
    elapsed = time.perf_counter() - start
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    del kept
    return elapsed / count * 1e6, faults / count


def one(batch_size: int, seq_len: int, variant: str, hold: bool, documents_per_row: int,
        count: int) -> tuple[float, float]:  # fmt: skip
    """One cell, in this (fresh) process: glibc's heap thresholds move with what a process
    allocated before, so every cell gets a process of its own."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 128_000, batch_size * (seq_len + 1), dtype=np.int32)
    choices = rng.choice(np.arange(1, len(tokens)), documents_per_row * batch_size, replace=False)
    boundaries = sorted(choices.tolist())
    allocate = separate_arrays if variant == "separate arrays" else allocate_arrays
    # As the concat packer hands them over: the documents' pieces, end to end (views).
    pieces = np.split(tokens, boundaries)
    build = partial(assemble_contiguous_batch, pieces, boundaries, batch_size, allocate=allocate)
    if variant == "twins":
        with twins():
            return measure(build, count, hold)
    return measure(build, count, hold)


def run(shapes, documents_per_row: int, count: int, repeat: int) -> list[dict]:
    rows_out = []
    for batch_size, seq_len in shapes:
        for variant in VARIANTS:
            for hold in (True, False):
                best = None
                for _ in range(repeat):
                    spec = [batch_size, seq_len, variant, hold, documents_per_row, count]
                    out = subprocess.run(
                        [sys.executable, __file__, "--one", json.dumps(spec)],
                        check=True, capture_output=True, text=True,
                    )  # fmt: skip
                    result = json.loads(out.stdout)
                    best = result if best is None or result[0] < best[0] else best
                rows_out.append(
                    {
                        "batch": f"{batch_size} x {seq_len}",
                        "variant": variant,
                        "caller": "held" if hold else "dropped",
                        "us_per_batch": round(best[0], 2),
                        "faults_per_batch": round(best[1], 1),
                    }
                )
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per cell; the fastest counts")
    parser.add_argument("--count", type=int, default=2000, help="batches per run")
    parser.add_argument("--documents-per-row", type=int, default=2, help="documents per row")
    parser.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES),
                        help="batch_size x seq_len, comma-separated (default: %(default)s)")  # fmt: skip
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a cell, in a fresh process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*json.loads(args.one))))
        return
    shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]
    rows = run(shapes, args.documents_per_row, args.count, args.repeat)
    print("| batch | arrays from | caller | µs per batch | page faults per batch |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['variant']} | {r['caller']} | {r['us_per_batch']} | "
              f"{r['faults_per_batch']} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
