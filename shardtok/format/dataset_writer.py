"""Writes a dataset: documents in, `<name>-NNNNNN.tar` shards and `index.json` out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardtok.format.frames import DEFAULT_COMPRESSION_LEVEL, DEFAULT_FRAME_SIZE
from shardtok.format.manifest import Manifest, ShardEntry
from shardtok.format.mmidx import dtype_for_vocab, token_dtype
from shardtok.format.shard_writer import ShardBuilder

DEFAULT_SHARD_SIZE = 64 << 20


def shard_file_name(name: str, number: int) -> str:
    return f"{name}-{number:06d}.tar"


class DatasetWriter:
    """Add documents (1-D integer arrays) in order; shards roll over at frame boundaries.

    A shard is finished after the first frame that brings its stored bytes to `shard_size`,
    so shard boundaries depend only on the documents and the options. Each shard is written
    atomically; the manifest is written last, so a folder with an `index.json` is complete.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        vocab_size: int,
        tokenizer: dict | None = None,
        name: str = "shard",
        shard_size: int = DEFAULT_SHARD_SIZE,
        compression_level: int | None = DEFAULT_COMPRESSION_LEVEL,
        frame_size: int = DEFAULT_FRAME_SIZE,
        dtype: str | np.dtype | None = None,
    ):
        if shard_size <= 0 or frame_size <= 0:
            raise ValueError("shard_size and frame_size must be positive")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.vocab_size = int(vocab_size)
        self.dtype = dtype_for_vocab(self.vocab_size) if dtype is None else token_dtype(dtype)
        self.tokenizer = dict(tokenizer or {})
        self.name = name
        self.shard_size = shard_size
        self.compression_level = compression_level
        self.frame_size = frame_size
        self._entries: list[ShardEntry] = []
        self._builder: ShardBuilder | None = None
        self._closed = False

    @property
    def shards(self) -> list[ShardEntry]:
        return list(self._entries)

    def add(self, tokens, provenance: tuple[str, int] | None = None) -> None:
        """Add one document. Token ids must lie in [0, vocab_size)."""
        if self._closed:
            raise RuntimeError("DatasetWriter is closed")
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise ValueError(
                f"a document is a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}"
            )
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = tokens[(tokens < 0) | (tokens >= self.vocab_size)][0]
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        if self._builder is not None and self._builder.would_close_frame(
            tokens.size * self.dtype.itemsize
        ):
            self._builder.close_frame()
            if self._builder.stored_bytes >= self.shard_size:
                self._finish_shard()
        if self._builder is None:
            self._builder = ShardBuilder(
                f"{self.name}-{len(self._entries):06d}",
                self.dtype,
                self.vocab_size,
                self.compression_level,
                self.frame_size,
                self.tokenizer,
            )
        self._builder.add(tokens, provenance)

    def _finish_shard(self) -> None:
        builder = self._builder
        if builder is None or builder.num_documents == 0:
            return
        file = shard_file_name(self.name, len(self._entries))
        meta, size, sha = builder.write(self.out_dir / file)
        self._entries.append(ShardEntry(file, size, meta.num_documents, meta.num_tokens, sha))
        self._builder = None

    def close(self, extra: dict | None = None) -> Manifest:
        """Finish the last shard and write the manifest (last)."""
        if not self._closed:
            self._finish_shard()
            self._closed = True
        manifest = Manifest(
            self.name,
            self.dtype,
            self.vocab_size,
            self.tokenizer,
            tuple(self._entries),
            dict(extra or {}),
        )
        manifest.write(self.out_dir)
        return manifest

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
