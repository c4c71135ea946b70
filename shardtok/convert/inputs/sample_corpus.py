"""A few MB of real English text, built from what every Python install already has.

The standard library's source is on every machine that runs shardtok, and its docstrings are
real prose written by people. This module walks the stdlib with :mod:`ast` (never importing
anything), collects the docstring of every module, class and function, and writes them as JSONL
records ``{"text": ..., "source": "module.qualname"}``. :func:`write_sample_chat` turns the same
docstrings into chat records (``{"messages": [...]}``, the ``openai`` SFT format): a user asks
what a name does, the assistant answers with its docstring, and a follow-up turn asks about the
next name of the same module.

The order is fixed (files sorted by relative path, definitions in source order), so the corpus is
byte-identical for a given Python version; a different Python version gives a slightly different
corpus, which is fine for a demo and a tokenizer training text.
"""

from __future__ import annotations

import ast
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Third-party packages live inside the stdlib folder on many installs; they vary per machine, so
# they would make the corpus non-deterministic. Test data folders hold deliberately broken files.
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__", "lib2to3"})

DEFAULT_MAX_BYTES: int | None = None  # the whole stdlib gives about 3 MB


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _python_files(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIPPED_DIRS]
        found.extend(Path(dirpath) / name for name in filenames if name.endswith(".py"))
    # Sort on the relative POSIX path so the order does not depend on the file system.
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or "__init__"


def _docstrings(tree: ast.Module, module: str) -> Iterator[tuple[str, str]]:
    doc = ast.get_docstring(tree, clean=True)
    if doc and doc.strip():
        yield module, doc

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                text = ast.get_docstring(child, clean=True)
                # Whitespace-only docstrings exist (test data); they are not documents.
                if text and text.strip():
                    yield name, text
                yield from walk(child, name)

    yield from walk(tree, module)


def iter_docstring_records(root: Path | None = None) -> Iterator[dict[str, str]]:
    """Yield ``{"text", "source"}`` for every docstring in the stdlib, in a fixed order."""
    root = root or stdlib_root()
    for path in _python_files(root):
        try:
            source = path.read_bytes()
            tree = ast.parse(source, filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            # A few stdlib files are test data with deliberately invalid syntax or encodings.
            continue
        for qualname, text in _docstrings(tree, _module_name(root, path)):
            yield {"text": text, "source": qualname}


_SYSTEM = "You answer questions about the Python standard library from its documentation."


def iter_chat_records(root: Path | None = None) -> Iterator[dict]:
    """Yield ``{"messages": [...], "source"}`` chat records built from the stdlib docstrings.

    Two consecutive docstrings of one module make a two-turn conversation (the second question
    asks about the next name); every third conversation starts with a system message, so the
    records exercise multi-turn masks and system turns, not only one question and one answer.
    """
    pending: tuple[str, str] | None = None
    number = 0
    for record in iter_docstring_records(root):
        name, text = record["source"], record["text"].strip()
        if pending is None:
            pending = (name, text)
            continue
        first_name, first_text = pending
        pending = None
        messages = [] if number % 3 else [{"role": "system", "content": _SYSTEM}]
        messages.append({"role": "user", "content": f"What does `{first_name}` do?"})
        messages.append({"role": "assistant", "content": first_text})
        if first_name.split(".")[0] == name.split(".")[0]:
            messages.append({"role": "user", "content": f"And `{name}`?"})
            messages.append({"role": "assistant", "content": text})
        number += 1
        yield {"messages": messages, "source": first_name}


def write_sample_corpus(
    out_path: str | os.PathLike[str],
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    *,
    chat: bool = False,
) -> tuple[int, int]:
    """Write the docstring corpus as JSONL, stopping before ``max_bytes`` (None = everything);
    `chat` writes the chat records of :func:`iter_chat_records` instead of plain text.

    Returns (records, bytes). The file is written to a temporary name and renamed, so a reader
    never sees half a corpus.
    """
    source = iter_chat_records() if chat else iter_docstring_records()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    records = written = 0
    with open(tmp, "wb") as out:
        for record in source:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
            if max_bytes is not None and written + len(line) > max_bytes:
                break
            out.write(line)
            records += 1
            written += len(line)
    os.replace(tmp, out_path)
    return records, written
