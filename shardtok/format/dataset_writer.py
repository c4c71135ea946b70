"""Writes a dataset: documents in, `<name>-NNNNNN.tar` shards, `index.compact` and `index.json` out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardtok.format.frames import DEFAULT_COMPRESSION_LEVEL, DEFAULT_FRAME_SIZE
from shardtok.format.manifest import Manifest, ShardEntry
from shardtok.format.mmidx import dtype_for_vocab, token_dtype
from shardtok.format.shard_plan import (
    FramedDocs,
    ShardSettings,
    append_frames,
    check_ids,
    check_mask,
    shard_is_full,
    write_shard,
)
from shardtok.format.shard_writer import ShardBuilder

DEFAULT_SHARD_SIZE = 64 << 20


class DatasetWriter:
    """Add documents (1-D integer arrays) in order; shards roll over at frame boundaries.

    A shard is finished after the first frame that brings its stored bytes to `shard_size`,
    so shard boundaries depend only on the documents and the options. Each shard is written
    atomically; the manifest is written last, so a folder with an `index.json` is complete.

    `masks=True` makes a fine-tuning dataset: every document then comes with its loss mask
    (one 0/1 per token) and `sft` (free-form settings) is recorded in the manifest. The flag
    is fixed up front, not by the first `add`, so a dataset is either masked or not as a whole
    -- including an empty one -- and a missing or unexpected mask is a ValueError at once.
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
        masks: bool = False,
        sft: dict | None = None,
    ):
        if shard_size <= 0 or frame_size <= 0:
            raise ValueError("shard_size and frame_size must be positive")
        if sft is not None and not masks:
            raise ValueError("sft settings are recorded only for a dataset with masks=True")
        self.masks = bool(masks)
        self.sft = (dict(sft or {})) if masks else None
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.vocab_size = int(vocab_size)
        self.dtype = dtype_for_vocab(self.vocab_size) if dtype is None else token_dtype(dtype)
        self.tokenizer = dict(tokenizer or {})
        self.name = name
        self.shard_size = shard_size
        self.compression_level = compression_level
        self.frame_size = frame_size
        self._shard_settings = ShardSettings(
            name,
            self.dtype,
            self.vocab_size,
            compression_level,
            frame_size,
            self.tokenizer,
            self.masks,
        )
        self._entries: list[ShardEntry] = []
        self._stored_token_bytes = 0
        self._builder: ShardBuilder | None = None
        self._closed = False

    @property
    def shards(self) -> list[ShardEntry]:
        return list(self._entries)

    @property
    def stored_token_bytes(self) -> int:
        """Bytes of the bin members (the frames as stored) of the shards written so far: what
        reading every shard's frame table back would sum to."""
        return self._stored_token_bytes

    def add(self, tokens, provenance: tuple[str, int] | None = None, mask=None) -> None:
        """Add one document. Token ids must lie in [0, vocab_size); `mask` (required with
        masks=True, refused otherwise) holds one 0/1 (bool or integer) per token."""
        if self._closed:
            raise RuntimeError("DatasetWriter is closed")
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise ValueError(
                f"a document is a 1-D integer array, got shape {tokens.shape} dtype {tokens.dtype}"
            )
        check_ids(tokens, self.vocab_size)
        mask = self._check_mask(mask, tokens.size)
        builder = self._builder
        if builder is not None:
            if builder.would_close_frame(tokens.size * self.dtype.itemsize):
                builder.close_frame()
            # With no open frame (just closed here, or by add_frames), a full shard rolls over.
            if not builder.has_open_frame and shard_is_full(builder.stored_bytes, self.shard_size):
                self._finish_shard()
        self._open_builder().add(tokens, provenance, mask)

    def add_frames(
        self,
        tokens: np.ndarray,
        sizes: np.ndarray,
        frames: np.ndarray,
        stored,
        provenance: tuple[list[str], np.ndarray, np.ndarray] | None = None,
        masks=None,
    ) -> None:
        """Add documents already cut into frames and encoded by a
        :class:`~shardtok.format.frames.FrameBuilder` with this writer's frame size and level.

        `tokens` are the documents concatenated (this writer's dtype), `sizes` their token
        counts, `frames` the builder's table (first document, uncompressed size, stored size,
        crc32; documents counted from 0 here), `stored` the encoded frames concatenated.
        `provenance` is (file names, file index of each document, record of each document).
        The open frame is closed first, and the shard rolls over between frames by the same
        rule as :meth:`add`, so these frames reach the shards unchanged. `masks` (masked
        datasets): the documents' masks concatenated, raw (one 0/1 per token); their frames
        are cut like the token frames and compressed here.
        """
        if self._closed:
            raise RuntimeError("DatasetWriter is closed")
        docs = FramedDocs.checked(
            tokens,
            sizes,
            frames,
            stored,
            self.dtype,
            self.vocab_size,
            provenance,
            self._check_mask(masks, np.asarray(tokens).size),
        )
        for frame in range(docs.num_frames):
            if self._builder is not None:
                self._builder.close_frame()
                if shard_is_full(self._builder.stored_bytes, self.shard_size):
                    self._finish_shard()
            append_frames(self._open_builder(), docs, frame, frame + 1)

    def _check_mask(self, mask, ntokens: int) -> np.ndarray | None:
        if not self.masks:
            if mask is not None:
                raise ValueError("a mask was given to a DatasetWriter made without masks=True")
            return None
        if mask is None:
            raise ValueError("this DatasetWriter has masks=True: every document needs a mask")
        return check_mask(mask, ntokens)

    def _open_builder(self) -> ShardBuilder:
        if self._builder is None:
            self._builder = self._shard_settings.builder(len(self._entries))
        return self._builder

    def _finish_shard(self) -> None:
        builder = self._builder
        if builder is None or builder.num_documents == 0:
            return
        file = self._shard_settings.file(len(self._entries))
        self._entries.append(write_shard(builder, self.out_dir / file))
        self._stored_token_bytes += builder.stored_bytes
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
            self.sft,
        )
        manifest.write(self.out_dir)
        return manifest

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
