"""All tokens of local uncompressed data as one zero-copy array, for the memmap path.

* a Megatron pair ``PREFIX.bin`` / ``PREFIX.idx``: the ``.bin`` memmap itself;
* a shardtok dataset written without compression: each shard's ``.bin`` member is memory-mapped
  in place inside its tar (512-byte aligned) and :class:`ConcatTokens` joins them virtually,
  without copying, checking each frame's crc32 the first time it is touched
  (:class:`shardtok.memmap.checked.FrameCheck`). A Megatron ``.bin`` has no checksums to check.

Either way the result is ``(tokens, sizes)`` for :class:`shardtok.memmap.samples.GPTSamples`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.errors import UsageError
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.format.megatron import MegatronPair
from shardtok.memmap.checked import FrameCheck


class ConcatTokens:
    """Several 1-D token arrays read as one: slices and integer-array indexing, like numpy.

    A slice inside one array is a zero-copy view; anything that crosses arrays is gathered.
    """

    ndim = 1

    def __init__(self, arrays: list[np.ndarray], check: FrameCheck | None = None):
        """`check`: frame crc32s to verify on first touch (shards); None for a Megatron .bin."""
        if not arrays:
            raise ValueError("ConcatTokens needs at least one array")
        dtypes = {a.dtype for a in arrays}
        if len(dtypes) != 1:
            raise ValueError(f"arrays of different dtypes: {sorted(map(str, dtypes))}")
        # Plain ndarray views: np.memmap's __getitem__ costs microseconds per call.
        self.arrays = [a.view(np.ndarray) for a in arrays]
        self.dtype = arrays[0].dtype
        self.bounds = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=self.bounds[1:])
        self.shape = (int(self.bounds[-1]),)
        self.check = check

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self[np.arange(start, stop, step)]
            if self.check is not None:
                self.check.range(start, stop)
            return self._range(start, stop)
        if isinstance(index, (int, np.integer)):
            i = int(index) + (len(self) if index < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"token {index} out of range for {len(self)} tokens")
            if self.check is not None:
                self.check.range(i, i + 1)
            k = int(np.searchsorted(self.bounds, i, side="right")) - 1
            return self.arrays[k][i - self.bounds[k]]
        positions = np.asarray(index, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= len(self)):
            raise IndexError(f"token positions out of range for {len(self)} tokens")
        if self.check is not None:
            self.check.positions(positions)
        if positions.ndim == 1 and positions.size > 16:
            # Samples gather a few runs of consecutive positions: copy runs, not elements.
            breaks = np.flatnonzero(np.diff(positions) != 1) + 1
            if len(breaks) < 64:
                edges = [0, *breaks.tolist(), len(positions)]
                return np.concatenate(
                    [
                        self._range(int(positions[a]), int(positions[a]) + (b - a))
                        for a, b in zip(edges, edges[1:])
                    ]
                )
        which = np.searchsorted(self.bounds, positions, side="right") - 1
        out = np.empty(positions.shape, dtype=self.dtype)
        for k in np.unique(which):
            mask = which == k
            out[mask] = self.arrays[k][positions[mask] - self.bounds[k]]
        return out

    def ranges(self, begins, lengths) -> list[np.ndarray]:
        """``[self[b : b + n] for b, n in zip(begins, lengths) if n]`` (int sequences or
        arrays) with one searchsorted for all of them and the offsets inside each array
        computed vectorized: what is left per range is its slice (a document never spans two
        arrays, so a range rarely does)."""
        if self.check is not None:
            self.check.ranges(begins, lengths)
        starts = np.asarray(begins, dtype=np.int64)
        sizes = np.asarray(lengths, dtype=np.int64)
        bounds = self.bounds
        # (an empty range at the very end would otherwise land past the last array)
        which = np.minimum(np.searchsorted(bounds, starts, side="right") - 1, len(self.arrays) - 1)
        local = starts - bounds[which]
        ends = local + sizes
        if bool(np.all(ends <= bounds[which + 1] - bounds[which])):
            arrays = self.arrays
            return [
                arrays[k][a:e]
                for k, a, e in zip(which.tolist(), local.tolist(), ends.tolist())
                if e > a
            ]
        return [self._range(b, b + n) for b, n in zip(starts.tolist(), sizes.tolist()) if n]

    def paired_ranges(
        self, begins, lengths, other: ConcatTokens
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """`ranges` of these arrays and of `other` (arrays of the same lengths: a masked
        dataset's masks beside its tokens) in one pass: half the lookups of two calls."""
        begins, lengths = _ints(begins), _ints(lengths)
        if self.check is not None:
            self.check.ranges(begins, lengths)
        if other.check is not None:
            other.check.ranges(begins, lengths)
        which = (np.searchsorted(self.bounds, begins, side="right") - 1).tolist()
        bounds = self.bounds.tolist()
        mine, theirs = [], []
        for k, b, n in zip(which, begins, lengths):
            if not n:
                continue
            if b + n <= bounds[k + 1]:
                at = b - bounds[k]
                mine.append(self.arrays[k][at : at + n])
                theirs.append(other.arrays[k][at : at + n])
            else:
                mine.append(self._range(b, b + n))
                theirs.append(other._range(b, b + n))
        return mine, theirs

    def _range(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty(0, dtype=self.dtype)
        first = int(np.searchsorted(self.bounds, start, side="right")) - 1
        last = int(np.searchsorted(self.bounds, stop, side="left")) - 1
        if first == last:
            base = int(self.bounds[first])
            return self.arrays[first][start - base : stop - base]
        parts = []
        for k in range(first, last + 1):
            base = int(self.bounds[k])
            parts.append(
                self.arrays[k][max(start, base) - base : min(stop, int(self.bounds[k + 1])) - base]
            )
        return np.concatenate(parts)


def _ints(values) -> list[int]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def open_local_tokens(path: str | Path) -> tuple[np.ndarray | ConcatTokens, np.ndarray]:
    """(tokens, sizes) of a Megatron prefix or an uncompressed shardtok dataset folder."""
    tokens, sizes, _ = open_local_data(path)
    return tokens, sizes


def open_local_data(
    path: str | Path,
) -> tuple[np.ndarray | ConcatTokens, np.ndarray, np.ndarray | ConcatTokens | None]:
    """(tokens, sizes, masks) of a Megatron prefix or an uncompressed shardtok dataset folder.

    `masks` (one uint8 0/1 per token, beside the tokens; None without loss masks) are the
    mask members of a masked dataset's shards, mapped in place and checked per frame like the
    tokens, or the ``PREFIX_mask.bin/.idx`` pair ``export-megatron --mask`` writes beside a
    Megatron prefix (which has no checksums; its sizes must equal the tokens')."""
    path = Path(path)
    if (path / MANIFEST_NAME).exists():
        source = DatasetSource(path)
        readers = [source.open_random(entry.file) for entry in source.manifest.shards]
        compressed = [r.where for r in readers if r.meta.compressed]
        if compressed:
            raise ValueError(
                f"{path}: the memmap path needs uncompressed shards ({compressed[0]} is zstd); "
                "stream compressed data with ShardStreamDataset, or convert with compression off"
            )
        arrays = [r.memmap_tokens() for r in readers]
        sizes = np.concatenate([np.asarray(r.sizes) for r in readers])
        masks = None
        if source.manifest.masked:
            mask_arrays = [r.memmap_mask() for r in readers]
            masks = ConcatTokens(mask_arrays, FrameCheck(readers, mask_arrays, masks=True))
        # Even one shard goes through ConcatTokens: it is where frames are checked.
        return ConcatTokens(arrays, FrameCheck(readers, arrays)), sizes, masks
    prefix = str(path)
    for suffix in (".bin", ".idx"):
        prefix = prefix.removesuffix(suffix)
    pair = MegatronPair(prefix)
    sizes = np.asarray(pair.sizes)
    mask_pair = None
    if Path(prefix + "_mask.idx").exists() or Path(prefix + "_mask.bin").exists():
        mask_pair = MegatronPair(prefix + "_mask")
        if mask_pair.dtype != np.uint8 or not np.array_equal(np.asarray(mask_pair.sizes), sizes):
            raise UsageError(
                f"{prefix}_mask: not the loss masks of {prefix} (a uint8 pair with the same "
                "document sizes, as export-megatron --mask writes)"
            )
    return pair.tokens, sizes, None if mask_pair is None else mask_pair.tokens


__all__ = ["ConcatTokens", "open_local_data", "open_local_tokens"]
