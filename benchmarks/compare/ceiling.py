"""The ceiling: what one core can do with shardtok's compressed bytes before any loader logic.

All `.bin.zst` frames of a dataset are read into memory first (not timed). Then, per pass and
on one thread: (a) zstd-decompress every frame; (b) the same plus one memcpy of the decoded
bytes into a preallocated buffer; (c) the same but widening the tokens to int64 (the dtype of a
training batch) instead of a plain copy. The best of `passes` passes counts: a ceiling.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import zstandard

from shardtok.format import ShardReader


def _frames(shards: Path) -> tuple[list[tuple[bytes, int]], np.dtype, int]:
    frames: list[tuple[bytes, int]] = []
    dtype = None
    tokens = 0
    for path in sorted(Path(shards).glob("*.tar")):
        reader = ShardReader(path)
        if not reader.meta.compressed:
            raise ValueError(f"{path}: the ceiling needs zstd-compressed shards")
        dtype = reader.meta.dtype
        base = reader.head.bin_header.data_offset
        for frame in reader.meta.frames:
            stored = reader.source.read_range(base + frame.compressed_offset, frame.compressed_size)
            frames.append((stored, frame.uncompressed_size))
        tokens += reader.meta.num_tokens
    if dtype is None:
        raise ValueError(f"no shards in {shards}")
    return frames, np.dtype(dtype), tokens


def measure_ceiling(shards: Path, passes: int = 5) -> dict:
    frames, dtype, tokens = _frames(shards)
    dctx = zstandard.ZstdDecompressor()
    largest = max(size for _, size in frames)
    raw_buffer = np.empty(largest, dtype=np.uint8)
    wide_buffer = np.empty(largest // dtype.itemsize, dtype=np.int64)

    def decompress_only() -> None:
        for stored, size in frames:
            dctx.decompress(stored, max_output_size=size)

    def with_memcpy() -> None:
        for stored, size in frames:
            raw = dctx.decompress(stored, max_output_size=size)
            np.copyto(raw_buffer[: len(raw)], np.frombuffer(raw, dtype=np.uint8))

    def with_int64() -> None:
        for stored, size in frames:
            raw = np.frombuffer(dctx.decompress(stored, max_output_size=size), dtype=dtype)
            np.copyto(wide_buffer[: len(raw)], raw)

    result: dict = {
        "tokens": tokens,
        "frames": len(frames),
        "compressed_bytes": sum(len(s) for s, _ in frames),
        "uncompressed_bytes": sum(size for _, size in frames),
    }
    for name, step in (
        ("decompress", decompress_only),
        ("decompress_memcpy", with_memcpy),
        ("decompress_int64", with_int64),
    ):
        best = float("inf")
        for _ in range(passes):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        result[f"{name}_tokens_per_s"] = tokens / best
    return result
