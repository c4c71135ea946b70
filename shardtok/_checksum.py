"""A file's crc32, read in blocks: shared by convert's work units and the index cache."""

from __future__ import annotations

import os
import zlib

BLOCK = 4 << 20


def file_crc32(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            crc = zlib.crc32(block, crc)
    return crc
