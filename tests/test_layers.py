"""Everything except shardtok.torch imports with torch unavailable, and without transformers."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys
sys.modules["torch"] = None          # any `import torch` now raises ImportError
sys.modules["transformers"] = None   # importing must not pull transformers either (it costs ~1 s)
import shardtok
names = sorted(m.name for m in pkgutil.walk_packages(shardtok.__path__, "shardtok."))
core = [n for n in names if not n.startswith("shardtok.torch") and not n.endswith("__main__")]
for name in core:
    importlib.import_module(name)
print(len(core))
"""


def test_core_imports_without_torch():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 10


def test_cli_help_needs_no_torch():
    code = (
        'import sys; sys.modules["torch"] = None; from shardtok.cli import main; main(["--help"])'
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "shardtok convert" in result.stdout


def test_errors_survive_pickling():
    # DataLoader workers send exceptions to the main process by pickling them.
    import pickle

    from shardtok.errors import BadRecordError, CorruptShardError, StorageError
    from shardtok.storage import ObjectNotFoundError

    for error in (
        CorruptShardError("s.tar", "s.bin.zst", 1024, "frame 3 fails its crc32 check"),
        BadRecordError("in.jsonl", 7, "invalid JSON"),
        StorageError("s3://bucket/s.tar", 4096, "retries exhausted"),
        ObjectNotFoundError("s3://bucket/missing.tar", None, "no such object"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
