"""Rebuild benchmarks/RESULTS.md from the per-area results in benchmarks/results/.

    python tools/assemble_results.py

The summary table at the top is maintained by hand in benchmarks/results/summary.md; each
benchmark script writes (or its author updates) its own section file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SECTIONS = [
    "convert", "parquet_ranges", "distributed", "stream", "webdataset", "trace", "s3",
    "job_start", "compare"
]  # fmt: skip


def nest(text: str) -> str:
    """Push every heading one level down so each section sits under RESULTS.md's title."""
    return "\n".join("#" + line if line.startswith("#") else line for line in text.splitlines())


def main() -> None:
    parts = [(RESULTS / "summary.md").read_text().rstrip() + "\n"]
    for name in SECTIONS:
        text = nest((RESULTS / f"{name}.md").read_text()).strip()
        # section files link their plots beside them; RESULTS.md sits one folder up
        parts.append(re.sub(r"\]\(([\w.-]+\.png)\)", r"](results/\1)", text) + "\n")
    (ROOT / "benchmarks" / "RESULTS.md").write_text("\n\n".join(parts))


if __name__ == "__main__":
    main()
