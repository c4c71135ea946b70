"""How long `shardtok trace` takes at a late step, and why (docs/TRACE.md, "How long it takes").

A trace replays one worker's rows on token addresses (idx reads only) from the start of the
part its step lies in: a single dataset's epoch (each epoch is a stream of its own), a mix's
whole run (sources run on through their epochs), a curriculum stage. This times ``trace_step`` for a
single dataset and a two-source mix, concat / greedy / bfd packing, 8 x 2048 batches, at steps
10^3..10^5 (and 10^6 where it takes under a minute or two), and writes
benchmarks/results/trace.md.

    PYTHONPATH=. python benchmarks/bench_trace.py [--max-step 1000000] [--out results/trace.md]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import date
from pathlib import Path

from shardtok.dataset.source import DatasetSource
from shardtok.stream import StreamOptions, StreamSetup, mix_spec
from shardtok.stream.provenance import trace_step
from shardtok.testing.synthetic import write_synthetic_dataset

SEQ_LEN, BATCH = 2048, 8
COMMAND = "PYTHONPATH=. python benchmarks/bench_trace.py"


def datasets(root: Path) -> tuple[str, str]:
    web, code = root / "web", root / "code"
    write_synthetic_dataset(web, num_tokens=40_000_000, vocab_size=50_000, mean_length=600,
                            shard_size=4_000_000)  # fmt: skip
    write_synthetic_dataset(code, num_tokens=10_000_000, vocab_size=50_000, mean_length=1500,
                            shard_size=2_000_000, seed=1)  # fmt: skip
    return str(web), str(code)


def setup_of(kind: str, packing: str, web: str, code: str) -> StreamSetup:
    options = StreamOptions(seq_len=SEQ_LEN, batch_size=BATCH, packing=packing, seed=7)
    if kind == "single":
        return StreamSetup.single(DatasetSource(web), options)
    return StreamSetup.mixed(mix_spec({web: 0.7, code: 0.3}), options)


def timed(setup: StreamSetup, step: int, workers: int) -> float:
    started = time.perf_counter()
    trace = trace_step(setup, step=step, rank=0, world_size=1, num_workers=workers,
                       num_batches=step)  # fmt: skip
    elapsed = time.perf_counter() - started
    assert len(trace["sequences"]) == BATCH
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-step", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "trace.md"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        web, code = datasets(Path(tmp))
        rows = []
        cases = [("single", "concat", 0), ("single", "greedy", 0), ("mix", "concat", 0),
                 ("mix", "concat", 2), ("mix", "greedy", 0), ("mix", "bfd", 0)]  # fmt: skip
        for kind, packing, workers in cases:
            setup = setup_of(kind, packing, web, code)
            timed(setup, 10, workers)  # warm: manifests and idx sizes read once per process
            step, seconds = 1000, 0.0
            while step <= args.max_step and seconds < 60:
                seconds = timed(setup, step, workers)
                per = seconds / (step / max(workers, 1)) * 1e6
                rows.append((kind, packing, workers, step, seconds, per))
                print(f"{kind:6} {packing:6} workers {workers}: step {step:>9,} {seconds:8.2f} s "
                      f"({per:.0f} us per batch replayed)", flush=True)  # fmt: skip
                step *= 10
    load = os.getloadavg()[0]
    lines = [
        "# Trace: how long `shardtok trace` takes at a late step",
        "",
        f"`{COMMAND}` ({date.today()}, 2-core VM, load average {load:.1f} at the end). "
        f"Batches of {BATCH} x {SEQ_LEN}; a 40 M-token dataset (mean document 600 tokens) and, "
        "for the mix, a 10 M-token one (mean 1,500) at 0.7 / 0.3, so late steps run through "
        "many source epochs (each replanned). One worker's rows are replayed as addresses "
        "(only the shards' idx are read); a run stops growing the step once one trace passes "
        "60 s. The µs column divides by the worker's batches up to the step, which for the "
        "single dataset overstates the work (only the step's epoch is replayed).",
        "",
        "| data | packing | workers | step | seconds | µs per batch of the worker |",
        "|---|---|---|---|---|---|",
        *(f"| {k} | {p} | {w} | {s:,} | {t:.2f} | {u:.0f} |" for k, p, w, s, t, u in rows),
        "",
        "A single dataset replays only the epoch the step lies in (each epoch is a stream of "
        "its own, about 2,440 batches here), so its traces cost the same at any step. A mix "
        "replays from the start of the run (its sources run on through their epochs; a "
        "curriculum: from the start of the stage), so its cost is linear in step / max(K, 1) "
        "(a worker replays only its own batches): multiply the µs per batch by that. Concat "
        "without overlap passes over runs of windows per numpy call; greedy and bfd place "
        "documents one by one, as the stream does. A state saved near the step (`--state`) "
        "bounds the replay to the batches since it.",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
