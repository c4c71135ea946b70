"""What `inspect` and `verify` were pointed at: a dataset, some of its shards, or one shard
alone; local or remote."""

from __future__ import annotations

from pathlib import Path

from shardtok.dataset.shard_names import check_not_manifest, is_pattern
from shardtok.dataset.source import DatasetSource
from shardtok.errors import ShardtokError
from shardtok.storage.location import Location

TARGET_HELP = (
    "a dataset folder or URL prefix (with index.json); one .tar shard, read alone; or some "
    "shards of one dataset, checked against its index.json: several .tar files, a quoted "
    "brace pattern ('data/shard-{000000..000009}.tar', also remote) or a quoted local glob "
    "('data/shard-*.tar')"
)


def target(paths: list[str]) -> tuple[DatasetSource | Location, str]:
    """A dataset (a ``DatasetSource``, maybe of a subset of its shards) or one shard alone (its
    ``Location``), and its name in output: one plain path or URL is what it always was
    (``is_dataset``); a pattern, a glob or several paths name shards of the dataset beside
    them."""
    if len(paths) == 1 and not is_pattern(paths[0]):
        check_not_manifest(paths[0])
        where = locate(paths[0])
        return (DatasetSource(where.url) if is_dataset(where) else where), label(where)
    dataset = DatasetSource.of(paths[0] if len(paths) == 1 else list(paths))
    return dataset, label(dataset.root)


def targets(paths: list[str]) -> list[tuple[DatasetSource | Location, str]]:
    """What `paths` name, in their order, each as ``target`` gives it: every dataset folder or
    URL prefix on its own (`inspect A B` reads two datasets, which no list of shards can
    hold), and the other paths (shard files, patterns, globs) together, as one dataset's
    shards."""
    if len(paths) == 1:
        return [target(paths)]
    alone = [not is_pattern(p) and is_dataset(Location.of(p)) for p in paths]
    shards = [p for p, own in zip(paths, alone, strict=True) if not own]
    chosen = []
    for path, own in zip(paths, alone, strict=True):
        if own:
            chosen.append(target([path]))
        elif path is shards[0]:  # the shards are read together, where the first one stood
            chosen.append(target(shards))
    return chosen


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
