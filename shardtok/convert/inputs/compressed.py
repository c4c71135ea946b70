"""Opening .gz and .zst inputs so that a damaged or cut-short file is an error, never less data.

zstandard's stream reader returns a clean end of stream when its source runs out in the middle
of a frame, so a truncated .zst would convert "successfully" without the records after the cut.
Before decoding, the frames are walked (headers and block headers only, a seek per block) and
the file must end exactly where its last frame does. A remote input is read once, as a stream:
the same walk is done on its bytes as they pass to the decoder, and its end is checked before the
decoder sees it, so a cut file fails the same way (its unit persists nothing). gzip raises
EOFError on a cut; both decoders' errors are given the file and the byte offset the read had
reached.
"""

from __future__ import annotations

import io
import os
import struct

from shardtok.convert.inputs.files import InputError

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50


class DamagedInputError(InputError):
    """A compressed or Parquet input is cut short or corrupt: named with a byte offset."""

    def __init__(self, path: str, offset: int | None, reason: str):
        self.path, self.offset, self.reason = str(path), offset, reason
        where = self.path if offset is None else f"{self.path}, byte offset {offset}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.offset, self.reason))


def _cut(path: str, size: int, frame_start: int) -> DamagedInputError:
    return DamagedInputError(
        path,
        size,
        f"the file ends inside the zstd frame that starts at byte {frame_start} "
        "(cut short: the records after the cut would be lost)",
    )


def _not_a_frame(path: str, pos: int) -> DamagedInputError:
    return DamagedInputError(path, pos, "not the start of a zstd frame (corrupt data)")


def check_zstd_frames(path: str) -> None:
    """Raise DamagedInputError unless `path` is a sequence of complete zstd frames."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:

        def cut(frame_start: int) -> DamagedInputError:
            return _cut(path, size, frame_start)

        def need(n: int, frame_start: int) -> bytes:
            data = f.read(n)
            if len(data) < n:
                raise cut(frame_start)
            return data

        pos = 0
        while pos < size:
            f.seek(pos)
            head = f.read(4)
            (magic,) = struct.unpack("<I", head.ljust(4, b"\0"))
            if len(head) == 4 and magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
                (length,) = struct.unpack("<I", need(4, pos))
                if pos + 8 + length > size:
                    raise cut(pos)
                pos += 8 + length
                continue
            if len(head) < 4 or magic != _ZSTD_MAGIC:
                raise _not_a_frame(path, pos)
            fhd = need(1, pos)[0]
            single_segment = (fhd >> 5) & 1
            has_checksum = (fhd >> 2) & 1
            dict_id_size = (0, 1, 2, 4)[fhd & 3]
            content_size_size = (single_segment, 2, 4, 8)[fhd >> 6]
            header_rest = (0 if single_segment else 1) + dict_id_size + content_size_size
            need(header_rest, pos)
            while True:
                (block,) = struct.unpack("<I", need(3, pos) + b"\0")
                last, kind, block_size = block & 1, (block >> 1) & 3, block >> 3
                if kind == 3:
                    raise DamagedInputError(path, f.tell() - 3, "reserved zstd block type")
                skip = 1 if kind == 1 else block_size  # RLE blocks store one byte
                if f.tell() + skip > size:
                    raise cut(pos)
                f.seek(skip, os.SEEK_CUR)
                if last:
                    break
            if has_checksum:
                need(4, pos)
            pos = f.tell()


class _FrameWalk:
    """check_zstd_frames' walk, fed the file's bytes in order instead of seeking through them.

    Each step takes a fixed number of header bytes (`want`); block contents are skipped."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0  # bytes fed so far
        self.frame_start = 0
        self.head = bytearray()
        self.head_start = 0
        self.skip = 0  # content bytes to pass over before the next header
        self.want, self.step = 4, self._magic
        self.has_checksum = False

    def feed(self, data) -> None:
        data = memoryview(data).cast("B")
        i, n = 0, len(data)
        while i < n:
            if self.skip:
                taken = min(self.skip, n - i)
                self.skip -= taken
                i += taken
                continue
            if not self.head:
                self.head_start = self.offset + i
            taken = min(self.want - len(self.head), n - i)
            self.head += data[i : i + taken]
            i += taken
            if len(self.head) == self.want:
                head, self.head = bytes(self.head), bytearray()
                self.step(head)
        self.offset += n

    def finish(self) -> None:
        """At the end of the file: raise unless it ended exactly after a frame."""
        if self.step == self._magic and not self.skip:
            if self.head:  # local: fewer than 4 bytes where a frame should start
                raise _not_a_frame(self.path, self.head_start)
            return
        raise _cut(self.path, self.offset, self.frame_start)

    def _magic(self, head: bytes) -> None:
        self.frame_start = self.head_start
        (magic,) = struct.unpack("<I", head)
        if magic & _SKIPPABLE_MASK == _SKIPPABLE_MAGIC:
            self.want, self.step = 4, self._skippable
        elif magic == _ZSTD_MAGIC:
            self.want, self.step = 1, self._descriptor
        else:
            raise _not_a_frame(self.path, self.frame_start)

    def _skippable(self, head: bytes) -> None:
        (self.skip,) = struct.unpack("<I", head)
        self.want, self.step = 4, self._magic

    def _descriptor(self, head: bytes) -> None:
        fhd = head[0]
        single_segment = (fhd >> 5) & 1
        self.has_checksum = bool((fhd >> 2) & 1)
        dict_id_size = (0, 1, 2, 4)[fhd & 3]
        content_size_size = (single_segment, 2, 4, 8)[fhd >> 6]
        self.skip = (0 if single_segment else 1) + dict_id_size + content_size_size
        self.want, self.step = 3, self._block

    def _block(self, head: bytes) -> None:
        (block,) = struct.unpack("<I", head + b"\0")
        last, kind, block_size = block & 1, (block >> 1) & 3, block >> 3
        if kind == 3:
            raise DamagedInputError(self.path, self.head_start, "reserved zstd block type")
        self.skip = 1 if kind == 1 else block_size  # RLE blocks store one byte
        if last:
            self.skip += 4 if self.has_checksum else 0
            self.want, self.step = 4, self._magic


class _FrameChecked(io.RawIOBase):
    """A remote .zst stream whose frames are walked as its bytes go by (see _FrameWalk)."""

    def __init__(self, path: str, raw):
        self._raw, self._walk = raw, _FrameWalk(path)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._raw.readinto(buffer)
        if n:
            self._walk.feed(memoryview(buffer)[:n])
        elif len(buffer):
            self._walk.finish()  # before the decoder sees the end
        return n

    def tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


class _Guarded(io.RawIOBase):
    """A decoded stream whose decoder errors name the file and how far its bytes were read."""

    def __init__(self, path: str, raw, decoded):
        self._path, self._raw, self._decoded = path, raw, decoded

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            return self._decoded.readinto(buffer)
        except EOFError:
            raise DamagedInputError(
                self._path,
                self._raw.tell(),
                "the file ends inside its gzip stream (cut short: the records after the cut "
                "would be lost)",
            ) from None
        except Exception as exc:  # gzip.BadGzipFile, zlib.error, zstandard.ZstdError
            if isinstance(exc, InputError):
                raise
            raise DamagedInputError(
                self._path, self._raw.tell(), f"corrupt compressed data (read up to here): {exc}"
            ) from None

    def close(self) -> None:
        try:
            self._decoded.close()
        finally:
            self._raw.close()
            super().close()


def open_decompressed(path: str, compression: str, raw=None):
    """A buffered binary stream of the decoded bytes of a "gzip" or "zstd" file.

    `raw`: the file already open (a remote input, read once from its start; closed with the
    returned stream); else `path` is opened."""
    if raw is None:
        if compression == "zstd":
            check_zstd_frames(path)
        raw = open(path, "rb")  # noqa: SIM115 (closed with the returned stream)
    elif compression == "zstd":
        raw = _FrameChecked(path, raw)
    try:
        if compression == "gzip":
            import gzip

            decoded = gzip.GzipFile(fileobj=raw, mode="rb")
        else:
            import zstandard

            decoded = zstandard.ZstdDecompressor().stream_reader(
                raw, read_across_frames=True, closefd=False
            )
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_Guarded(path, raw, decoded), buffer_size=1 << 20)


def open_parquet(path: str, raw=None):
    """pyarrow's ParquetFile, or a one-line error naming the file (pyarrow's own names none).
    `raw`: the file already open (a remote input; the caller keeps it open while reading)."""
    import pyarrow.parquet as pq  # optional dependency: only needed for Parquet inputs

    try:
        return pq.ParquetFile(path if raw is None else raw)
    except OSError as exc:
        if exc.errno is not None:  # a real I/O error (permissions...), not pyarrow's verdict
            raise
        raise DamagedInputError(path, None, f"not a readable Parquet file: {exc}") from None
    except Exception as exc:  # pyarrow.ArrowInvalid and kin: truncated, not Parquet at all
        if type(exc).__module__.split(".")[0] != "pyarrow":
            raise
        raise DamagedInputError(path, None, f"not a readable Parquet file: {exc}") from None
