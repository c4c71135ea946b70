"""Reading shards: sequentially from any byte stream, or by random access, with identical tokens.

Both readers parse the same head (json member, idx member, bin member header) and verify that
json and idx agree before returning a single token; each frame is checked (zstd checksum and
crc32) before its documents are handed out, so damage raises CorruptShardError instead of
turning into wrong tokens.

Loss masks (`<key>.mask[.zst]`, after the bin member) are framed like the tokens, so mask frame
n is read and checked exactly like token frame n. Random access reads both by range. The
sequential reader cannot reach a mask frame in one forward pass without holding the whole bin
member (the mask member comes after it, and the .bin must stay one contiguous member so that
`tar -x` gives Megatron its file); it therefore reads mask frame n by range from a second
source (`mask_source`) while it streams token frame n, so memory stays bounded by one frame of
each. Only a full check (`verify`) reads the mask member from the stream itself, after the bin.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.decode_ahead import DecodeAhead, Pending
from shardtok.format.frame_documents import (
    cut_documents,
    document_slices,
    frame_documents,
    frame_range,
    frame_view,
)
from shardtok.format.frames import FrameDecoder
from shardtok.format.mask_reader import MaskFrames, check_mask_member
from shardtok.format.shard_head import ShardHead, read_head, read_mask_header
from shardtok.format.tar import BLOCK, END_OF_ARCHIVE, decode_header

# Reads from a stream are at most this large, so a size a damaged header declares is never
# allocated up front: memory grows only with the bytes that actually arrive.
READ_CHUNK = 8 << 20
# Frames a reader keeps in flight in its helper thread beyond the one it is cutting
# (``documents(ahead=...)``), by default: each costs one decoded frame of memory.
AHEAD_FRAMES = 2


class RangeSource(Protocol):
    """What random access needs: a size and exact range reads. The caller opens it (for a
    path or URL, ``shardtok.storage.open_source``): this layer never decides where bytes live."""

    @property
    def size(self) -> int: ...

    def read_range(self, offset: int, length: int) -> bytes: ...


class PathSource:
    """A local file path as a ``RangeSource``, for ``ShardReader(path)``.

    Only a plain path: where bytes live (``file://``, URLs, percent-decoding, caching) is decided
    in ``shardtok.storage.location``, which this layer does not import."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        if "://" in self.path:
            raise ValueError(
                f"{self.path}: a URL, not a local path; open it with "
                "shardtok.storage.open_source(url) and pass that"
            )
        self._file = open(self.path, "rb")  # noqa: SIM115 - kept open; missing: the OS error
        self.size = os.fstat(self._file.fileno()).st_size

    def read_range(self, offset: int, length: int) -> bytes:
        return os.pread(self._file.fileno(), length, offset)  # no shared file offset to move

    def __getstate__(self) -> dict:
        return {"path": self.path}  # an open file does not cross processes: reopen by path

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def read_source_head(source: RangeSource, where: str) -> ShardHead:
    """``read_head`` over a RangeSource; reads past the end come back short, so a truncated
    file is reported as a corrupt shard rather than as a failed read."""
    size = source.size

    def read_upto(offset: int, n: int) -> bytes:
        return source.read_range(offset, max(0, min(n, size - offset)))

    return read_head(read_upto, where, size)


class ShardReader:
    """Random access to the documents of one shard, reading only the frames it needs."""

    def __init__(self, source: RangeSource | str | os.PathLike, name: str | None = None):
        """`source`: a local file path, or any ``RangeSource`` (for a URL or a cached file,
        ``shardtok.storage.open_source(url)``)."""
        if isinstance(source, (str, os.PathLike)):
            source = PathSource(source)
        self.source = source
        self.where = name or str(
            getattr(self.source, "path", None) or getattr(self.source, "url", "shard")
        )
        head = read_source_head(self.source, self.where)
        self.head = head
        self.meta = head.meta
        self.sizes = head.index.sizes
        self.offsets = head.offsets
        last = head.bin_header
        self._mask = None
        if self.meta.mask is not None:
            size = self.source.size
            last = read_mask_header(
                lambda o, n: self.source.read_range(o, max(0, min(n, size - o))),
                head,
                self.where,
                size,
            )
            self._mask = MaskFrames(head, last, self.where)
        end = last.end_offset + len(END_OF_ARCHIVE)
        if self.source.size < end:
            raise CorruptShardError(
                self.where,
                last.name,
                self.source.size,
                f"truncated tar: {self.source.size} bytes, at least {end} expected",
            )
        self._decoder = FrameDecoder(
            self.meta.compressed, self.where, head.bin_header.name, head.bin_header.data_offset
        )
        self._cached: tuple[int, bytes] | None = None

    def __len__(self) -> int:
        return self.meta.num_documents

    def _frame_bytes(self, frame_no: int) -> bytes:
        if self._cached is not None and self._cached[0] == frame_no:
            return self._cached[1]
        frame = self.meta.frames[frame_no]
        stored = self.source.read_range(
            self.head.bin_header.data_offset + frame.compressed_offset, frame.compressed_size
        )
        raw = self._decoder.decode(frame, stored, frame_no)
        self._cached = (frame_no, raw)
        return raw

    def document(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(
                f"document {i} out of range for {self.where} with {len(self)} documents"
            )
        (frame_no,) = frame_range(self.meta, i, i + 1)
        return document_slices(self.head, frame_no, self._frame_bytes(frame_no), i, i + 1)[0]

    def document_mask(self, i: int) -> np.ndarray:
        """Document i's loss mask (uint8 0/1, one per token)."""
        mask = self._need_mask()
        if not 0 <= i < len(self):
            raise IndexError(
                f"document {i} out of range for {self.where} with {len(self)} documents"
            )
        (frame_no,) = frame_range(self.meta, i, i + 1)
        return document_slices(
            self.head, frame_no, mask.frame(self.source, frame_no), i, i + 1, np.uint8
        )[0]

    def documents(
        self, start: int = 0, stop: int | None = None, *, with_masks: bool = False
    ) -> Iterator:
        """Documents [start, stop); with_masks: (tokens, mask) pairs."""
        stop = len(self) if stop is None else min(stop, len(self))
        mask = self._need_mask() if with_masks else None
        for frame_no in frame_range(self.meta, start, stop):
            raw = self._frame_bytes(frame_no)
            yield from frame_documents(self.head, frame_no, raw, mask, self.source, start, stop)

    def _need_mask(self) -> MaskFrames:
        if self._mask is None:
            raise ValueError(f"{self.where}: this shard has no loss masks")
        return self._mask

    def memmap_tokens(self) -> np.ndarray:
        """All tokens as a zero-copy memmap of the uncompressed bin member (local files only)."""
        path = getattr(self.source, "path", None)
        if self.meta.compressed or path is None:
            raise ValueError(f"{self.where}: memmap needs an uncompressed shard on local disk")
        if self.meta.num_tokens == 0:
            return np.empty(0, dtype=self.meta.dtype)
        return np.memmap(
            path,
            dtype=self.meta.dtype,
            mode="r",
            offset=self.head.bin_header.data_offset,
            shape=(self.meta.num_tokens,),
        )

    def memmap_mask(self) -> np.ndarray:
        """The loss mask as a zero-copy memmap of the uncompressed mask member (one uint8 per
        token, local files only); nothing is checked here (the memmap path checks each frame's
        crc32 and values on first touch)."""
        mask = self._need_mask()
        path = getattr(self.source, "path", None)
        if self.meta.compressed or path is None:
            raise ValueError(f"{self.where}: memmap needs an uncompressed shard on local disk")
        if self.meta.num_tokens == 0:
            return np.empty(0, dtype=np.uint8)
        return np.memmap(
            path,
            dtype=np.uint8,
            mode="r",
            offset=mask.header.data_offset,
            shape=(self.meta.num_tokens,),
        )


class ShardStreamReader:
    """Reads a shard front to back from a non-seekable stream; memory is bounded by one frame.

    Every frame is checked before its documents are handed out (zstd content checksum, or crc32
    for uncompressed frames). `full_checks=True` (what `shardtok verify` uses) also checks the
    crc32 of compressed frames and, when the whole shard is read, the .bin sha256 and the end of
    the archive: redundant for token safety, and about a third of the decoding cost.
    """

    def __init__(
        self,
        stream,
        name: str,
        *,
        full_checks: bool = False,
        size: int | None = None,
        mask_source: RangeSource | None = None,
    ):
        """`size`: the shard's size when known (the manifest's `bytes`); member headers that
        claim more are refused before they are read. `mask_source`: range reads of the same
        shard file, needed only for ``documents(with_masks=True)`` (see the module docstring)."""
        self._stream = stream
        self._size = size
        self.mask_source = mask_source
        self.where = name
        self.full_checks = full_checks
        self._position = 0
        self.head = read_head(self._read_at, name, size)
        self.meta = self.head.meta
        self.sizes = self.head.index.sizes
        self.offsets = self.head.offsets
        self._decoder = FrameDecoder(
            self.meta.compressed,
            name,
            self.head.bin_header.name,
            self.head.bin_header.data_offset,
            full_checks,
        )
        self._consumed = False
        # Frames being read ahead (decode_ahead), in order, and how many were asked for.
        self._pending: deque[Pending] = deque()
        self._submitted = 0

    def _read_at(self, offset: int, n: int) -> bytes:
        """Read n bytes at `offset`; the bytes skipped to get there are tar padding and must be zero."""
        if offset < self._position:
            raise RuntimeError("a stream can only be read forward")
        gap_start = self._position
        gap = self._read(offset - gap_start)
        if len(gap) != offset - gap_start:
            raise CorruptShardError(
                self.where, None, self._position, "truncated tar: stream ended early"
            )
        if gap.count(0) != len(gap):
            first = gap_start + len(gap) - len(gap.lstrip(b"\0"))
            raise CorruptShardError(self.where, None, first, "non-zero bytes in tar padding")
        return self._read(n)

    def _read(self, n: int) -> bytes:
        parts, remaining = [], n
        while remaining:
            chunk = self._stream.read(min(remaining, READ_CHUNK))
            if not chunk:
                break
            parts.append(chunk)
            remaining -= len(chunk)
        data = b"".join(parts) if len(parts) != 1 else parts[0]
        self._position += len(data)
        return data

    def _discard(self, n: int) -> None:
        """Skip n bytes of frames we do not decode, in bounded chunks."""
        while n > 0:
            got = self._read(min(n, 8 << 20))
            if not got:
                raise CorruptShardError(
                    self.where, None, self._position, "truncated tar: stream ended early"
                )
            n -= len(got)

    def _open_masks(self) -> MaskFrames:
        if self.meta.mask is None:
            raise ValueError(f"{self.where}: this shard has no loss masks")
        if self.mask_source is None:
            raise ValueError(
                f"{self.where}: reading masks from a stream needs mask_source, range reads of "
                "the same shard (the mask member follows the whole bin member)"
            )
        source = self.mask_source
        size = source.size if self._size is None else min(self._size, source.size)

        def read_upto(offset: int, n: int) -> bytes:
            return source.read_range(offset, max(0, min(n, size - offset)))

        header = read_mask_header(read_upto, self.head, self.where, size)
        return MaskFrames(self.head, header, self.where, self.full_checks)

    def documents(self, start: int = 0, stop: int | None = None, **options) -> Iterator:
        """Yield documents [start, stop) one at a time: ``document_runs``'s, same options."""
        runs = self.document_runs(start, stop, **options)
        try:
            for run in runs:
                yield from run
        finally:
            runs.close()

    def document_runs(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        with_masks: bool = False,
        combine=None,
        ahead: DecodeAhead | None = None,
        ahead_frames: int = AHEAD_FRAMES,
    ) -> Iterator[list]:
        """The documents [start, stop) (with_masks: (tokens, mask) pairs), one list per frame:
        those that begin in it (a stream reader takes them in runs, without a Python step per
        document). With full_checks, a whole-shard read also checks bin_sha256, the mask member
        and the archive end.

        `combine` (with masks): a function of a frame's (tokens, mask) arrays returning one
        array, applied once per frame; the documents are then slices of what it returns (the
        stream keeps masks as flag bits of the tokens this way: one pass per frame). Its
        tokens are writable where the reader decoded them into a buffer of their own for it
        (not with full_checks, which hashes them afterwards): it may then write its result
        over them.

        `ahead`: a helper thread that decodes and combines the next `ahead_frames` frames
        (their compressed bytes are read, and their mask frames decoded, here) while frame n's
        documents are handed out (``decode_ahead``); same documents, and a frame that does not
        decode fails at the same document (a read error can come up to `ahead_frames` frames
        earlier). ``settle()`` waits for the thread's frames before the stream is closed."""
        masks = self._open_masks() if with_masks else None
        if self._consumed:
            raise RuntimeError(f"{self.where}: a stream reader yields its documents once")
        self._consumed = True
        meta = self.meta
        stop = meta.num_documents if stop is None else min(stop, meta.num_documents)
        whole = start == 0 and stop == meta.num_documents
        bin_hash = hashlib.sha256() if whole and self.full_checks else None
        frames = frame_range(meta, start, stop)
        head = self.head
        try:
            for i, frame_no in enumerate(frames):
                if ahead is None:
                    raw, view = self._load_frame(frame_no, masks, combine, i == 0)
                else:
                    pending = self._pending
                    while len(pending) <= ahead_frames and self._submitted < len(frames):
                        n = self._submitted
                        # Read here, decoded there: the helper then needs the GIL once per
                        # frame (after decompressing), not once more after each read. A mask
                        # frame is read and decoded here too: in the helper its read, its
                        # decompression and its check each gave the GIL back and waited to
                        # retake it from this busy thread, idling the helper's core.
                        stored = self._read_frame(frames[n], n == 0)
                        bits = self._mask_bits(masks, frames[n])
                        pending.append(
                            ahead.submit(self._decode_frame, frames[n], stored, bits, combine)
                        )
                        self._submitted += 1
                    raw, view = pending.popleft().result()
                if bin_hash is not None:
                    bin_hash.update(raw)
                del raw
                yield cut_documents(head, frame_no, view, start, stop)
        finally:
            self.settle()
        if bin_hash is not None:
            if bin_hash.hexdigest() != meta.bin_sha256:
                bin_header = head.bin_header
                raise CorruptShardError(
                    self.where,
                    bin_header.name,
                    bin_header.data_offset,
                    "token bytes do not match bin_sha256",
                )
            self._check_end()

    def _load_frame(self, frame_no: int, masks: MaskFrames | None, combine, first: bool):
        """Frame `frame_no` read (the `first` one wanted: after skipping the frames before
        it), decoded, checked, and as the array its documents are cut from: (raw, view)."""
        stored = self._read_frame(frame_no, first)
        return self._decode_frame(frame_no, stored, self._mask_bits(masks, frame_no), combine)

    def _read_frame(self, frame_no: int, first: bool) -> bytes:
        offset = self.head.bin_header.data_offset + self.meta.frames[frame_no].compressed_offset
        if first:
            self._discard(offset - self._position)
        return self._read_at(offset, self.meta.frames[frame_no].compressed_size)

    def _mask_bits(self, masks: MaskFrames | None, frame_no: int):
        """Mask frame `frame_no` decoded and checked (None without masks), or the
        CorruptShardError it raised, for `_decode_frame` to raise after the token frame's own
        checks: a damaged frame fails at the same document, whichever thread decodes it."""
        if masks is None:
            return None
        try:
            return masks.frame(self.mask_source, frame_no)
        except CorruptShardError as exc:
            return exc

    def _decode_frame(self, frame_no: int, stored: bytes, bits, combine):
        # `combine` may write over writable tokens; full_checks hashes them after it.
        writable = combine is not None and not self.full_checks
        raw = self._decoder.decode(self.meta.frames[frame_no], stored, frame_no, writable)
        if isinstance(bits, CorruptShardError):
            raise bits
        return raw, frame_view(self.head, raw, bits=bits, combine=combine)

    def settle(self) -> None:
        """Wait until no frame of this reader is being read in a helper thread (before its
        stream is closed); a frame read ahead and never used is dropped, errors included."""
        while self._pending:
            self._pending.popleft().wait()

    def _check_end(self) -> None:
        offset = self.head.bin_header.end_offset
        if self.meta.mask is not None:
            header = read_mask_header(self._read_at, self.head, self.where, self._size)
            check_mask_member(self._read_at, self.head, header, self.where)
            offset = header.end_offset
        while True:
            header = decode_header(self._read_at(offset, BLOCK), offset, self.where)
            if header is None:
                break
            offset = header.end_offset  # side arrays: skipped by the token reader
        if self._read_at(offset + BLOCK, BLOCK) != b"\0" * BLOCK:
            raise CorruptShardError(
                self.where, None, offset + BLOCK, "archive does not end with two zero blocks"
            )


__all__ = [
    "RangeSource",
    "ShardHead",
    "ShardReader",
    "ShardStreamReader",
    "read_head",
    "read_source_head",
]
