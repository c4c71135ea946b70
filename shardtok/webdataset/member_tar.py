"""The shard a grouped WebDataset sample stands for, laid out again as the tar shardtok writes.

``wds.WebDataset`` parses the tar itself and hands on one dict per key: ``{"json": bytes, "idx":
bytes, "bin.zst": bytes, ...}`` in member order. Rather than check those blobs with a second,
diverging copy of the reader's rules, :class:`MemberTar` puts them back where a shardtok shard
keeps them (a header block, the data, zero padding; two zero blocks at the end) and serves that
layout as a forward stream and as range reads, so the native ``ShardStreamReader`` runs on it
unchanged. Nothing is copied up front: reads slice the blobs, one frame at a time.
"""

from __future__ import annotations

import bisect

from shardtok.errors import CorruptShardError
from shardtok.format.tar import END_OF_ARCHIVE, encode_header, padding


def sample_members(sample: dict, where: str) -> list[tuple[str, bytes]]:
    """(member name, data) of a grouped sample, in the order the tar held them.

    WebDataset's grouping keeps that order in the dict and names each value by the member's
    extension after the key (``shard-000003.bin.zst`` -> ``bin.zst``); ``__key__``-style
    entries are its own metadata, not members."""
    key = sample.get("__key__")
    if not isinstance(key, str):
        raise CorruptShardError(where, None, None, "sample has no __key__: not a grouped tar")
    members = []
    for suffix, data in sample.items():
        if suffix.startswith("__"):
            continue
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise CorruptShardError(
                where,
                f"{key}.{suffix}",
                None,
                f"holds a {type(data).__name__}, not the member's bytes: compose "
                "shardtok.webdataset.documents() right after WebDataset's grouping, before "
                ".decode() or .map()",
            )
        members.append((f"{key}.{suffix}", data))
    return members


class MemberTar:
    """Members as one shard file: ``size``, ``read_range(offset, n)`` and a forward
    ``stream()``; a member name the format cannot hold is a ``CorruptShardError``."""

    def __init__(self, members: list[tuple[str, bytes]], where: str):
        self.where = where
        self._starts: list[int] = []
        self._pieces: list[memoryview | None] = []  # None: that many zero bytes
        self._lengths: list[int] = []
        for name, data in members:
            try:
                header = encode_header(name, len(data))
            except ValueError as exc:
                raise CorruptShardError(
                    where, name, None, f"not a shardtok member: {exc}"
                ) from None
            self._add(memoryview(header))
            self._add(memoryview(data).cast("B"))
            self._add(None, padding(len(data)))
        self._add(None, len(END_OF_ARCHIVE))
        self.size = self._starts[-1] + self._lengths[-1] if self._starts else 0

    def _add(self, piece: memoryview | None, length: int | None = None) -> None:
        length = len(piece) if piece is not None else length
        if not length:
            return
        start = self._starts[-1] + self._lengths[-1] if self._starts else 0
        self._starts.append(start)
        self._pieces.append(piece)
        self._lengths.append(length)

    def read_range(self, offset: int, length: int) -> bytes:
        """Up to `length` bytes at `offset` (fewer at the end, like a file)."""
        end = min(offset + length, self.size)
        parts = []
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while offset < end:
            start, piece, n = self._starts[i], self._pieces[i], self._lengths[i]
            stop = min(end, start + n)
            if piece is None:
                parts.append(bytes(stop - offset))
            else:
                parts.append(piece[offset - start : stop - start])
            offset = stop
            i += 1
        return b"".join(parts)

    def stream(self) -> MemberStream:
        return MemberStream(self)


class MemberStream:
    """A forward reader over a ``MemberTar``: what ``ShardStreamReader`` reads from."""

    def __init__(self, tar: MemberTar):
        self._tar = tar
        self._position = 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._tar.size - self._position
        data = self._tar.read_range(self._position, n)
        self._position += len(data)
        return data


__all__ = ["MemberStream", "MemberTar", "sample_members"]
