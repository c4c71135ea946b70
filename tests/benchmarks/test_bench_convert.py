"""benchmarks/bench_convert.py on a 1 MB corpus with the bundled tokenizer (which passes the
tiktoken gate), so the script does not rot. No figure is asserted: only that every quick
contender ran and the summary states target 5's ratios."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_convert_benchmark_runs_its_quick_contenders(tmp_path):
    tokenizer = REPO / "shardtok" / "assets" / "tokenizer"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_convert.py"), "--quick",
           "--corpus-mb", "1", "--repeats", "1", "--workers", "1", "2",
           "--tokenizer-dir", str(tokenizer), "--work", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for name in ("ceiling tiktoken", "ceiling tiktoken lists", "ceiling x2",
                 "shardtok convert w=1", "shardtok convert w=2"):  # fmt: skip
        assert re.search(rf"^{re.escape(name)} +[\d,]+ tokens/s", out, re.M), name
    assert "megatron" not in out and "backend=hf" not in out
    assert re.search(r"target 5 at w=1: convert per worker = [\d.]+% of the tiktoken ceiling", out)
    assert re.search(r"target 5 at w=2: .*CPU per token", out)
    assert (tmp_path / "corpus-1mb.jsonl").exists() and (tmp_path / "out" / "s").is_dir()
