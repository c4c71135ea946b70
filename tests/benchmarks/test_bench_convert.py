"""benchmarks/bench_convert.py on a 1 MB corpus with the bundled tokenizer (which passes the
tiktoken gate), so the script does not rot. No figure is asserted: only that every quick
contender ran and the summary states target 5's ratios: end to end, (--steady) at the margin,
and paired repeat by repeat."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_convert_benchmark_runs_its_quick_contenders(tmp_path):
    tokenizer = REPO / "shardtok" / "assets" / "tokenizer"
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_convert.py"), "--quick",
           "--corpus-mb", "1", "--repeats", "1", "--workers", "1", "2", "--steady", "2",
           "--tokenizer-dir", str(tokenizer), "--work", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for name in ("ceiling tiktoken", "ceiling encode", "ceiling tiktoken lists", "ceiling x2",
                 "shardtok convert w=1", "shardtok convert w=2", "ceiling tiktoken [corpus x2]",
                 "shardtok convert w=1 [corpus x2]", "shardtok convert w=2 [corpus x2]"):  # fmt: skip
        assert re.search(rf"^{re.escape(name)} +[\d,]+ tokens/s", out, re.M), name
    assert "megatron" not in out and "backend=hf" not in out
    assert re.search(
        r"target 5 at w=1: convert per worker = [\d.]+% of the tiktoken ceiling \(wall\), "
        r"[\d.]+% of the encode ceiling",
        out,
    )
    assert re.search(r"target 5 at w=2: .*CPU per token", out)
    for w in (1, 2):
        assert re.search(
            # The margin is a difference of two timings: on a busy machine it can come out
            # negative, which the smoke run (one repeat, 1 MB) must still print.
            rf"target 5 at w={w}, steady state: convert per worker = -?[\d.]+% of the tiktoken "
            r"ceiling \(-?[\d,]+ tokens/s at the margin\); fixed cost per job -?\d+ ms .*"
            r"on the corpus x2, whole runs: [\d.]+% of the ceiling on it$",
            out,
            re.M,
        ), w
    for w in (1, 2):  # one repeat: one pair, its own median and range
        for which in ("tiktoken", "encode"):
            pair = re.search(
                rf"^target 5 at w={w}, paired with the {which} ceiling: median ([\d.]+%) of 1 "
                r"\(range ([\d.]+%)-([\d.]+%)\): ([\d.]+%)$",
                out,
                re.M,
            )
            assert pair is not None and len(set(pair.groups())) == 1, (w, which)
    corpus = tmp_path / "corpus-1mb.jsonl"
    assert (tmp_path / "corpus-1mb-x2.jsonl").read_bytes() == corpus.read_bytes() * 2
    assert (tmp_path / "out" / "s").is_dir()


def test_the_paired_lower_bound_is_the_binomial_order_statistic():
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_convert import _lower_bound

    assert _lower_bound([0.9, 0.8, 1.0, 0.7]) is None  # 4 pairs: even the lowest is 94% sure
    assert _lower_bound([0.9, 0.8, 1.0, 0.7, 0.95]) == (0.7, 1)  # 5: the lowest, 97% sure
    # 12 pairs: 3 or more fall below the median with probability 1 - 79/4096 = 98.1%; 4 or
    # more with 92.7%, too little
    ratios = [0.93, 0.63, 1.07, 0.88, 0.91, 0.95, 0.86, 0.99, 0.97, 0.94, 0.9, 0.92]
    assert _lower_bound(ratios) == (0.88, 3)
    assert _lower_bound(ratios, confidence=0.9) == (0.9, 4)
