"""What `inspect` and `verify` were pointed at: a dataset or one shard, local or remote."""

from __future__ import annotations

from pathlib import Path

from shardtok.errors import ShardtokError
from shardtok.storage.location import Location


def locate(path: str) -> Location:
    """`path` as a location; a local path that does not exist is one clear error (nothing to
    read is not a damaged shard)."""
    where = Location.of(path)
    if where.is_local and not Path(where.local_path).exists():
        raise ShardtokError(f"{where.local_path}: no such file or folder")
    return where


def is_dataset(where: Location) -> bool:
    """A local folder, or a remote prefix (any URL not naming a .tar file)."""
    if where.is_local:
        return Path(where.local_path).is_dir()
    return not where.name.endswith(".tar")


def label(where: Location) -> str:
    """How the shard or dataset is named in output: local paths as pathlib writes them
    ("data/" -> "data"), as they always have; URLs redacted."""
    return str(Path(where.local_path)) if where.is_local else where.display
