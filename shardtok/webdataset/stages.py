"""The pipeline stages: shards in, one sample per document out.

``ShardDocuments`` sits after ``wds.WebDataset``'s tar expansion and grouping, where a shard
arrives as one sample of member blobs; ``StreamDocuments`` sits where a pipeline still carries
URLs and reads each shard itself with the native streaming reader. Both serve the same samples
after the same checks, and both follow WebDataset's ``handler=`` convention for a shard that
fails: the handler raises (the default), returns True (skip the rest of that shard) or False
(stop). Documents already served came from frames that passed every check; a mistake in the
caller's own arguments is raised whatever the handler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from webdataset.handlers import reraise_exception

from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.format.identity import check_shard_identity
from shardtok.format.shard_reader import ShardStreamReader
from shardtok.storage.location import display_url
from shardtok.webdataset.manifests import Manifests, shard_folder, shard_name
from shardtok.webdataset.member_tar import MemberTar, sample_members

KEY_DIGITS = 6  # document numbers in keys: at least this many digits, more for larger shards


def document_samples(reader: ShardStreamReader, url: str) -> Iterator[dict]:
    """One sample per document of the shard `reader` streams, in order.

    Arrays are copies: a sample must not hold its whole decoded frame alive (a shuffle buffer
    of views would keep one frame per buffered document), and copies are writable, which
    ``torch.from_numpy`` wants."""
    meta = reader.meta
    masked = meta.mask is not None
    width = max(KEY_DIGITS, len(str(max(meta.num_documents - 1, 0))))
    prefix = f"{meta.key}/"
    # (str.zfill and np.array: the cheapest spellings; per-document cost bounds short documents)
    if masked:
        for number, (tokens, mask) in enumerate(reader.documents(with_masks=True)):
            yield {
                "__key__": prefix + str(number).zfill(width),
                "__url__": url,
                "tokens": np.array(tokens),
                "mask": np.array(mask),
            }
    else:
        for number, tokens in enumerate(reader.documents()):
            yield {
                "__key__": prefix + str(number).zfill(width),
                "__url__": url,
                "tokens": np.array(tokens),
            }


class _Stage:
    def __init__(self, handler: Callable[[Exception], bool]):
        self.handler = handler

    def _each(self, items: Iterable, shard: Callable[[Any], Iterator[dict]]) -> Iterator[dict]:
        for item in items:
            try:
                yield from shard(item)
            except UsageError:
                raise
            except Exception as exc:
                if self.handler(exc):
                    continue
                break


class ShardDocuments(_Stage):
    """Grouped shard samples (``{"__key__", "__url__", "json", "idx", "bin.zst", ...}``) in,
    document samples out. See :func:`shardtok.webdataset.documents`."""

    def __init__(self, manifests: Manifests, handler: Callable[[Exception], bool]):
        super().__init__(handler)
        self.manifests = manifests

    def __call__(self, samples: Iterable[dict]) -> Iterator[dict]:
        return self._each(samples, self._shard)

    def _shard(self, sample: dict) -> Iterator[dict]:
        url = str(sample.get("__url__", "(no __url__)"))
        where = display_url(url)
        tar = MemberTar(sample_members(sample, where), where)
        reader = ShardStreamReader(tar.stream(), where, size=tar.size, mask_source=tar)
        dataset, name = self.manifests.locate(url, reader.meta.key)
        check_shard_identity(reader.meta, dataset.entry(name), dataset.manifest, where)
        yield from document_samples(reader, url)


class StreamDocuments(_Stage):
    """Shard URLs (``{"url": ...}`` as ``wds.SimpleShardList`` yields them, or strings) in,
    document samples out. See :func:`shardtok.webdataset.stream_documents`."""

    def __init__(self, manifests: Manifests, handler: Callable[[Exception], bool]):
        super().__init__(handler)
        self.manifests = manifests

    def __call__(self, urls: Iterable) -> Iterator[dict]:
        return self._each(urls, self._shard)

    def _shard(self, item: Any) -> Iterator[dict]:
        url = str(item["url"] if isinstance(item, dict) else item)
        folder = shard_folder(url)
        if folder is None:
            raise UsageError(
                f"{display_url(url)}: stream_documents() reads the index.json beside each shard, "
                "and a pipe: command or a URL with a query string has no place beside it; use "
                "wds.WebDataset(urls).compose(shardtok.webdataset.documents(dataset=...))"
            )
        dataset = self.manifests.beside(folder)
        reader, fileobj = dataset.open_stream(shard_name(url), with_masks=dataset.manifest.masked)
        try:
            yield from document_samples(reader, url)
        finally:
            fileobj.close()


def documents(
    dataset: str | Path | DatasetSource | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    retry: Any = None,
    handler: Callable[[Exception], bool] = reraise_exception,
) -> ShardDocuments:
    """A stage for ``wds.WebDataset(urls).compose(...)``: each shard sample becomes one sample
    per document, ``{"__key__": "<shard key>/<document number>", "__url__": url, "tokens":
    ndarray, "mask": ndarray}`` ("mask" only for datasets with loss masks).

    `dataset`: where the shards' ``index.json`` is (folder, URL prefix or ``DatasetSource``);
    None (default) reads the one beside each shard's URL, once per folder and process, which a
    ``pipe:`` URL cannot give. `storage_options`, `retry`: for reading a remote manifest.
    `handler`: WebDataset's convention, for a shard that fails its checks or cannot be read."""
    return ShardDocuments(Manifests(dataset, storage_options, retry), handler)


def stream_documents(
    *,
    storage_options: dict[str, Any] | None = None,
    retry: Any = None,
    handler: Callable[[Exception], bool] = reraise_exception,
) -> StreamDocuments:
    """A stage for a pipeline of shard URLs, e.g. ``wds.DataPipeline(wds.SimpleShardList(urls),
    wds.split_by_worker, stream_documents())``: opens each shard with shardtok's storage and
    streams it through the native reader (one frame in memory, never the shard), checked
    against the ``index.json`` beside it. Same samples as :func:`documents`."""
    return StreamDocuments(Manifests(None, storage_options, retry), handler)


__all__ = ["ShardDocuments", "StreamDocuments", "document_samples", "documents", "stream_documents"]
