"""Builds one shard: collects documents into frames, then writes the tar atomically.

The json member comes first in the tar but depends on everything after it (frame table,
checksums), so stored frame bytes are spooled until :meth:`ShardBuilder.write` lays out
json, idx and bin in one pass.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shardtok._threads import beside
from shardtok.format.frames import DEFAULT_FRAME_SIZE, FrameEncoder
from shardtok.format.mask_meta import MaskFrame, MaskInfo, mask_member
from shardtok.format.mmidx import encode_idx, token_dtype
from shardtok.format.shard_meta import Frame, ShardMeta
from shardtok.format.tar import END_OF_ARCHIVE, encode_header, padding

_SPOOL_IN_MEMORY = 256 << 20


class ShardBuilder:
    """Accumulates the documents of one shard.

    Documents are grouped into frames of about `frame_size` uncompressed bytes: a frame is
    closed before a document that would push it past the target, so a document larger than
    the target gets a frame of its own and no document ever spans two frames.
    """

    def __init__(
        self,
        key: str,
        dtype: np.dtype,
        vocab_size: int,
        compression_level: int | None,
        frame_size: int = DEFAULT_FRAME_SIZE,
        tokenizer: dict | None = None,
        masked: bool = False,
    ):
        self.key = key
        self.masked = masked
        self.dtype = token_dtype(dtype)
        self.vocab_size = vocab_size
        self.frame_size = frame_size
        self.tokenizer = dict(tokenizer or {})
        self._encoder = FrameEncoder(compression_level)
        self._sizes: list[int] = []
        self._frames: list[Frame] = []
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_first = 0
        self._stored_bytes = 0
        self._token_bytes = 0
        self._bin_hash = hashlib.sha256()
        self._spool = _Spool(_SPOOL_IN_MEMORY)
        self._provenance: list[list] = []
        # Mask frames mirror the token frames one for one; they are spooled apart because the
        # mask member follows the whole bin member in the tar.
        self._mask_pending: list[bytes] = []
        self._mask_frames: list[MaskFrame] = []
        self._mask_stored = 0
        self._mask_hash = hashlib.sha256()
        self._trained = 0
        self._mask_spool = _Spool(_SPOOL_IN_MEMORY) if masked else None

    @property
    def num_documents(self) -> int:
        return len(self._sizes)

    @property
    def stored_bytes(self) -> int:
        """Bytes of closed frames so far (compressed when compressing)."""
        return self._stored_bytes

    @property
    def has_open_frame(self) -> bool:
        return bool(self._pending)

    def would_close_frame(self, nbytes: int) -> bool:
        """Whether adding a document of `nbytes` closes the open frame first."""
        return self._pending_bytes > 0 and self._pending_bytes + nbytes > self.frame_size

    def add(
        self,
        tokens: np.ndarray,
        provenance: tuple[str, int] | None = None,
        mask: np.ndarray | None = None,
    ) -> None:
        """Add one document, closing the open frame first when the document would overflow it.
        `mask` (masked shards only): one 0/1 uint8 per token, already checked by the caller."""
        raw = np.ascontiguousarray(tokens, dtype=self.dtype).tobytes()
        if self.would_close_frame(len(raw)):
            self.close_frame()
        if not self._pending:
            self._pending_first = len(self._sizes)
        if self.masked:
            self._mask_pending.append(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
        self._pending.append(raw)
        self._pending_bytes += len(raw)
        self._sizes.append(len(tokens))
        if provenance is not None:
            self._note_provenance(provenance[0], provenance[1], provenance[1])

    def add_frame(
        self, stored, raw: np.ndarray, sizes: np.ndarray, crc32: int, provenance=(), mask=None
    ) -> None:
        """Append a frame encoded elsewhere (FrameBuilder with this shard's level): `stored`
        its encoded bytes, `raw` its tokens, `sizes` its documents' token counts, `provenance`
        (file, first record, last record) runs of its documents, `mask` (masked shards) its raw
        mask bytes, encoded here. The open frame closes first."""
        self.close_frame()
        raw = np.ascontiguousarray(raw, dtype=self.dtype)
        if self.masked:
            self._append_mask(np.ascontiguousarray(mask, dtype=np.uint8).tobytes())
        self._append_frame(stored, raw, len(self._sizes), int(crc32))
        self._sizes.extend(np.asarray(sizes).tolist())
        for file, first, last in provenance:
            self._note_provenance(file, first, last)

    def close_frame(self) -> None:
        if not self._pending:
            return
        raw = b"".join(self._pending)
        if self.masked:
            self._append_mask(b"".join(self._mask_pending))
            self._mask_pending = []
        self._append_frame(self._encoder.encode(raw), raw, self._pending_first, zlib.crc32(raw))
        self._pending, self._pending_bytes = [], 0

    def _append_frame(self, stored, raw, first_document: int, crc32: int) -> None:
        """Spool one encoded frame and enter it in the frame table and the .bin hash."""
        nbytes = memoryview(raw).nbytes
        self._frames.append(
            Frame(self._stored_bytes, len(stored), first_document, self._token_bytes, nbytes, crc32)
        )
        self._spool.write(stored)
        self._bin_hash.update(raw)
        self._stored_bytes += len(stored)
        self._token_bytes += nbytes

    def _append_mask(self, raw: bytes) -> None:
        stored = self._encoder.encode(raw)
        self._mask_frames.append(MaskFrame(self._mask_stored, len(stored), zlib.crc32(raw)))
        self._mask_spool.write(stored)
        self._mask_hash.update(raw)
        self._mask_stored += len(stored)
        self._trained += int(np.count_nonzero(np.frombuffer(raw, dtype=np.uint8)))

    def _note_provenance(self, file: str, first: int, last: int) -> None:
        """Records first..last of `file`, merged into the previous range when it continues it."""
        prev = self._provenance[-1] if self._provenance else None
        if prev is not None and prev[0] == file and prev[2] == first - 1:
            prev[2] = last
        else:
            self._provenance.append([file, first, last])

    def meta(self) -> tuple[ShardMeta, bytes]:
        """Close the open frame and return the metadata and the encoded idx."""
        self.close_frame()
        sizes = np.asarray(self._sizes, dtype=np.int32)
        idx = encode_idx(sizes, self.dtype)
        meta = ShardMeta(
            key=self.key,
            dtype=self.dtype,
            vocab_size=self.vocab_size,
            num_documents=len(sizes),
            num_tokens=self._token_bytes // self.dtype.itemsize,
            compression="none" if self._encoder.level is None else "zstd",
            compression_level=self._encoder.level,
            frames=tuple(self._frames),
            bin_sha256=self._bin_hash.hexdigest(),
            idx_sha256=hashlib.sha256(idx).hexdigest(),
            tokenizer=self.tokenizer,
            provenance=tuple(
                {"file": f, "first_record": a, "last_record": b} for f, a, b in self._provenance
            ),
            mask=None
            if not self.masked
            else MaskInfo(
                mask_member(self.key, self._encoder.level is not None),
                tuple(self._mask_frames),
                self._mask_hash.hexdigest(),
                self._trained,
            ),
        )
        return meta, idx

    def _pieces(self, meta: ShardMeta, idx: bytes) -> Iterator[bytes]:
        """The shard file's bytes, in order."""
        for name, data in ((meta.json_member, meta.to_json_bytes()), (meta.idx_member, idx)):
            yield encode_header(name, len(data))
            yield data
            yield b"\0" * padding(len(data))
        yield encode_header(meta.bin_member, self._stored_bytes)
        yield from self._spool.chunks()
        yield b"\0" * padding(self._stored_bytes)
        if meta.mask is not None:
            yield encode_header(meta.mask.member, self._mask_stored)
            yield from self._mask_spool.chunks()
            yield b"\0" * padding(self._mask_stored)
        yield END_OF_ARCHIVE

    def write(self, path: str | Path) -> tuple[ShardMeta, int, str]:
        """Write the shard to `path` atomically; returns (meta, file size, sha256 of the file).

        With the frames in memory (shards up to 256 MiB stored), the file's sha256 is taken on
        another thread while the file is written and fsynced (all three release the GIL): ~3
        ms of a 4 MB shard's close, which is on convert's critical path after the last unit."""
        meta, idx = self.meta()
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        file_hash = hashlib.sha256()
        size = 0
        in_memory = self._spool.in_memory and (
            self._mask_spool is None or self._mask_spool.in_memory
        )
        try:
            with open(tmp, "wb") as out:
                if in_memory:
                    pieces = list(self._pieces(meta, idx))
                    size = sum(map(len, pieces))
                    with beside("shardtok-sha256", functools.partial(_hash_all, file_hash, pieces)):
                        for piece in pieces:
                            out.write(piece)
                        out.flush()
                        os.fsync(out.fileno())
                else:
                    for piece in self._pieces(meta, idx):
                        out.write(piece)
                        file_hash.update(piece)
                        size += len(piece)
                    out.flush()
                    os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            self._spool.close()
            if self._mask_spool is not None:
                self._mask_spool.close()
        return meta, size, file_hash.hexdigest()


def _hash_all(digest, pieces) -> None:
    for piece in pieces:
        digest.update(piece)


class _Spool:
    """A shard's encoded frames in the order appended: the bytes objects themselves up to
    `limit` bytes (no copy; SpooledTemporaryFile copied them in, then out again), beyond it a
    temporary file."""

    def __init__(self, limit: int):
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0
        self._file = None

    @property
    def in_memory(self) -> bool:
        return self._file is None

    def write(self, data) -> None:
        data = bytes(data)  # a bytes object is kept as it is; a view is copied, as before
        self._size += len(data)
        if self._file is None and self._size > self._limit:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
            for chunk in self._chunks:
                self._file.write(chunk)
            self._chunks = []
        if self._file is None:
            self._chunks.append(data)
        else:
            self._file.write(data)

    def chunks(self) -> Iterator[bytes]:
        if self._file is None:
            yield from self._chunks
            return
        self._file.seek(0)
        while chunk := self._file.read(8 << 20):
            yield chunk

    def close(self) -> None:
        self._chunks = []
        if self._file is not None:
            self._file.close()
