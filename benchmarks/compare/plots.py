"""PNG plots from compare.json (runs in the peers' venv, which has matplotlib)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.compare.report import MB, median_of, read_cells, system_labels  # noqa: E402


def _ceiling(results: dict, dataset: str) -> float | None:
    for entry in results["entries"]:
        job, result = entry["job"], entry["result"]
        if job["kind"] == "ceiling" and job["dataset"] == dataset and result["ok"]:
            return result["decompress_memcpy_tokens_per_s"]
    return None


def _style(system: str) -> dict:
    if system.startswith("shardtok"):
        return {"linewidth": 2.6, "linestyle": "-" if system.endswith("stream") else "--"}
    return {"linewidth": 1.4}


def throughput(results: dict, path: Path) -> None:
    cells, labels = read_cells(results), system_labels(results)
    workers = results["plan"]["workers"]
    datasets = list(results["datasets"])
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 4), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for system in results["systems"]:
            ys = [y for w in workers if (y := median_of(cells, dataset, system, w, "tokens_per_s"))]
            if len(ys) != len(workers):
                continue
            label = labels.get(system, {}).get("label", system)
            ax.plot(workers, [y / MB for y in ys], marker="o", label=label, **_style(system))
        ceiling = _ceiling(results, dataset)
        if ceiling:
            ax.axhline(ceiling / MB, color="grey", linestyle=":", linewidth=1)
            ax.annotate("zstd + memcpy, 1 core", (workers[0], ceiling / MB), fontsize=7,
                        color="grey", va="bottom")  # fmt: skip
        ax.set_title(f"{dataset}: packed int64 batches 8 x 2048")
        ax.set_xlabel("DataLoader workers")
        ax.set_ylabel("M tokens/s (median)")
        ax.set_xticks(workers)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _grouped_bars(results: dict, path: Path, title: str, ylabel: str, draw) -> None:
    """One panel per dataset, one bar group per worker count, one bar per system.

    `draw(ax, xs, width, cells, dataset, system, label)` draws one system's bars at `xs`.
    """
    cells, labels = read_cells(results), system_labels(results)
    workers = results["plan"]["workers"]
    datasets = list(results["datasets"])
    systems = results["systems"]
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.2 * len(datasets), 4), squeeze=False)
    width = 0.8 / max(1, len(systems))
    for ax, dataset in zip(axes[0], datasets):
        for i, system in enumerate(systems):
            xs = [w - 0.4 + width * (i + 0.5) for w in workers]
            label = labels.get(system, {}).get("label", system)
            draw(ax, xs, width, cells, dataset, system, label)
        ax.set_title(title.format(dataset=dataset))
        ax.set_xlabel("DataLoader workers")
        ax.set_ylabel(ylabel)
        ax.set_xticks(workers)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def memory(results: dict, path: Path) -> None:
    workers = results["plan"]["workers"]

    def draw(ax, xs, width, cells, dataset, system, label) -> None:
        rss = [median_of(cells, dataset, system, w, "peak_rss") or 0 for w in workers]
        uss = [median_of(cells, dataset, system, w, "peak_uss") or 0 for w in workers]
        bars = ax.bar(xs, [v / MB for v in rss], width, label=label, alpha=0.45)
        ax.bar(xs, [v / MB for v in uss], width, color=bars.patches[0].get_facecolor(), alpha=1.0)

    _grouped_bars(
        results, path, "{dataset}: peak RSS (light) and USS (dark), process tree", "MB", draw
    )


def cpu(results: dict, path: Path) -> None:
    """CPU cost per token: the view of throughput that the machine's load barely moves."""
    workers = results["plan"]["workers"]

    def draw(ax, xs, width, cells, dataset, system, label) -> None:
        ms = [(median_of(cells, dataset, system, w, "cpu_s_per_m_tokens") or 0) * 1000 for w in workers]  # fmt: skip
        ax.bar(xs, ms, width, label=label)

    _grouped_bars(
        results, path, "{dataset}: CPU ms per million tokens (all processes)",
        "ms of CPU per M tokens (lower is better)", draw,
    )  # fmt: skip


def make_plots(results_path: Path, out: Path) -> list[str]:
    results = json.loads(Path(results_path).read_text())
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "compare-throughput.png", out / "compare-memory.png", out / "compare-cpu.png"]
    throughput(results, files[0])
    memory(results, files[1])
    cpu(results, files[2])
    return [str(f) for f in files]
