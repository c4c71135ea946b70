"""Token addresses: a dataset whose documents say where their tokens live instead of what they are.

An ``AddressSource`` wraps a real ``DatasetSource`` (same location, manifest and document
sizes) and reads, in place of token ids, int64 *addresses* ``shard_index << 40 | token_offset``
(the shard's index in the streamed manifest -- a subset's view when the source is one --, the
token's offset in that shard). They are computed from
the shards' idx alone (``document_sizes``): no ``.bin`` byte is read.

Every stream stage decides from document lengths and positions only (the plan, the reader's
interleave and piece trims, the shuffle buffer's keys, all three packers and their overlong
rules, the mix schedule, elastic remainders), so the same setup streamed over addresses
(``StreamSetup.map_sources(AddressSource)``) packs the same documents into the same places:
each slot of an address row names the token the real row holds there. Masks are ignored:
addresses are never negative, and no stage looks at a mask's values.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardtok.dataset.source import DatasetSource

SHARD_SHIFT = 40  # token offsets below 2**40 per shard; shard indices below 2**23
OFFSET_MASK = (1 << SHARD_SHIFT) - 1
# Addresses are made in runs of about this many tokens, the documents being views of a run:
# one numpy call per run instead of one per document, and bounded memory.
RUN_TOKENS = 1 << 20


def split_addresses(addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard indices, token offsets in the shard) of int64 `addresses`."""
    addresses = np.asarray(addresses, dtype=np.int64)
    return addresses >> SHARD_SHIFT, addresses & OFFSET_MASK


class _NoFile:
    """What the reader hands back as its open file: nothing to close."""

    def close(self) -> None:
        pass


class AddressReader:
    """Stands in for ``ShardStreamReader``: ``offsets`` and ``documents()``, as addresses."""

    mask_source = None  # addresses carry no mask, so no range reads of mask frames

    def __init__(self, shard_index: int, offsets: np.ndarray):
        self.offsets = offsets
        self.base = int(shard_index) << SHARD_SHIFT

    def documents(
        self, start: int = 0, stop: int | None = None, *, with_masks: bool = False, combine=None
    ) -> Iterator[np.ndarray]:
        """The addresses of documents [start, stop) (`with_masks` and `combine` are accepted
        and ignored: an address is the same whether its token is trained or not)."""
        offsets = self.offsets
        count = len(offsets) - 1
        stop = count if stop is None else min(stop, count)
        d = start
        while d < stop:
            end = int(np.searchsorted(offsets, offsets[d] + RUN_TOKENS, side="right")) - 1
            end = min(max(end, d + 1), stop)
            low = int(offsets[d])
            run = np.arange(self.base + low, self.base + int(offsets[end]), dtype=np.int64)
            bounds = (offsets[d : end + 1] - low).tolist()
            for a, b in zip(bounds, bounds[1:]):
                yield run[a:b]
            d = end


class AddressSource(DatasetSource):
    """`source` with token addresses for tokens (module docstring); everything else is the
    real source's: location, storage options, manifest, document sizes."""

    def __init__(self, source: DatasetSource):
        super().__init__(
            source.location,
            source.storage_options,
            retry=source.retry,
            cache_dir=source.cache_dir,
            cache_bytes=source.cache_bytes,
            shards=source.shards,
        )
        self.real = source
        self._manifest, self._view = source.dataset_manifest, source.manifest
        self._offsets: dict[str, np.ndarray] = {}
        # Addresses number shards in the streamed manifest (a subset's view, when it is one).
        self._index = {entry.file: i for i, entry in enumerate(self._view.shards)}

    def __reduce__(self):
        return (AddressSource, (self.real,))

    def document_sizes(self, name: str) -> np.ndarray:
        return self.real.document_sizes(name)

    def offsets(self, name: str) -> np.ndarray:
        """Token offset of each document of shard `name`, plus the total (int64[D + 1])."""
        out = self._offsets.get(name)
        if out is None:
            sizes = self.document_sizes(name)
            out = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(sizes, out=out[1:])
            self._offsets[name] = out
        return out

    def shard_index(self, name: str) -> int:
        self.entry(name)  # a name the manifest does not list: the usual error
        return self._index[name]

    def open_stream(self, name: str, *, with_masks: bool = False) -> tuple[AddressReader, _NoFile]:
        return AddressReader(self.shard_index(name), self.offsets(name)), _NoFile()

    def prefetch(self, names: list[str]) -> None:
        pass  # nothing is fetched: the idx was read by document_sizes
