"""Benchmark `shardtok convert` on a Parquet file of one large row group against the same rows as
JSONL (and as an Arrow IPC stream, as datasets' save_to_disk writes it).

    python benchmarks/bench_parquet_ranges.py                    # .bench/corpus-32mb.jsonl, 3 repeats
    python benchmarks/bench_parquet_ranges.py --tree before=/tmp/base   # also another checkout

Before row ranges, a row group was one work unit, so a file written by `pq.write_table` (one
row group up to 1M rows) was tokenized by one worker while the others idled. Now a row group
larger than a unit is cut into row ranges. Each contender is the CLI (`python -m shardtok
convert INPUT -o OUT --workers N --tokenizer T`; T: each --tokenizer, by default the bundled
one (the `hf` backend) and Llama 3's from .bench/llama3 (tiktoken) when bench_convert.py
fetched it), run as a subprocess from this checkout or
from each `--tree NAME=PATH` (a checkout of other code, e.g. `git archive <commit> | tar -x -C
/tmp/base`; a tree that cannot read .arrow inputs is not given them); every repeat runs every
contender once, interleaved, so machine noise spreads over all of them. Figures: best and median wall seconds, and CPU seconds (user + system
of the command and its workers) of the best run. Writes benchmarks/results/parquet_ranges.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / ".bench" / "corpus-32mb.jsonl"
LLAMA3 = ROOT / ".bench" / "llama3"  # fetched by benchmarks/bench_convert.py
RESULTS = ROOT / "benchmarks" / "results" / "parquet_ranges.md"


def make_inputs(corpus: Path, folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(corpus, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    table = pa.Table.from_pylist(rows)
    parquet = folder / "corpus.parquet"
    pq.write_table(table, parquet, row_group_size=len(rows))  # one row group, as pq's default
    assert pq.ParquetFile(parquet).metadata.num_row_groups == 1
    arrow = folder / "corpus.arrow"
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):  # datasets' writer batch size
            writer.write_batch(batch)
    return {"jsonl": corpus, "parquet (1 row group)": parquet, "arrow stream": arrow}


def run_once(
    tree: Path, source: Path, out: Path, workers: int, tokenizer: str
) -> tuple[float, float, str]:
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "shardtok", "convert", str(source), "-o", str(out),
         "--workers", str(workers), "--tokenizer", tokenizer],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"bench_parquet_ranges: {tree}: {proc.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    units = next((ln for ln in proc.stdout.splitlines() if "work units" in ln), "").strip()
    return wall, cpu, units


def reads_arrow(tree: Path) -> bool:
    return (tree / "shardtok" / "convert" / "arrow_ipc.py").exists() or (
        tree / "shardtok" / "convert" / "inputs" / "arrow_ipc.py"
    ).exists()


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tokenizer", action="append", help="repeatable (default: see above)")
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=PATH",
        help="another checkout to run too (repeatable)",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not args.corpus.exists():
        sys.exit(
            f"bench_parquet_ranges: {args.corpus} is missing (see benchmarks/bench_convert.py)"
        )
    tokenizers = args.tokenizer or ["bundled"] + (
        [str(LLAMA3)] if (LLAMA3 / "tokenizer.json").exists() else []
    )
    trees = [
        (name, Path(path).resolve()) for name, _, path in (t.partition("=") for t in args.tree)
    ]
    trees.append(("this tree", ROOT))
    with tempfile.TemporaryDirectory(prefix="bench-parquet-ranges-") as tmp:
        folder = Path(tmp)
        inputs = make_inputs(args.corpus, folder)
        contenders = [
            (tokenizer, tree_name, tree, input_name, path)
            for tokenizer in tokenizers
            for tree_name, tree in trees
            for input_name, path in inputs.items()
            if path.suffix != ".arrow" or reads_arrow(tree)
        ]
        runs: dict[tuple[str, str, str], list[tuple[float, float, str]]] = {}
        loads = [load_average()]
        for _ in range(args.repeats):
            for tokenizer, tree_name, tree, input_name, path in contenders:
                result = run_once(tree, path, folder / "out", args.workers, tokenizer)
                name = Path(tokenizer).name
                runs.setdefault((name, tree_name, input_name), []).append(result)
                print(f"{name} {tree_name:10s} {input_name:22s} {result[0]:6.2f} s  {result[2]}")
            loads.append(load_average())
        sizes = {name: path.stat().st_size for name, path in inputs.items()}
    lines = [
        "## Parquet row ranges (benchmarks/bench_parquet_ranges.py)",
        "",
        f"`python benchmarks/bench_parquet_ranges.py --repeats {args.repeats}"
        + "".join(f" --tree '{name}=...'" for name, _ in trees[:-1])
        + f"`: `shardtok convert INPUT -o OUT --workers {args.workers} --tokenizer T`, "
        f"{args.corpus.name} ({sizes['jsonl']:,} bytes) as JSONL, as a Parquet file of one row "
        f"group ({sizes['parquet (1 row group)']:,} bytes, snappy) and as an Arrow IPC stream of "
        f"1,000-row batches ({sizes['arrow stream']:,} bytes). Load average (1, 5, 15 min) "
        f"before and after each repeat: {'; '.join(loads)}.",
        "",
        "| tokenizer | code | input | best s | median s | CPU s (best run) | work units |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for (tokenizer, tree_name, input_name), results in runs.items():
        best = min(results)
        units = best[2].removeprefix("work units").strip().split(":")[0]
        lines.append(
            f"| {tokenizer} | {tree_name} | {input_name} | {best[0]:.2f} | "
            f"{statistics.median(r[0] for r in results):.2f} | {best[1]:.2f} | {units} |"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
