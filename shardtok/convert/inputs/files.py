"""Finding the input files of a conversion, telling their formats apart, and opening them.

Inputs keep the order given on the command line; a folder or glob pattern expands to its files
sorted by path, so the same command always sees the same files in the same order. An input may
also be an object-store URL (``s3://bucket/data/x.jsonl``, any fsspec protocol): a file, a
prefix ending in ``/`` or naming a "folder", or a glob. A remote file is known by its size and
ETag (object stores have no trustworthy mtime), and is checked against them whenever it is
opened, so a worker never tokenizes other bytes than the plan measured.

A Hugging Face `datasets` save_to_disk folder (see hf_folder.py), given or met while expanding a
folder, stands for its data files in the order its state.json lists them.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shardtok.convert.inputs import hf_folder
from shardtok.errors import ShardtokError
from shardtok.storage.endpoints import contact
from shardtok.storage.location import display_url, is_local, protocol_of

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TXT_SUFFIXES = (".txt",)
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class InputError(ShardtokError):
    """An input path is missing, of an unknown format, or given twice."""


@dataclass(frozen=True)
class InputFile:
    path: str  # as the user named it (or as the folder/glob expansion produced it)
    kind: str  # "jsonl", "txt", "parquet" or "arrow" (Arrow IPC, stream or file format)
    compression: str | None  # None, "gzip" or "zstd"
    size: int
    mtime_ns: int  # 0 for a remote file
    etag: str | None = None  # a remote file's ETag as its store reports it; None locally

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
        ("arrow", ARROW_SUFFIXES),
    ):
        if name.endswith(suffixes):
            if kind in ("parquet", "arrow") and compression is not None:
                return None  # compressed inside; a .parquet.gz cannot be read by row group
            return kind, compression
    return None


def _stat(path: str, kind: str, compression: str | None) -> InputFile:
    st = os.stat(path)
    return InputFile(path, kind, compression, st.st_size, st.st_mtime_ns)


FORMATS = (
    "expected .jsonl, .json, .ndjson or .txt, optionally .gz/.zst, .parquet, .arrow, or a "
    "datasets save_to_disk folder"
)
NO_INPUTS = "holds no .jsonl/.json/.txt/.parquet/.arrow files"


def _below(name: str, folder: str) -> bool:
    return not folder or name.startswith(folder + "/")


def _folder_inputs(
    shown: str, names: list[str], read: Callable[[str], bytes]
) -> list[tuple[str, str | None]]:
    """The inputs among `names` (every non-hidden file below a folder, relative, "/"-separated),
    in order, each with the save_to_disk folder it belongs to (None for a plain file): files
    sorted by name, and a save_to_disk folder's data files where that folder sorts, in its
    state.json's order (other files in it are not inputs). `read(name)` gives a file's bytes;
    `shown` names the folder in messages."""
    by_dir: dict[str, set[str]] = {}
    for name in names:
        parent, _, base = name.rpartition("/")
        by_dir.setdefault(parent, set()).add(base)
    datasets: dict[str, list[str]] = {}
    for parent in sorted(by_dir):
        if any(_below(parent, d) for d in datasets):
            continue
        kind = hf_folder.folder_kind(by_dir[parent])
        where = hf_folder.join_name(shown, parent)
        if kind == "dataset_dict":
            dataset_dict = read(hf_folder.join_name(parent, hf_folder.DATASET_DICT))
            splits = [
                d.rpartition("/")[2]
                for d in by_dir
                if d.rpartition("/")[0] == parent and d != parent
                and hf_folder.STATE in by_dir[d]
            ]  # fmt: skip
            raise hf_folder.dataset_dict_error(where, dataset_dict, splits)
        if kind == "cache":
            raise hf_folder.cache_error(where)
        if kind == "dataset":
            listed = hf_folder.data_files(where, read(hf_folder.join_name(parent, hf_folder.STATE)))
            for name in listed:
                if name not in by_dir[parent]:
                    raise hf_folder.missing_file_error(where, name)
            datasets[parent] = listed
    entries = [
        (name, [(name, None)])
        for name in names
        if classify(name) is not None
        and not any(_below(name, d) for d in datasets)
    ]  # fmt: skip
    for folder, listed in datasets.items():
        # Where the folder's own files would sort among the others: just before them.
        key = folder + "/" if folder else ""
        entries.append((key, [(hf_folder.join_name(folder, n), folder) for n in listed]))
    entries.sort(key=lambda entry: entry[0])
    return [item for _, items in entries for item in items]


def _expand_folder(folder: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        # Hidden folders (.git, our own .shardtok-work) are never input.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        found.extend(os.path.join(dirpath, f) for f in filenames if not f.startswith("."))
    names = [Path(os.path.relpath(p, folder)).as_posix() for p in found]

    shown = folder.rstrip("/") if folder != "/" else folder

    def read(name: str) -> bytes:
        """A datasets folder's state.json or dataset_dict.json: never through a link out."""
        path = os.path.join(folder, *name.split("/"))
        parent, _, base = name.rpartition("/")
        if not _inside(path, os.path.dirname(path)):
            raise hf_folder.outside_error(hf_folder.join_name(shown, parent), base)
        with open(path, "rb") as f:
            return f.read()

    expanded = []
    for name, dataset in _folder_inputs(shown, names, read):
        path = os.path.join(folder, *name.split("/"))
        if dataset is not None and not _inside(path, os.path.join(folder, dataset)):
            raise hf_folder.outside_error(
                hf_folder.join_name(shown, dataset), name.rpartition("/")[2]
            )
        expanded.append(path)
    return expanded


def _inside(path: str, folder: str | None) -> bool:
    if folder is None:
        return False
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([real, root]) == root


def _filesystem(url: str, storage_options: dict | None):
    import fsspec

    return fsspec.filesystem(protocol_of(url), **(storage_options or {}))


def _etag(info: dict) -> str | None:
    for key in ("ETag", "etag"):
        if isinstance(info.get(key), str) and info[key]:
            return info[key]
    return None


def _hidden_below(name: str, root: str) -> bool:
    """Whether a path component of `name` below `root` is hidden (as local expansion skips)."""
    rest = name[len(root) :] if name.startswith(root) else name
    return any(part.startswith(".") for part in rest.split("/") if part)


def _expand_remote(given: str, storage_options: dict | None) -> list[tuple[str, dict]]:
    """(URL, fsspec info) of each input file `given` names on an object store, sorted by URL."""
    fs = _filesystem(given, storage_options)
    stripped = fs._strip_protocol(given)
    shown = display_url(given)
    info = None
    if not given.endswith("/"):
        try:
            info = fs.info(stripped)
        except FileNotFoundError:
            info = None
    if given.endswith("/") or (info is not None and info.get("type") == "directory"):
        root = stripped.rstrip("/") + "/"
        prefix = given.rstrip("/") + "/"
        try:
            found = fs.find(root, detail=True)
        except FileNotFoundError:
            found = {}
        entries = {
            name[len(root) :]: entry
            for name, entry in found.items()
            if entry.get("type") == "file"
            and name.startswith(root)
            and not _hidden_below(name, root)
        }

        def read(name: str) -> bytes:
            return fs.cat_file(root + name)

        selected = _folder_inputs(shown.rstrip("/"), sorted(entries), read)
        if not selected:
            raise InputError(f"folder {shown!r} {NO_INPUTS}")
        return [(prefix + name, entries[name]) for name, _ in selected]
    if info is not None:
        if classify(stripped) is None:
            raise InputError(f"{shown!r}: unknown input format ({FORMATS})")
        return [(given, info)]
    if glob.has_magic(stripped):
        # Like a local glob, wildcards do not match hidden names.
        fixed = stripped[: min(stripped.find(c) for c in "*?[" if c in stripped)]
        root = fixed[: fixed.rfind("/") + 1]
        expanded = sorted(
            (fs.unstrip_protocol(name), entry)
            for name, entry in fs.glob(stripped, detail=True).items()
            if entry.get("type") == "file"
            and not _hidden_below(name, root)
            and classify(name) is not None
        )
        if not expanded:
            raise InputError(f"pattern {shown!r} matches no input files")
        return expanded
    raise InputError(f"input {shown!r} does not exist")


def _under(url: str, folder: str | None) -> bool:
    """Whether remote `url` lies in the remote folder `folder` (the output, for instance)."""
    if folder is None or is_local(folder) or protocol_of(folder) != protocol_of(url):
        return False
    root = folder.rstrip("/") + "/"
    return url.startswith(root)


def _refuse_metadata(path: str) -> None:
    """A datasets folder's JSON metadata named as an input (`saved/*`) would be read as JSONL and
    fail on its first line: say what it is instead."""
    folder, name = os.path.split(path)
    if name not in (hf_folder.STATE, hf_folder.INFO, hf_folder.DATASET_DICT):
        return
    if hf_folder.folder_kind(os.listdir(folder or ".")) is not None:
        raise hf_folder.HFDatasetError(
            f"{path}: metadata of a Hugging Face datasets folder, not data: convert the folder "
            f"({folder or '.'}) or its .arrow files"
        )


def discover(
    inputs: list[str], exclude_dir: str | None = None, storage_options: dict | None = None
) -> list[InputFile]:
    """Expand files, folders and glob patterns into the ordered list of input files.

    Files under `exclude_dir` (the output folder, when it sits inside an input folder) are left
    out: index.json and rejects.jsonl would otherwise read as JSONL input on the next run.
    `storage_options` go to fsspec for remote inputs.
    """
    files: list[InputFile] = []
    seen: dict[str, str] = {}
    for given in inputs:
        if not is_local(given):
            # a refused first connection fails here, naming the endpoint, not after retries
            with contact(given, storage_options):
                expanded = _expand_remote(given, storage_options)
            for url, info in expanded:
                if _under(url, exclude_dir):
                    continue
                scheme, _, rest = url.partition("://")
                key = scheme + "://" + re.sub("/+", "/", rest)
                if key in seen:
                    raise InputError(
                        f"input file {display_url(url)!r} is given twice "
                        f"(also as {display_url(seen[key])!r})"
                    )
                seen[key] = url
                kind, compression = classify(url)  # type: ignore[misc]
                size = int(info.get("size") or 0)
                files.append(InputFile(url, kind, compression, size, 0, _etag(info)))
            continue
        if os.path.isdir(given):
            expanded = _expand_folder(given)
            if not expanded:
                raise InputError(f"folder {given!r} {NO_INPUTS}")
        elif os.path.exists(given):
            if classify(given) is None:
                raise InputError(f"{given!r}: unknown input format ({FORMATS})")
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
            _refuse_metadata(path)
            real = os.path.realpath(path)
            if real in seen:
                raise InputError(f"input file {path!r} is given twice (also as {seen[real]!r})")
            seen[real] = path
            kind, compression = classify(path)  # type: ignore[misc]
            files.append(_stat(path, kind, compression))
    if not files:
        raise InputError("no input files given")
    return files


# Remote reads: exact ranges go without a cache (one request each); streams read ahead.
STREAM_BLOCK = 8 << 20
PARQUET_BLOCK = 1 << 20
# Walking an Arrow file's message headers: one small request per message, bodies skipped.
ARROW_SCAN_BLOCK = 64 << 10


def open_input(file: InputFile, storage_options: dict | None = None, block_size: int = 0):
    """`file` opened for binary reading: plain open() for a local file; for a remote one an
    fsspec file that reads ahead `block_size` bytes (0: each read is exactly one range
    request), checked to still have the size and ETag the plan saw."""
    if is_local(file.path):
        return open(file.path, "rb")  # noqa: SIM115 (the caller closes it)
    fs = _filesystem(file.path, storage_options)
    if block_size:
        f = fs.open(file.path, "rb", block_size=block_size, cache_type="readahead")
    else:
        f = fs.open(file.path, "rb", cache_type="none")
    try:
        details = f.details
        etag, size = _etag(details), details.get("size")
        if (size is not None and int(size) != file.size) or (
            file.etag is not None and etag is not None and etag != file.etag
        ):
            raise InputError(
                f"{display_url(file.path)}: the file changed since the conversion was planned "
                f"(now {details.get('size')} bytes, ETag {etag}; planned {file.size} bytes, "
                f"ETag {file.etag}); plan the conversion again"
            )
    except BaseException:
        f.close()
        raise
    return f


def read_input_range(
    file: InputFile, start: int, end: int, storage_options: dict | None = None
) -> bytes:
    """Bytes [start, end) of `file` (fewer if it ends earlier): one read, one request remotely."""
    with open_input(file, storage_options) as f:
        f.seek(start)
        return f.read(end - start)
