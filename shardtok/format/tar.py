"""The deterministic subset of POSIX ustar that shard files use.

We write the headers ourselves rather than through :mod:`tarfile` or webdataset's TarWriter:
both add PAX headers or pad to a 10 KiB record, and we want every byte pinned by the spec
(docs/FORMAT.md) so that identical documents always give identical shards.

A member is a 512-byte header followed by its data, zero-padded to a multiple of 512 bytes.
The archive ends with two zero blocks and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardtok.errors import CorruptShardError

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MEMBER_MODE = 0o644
MAX_NAME = 100  # ustar name field; we never use the prefix field or long-name extensions
MAX_SIZE = 8**11 - 1  # 11 octal digits


def padding(size: int) -> int:
    """Zero bytes that follow `size` bytes of member data."""
    return -size % BLOCK


def encode_header(name: str, size: int) -> bytes:
    """A ustar header for a regular file with every variable field fixed (mtime/uid/gid 0)."""
    raw_name = name.encode("ascii")
    if not 0 < len(raw_name) <= MAX_NAME or "/" in name:
        raise ValueError(f"member name {name!r} must be 1..{MAX_NAME} ASCII bytes without '/'")
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(
            f"member {name!r} is {size} bytes; ustar members are limited to {MAX_SIZE}"
        )
    header = bytearray(BLOCK)
    header[0 : len(raw_name)] = raw_name
    header[100:108] = b"%07o\0" % MEMBER_MODE
    header[108:116] = b"%07o\0" % 0  # uid
    header[116:124] = b"%07o\0" % 0  # gid
    header[124:136] = b"%011o\0" % size
    header[136:148] = b"%011o\0" % 0  # mtime
    header[148:156] = b" " * 8  # checksum is computed with this field as spaces
    header[156:157] = b"0"  # regular file
    header[257:263] = b"ustar\0"
    header[263:265] = b"00"
    header[329:337] = b"%07o\0" % 0  # devmajor
    header[337:345] = b"%07o\0" % 0  # devminor
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


@dataclass(frozen=True)
class MemberHeader:
    name: str
    size: int
    header_offset: int  # where the 512-byte header starts in the tar

    @property
    def data_offset(self) -> int:
        return self.header_offset + BLOCK

    @property
    def end_offset(self) -> int:
        """Offset of the next header."""
        return self.data_offset + self.size + padding(self.size)


def decode_header(block: bytes, offset: int, where: str) -> MemberHeader | None:
    """Parse one header block; None for the end-of-archive zero block."""
    if len(block) < BLOCK:
        raise CorruptShardError(
            where, None, offset, f"truncated tar: {len(block)} of {BLOCK} header bytes"
        )
    if block == b"\0" * BLOCK:
        return None
    # Until the checksum and the magic match, these 512 bytes may be any file at all (a shard
    # path that leads to someone else's file): messages name offsets and what is wrong, and
    # never quote the bytes, not even the digits of a checksum field.
    stored = _octal(block[148:156], offset + 148, where, "checksum")
    computed = sum(block[:148]) + 8 * 0x20 + sum(block[156:BLOCK])
    if stored != computed:
        raise CorruptShardError(
            where, None, offset, "not a tar header: its checksum does not match its 512 bytes"
        )
    if block[257:263] != b"ustar\0":
        raise CorruptShardError(where, None, offset + 257, "not a POSIX ustar header")
    if block[156:157] not in (b"0", b"\0"):
        kind = _MEMBER_TYPES.get(block[156:157], "of a type ustar does not define")
        raise CorruptShardError(where, None, offset + 156, f"member is {kind}, not a regular file")
    raw_name = block[0:100].split(b"\0", 1)[0]
    if not raw_name or b"/" in raw_name or not all(0x20 <= c < 0x7F for c in raw_name):
        raise CorruptShardError(
            where,
            None,
            offset,
            f"member name ({len(raw_name)} bytes) is not 1-{MAX_NAME} printable ASCII bytes "
            "without '/'",
        )
    name = raw_name.decode("ascii")
    if block[345:346] != b"\0":
        raise CorruptShardError(
            where, name, offset + 345, "ustar name prefix is not used by shardtok shards"
        )
    size = _octal(block[124:136], offset + 124, where, "size")
    return MemberHeader(name, size, offset)


def _octal(field: bytes, offset: int, where: str, what: str) -> int:
    text = field.replace(b"\0", b" ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise CorruptShardError(
            where, None, offset, f"tar header {what} field ({len(field)} bytes) is not octal"
        ) from None


# Named from this fixed list only, so a type byte is never echoed.
_MEMBER_TYPES = {
    b"1": "a hard link",
    b"2": "a symbolic link",
    b"3": "a character device",
    b"4": "a block device",
    b"5": "a directory",
    b"6": "a FIFO",
    b"7": "a contiguous file",
    b"g": "a pax global header",
    b"x": "a pax extended header",
    b"L": "a GNU long name",
    b"K": "a GNU long link name",
}
