"""Streaming benchmarks: packed int64 batches (8 x 2048) through a torch DataLoader.

    python benchmarks/bench_stream.py prepare              # ~210 MB of int32 tokens under .bench/stream
    python benchmarks/bench_stream.py throughput           # zstd stream and memmap path, 0/1/2 workers
    python benchmarks/bench_stream.py stages               # CPU per batch of each stage, in process
    python benchmarks/bench_stream.py memory --big-gb 5    # worker RSS: 0.2 GB vs >= 5 GB dataset
    python benchmarks/bench_stream.py prepare --masked     # + the same tokens with loss masks
    python benchmarks/bench_stream.py masks                # masked vs the same tokens unmasked

Data: synthetic text-like tokens (Zipf ids, vocab 128256 so int32, log-normal document lengths
with mean 1000, EOS at every end), written once compressed (zstd level 3, 1 MiB frames, 64 MiB
shards) and once uncompressed (for the memmap path), plus the same tokens as a flat Megatron
.bin/.idx for the plain memmap window loader used as a reference. Every measurement runs in a
fresh process; the machine's load average is printed with each figure because the cores are
shared. Figures and commands go to benchmarks/results/stream.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench" / "stream"
SEQ_LEN, BATCH = 2048, 8


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# -- data -------------------------------------------------------------------------------------


def mask_of(length: int, rng):
    """A conversation-like loss mask: alternating untrained (prompt) and trained (response)
    runs, log-normal run lengths (mean ~120 tokens), about half the tokens trained."""
    import numpy as np

    runs = np.maximum(1, rng.lognormal(np.log(120) - 0.5, 1.0, size=length // 40 + 2).astype(int))
    bits = np.repeat(np.arange(len(runs)) % 2, runs)
    while len(bits) < length:  # rare: short runs
        bits = np.concatenate([bits, 1 - bits[-1:].repeat(length)])
    return bits[:length].astype(np.uint8)


def prepare_masked(manifest) -> None:
    """zstd-masked (and plain-masked for the memmap path): the zstd data's documents again,
    with loss masks; tokens, shards and frames as in the unmasked copies."""
    import numpy as np

    from shardtok.format import DatasetWriter, ShardReader, load_manifest

    for name, level in (("zstd-masked", 3), ("plain-masked", None)):
        out = BENCH / name
        if (out / "index.json").exists():
            continue
        rng = np.random.default_rng(1)
        t0 = time.perf_counter()
        with DatasetWriter(out, vocab_size=manifest.vocab_size, tokenizer=manifest.tokenizer,
                           compression_level=level, masks=True,
                           sft={"synthetic": "alternating runs, mean 120"}) as writer:  # fmt: skip
            for entry in manifest.shards:
                for doc in ShardReader(BENCH / "zstd" / entry.file).documents():
                    writer.add(doc, mask=mask_of(len(doc), rng))
        m = load_manifest(out)
        print(f"{name}: {m.num_tokens:,} tokens, {100 * m.trained_tokens / m.num_tokens:.1f}% "
              f"trained, {m.num_bytes / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")  # fmt: skip


def prepare(args) -> None:
    from shardtok.format import DatasetWriter, ShardReader, load_manifest, write_megatron_pair
    from shardtok.testing.synthetic import write_synthetic_dataset

    BENCH.mkdir(parents=True, exist_ok=True)
    zstd = BENCH / "zstd"
    if not (zstd / "index.json").exists():
        t0 = time.perf_counter()
        m = write_synthetic_dataset(zstd, num_tokens=int(args.tokens), seed=0)
        print(f"zstd: {m.num_tokens:,} tokens, {len(m.shards)} shards, {m.num_bytes / 1e6:.0f} MB "
              f"in {time.perf_counter() - t0:.1f} s")  # fmt: skip
    manifest = load_manifest(zstd)
    plain = BENCH / "plain"
    if not (plain / "index.json").exists():
        with DatasetWriter(plain, vocab_size=manifest.vocab_size, tokenizer=manifest.tokenizer,
                           compression_level=None) as writer:  # fmt: skip
            for entry in manifest.shards:
                for doc in ShardReader(zstd / entry.file).documents():
                    writer.add(doc)
        print(f"plain: {load_manifest(plain).num_bytes / 1e6:.0f} MB")
    pair = BENCH / "megatron" / "tokens"
    if not pair.with_suffix(".idx").exists():
        pair.parent.mkdir(exist_ok=True)

        def documents():
            for entry in manifest.shards:
                yield from ShardReader(zstd / entry.file).documents()

        write_megatron_pair(pair, documents(), manifest.dtype)
        print(f"megatron pair: {pair}.bin")
    if args.masked:
        prepare_masked(manifest)


# -- one measured run (child process) -----------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss(pid: int) -> dict:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) // 1024  # MiB
    return out


class _RssSampler(threading.Thread):
    """Peak RSS (anonymous + shared memory) of the given processes, sampled every 50 ms."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.peak, self.stop = pids, {p: {} for p in pids}, threading.Event()

    def run(self):
        while not self.stop.wait(0.05):
            for p in self.pids:
                try:
                    now = _rss(p)
                except FileNotFoundError:
                    continue
                for k, v in now.items():
                    self.peak[p][k] = max(self.peak[p].get(k, 0), v)


class PlainWindows:
    """The reference: a plain memmap window loader (reference note 004's PretrainBinaryDataset)."""

    def __init__(self, prefix: Path):
        import numpy as np

        self.prefix = prefix
        self.n = os.path.getsize(f"{prefix}.bin") // 4 // (SEQ_LEN + 1)
        self.np = np

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch

        data = self.np.memmap(f"{self.prefix}.bin", dtype=self.np.int32, mode="r")
        item = data[i * (SEQ_LEN + 1) : (i + 1) * (SEQ_LEN + 1)].astype(self.np.int64)
        return torch.from_numpy(item[:-1]), torch.from_numpy(item[1:])


def child(args) -> None:
    import torch
    from torch.utils.data import DataLoader

    t0 = time.perf_counter()
    workers = args.workers
    extra = {"prefetch_factor": args.prefetch} if workers else {}
    # ShardLoader's start method; the DataLoader kinds keep the default (fork on Linux <3.14).
    context = (
        {"multiprocessing_context": args.start_method} if workers and args.start_method else {}
    )
    packing = {"packing": args.packing} if args.packing else {}
    if args.overlong:
        packing["overlong"] = args.overlong
    plain = BENCH / args.data.replace("zstd", "plain")  # the memmap kinds' uncompressed copy
    if args.kind == "zstd":
        from shardtok.torch import ShardStreamDataset

        ds = ShardStreamDataset(BENCH / args.data, seq_len=SEQ_LEN, batch_size=BATCH,
                                shuffle_buffer=args.shuffle_buffer,
                                labels_format=args.labels_format, **packing)  # fmt: skip
        loader = DataLoader(ds, batch_size=None, num_workers=workers, **extra)
    elif args.kind == "lean":
        from shardtok.torch import ShardLoader, ShardStreamDataset

        ds = ShardStreamDataset(BENCH / args.data, seq_len=SEQ_LEN, batch_size=BATCH,
                                shuffle_buffer=args.shuffle_buffer,
                                labels_format=args.labels_format, **packing)  # fmt: skip
        loader = ShardLoader(ds, num_workers=workers, prefetch=args.prefetch, **context)
    elif args.kind == "memlean":
        from shardtok.torch import ShardLoader
        from shardtok.torch.memmap_dataset import MemmapTokenDataset

        ds = MemmapTokenDataset(plain, seq_len=SEQ_LEN, num_samples=args.batches * BATCH,
                                seed=1234, cache_dir=BENCH / "index-cache",
                                labels_format=args.labels_format)  # fmt: skip
        loader = ShardLoader(ds, batch_size=BATCH, num_workers=workers, prefetch=args.prefetch,
                             **context)  # fmt: skip
    elif args.kind == "memmap":
        from shardtok.torch.memmap_dataset import MemmapTokenDataset

        ds = MemmapTokenDataset(plain, seq_len=SEQ_LEN, num_samples=args.batches * BATCH,
                                seed=1234, cache_dir=BENCH / "index-cache",
                                labels_format=args.labels_format)  # fmt: skip
        loader = DataLoader(
            ds, batch_size=BATCH, collate_fn=ds.collate, num_workers=workers, **extra
        )
    elif args.kind == "idle":  # the DataLoader's own floor: workers hand over ready slots
        from torch.utils.data import IterableDataset

        from shardtok.torch.transport import SlotRing

        class Idle(IterableDataset):
            def __iter__(self):
                ring = SlotRing(BATCH, SEQ_LEN)
                while True:
                    batch = dict(ring.allocate(BATCH, SEQ_LEN))
                    batch["cu_seqlens"] = batch["cu_seqlens"][: BATCH + 1]
                    local = torch.utils.data.get_worker_info() is None
                    yield ring.package(batch, labels_format="shifted", local=local)

        loader = DataLoader(Idle(), batch_size=None, num_workers=workers, **extra)
    elif args.kind == "plain":
        ds = PlainWindows(BENCH / "megatron" / "tokens")
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, **extra,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    else:
        raise SystemExit(f"bench_stream: unknown kind {args.kind!r}")
    built = time.perf_counter()
    it = iter(loader)
    next(it)
    first = time.perf_counter()
    procs = it.workers.processes if hasattr(it, "workers") else getattr(it, "_workers", [])
    pids = [w.pid for w in procs]
    sampler = _RssSampler([os.getpid(), *pids])
    sampler.start()
    cpu0 = [_cpu_seconds(p) for p in pids]
    main0, thread0 = time.process_time(), time.thread_time()
    n = 1
    for batch in it:
        n += 1
        if isinstance(batch, dict):  # what a training step takes: inputs, targets, positions
            batch["input_ids"], batch["labels"], batch["position_ids"]
        else:
            batch[0], batch[1]
        if n >= args.batches:
            break
    end = time.perf_counter()
    main1, thread1 = time.process_time(), time.thread_time()
    cpu1 = [_cpu_seconds(p) for p in pids]
    sampler.stop.set()
    sampler.join()
    timed = n - 1
    tokens = timed * BATCH * SEQ_LEN
    del batch
    print(json.dumps({
        "kind": args.kind, "data": args.data, "workers": workers, "batches": n,
        "tokens_per_s": tokens / (end - first),
        "first_batch_s": first - built, "setup_s": built - t0,
        "main_cpu_us_per_batch": (main1 - main0) / timed * 1e6,
        # the main thread alone (in process, the rest of the main process's CPU is the
        # decode-ahead thread's): what bounds in-process throughput on an otherwise idle core
        "main_thread_cpu_us_per_batch": (thread1 - thread0) / timed * 1e6,
        "worker_cpu_us_per_batch": sum(b - a for a, b in zip(cpu0, cpu1)) / timed * 1e6,
        "rss_peak_mib": {("main" if p == os.getpid() else f"worker{i}"): sampler.peak[p]
                         for i, p in enumerate([os.getpid(), *pids])},
        "load": load(),
    }))  # fmt: skip


# --in-process: the smoke test's mode (tests/benchmarks), every run in this process through the
# same _child arguments and JSON line, torch imported once; its figures are not comparable.
IN_PROCESS = False


def run_child(**kw) -> dict:
    argv = ["--dir", str(BENCH), "_child"]
    for key, value in kw.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    if IN_PROCESS:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            child(parser().parse_args(argv))
        return json.loads(out.getvalue().strip().splitlines()[-1])
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                         cwd=ROOT)  # fmt: skip
    if out.returncode:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- reports ----------------------------------------------------------------------------------


LABELS = {
    "lean": "shardtok stream, zstd shards, `ShardLoader`",
    "zstd": "shardtok stream, zstd shards, `DataLoader`",
    "memmap": "shardtok memmap path (GPTSamples), `DataLoader`",
    "memlean": "shardtok memmap path (GPTSamples), `ShardLoader`",
    "plain": "reference: plain memmap windows, default collate",
    "idle": "DataLoader floor: workers hand over ready slots, build nothing",
}


def kinds(text: str) -> list[str]:
    """--kinds, checked before any run: an unknown kind used to fall through to the plain windows
    loader in the child and only fail at the report, after every measurement."""
    # "window" is what RESULTS.md calls the plain memmap window reference
    chosen = ["plain" if k == "window" else k for k in text.split(",")]
    unknown = [k for k in chosen if k not in LABELS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown kind {', '.join(map(repr, unknown))}; kinds: {', '.join(LABELS)} "
            "(the plain memmap window reference is 'plain')"
        )
    return chosen


KINDS_HELP = "comma-separated loaders: " + "; ".join(f"{k}: {v}" for k, v in LABELS.items())


def capacity(r: dict) -> float:
    """M tokens/s the measured CPU per batch allows with two cores to ourselves (main + workers
    share them; in process, the main thread on one core and the decode-ahead thread on the
    other). Contention inflates the CPU figures, so this is low."""
    cpu = r["main_cpu_us_per_batch"] + r["worker_cpu_us_per_batch"]
    if r["workers"] == 0:
        us = max(r["main_thread_cpu_us_per_batch"], cpu / 2)
    else:
        us = cpu / 2
    return 1e6 / us * BATCH * SEQ_LEN / 1e6


def throughput(args) -> None:
    rows = []
    kinds = args.kinds
    for rep in range(args.repeat):
        for kind in kinds:
            for workers in args.workers:
                method = {"start_method": args.start_method} if args.start_method else {}
                r = run_child(kind=kind, workers=workers, batches=args.batches,
                              prefetch=args.prefetch, shuffle_buffer=args.shuffle_buffer,
                              data="zstd", labels_format=args.labels_format,
                              **method)  # fmt: skip
                rows.append(r)
                print(f"[{rep}] {kind:7s} workers={workers}: {r['tokens_per_s'] / 1e6:6.1f} M tok/s, "
                      f"first batch {r['first_batch_s']:.3f} s, main {r['main_cpu_us_per_batch']:.0f} us/b "
                      f"(main thread {r['main_thread_cpu_us_per_batch']:.0f}), "
                      f"workers {r['worker_cpu_us_per_batch']:.0f} us/b, load {r['load']}", flush=True)  # fmt: skip
    print("\n| loader | workers | M tokens/s (best of runs) | median | first batch (s) | "
          "main CPU µs/batch (main thread) | worker CPU µs/batch | CPU-bound M tokens/s on 2 free cores | "
          "load avg (1/5/15 min) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for workers in args.workers:
            mine = [r for r in rows if r["kind"] == kind and r["workers"] == workers]
            speeds = sorted(r["tokens_per_s"] / 1e6 for r in mine)
            best = max(mine, key=lambda r: r["tokens_per_s"])
            print(f"| {LABELS[kind]} | {workers} | {speeds[-1]:.1f} | {speeds[len(speeds) // 2]:.1f} | "
                  f"{max(r['first_batch_s'] for r in mine):.3f} (worst) | {best['main_cpu_us_per_batch']:.0f} "
                  f"({best['main_thread_cpu_us_per_batch']:.0f}) | "
                  f"{best['worker_cpu_us_per_batch']:.0f} | {capacity(best):.0f} | {best['load']} |")  # fmt: skip


def masks(args) -> None:
    """The same tokens with and without loss masks, same loader and packing, alternating runs
    (issue 14's target: masked at least 85% of unmasked tokens/s)."""
    rows = []
    for rep in range(args.repeat):
        for kind in args.kinds:
            for packing in args.packings if kind == "lean" else ["-"]:
                for data in ("zstd", "zstd-masked"):
                    # overlong: split for both, so both pack the very same tokens (masked data
                    # would truncate long documents by default and read more per batch)
                    r = run_child(kind=kind, data=data, workers=args.workers, batches=args.batches,
                                  labels_format=args.labels_format, overlong="split",
                                  **({"packing": packing} if packing != "-" else {}))  # fmt: skip
                    r["packing"] = packing
                    rows.append(r)
                    print(f"[{rep}] {kind} {packing:6s} {data:11s}: {r['tokens_per_s'] / 1e6:6.1f} M tok/s, "
                          f"workers {r['worker_cpu_us_per_batch']:.0f} us/b, load {r['load']}", flush=True)  # fmt: skip
    # Each masked run directly follows its unmasked twin, so the load on the shared cores is
    # alike within a pair: the median of the pairs' ratios is the figure, not a ratio of medians.
    # In process the main thread is what bounds throughput (the decode-ahead thread runs on the
    # other core): its CPU is the figure that load on the shared cores moves least.
    cpu_name = "worker CPU" if args.workers else "main thread CPU"
    print("\n| loader | packing | unmasked: M tokens/s, median (runs) | masked: median (runs) | "
          f"masked / unmasked: median of pairs (range) | {cpu_name} µs/batch unmasked / masked "
          "(ratio) |\n|---|---|---|---|---|---|")  # fmt: skip
    for kind in args.kinds:
        for packing in args.packings if kind == "lean" else ["-"]:
            mine = [r for r in rows if (r["kind"], r["packing"]) == (kind, packing)]
            plain = [r for r in mine if r["data"] == "zstd"]
            masked = [r for r in mine if r["data"] == "zstd-masked"]
            ratios = sorted(m["tokens_per_s"] / p["tokens_per_s"] for p, m in zip(plain, masked))
            cells = []
            for runs in (plain, masked):
                speeds = sorted(r["tokens_per_s"] / 1e6 for r in runs)
                key = "worker_cpu_us_per_batch" if args.workers else "main_thread_cpu_us_per_batch"
                cpu = sorted(r[key] for r in runs)
                text = ", ".join(f"{x:.1f}" for x in speeds)
                cells.append((f"{speeds[len(speeds) // 2]:.1f} ({text})", cpu[len(cpu) // 2]))
            print(f"| {LABELS[kind]}, {args.workers} workers | {packing} | {cells[0][0]} | "
                  f"{cells[1][0]} | {100 * ratios[len(ratios) // 2]:.1f}% "
                  f"({100 * ratios[0]:.0f}-{100 * ratios[-1]:.0f}%) | "
                  f"{cells[0][1]:.0f} / {cells[1][1]:.0f} ({100 * cells[0][1] / cells[1][1]:.0f}%) |")  # fmt: skip


def stages(args) -> None:
    """CPU time per batch of each stage, measured in process (cumulative: each row adds one)."""
    import numpy as np

    from shardtok.format import ShardStreamReader, load_manifest
    from shardtok.stream.batch import allocate_arrays
    from shardtok.stream.nodes.base import take
    from shardtok.stream.options import StreamOptions
    from shardtok.stream.slice_stream import SliceStream

    data = BENCH / "zstd"
    manifest = load_manifest(data)
    batches = args.batches
    tokens_needed = batches * BATCH * (SEQ_LEN + 1)

    def cpu(fn, repeat=3):
        """Best of `repeat`: (process CPU, main thread CPU) per batch, µs. They differ by the
        decode-ahead thread's share: in process the main thread is what bounds throughput."""
        best = (float("inf"), float("inf"))
        for _ in range(repeat):
            c0, t0 = time.process_time(), time.thread_time()
            fn()
            best = min(best, (time.process_time() - c0, time.thread_time() - t0))
        return tuple(x / batches * 1e6 for x in best)

    def decode():
        with open(data / manifest.shards[0].file, "rb") as f:
            r = ShardStreamReader(f, "bench")
            got = 0
            for doc in r.documents():
                got += len(doc)
                if got >= tokens_needed:
                    break

    pre = allocate_arrays(BATCH, SEQ_LEN)

    def pipeline(**options):
        def fn():
            stream = SliceStream(data, StreamOptions(seq_len=SEQ_LEN, batch_size=BATCH, **options),
                                 allocate=lambda b, s: pre)  # fmt: skip
            take(stream, batches)

        return fn

    def memmap_batches():
        from shardtok.torch.memmap_dataset import MemmapTokenDataset

        ds = MemmapTokenDataset(BENCH / "plain", seq_len=SEQ_LEN, num_samples=batches * BATCH,
                                seed=1234, cache_dir=BENCH / "index-cache",
                                shared_memory=False)  # fmt: skip
        order = np.random.default_rng(0).permutation(len(ds))[: batches * BATCH].tolist()

        def fn():
            for b in range(batches):
                ds.collate(ds.__getitems__(order[b * BATCH : (b + 1) * BATCH]))

        return fn

    rows = [
        ("read + zstd-decode (the format's streaming checks)", cpu(decode)),
        ("+ concat packing + batch build (no shuffle)", cpu(pipeline(shuffle_buffer=0))),
        ("+ shuffle buffer 4096 (the default pipeline)", cpu(pipeline())),
        ("greedy packing (lookahead 8), shuffle 4096", cpu(pipeline(packing="greedy"))),
        ("memmap path: gather 8 shuffled GPT samples + batch build", cpu(memmap_batches())),
    ]
    print(f"\nCPU per 8 x 2048 batch, in process, best of 3 (load {load()}):\n")
    print("| stage | µs per batch, process | of which the main thread |\n|---|---|---|")
    for name, (process, main) in rows:
        print(f"| {name} | {process:.0f} | {main:.0f} |")


def memory(args) -> None:
    """Peak worker RSS streaming the 0.2 GB dataset and a >= big_gb GB one (its documents
    written again and again)."""
    from shardtok.format import load_manifest

    small = load_manifest(BENCH / "zstd")
    big_dir = BENCH / "big"
    copies = int(-(-args.big_gb * 1e9 // small.num_bytes))
    if not (big_dir / "index.json").exists():
        # The small dataset's documents written `copies` times by the writer, not shard files
        # copied under new names: a shard's name is part of its identity, checked on read.
        from shardtok.format import DatasetWriter, ShardReader

        with DatasetWriter(big_dir, vocab_size=small.vocab_size, tokenizer=small.tokenizer,
                           dtype=small.dtype) as writer:  # fmt: skip
            for _ in range(copies):
                for e in small.shards:
                    for doc in ShardReader(BENCH / "zstd" / e.file).documents():
                        writer.add(doc)
    big = load_manifest(big_dir)
    print(f"small: {small.num_bytes / 1e9:.2f} GB, {small.num_tokens:,} tokens, {len(small.shards)} shards; "
          f"big: {big.num_bytes / 1e9:.2f} GB, {big.num_tokens:,} tokens, {len(big.shards)} shards")  # fmt: skip
    print("\n| dataset | shuffle buffer | worker | batches | peak RSS: VmRSS / anon / file / shmem (MiB) | load |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    runs = [("idle", "zstd", 0, 2000)]
    for kind in args.kinds:
        for shuffle in (0, args.shuffle_buffer):
            runs += [
                (kind, "zstd", shuffle, args.batches_small),
                (kind, "big", shuffle, args.batches_big),
            ]
    for kind, data, shuffle, batches in runs:
        r = run_child(kind=kind, data=data, workers=2, batches=batches, prefetch=4,
                      shuffle_buffer=shuffle)  # fmt: skip
        m = small if data == "zstd" else big
        label = ("baseline: a torch worker streaming nothing" if kind == "idle" else
                 f"{LABELS[kind]}: {m.num_bytes / 1e9:.2f} GB on disk, {m.num_tokens / 1e9:.2f} B tokens")  # fmt: skip
        for name, peak in r["rss_peak_mib"].items():
            if name.startswith("worker"):
                print(f"| {label} | {shuffle if kind != 'idle' else '-'} | {name} | {r['batches']} | "
                      f"{peak.get('VmRSS')} / {peak.get('RssAnon')} / {peak.get('RssFile')} / "
                      f"{peak.get('RssShmem')} | {r['load']} |")  # fmt: skip
    if not args.keep:
        shutil.rmtree(big_dir)
        print(f"\n(deleted {big_dir})")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir", type=Path, default=BENCH, help=f"where the data lives (default {BENCH})"
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every measurement in this process (the smoke test's mode; figures not comparable)",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--tokens", type=float, default=52.5e6)
    p.add_argument("--masked", action="store_true", help="also write the masked copies")
    p = sub.add_parser("masks")
    p.add_argument("--kinds", type=kinds, default="lean", help="lean and/or memlean")
    p.add_argument("--packings", nargs="+", default=["concat", "greedy"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=2500)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--labels-format", choices=["shifted", "hf"], default="shifted")
    p = sub.add_parser("throughput")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--kinds", type=kinds, default="lean,memlean,zstd,memmap,plain", help=KINDS_HELP)
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--shuffle-buffer", type=int, default=4096)
    p.add_argument("--labels-format", choices=["shifted", "hf"], default="shifted")
    p.add_argument("--start-method", choices=["fork", "forkserver", "spawn"],
                   help="ShardLoader's multiprocessing start method (lean, memlean)")  # fmt: skip
    p = sub.add_parser("stages")
    p.add_argument("--batches", type=int, default=1500)
    p = sub.add_parser("memory")
    p.add_argument("--big-gb", type=float, default=5.0)
    p.add_argument(
        "--kinds", type=kinds, default="lean,zstd", help="loaders to measure: lean, zstd"
    )
    p.add_argument("--batches-small", type=int, default=3000)
    p.add_argument("--batches-big", type=int, default=12000)
    p.add_argument("--shuffle-buffer", type=int, default=4096)
    p.add_argument("--keep", action="store_true")
    p = sub.add_parser("_child")
    p.add_argument("--kind", required=True)
    p.add_argument("--data", default="zstd")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--shuffle-buffer", type=int, default=4096)
    p.add_argument("--start-method", default=None)
    p.add_argument("--labels-format", default="shifted")
    p.add_argument("--packing", default=None)
    p.add_argument("--overlong", default=None)
    return parser


def main() -> None:
    global BENCH, IN_PROCESS
    args = parser().parse_args()
    BENCH, IN_PROCESS = args.dir, args.in_process
    {"prepare": prepare, "throughput": throughput, "stages": stages, "memory": memory,
     "masks": masks, "_child": child}[args.cmd](args)  # fmt: skip


if __name__ == "__main__":
    main()
