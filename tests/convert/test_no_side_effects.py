"""shardtok leaves the process it runs in as it found it: no environment variable written, no
thread pool started by encoding in the caller's process.

Checked in a fresh interpreter: the test process has imported shardtok, transformers and
tokenizers long before this test runs, so only a new process shows what an import does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import ctypes, json, os, sys
from pathlib import Path

# What libc sees too: Rust's std::env::set_var bypasses os.environ.
NAMES = ("TOKENIZERS_PARALLELISM", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "RAYON_NUM_THREADS",
         "SHARDTOK_CACHE_DIR", "OMP_NUM_THREADS")
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p

def snapshot():
    return {"py": dict(os.environ), "c": {n: libc.getenv(n.encode()) and libc.getenv(n.encode()).decode() for n in NAMES}}

def threads():
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None

work = Path(sys.argv[1])
before = snapshot()
import shardtok  # noqa: F401
from shardtok.convert import ConvertJob, RunOptions, convert, load_tokenizer
from shardtok.convert.tokenizing.encoder import BatchEncoder

after_import = snapshot()
spec = load_tokenizer("bundled")
threads_before = threads()  # after the imports: numpy's BLAS starts its own
tokens, sizes = BatchEncoder(spec).encode(["hello world", "one more document"])
threads_after_encode = threads()
corpus = work / "corpus.jsonl"
corpus.write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(200)))
result = convert(ConvertJob(inputs=(str(corpus),), output=str(work / "out"), tokenizer=spec),
                 RunOptions(workers=2, progress=False))
print(json.dumps({
    "import": after_import == before,
    "end": snapshot() == before,
    "diff": sorted(set(snapshot()["py"].items()) ^ set(before["py"].items())),
    "c": snapshot()["c"],
    "threads": [threads_before, threads_after_encode],
    "tokens": result.manifest.num_tokens,
}))
"""


def test_import_load_encode_and_convert_leave_the_environment_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.pop("TOKENIZERS_PARALLELISM", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # A fork after tokenizers' pool was used would print its "Disabling parallelism" warning.
    assert "huggingface/tokenizers" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["import"] and report["end"], report["diff"]
    assert all(v is None for v in report["c"].values()), report["c"]
    assert report["tokens"] > 0
    if report["threads"][0] is None:
        pytest.skip("no /proc/self/task to count threads")
    assert report["threads"][1] == report["threads"][0], "encoding started threads"
