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

from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.storage.location import Location, display_url
from shardtok.storage.origins import options_by_origin

# `pipe:cmd`, `ais:...`, `hf:...`: a scheme without `//`, which only WebDataset's gopen opens.
_GOPEN_ONLY = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(?!//)")


def shard_name(url: str) -> str | None:
    """The file name a shard path or URL ends in; None for a ``pipe:`` command."""
    if _GOPEN_ONLY.match(url):
        return None
    where = Location(url)
    if where.is_local:
        return os.path.basename(where.local_path)
    return urllib.parse.urlsplit(url).path.rpartition("/")[2]


def shard_folder(url: str) -> str | None:
    """The folder or URL prefix a shard sits in, where its dataset's ``index.json`` is; None
    when the URL names none: a ``pipe:`` command, or a URL with a query string (a pre-signed
    URL signs one object, so nothing beside it can be reached)."""
    if _GOPEN_ONLY.match(url):
        return None
    where = Location(url)
    if where.is_local:
        return os.path.dirname(where.local_path) or "."
    parts = urllib.parse.urlsplit(url)
    if parts.query or parts.fragment:
        return None
    return url.rpartition("/")[0]


class Manifests:
    """The dataset (manifest and shard entries) of each shard URL, one ``DatasetSource`` per
    folder and process (each reads its ``index.json`` once)."""

    def __init__(
        self,
        dataset: str | Path | DatasetSource | None = None,
        storage_options: dict[str, Any] | None = None,
        retry: Any = None,
    ):
        # A URL list may be someone else's: options go to one origin only (flat), or each
        # origin its own (keyed by origin), never along the list to another host.
        self.options_for = options_by_origin(storage_options)
        self.retry = retry
        if dataset is None or isinstance(dataset, DatasetSource):
            self.fixed = dataset
        else:
            self.fixed = self._source(str(dataset))
        self._beside: dict[str, DatasetSource] = {}

    def locate(self, url: str, key: str) -> tuple[DatasetSource, str]:
        """The dataset shard `url` belongs to and its file name there (for a URL that ends in
        none, the shard's own key + ``.tar``)."""
        name = shard_name(url) or f"{key}.tar"
        if self.fixed is not None:
            return self.fixed, name
        folder = shard_folder(url)
        if folder is None:
            raise UsageError(
                f"{display_url(url)}: names no folder to find index.json in (a pipe: command or "
                "a URL with a query string); pass documents(dataset=...) the dataset's folder "
                "or URL prefix"
            )
        return self.beside(folder), name

    def beside(self, folder: str) -> DatasetSource:
        dataset = self._beside.get(folder)
        if dataset is None:
            dataset = self._beside[folder] = self._source(folder)
        return dataset

    def _source(self, location: str) -> DatasetSource:
        return DatasetSource(location, self.options_for(Location(location)), retry=self.retry)


__all__ = ["Manifests", "shard_folder", "shard_name"]
