"""Which manifest a shard met in a WebDataset pipeline is checked against.

A WebDataset URL names one shard; the dataset it belongs to is the folder or URL prefix it sits
in, whose ``index.json`` the native reader checks every shard against. That is the default
here too. A ``pipe:`` command (or any other scheme only WebDataset's ``gopen`` knows) names no
place shardtok could read ``index.json`` from: the caller names the dataset instead.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path
from typing import Any

from shardtok.errors import UsageError
from shardtok.storage.dataset import DatasetSource
from shardtok.storage.location import Location, display_url

# `pipe:cmd`, `ais:...`, `hf:...`: a scheme without `//`, which only WebDataset's gopen opens.
_GOPEN_ONLY = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(?!//)")


def shard_location(url: str) -> tuple[str, str] | None:
    """(dataset folder or URL prefix, shard file name) of a shard path or URL; None when the
    URL names no place (a ``pipe:`` command)."""
    if _GOPEN_ONLY.match(url):
        return None
    where = Location(url)
    if where.is_local:
        folder, name = os.path.split(where.local_path)
        return folder or ".", name
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment:
        raise UsageError(
            f"{display_url(url)}: a URL with a query string names one object, so no index.json "
            "can be found beside it; pass dataset= (the dataset's folder or URL prefix)"
        )
    folder, _, name = url.rpartition("/")
    return folder, name


class Manifests:
    """The dataset (manifest and shard entries) of each shard URL, one ``DatasetSource`` per
    folder and process (each reads its ``index.json`` once)."""

    def __init__(
        self,
        dataset: str | Path | DatasetSource | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: Any = None,
    ):
        self.storage_options = storage_options
        self.retry = retry
        if dataset is None or isinstance(dataset, DatasetSource):
            self.fixed = dataset
        else:
            self.fixed = DatasetSource(dataset, storage_options, retry=retry)
        self._beside: dict[str, DatasetSource] = {}

    def locate(self, url: str, key: str) -> tuple[DatasetSource, str]:
        """The dataset shard `url` belongs to and its file name there. With a fixed dataset, a
        URL that names no file is looked up by the shard's own key (`key`.tar)."""
        place = shard_location(url)
        if self.fixed is not None:
            return self.fixed, f"{key}.tar" if place is None else place[1]
        if place is None:
            raise UsageError(
                f"{url}: a {url.split(':', 1)[0]}: URL names no folder to find index.json in; "
                "pass documents(dataset=...) the dataset's folder or URL prefix"
            )
        return self.beside(place[0]), place[1]

    def beside(self, folder: str) -> DatasetSource:
        dataset = self._beside.get(folder)
        if dataset is None:
            dataset = DatasetSource(folder, self.storage_options, retry=self.retry)
            self._beside[folder] = dataset
        return dataset


__all__ = ["Manifests", "shard_location"]
