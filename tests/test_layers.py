"""Everything except shardtok.torch imports with torch unavailable, and without transformers; and
each layer of shardtok imports only the layers below it, with no import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "shardtok"

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


# --- layers: which part of shardtok may import which ----------------------------------------
#
# Read from the source with `ast`, so imports inside functions and under TYPE_CHECKING count as
# much as module-level ones: a deferred import is still a dependency, it only fails later.

# Layer -> the layers it may import (itself included). "Below" is the data path: format and index
# at the bottom, storage over format, dataset (shards and their manifest at a location) over
# storage, convert over format/index/storage, stream/memmap side by side over those and dataset, torch
# over all of them, cli on top. webdataset (stages for WebDataset pipelines, an optional extra)
# sits over format and storage, and no other layer imports it. testing (synthetic data, the
# save/restore checker) serves tests and benchmarks; nothing in the library may import it.
LAYER_RULES: dict[str, set[str]] = {
    "format": {"format"},
    "index": {"index"},
    "storage": {"storage", "format"},
    "dataset": {"dataset", "storage", "format"},
    "convert": {"convert", "format", "index", "storage"},
    "stream": {"stream", "dataset", "format", "index", "storage"},
    "memmap": {"memmap", "dataset", "format", "index", "storage"},
    "torch": {"torch", "convert", "stream", "memmap", "dataset", "format", "index", "storage"},
    "cli": {"cli", "torch", "convert", "stream", "memmap", "dataset", "format", "index", "storage"},
    "testing": {"testing", "stream", "dataset", "format", "index", "storage"},
    "webdataset": {"webdataset", "dataset", "format", "storage"},
}
# Top-level modules that are not layers: every layer may import them, and they import no layer.
SHARED = {"", "errors", "_process", "_checksum", "_threads", "_safe_yaml"}
# `python -m shardtok` is the command line.
ALIASES = {"__main__": "cli", "command": "cli"}  # the console script and python -m shardtok

_SHARED_LAYER = "(shared)"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    path: Path
    line: int
    target: str  # the imported module, dotted (a submodule when `from pkg import submodule`)


def module_name(root: Path, file: Path) -> str:
    parts = list(file.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def collect_imports(root: Path) -> tuple[set[str], list[Import]]:
    """Every module under the package folder `root`, and every import of that package in them
    (at any depth), with relative imports resolved."""
    files = sorted(root.rglob("*.py"))
    # A C extension (its source beside the Python modules) is a module that imports nothing.
    modules = {module_name(root, f) for f in [*files, *root.rglob("*.c")]}
    package = root.name
    found = []
    for file in files:
        name = module_name(root, file)
        is_package = file.name == "__init__.py"
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = name.split(".")
                    drop = node.level - 1 if is_package else node.level
                    base = ".".join(
                        anchor[: len(anchor) - drop] + ([node.module] if node.module else [])
                    )
                else:
                    base = node.module or ""
                # `from pkg import sub` depends on pkg.sub when that is a module, else on pkg.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for target in dict.fromkeys(targets):
                if target == package or target.startswith(package + "."):
                    while target not in modules and "." in target:  # `import pkg.mod.attr`
                        target = target.rsplit(".", 1)[0]
                    found.append(Import(name, file, node.lineno, target))
    return modules, found


def layer_of(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in SHARED:
        return _SHARED_LAYER
    return ALIASES.get(top, top)


def layer_violations(imports: list[Import], rules: dict[str, set[str]] = LAYER_RULES) -> list[str]:
    out = []
    for imp in imports:
        mine, theirs = layer_of(imp.module), layer_of(imp.target)
        if theirs == _SHARED_LAYER:
            continue
        if mine == _SHARED_LAYER:
            allowed = False
        elif mine not in rules:
            out.append(f"{imp.module}:{imp.line}: {mine!r} is no known layer")
            continue
        else:
            allowed = theirs in rules[mine]
        if not allowed:
            out.append(
                f"{imp.module}:{imp.line} imports {imp.target} "
                f"(layer {mine} may not import layer {theirs})"
            )
    return out


def import_cycles(imports: list[Import]) -> list[str]:
    """One line per strongly connected group of modules: a shortest cycle through it, each step
    with the line of the import, then every import among the group's modules (what to cut)."""
    graph: dict[str, dict[str, int]] = {}
    for imp in imports:
        if imp.module != imp.target:
            graph.setdefault(imp.module, {}).setdefault(imp.target, imp.line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan; module graphs are small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)

    out = []
    for group in sorted(groups):
        members = set(group)
        start = group[0]
        # Shortest way back to `start` inside the group.
        previous = {start: None}
        queue = [start]
        found = None
        while queue and found is None:
            v = queue.pop(0)
            for w in sorted(graph.get(v, {})):
                if w == start:
                    found = v
                    break
                if w in members and w not in previous:
                    previous[w] = v
                    queue.append(w)
        path = [start]
        v = found
        while v != start:
            path.insert(1, v)
            v = previous[v]
        steps = " -> ".join(f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:] + [start]))
        inside = ", ".join(
            f"{a}:{line} -> {b}"
            for a in group
            for b, line in sorted(graph.get(a, {}).items())
            if b in members
        )
        out.append(f"cycle {steps} -> {start} (all imports among its modules: {inside})")
    return out


def test_layers_import_only_the_layers_below_them():
    modules, imports = collect_imports(PACKAGE_ROOT)
    unknown = sorted({layer_of(m) for m in modules} - set(LAYER_RULES) - {_SHARED_LAYER})
    assert not unknown, f"packages with no layer rule: {unknown}"
    violations = layer_violations(imports)
    assert not violations, "layer violations:\n" + "\n".join(violations)


def test_no_import_cycles():
    _, imports = collect_imports(PACKAGE_ROOT)
    cycles = import_cycles(imports)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# --- the checker itself, on a made-up package ---------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "shardtok"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_checker_sees_every_kind_of_import(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from shardtok.errors import E\n",
        "errors.py": "class E(Exception): ...\n",
        "format/__init__.py": "",
        "format/a.py": "from . import b\nfrom .b import thing\n",
        "format/b.py": "thing = 1\n",
        "storage/__init__.py": "from shardtok.storage.s import S\n",
        "storage/s.py": """\
            from typing import TYPE_CHECKING
            import shardtok.format.a
            if TYPE_CHECKING:
                from shardtok.stream import nodes
            def late():
                from ..torch import loader
                import shardtok.testing.synthetic as syn
            class S:
                def m(self):
                    from shardtok.errors import E
                    from shardtok import errors
            """,
        "stream/__init__.py": "",
        "stream/nodes.py": "",
        "torch/__init__.py": "",
        "torch/loader.py": "from shardtok.stream.nodes import x\n",
        "testing/__init__.py": "",
        "testing/synthetic.py": "",
    })  # fmt: skip
    modules, imports = collect_imports(root)
    assert "shardtok" in modules and "shardtok.storage.s" in modules
    got = {(i.module, i.line, i.target) for i in imports}
    assert ("shardtok.format.a", 1, "shardtok.format.b") in got  # from . import b
    assert ("shardtok.format.a", 2, "shardtok.format.b") in got  # from .b import thing
    assert ("shardtok.storage", 1, "shardtok.storage.s") in got
    assert ("shardtok.torch.loader", 1, "shardtok.stream.nodes") in got  # attribute of a module
    violations = layer_violations(imports)
    assert violations == [
        "shardtok.storage.s:4 imports shardtok.stream.nodes (layer storage may not import layer stream)",
        "shardtok.storage.s:6 imports shardtok.torch.loader (layer storage may not import layer torch)",
        "shardtok.storage.s:7 imports shardtok.testing.synthetic (layer storage may not import layer testing)",
    ]  # fmt: skip


def test_checker_finds_cycles_through_function_level_imports(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "storage/__init__.py": "",
        "storage/cache.py": "from shardtok.storage import readahead\n",
        "storage/readahead.py": "import os\n\nfrom shardtok.storage.remote import R\n",
        "storage/remote.py": "def f():\n    from shardtok.storage.cache import C\n",
        "storage/plain.py": "from shardtok.storage import cache\n",  # into the cycle, not in it
        "format/__init__.py": "",
        "format/x.py": "from .y import Y\n",
        "format/y.py": "Y = 1\n",
    })  # fmt: skip
    _, imports = collect_imports(root)
    assert not layer_violations(imports)
    assert import_cycles(imports) == [
        "cycle shardtok.storage.cache:1 -> shardtok.storage.readahead:3 -> "
        "shardtok.storage.remote:2 -> shardtok.storage.cache (all imports among its modules: "
        "shardtok.storage.cache:1 -> shardtok.storage.readahead, "
        "shardtok.storage.readahead:3 -> shardtok.storage.remote, "
        "shardtok.storage.remote:2 -> shardtok.storage.cache)"
    ]


def test_checker_rules_for_shared_modules_and_unknown_layers(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from shardtok.format import f\n",  # shared modules import no layer
        "_process.py": "",
        "format/__init__.py": "",
        "format/f.py": "from shardtok import _process\nimport shardtok\n",
        "extra/__init__.py": "from shardtok.format import f\n",
    })  # fmt: skip
    _, imports = collect_imports(root)
    assert layer_violations(imports) == [
        "shardtok:1 imports shardtok.format.f (layer (shared) may not import layer format)",
        "shardtok.extra:1: 'extra' is no known layer",
    ]
