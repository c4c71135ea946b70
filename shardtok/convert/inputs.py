"""Finding the input files of a conversion and telling their formats apart.

Inputs keep the order given on the command line; a folder or glob pattern expands to its files
sorted by path, so the same command always sees the same files in the same order.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

from shardtok.errors import ShardtokError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TXT_SUFFIXES = (".txt",)
PARQUET_SUFFIXES = (".parquet",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class InputError(ShardtokError):
    """An input path is missing, of an unknown format, or given twice."""


@dataclass(frozen=True)
class InputFile:
    path: str  # as the user named it (or as the folder/glob expansion produced it)
    kind: str  # "jsonl", "txt" or "parquet"
    compression: str | None  # None, "gzip" or "zstd"
    size: int
    mtime_ns: int

    @property
    def splittable(self) -> bool:
        """Whether byte ranges of the file can be read independently (plain text formats)."""
        return self.compression is None and self.kind in ("jsonl", "txt")


def classify(path: str) -> tuple[str, str | None] | None:
    """(kind, compression) from the file name, or None when it is not a known input format."""
    name = path.lower()
    compression = None
    for suffix, codec in COMPRESSION_SUFFIXES.items():
        if name.endswith(suffix):
            compression, name = codec, name[: -len(suffix)]
            break
    for kind, suffixes in (
        ("jsonl", JSONL_SUFFIXES),
        ("txt", TXT_SUFFIXES),
        ("parquet", PARQUET_SUFFIXES),
    ):
        if name.endswith(suffixes):
            if kind == "parquet" and compression is not None:
                return (
                    None  # Parquet compresses internally; a .parquet.gz cannot be read by row group
                )
            return kind, compression
    return None


def _stat(path: str, kind: str, compression: str | None) -> InputFile:
    st = os.stat(path)
    return InputFile(path, kind, compression, st.st_size, st.st_mtime_ns)


def _expand_folder(folder: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        # Hidden folders (.git, our own .shardtok-work) are never input.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith("."))
    return sorted((p for p in found if classify(p) is not None), key=lambda p: Path(p).as_posix())


def _inside(path: str, folder: str | None) -> bool:
    if folder is None:
        return False
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def discover(inputs: list[str], exclude_dir: str | None = None) -> list[InputFile]:
    """Expand files, folders and glob patterns into the ordered list of input files.

    Files under `exclude_dir` (the output folder, when it sits inside an input folder) are left
    out: index.json and rejects.jsonl would otherwise read as JSONL input on the next run.
    """
    files: list[InputFile] = []
    seen: dict[str, str] = {}
    for given in inputs:
        if os.path.isdir(given):
            expanded = _expand_folder(given)
            if not expanded:
                raise InputError(f"folder {given!r} holds no .jsonl/.json/.txt/.parquet files")
        elif os.path.exists(given):
            if classify(given) is None:
                raise InputError(
                    f"{given!r}: unknown input format (expected .jsonl, .json, .ndjson or .txt, "
                    "optionally .gz/.zst, or .parquet)"
                )
            expanded = [given]
        elif glob.has_magic(given):
            expanded = sorted(
                (
                    p
                    for p in glob.glob(given, recursive=True)
                    if os.path.isfile(p) and classify(p) is not None
                ),
                key=lambda p: Path(p).as_posix(),
            )
            if not expanded:
                raise InputError(f"pattern {given!r} matches no input files")
        else:
            raise InputError(f"input {given!r} does not exist")
        for path in expanded:
            if _inside(path, exclude_dir):
                continue
            real = os.path.realpath(path)
            if real in seen:
                raise InputError(f"input file {path!r} is given twice (also as {seen[real]!r})")
            seen[real] = path
            kind, compression = classify(path)  # type: ignore[misc]
            files.append(_stat(path, kind, compression))
    if not files:
        raise InputError("no input files given")
    return files
