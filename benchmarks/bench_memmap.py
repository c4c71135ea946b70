"""The memmap path against a plain numpy memmap loader, and its planned batches against building
them one at a time (issue 18: shardtok memmap >= numpy memmap, in process and with workers).

    python benchmarks/bench_memmap.py                      # 64 M tokens, about 2 minutes
    python benchmarks/bench_memmap.py --tokens 400000 --batches 20 --reps 1   # smoke

Data (made once in --work, reused while its recipe is the same): synthetic documents (log-normal
lengths, mean 1000 tokens, int32 ids) written as uncompressed shards (64 MiB, 1 MiB frames),
read by `MemmapTokenDataset` (Megatron GPTDataset samples), and the same tokens as one flat file
for the numpy loader of the comparison harness (`benchmarks/compare/systems/numpy_memmap.py`:
seq_len + 1 windows, `DataLoader(batch_size=8, shuffle=True)`).

Two parts, each A/B interleaved in one process and repeated (the median is reported), with wall
and CPU seconds (CPU moves less when other work shares the machine):

* builders: the batches of the same shuffled samples built one at a time the previous way
  (`GPTSamples.gather` + `assemble_contiguous_batch`) and through `BatchPlan` (what
  `ShardLoader` does), no loader, in this process;
* loaders: `ShardLoader(MemmapTokenDataset, batch_size=8)` against the numpy memmap loader, each
  delivering what a training step takes (int64 input ids, labels and positions [8, S]; numpy's
  positions are a broadcast arange, as in the harness), for every --workers count. CPU is that
  of the whole process tree (workers included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.compare.measure import cpu_seconds  # noqa: E402
from benchmarks.compare.systems import arange_positions  # noqa: E402
from benchmarks.compare.systems.numpy_memmap import Windows  # noqa: E402
from shardtok.memmap.samples import GPTSamples  # noqa: E402
from shardtok.memmap.tokens import open_local_tokens  # noqa: E402
from shardtok.stream.batch import assemble_contiguous_batch  # noqa: E402
from shardtok.testing.synthetic import write_synthetic_dataset  # noqa: E402

SHARD_BYTES, FRAME_BYTES = 64 << 20, 1 << 20


def prepare(work: Path, tokens: int, seed: int) -> tuple[Path, Path]:
    """(shards folder, flat token file), written unless already there with the same recipe."""
    recipe = {"tokens": tokens, "seed": seed, "shard": SHARD_BYTES, "frame": FRAME_BYTES, "v": 1}
    shards, flat, stamp = work / "shards", work / "tokens.bin", work / "recipe.json"
    if stamp.exists() and json.loads(stamp.read_text()) == recipe:
        return shards, flat
    work.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    write_synthetic_dataset(
        shards, num_tokens=tokens, seed=seed, mean_length=1000.0, shard_size=SHARD_BYTES,
        frame_size=FRAME_BYTES, compression_level=None,
    )  # fmt: skip
    all_tokens, _ = open_local_tokens(shards)
    with open(flat, "wb") as f:
        for start in range(0, len(all_tokens), 1 << 24):
            f.write(np.asarray(all_tokens[start : start + (1 << 24)]).tobytes())
    stamp.write_text(json.dumps(recipe))
    return shards, flat


def timed(step, batches: int) -> tuple[float, float]:
    """(wall, CPU of this process tree) seconds of `batches` calls of `step`: this process's
    from process_time (ns), its workers' from /proc (10 ms ticks: long runs only)."""
    me = os.getpid()
    workers = {p: t for p, t in cpu_seconds(me).items() if p != me}
    own = time.process_time()
    start = time.perf_counter()
    for _ in range(batches):
        step()
    wall = time.perf_counter() - start
    own = time.process_time() - own
    after = {p: t for p, t in cpu_seconds(me).items() if p != me}
    return wall, own + sum(t - workers.get(pid, 0.0) for pid, t in after.items())


def compare(contenders: dict, batches: int, reps: int, tokens_per_batch: int) -> dict:
    """Interleaved repetitions: every contender once per round, the order rotated per round."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            runs[name].append(timed(contenders[name], batches))
    out = {}
    for name, results in runs.items():
        wall = statistics.median(w for w, _ in results)
        cpu = statistics.median(c for _, c in results)
        out[name] = {
            "us_per_batch": wall / batches * 1e6,
            "m_tokens_per_s": tokens_per_batch * batches / wall / 1e6,
            "cpu_s_per_m_tokens": cpu / (tokens_per_batch * batches) * 1e6,
        }
    return out


def builders(shards: Path, seq_len: int, batch: int, seed: int) -> dict:
    """The two ways to build a batch of the same shuffled samples, as endless steps."""
    import torch  # noqa: F401  # the dataset module needs it; imported here to time nothing else

    from shardtok.torch.memmap_dataset import MemmapTokenDataset

    dataset = MemmapTokenDataset(shards, seq_len=seq_len, seed=seed, shared_memory=False)
    samples: GPTSamples = dataset.samples
    order = np.random.default_rng(seed).permutation(len(samples))
    count = len(order) // batch
    old, new = {"b": 0}, {"b": 0, "plan": None, "at": 0}

    def one_at_a_time():
        b = old["b"] = (old["b"] + 1) % count
        tokens, boundaries = samples.gather(order[b * batch : (b + 1) * batch].tolist())
        assemble_contiguous_batch(tokens, boundaries, batch)

    def planned():
        if new["plan"] is None or new["at"] == len(new["plan"]):
            run = min(32, count)
            b = new["b"] = (new["b"] + run) % (count - run + 1)
            new["plan"] = dataset.plan(order[b * batch : (b + run) * batch], [batch] * run)
            new["at"] = 0
        new["plan"].batch(new["at"])
        new["at"] += 1

    return {"one batch at a time (gather + assemble)": one_at_a_time, "BatchPlan": planned}


def loaders(shards: Path, flat: Path, seq_len: int, batch: int, seed: int, workers: int) -> dict:
    import torch

    from shardtok.torch import ShardLoader
    from shardtok.torch.memmap_dataset import MemmapTokenDataset

    dataset = MemmapTokenDataset(shards, seq_len=seq_len, seed=seed)
    shardtok = ShardLoader(dataset, batch_size=batch, num_workers=workers, drop_last=True)
    numpy = torch.utils.data.DataLoader(
        Windows(flat, "int32", seq_len), batch_size=batch, shuffle=True, num_workers=workers,
        drop_last=True, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    steps = {}
    for name, loader, take in (
        ("shardtok memmap (ShardLoader)", shardtok,
         lambda b: (b["input_ids"], b["labels"], b["position_ids"])),
        ("numpy memmap (DataLoader)", numpy,
         lambda b: (b["input_ids"].long(), b["labels"].long(), arange_positions(batch, seq_len))),
    ):  # fmt: skip
        steps[name] = _endless(loader, take)
    return steps


def _endless(loader, take):
    """One batch a call, epoch after epoch (a new epoch's first batches are timed too)."""
    state = {"it": iter(loader)}

    def step():
        try:
            batch = next(state["it"])
        except StopIteration:
            state["it"] = iter(loader)
            batch = next(state["it"])
        for t in take(batch):
            if t.dtype != np.int64 and str(t.dtype) != "torch.int64":
                raise AssertionError(f"a batch tensor of {t.dtype}")

    return step


def report(title: str, results: dict) -> list[str]:
    lines = [
        f"{title}",
        "",
        "| | µs / batch | M tokens/s | CPU s / M tokens |",
        "|---|---:|---:|---:|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {r['us_per_batch']:.1f} | {r['m_tokens_per_s']:.1f} | "
            f"{r['cpu_s_per_m_tokens']:.4f} |"
        )
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64_000_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=1000, help="timed batches per repetition")
    parser.add_argument("--warmup", type=int, default=100, help="batches before timing")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", default="0,2", help="comma-separated worker counts")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--work", type=Path, default=REPO / ".bench" / "memmap")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    shards, flat = prepare(args.work, args.tokens, args.seed)
    per_batch = args.batch_size * args.seq_len
    out: dict = {"command": "python benchmarks/bench_memmap.py " + " ".join(argv or sys.argv[1:])}
    lines = [f"{args.tokens:,} synthetic tokens in {shards}; {args.batch_size} x {args.seq_len}, "
             f"{args.batches} batches x {args.reps} interleaved repetitions (median)", ""]  # fmt: skip

    steps = builders(shards, args.seq_len, args.batch_size, args.seed)
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    out["builders"] = compare(steps, args.batches, args.reps, per_batch)
    lines += report("Batch builders, in process, no loader", out["builders"])

    for workers in (int(w) for w in args.workers.split(",")):
        steps = loaders(shards, flat, args.seq_len, args.batch_size, args.seed, workers)
        for step in steps.values():
            for _ in range(args.warmup):
                step()
        results = compare(steps, args.batches, args.reps, per_batch)
        out[f"loaders_w{workers}"] = results
        lines += report(f"Loaders, {workers} workers", results)
        del steps
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
