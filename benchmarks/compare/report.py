"""compare.md from compare.json: medians over repetitions and ratios to shardtok's streaming loader."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

BASELINE = "shardtok_stream"
MB = 1e6


def read_cells(results: dict) -> dict[tuple[str, str, int], list[dict]]:
    cells: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        if job["kind"] == "read" and result["ok"]:
            workers = job["read_options"]["num_workers"]
            cells[(job["dataset"], job["system"], workers)].append({**result, **entry["memory"]})
    return cells


def median_of(cells, dataset: str, system: str, workers: int, key: str) -> float | None:
    values = [r[key] for r in cells.get((dataset, system, workers), []) if key in r]
    return statistics.median(values) if values else None


def system_labels(results: dict) -> dict[str, dict]:
    labels: dict[str, dict] = {}
    for entry in results["entries"]:
        if entry.get("label"):
            labels.setdefault(entry["job"]["system"], entry["label"])
    return labels


def _writes(results: dict) -> dict[tuple[str, str], list[dict]]:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        if job["kind"] == "write" and result["ok"]:
            cells[(job["dataset"], job["system"])].append(result)
    return cells


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def headline(results: dict) -> list[str]:
    """The README table: one row per system, tokens/s on every dataset at 0 and the most workers,
    then the costs (CPU per token, first batch, memory, disk) on the first dataset, most workers."""
    cells, writes, labels = read_cells(results), _writes(results), system_labels(results)
    datasets = list(results["datasets"])
    most = max(results["plan"]["workers"])
    columns = [(d, w) for d in datasets for w in sorted({min(results["plan"]["workers"]), most})]
    first = datasets[0]
    rows = []
    for system in results["systems"]:
        row = [labels.get(system, {}).get("label", system)]
        for dataset, workers in columns:
            tps = median_of(cells, dataset, system, workers, "tokens_per_s")
            base = median_of(cells, dataset, BASELINE, workers, "tokens_per_s")
            row.append(f"{tps / MB:.1f} M{_ratio(tps, base)}" if tps else "failed")
        cpu = median_of(cells, first, system, most, "cpu_s_per_m_tokens")
        base_cpu = median_of(cells, first, BASELINE, most, "cpu_s_per_m_tokens")
        ttfb = median_of(cells, first, system, most, "ttfb_s")
        rss = median_of(cells, first, system, most, "peak_rss")
        done = writes.get((first, system))
        row += [
            f"{cpu * 1000:.0f} ms{_ratio(cpu, base_cpu)}" if cpu else "",
            f"{ttfb:.2f} s" if ttfb is not None else "",
            f"{rss / MB:,.0f} MB" if rss else "",
            f"{statistics.median(w['bytes_per_token'] for w in done):.2f}" if done else "",
        ]
        rows.append(row)
    header = ["system"]
    header += [f"{d}, {w} workers: tokens/s (vs shardtok)" for d, w in columns]
    header += [
        f"CPU per M tokens ({first}, {most} workers)",
        "first batch",
        "peak RSS (tree)",
        "bytes/token on disk",
    ]
    return _table(header, rows)


def targets(results: dict) -> list[str]:
    """Issue 18's ratios, each side by side in this run: shardtok stream against LitData and the
    one-core decompress + memcpy ceiling, shardtok memmap against the numpy memmap loader."""
    cells = read_cells(results)
    rows = []
    for dataset in results["datasets"]:

        def tps(system: str, workers: int, dataset: str = dataset) -> float | None:
            return median_of(cells, dataset, system, workers, "tokens_per_s")

        ceiling = next(
            (
                e["result"]["decompress_memcpy_tokens_per_s"]
                for e in results["entries"]
                if e["job"]["kind"] == "ceiling"
                and e["job"]["dataset"] == dataset
                and e["result"]["ok"]
            ),
            None,
        )
        pairs = [
            ("stream / LitData, 0 workers", tps(BASELINE, 0), tps("litdata_tokens", 0), 1.0),
            (
                "memmap / numpy memmap, 0 workers",
                tps("shardtok_memmap", 0),
                tps("numpy_memmap", 0),
                1.0,
            ),
            ("stream, 0 workers / decompress + memcpy ceiling", tps(BASELINE, 0), ceiling, 0.6),
            ("stream / LitData, 2 workers", tps(BASELINE, 2), tps("litdata_tokens", 2), 5.0),
        ]
        for what, a, b, goal in pairs:
            if a and b:
                status = "met" if a / b >= goal else "not met"
                rows.append(
                    [
                        dataset,
                        what,
                        f"{a / MB:.1f} M / {b / MB:.1f} M",
                        f"{a / b:.2f}",
                        f">= {goal:g}",
                        status,
                    ]
                )
    return _table(["dataset", "ratio", "tokens/s", "measured", "target", ""], rows) if rows else []


def _per_workers(results, cells, dataset, key, fmt, ratio: bool) -> list[str]:
    workers = results["plan"]["workers"]
    labels = system_labels(results)
    rows = []
    for system in results["systems"]:
        row = [labels.get(system, {}).get("label", system)]
        for w in workers:
            value = median_of(cells, dataset, system, w, key)
            base = median_of(cells, dataset, BASELINE, w, key) if ratio else None
            row.append(fmt(value) + _ratio(value, base) if value is not None else "failed")
        rows.append(row)
    return _table(["system", *[f"{w} workers" for w in workers]], rows)


def write_report(results: dict, path: Path) -> None:
    cells, writes, labels = read_cells(results), _writes(results), system_labels(results)
    plan, m = results["plan"], results["machine"]
    lines = [
        "# shardtok against WebDataset, MosaicML Streaming, LitData, Megatron and a numpy memmap loader",
        "",
    ]
    if results["mode"] == "smoke":
        lines += ["**Smoke run: tiny data, one repetition, several jobs per process. These numbers", "only show that the harness works; they measure nothing.**", ""]  # fmt: skip
    lines += [
        f"- command: `{results['command']}`",
        f"- run: {results['started']} to {results['finished']} (UTC); load average (1, 5, 15 min) "
        f"at start {_load(results['load_average_start'])}, at end {_load(results['load_average_end'])}",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_bytes'] / 2**30:.0f} GiB RAM, "
        f"Linux {m['kernel']}, Python {m['python']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        f"- batches: {results['read_options']['batch_size']} x {results['read_options']['seq_len']} "
        "int64 input ids, labels and position ids, what a training step takes (windows of seq_len + 1 "
        f"tokens, concat packing; a peer's `.long()` and positions are done in the timed loop); "
        f"{plan['warmup_batches']} "
        f"warm-up batches not timed, then a fixed budget of at most {plan['budget_tokens']:,} "
        f"tokens timed (less where 60% of an epoch is less); {plan['reps']} repetition(s), system "
        f"order rotated per repetition, {_processes(plan)}; figures are medians, ratios are to "
        "shardtok stream; data in the page cache (written just before)",
        "",
        "## Data",
        "",
    ]
    for name, source in results["datasets"].items():
        lines.append(f"- **{name}**: {source['description']}")
    lines += ["", "## Systems", ""]
    lines += _table(
        ["system", "format and reader"],
        [[labels.get(s, {}).get("label", s), labels.get(s, {}).get("layout", "")] for s in results["systems"]],
    )  # fmt: skip
    for dataset in results["datasets"]:
        lines += [f"## {dataset}: throughput (M tokens/s; ratio to shardtok stream)", ""]
        lines += _per_workers(
            results, cells, dataset, "tokens_per_s", lambda v: f"{v / MB:.1f}", True
        )
        ceiling = _ceiling(results, dataset)
        if ceiling:
            lines += [ceiling, ""]
        lines += [_load_during(results, dataset), ""]
        lines += [
            f"## {dataset}: CPU time per million tokens, all processes (ms; ratio to shardtok stream)",
            "",
            "User + system CPU of the benchmark process and its workers during the timed window.",
            "It moves much less than wall time with the load of other work: it is the cost of the",
            "loader itself. 1000 ms per million tokens = 1 M tokens/s per busy core.",
            "",
        ]
        lines += _per_workers(
            results, cells, dataset, "cpu_s_per_m_tokens", lambda v: f"{v * 1000:.0f}", True
        )
        lines += [f"## {dataset}: time to first batch (s)", ""]
        lines += _per_workers(results, cells, dataset, "ttfb_s", lambda v: f"{v:.2f}", False)
        lines += [f"## {dataset}: peak memory of the process tree, RSS / USS / anonymous (MB)", ""]
        lines += _memory(results, cells, dataset)
    lines += [
        "## Disk and write time",
        "",
        f"Bytes of the written format per token, and the time to write it from the source's "
        f".bin/.idx pair in a fresh process (median of {plan['write_reps']} writes).",
        "",
    ]
    lines += _disk(results, writes, labels)
    lines += ["## Checks", ""]
    lines += _checks(results)
    lines += ["## Headline", ""]
    lines += headline(results)
    if targets(results):
        lines += ["## Issue 18's ratios", ""]
        lines += targets(results)
    lines += ["## Plots", ""]
    for name, what in (("throughput", "tokens/s against workers"), ("cpu", "CPU per token"), ("memory", "peak memory")):  # fmt: skip
        lines += [f"![{what}](compare-{name}.png)", ""]
    path.write_text("\n".join(lines))


def _processes(plan: dict) -> str:
    if plan["one_process_per_job"]:
        return "each measurement in a fresh process"
    return "one process per system and phase (smoke: memory and first-batch figures mix jobs)"


def _load_during(results: dict, dataset: str) -> str:
    loads = [
        e["load1"] for e in results["entries"] if e["job"]["kind"] == "read" and e["job"]["dataset"] == dataset
    ]  # fmt: skip
    if not loads:
        return ""
    return (
        f"1-minute load average as each of these {len(loads)} measurements started: median "
        f"{statistics.median(loads):.2f}, min {min(loads):.2f}, max {max(loads):.2f} "
        f"({results['machine']['cores']} cores; the benchmark itself accounts for 1 to 2 of it, the "
        "rest is other work on the machine)."
    )


def _load(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _ceiling(results: dict, dataset: str) -> str:
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        if job["kind"] == "ceiling" and job["dataset"] == dataset and result["ok"]:
            return (
                f"Ceiling, one core, the same compressed bytes shardtok reads: zstd decompression "
                f"{result['decompress_tokens_per_s'] / MB:.0f} M tokens/s; plus one memcpy "
                f"{result['decompress_memcpy_tokens_per_s'] / MB:.0f} M/s; plus widening to int64 "
                f"instead {result['decompress_int64_tokens_per_s'] / MB:.0f} M/s "
                f"(compression ratio {result['uncompressed_bytes'] / result['compressed_bytes']:.2f})."
            )
    return ""


def _memory(results, cells, dataset) -> list[str]:
    labels = system_labels(results)
    workers = results["plan"]["workers"]
    rows = []
    for system in results["systems"]:
        row = [labels.get(system, {}).get("label", system)]
        for w in workers:
            keys = ("peak_rss", "peak_uss", "peak_anon")
            values = [v for k in keys if (v := median_of(cells, dataset, system, w, k)) is not None]
            row.append(" / ".join(f"{v / MB:,.0f}" for v in values) if len(values) == 3 else "failed")  # fmt: skip
        rows.append(row)
    return _table(["system", *[f"{w} workers" for w in workers]], rows)


def _disk(results, writes, labels) -> list[str]:
    rows = []
    for system in results["systems"]:
        row = [labels.get(system, {}).get("label", system)]
        for dataset in results["datasets"]:
            done = writes.get((dataset, system))
            if not done:
                row += ["failed", "failed"]
                continue
            row.append(f"{statistics.median(w['bytes_per_token'] for w in done):.3f}")
            seconds = statistics.median(w["write_s"] for w in done)
            speed = statistics.median(w["write_tokens_per_s"] for w in done)
            row.append(f"{seconds:.1f} s ({speed / MB:.1f} M tokens/s)")
        rows.append(row)
    header = ["system"]
    for dataset in results["datasets"]:
        header += [f"{dataset}: bytes/token", f"{dataset}: write time"]
    return _table(header, rows)


def _checks(results: dict) -> list[str]:
    lines = []
    total = failed = documents = 0
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        if job["kind"] not in ("read", "write", "ceiling"):
            continue
        total += 1
        if not result["ok"]:
            failed += 1
            lines.append(f"- FAILED {job['kind']} {job.get('system', '')} {job.get('dataset', '')}: `{result['error'].strip().splitlines()[-1]}`")  # fmt: skip
        elif "checks" in result:
            documents += result["checks"]["whole_documents"]
            if not result["checks"]["ok"]:
                failed += 1
                lines.append(
                    f"- WRONG BATCHES {job['system']} {job['dataset']}: {result['checks']}"
                )
    summary = (
        f"{total - failed} of {total} jobs passed. Every read job's first batches were checked against "
        f"the source: shape and dtype, ids within the vocabulary and never more frequent than in the "
        f"data, and every document lying whole inside a window ({documents:,} in all) equal to a source "
        "document."
    )
    return [summary, "", *lines, ""]
