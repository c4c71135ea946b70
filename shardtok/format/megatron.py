"""Megatron `.bin/.idx` pairs: read them by memmap, and write them byte-identically to megatron-core."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.mmidx import decode_idx, encode_idx, token_dtype


class MegatronPair:
    """A Megatron indexed dataset (`PREFIX.bin` + `PREFIX.idx`), read zero-copy.

    Each sequence is treated as one document; `doc_idx` is kept for callers that care.
    """

    def __init__(self, prefix: str | Path):
        self.prefix = str(prefix)
        idx_path, bin_path = self.prefix + ".idx", self.prefix + ".bin"
        for path in (idx_path, bin_path):
            if not os.path.exists(path):
                raise CorruptShardError(
                    path, None, None, "missing half of a Megatron .bin/.idx pair"
                )
        self._idx_map = np.memmap(idx_path, dtype=np.uint8, mode="r")
        index = decode_idx(self._idx_map, idx_path)
        self.dtype = index.dtype
        self.sizes = index.sizes
        self.pointers = index.pointers
        self.doc_idx = index.doc_idx
        bin_size = os.path.getsize(bin_path)
        if bin_size != index.bin_nbytes:
            raise CorruptShardError(
                bin_path,
                None,
                bin_size,
                f".bin has {bin_size} bytes, the .idx describes {index.bin_nbytes}",
            )
        if bin_size == 0:
            self.tokens = np.empty(0, dtype=self.dtype)
        else:
            self.tokens = np.memmap(bin_path, dtype=self.dtype, mode="r")
        self.offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=self.offsets[1:])

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(
                f"sequence {i} out of range for {self.prefix} with {len(self)} sequences"
            )
        i %= len(self)
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def write_megatron_pair(
    prefix: str | Path, documents: Iterable[np.ndarray], dtype: str | np.dtype
) -> tuple[int, int]:
    """Write documents as a pair megatron-core's IndexedDatasetBuilder would write; returns (docs, tokens).

    Both files are written under temporary names and renamed, the .idx last.
    """
    # uint8 is for loss-mask pairs (export --mask); token pairs use the token dtypes.
    dtype = np.dtype(np.uint8) if np.dtype(dtype) == np.uint8 else token_dtype(dtype)
    prefix = str(prefix)
    sizes: list[int] = []
    tmp_bin, tmp_idx = prefix + ".bin.tmp", prefix + ".idx.tmp"
    try:
        with open(tmp_bin, "wb") as out:
            for doc in documents:
                out.write(np.ascontiguousarray(doc, dtype=dtype).tobytes())
                sizes.append(len(doc))
        with open(tmp_idx, "wb") as out:
            out.write(encode_idx(np.asarray(sizes, dtype=np.int64), dtype))
        os.replace(tmp_bin, prefix + ".bin")
        os.replace(tmp_idx, prefix + ".idx")
    except BaseException:
        for tmp in (tmp_bin, tmp_idx):
            Path(tmp).unlink(missing_ok=True)
        raise
    return len(sizes), int(sum(sizes))
