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
