"""The head of a shard: json member, idx member and the bin member's header.

Both readers parse it the same way. Every size a header declares is compared with what is
already known (the file's size, the json's document count) before anything is read for it, so
a damaged or hostile header cannot make a reader allocate more than the file holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.mmidx import MMIndex, decode_idx, idx_nbytes
from shardtok.format.shard_meta import ShardMeta, check_against_index
from shardtok.format.tar import BLOCK, MemberHeader, decode_header

MAX_JSON_BYTES = 64 << 20


@dataclass(frozen=True)
class ShardHead:
    meta: ShardMeta
    index: MMIndex
    bin_header: MemberHeader

    @property
    def offsets(self) -> np.ndarray:
        """Token offset of each document, plus the total (int64[D + 1])."""
        out = np.zeros(self.meta.num_documents + 1, dtype=np.int64)
        np.cumsum(self.index.sizes, out=out[1:])
        return out


def read_head(
    read_exact: Callable[[int, int], bytes], where: str, size: int | None = None
) -> ShardHead:
    """Parse json, idx and the bin header; `read_exact(offset, n)` returns n bytes or fewer at EOF.

    `size`, when known, is the file's size (or what the manifest says it is): a member header
    declaring more than that is refused before anything is read or allocated for it."""

    def member(offset: int, expected_suffix: tuple[str, ...]) -> MemberHeader:
        header = decode_header(read_exact(offset, BLOCK), offset, where)
        if header is None:
            raise CorruptShardError(
                where,
                None,
                offset,
                f"archive ends where a {expected_suffix[0]} member was expected",
            )
        if not header.name.endswith(expected_suffix):
            raise CorruptShardError(
                where, header.name, offset, f"expected a {' or '.join(expected_suffix)} member here"
            )
        if size is not None and header.data_offset + header.size > size:
            raise CorruptShardError(
                where,
                header.name,
                offset + 124,
                f"member claims {header.size} bytes, past the end of the {size}-byte file",
            )
        return header

    json_header = member(0, (".json",))
    if json_header.size > MAX_JSON_BYTES:
        raise CorruptShardError(
            where, json_header.name, 124, f"metadata member claims {json_header.size} bytes"
        )
    json_data = _exact(
        read_exact, json_header.data_offset, json_header.size, where, json_header.name
    )
    meta = ShardMeta.from_json_bytes(json_data, where, json_header.name, json_header.data_offset)
    if json_header.name != meta.json_member:
        raise CorruptShardError(
            where, json_header.name, 0, f"member name does not match key {meta.key!r}"
        )

    idx_header = member(json_header.end_offset, (".idx",))
    if idx_header.name != meta.idx_member:
        raise CorruptShardError(
            where, idx_header.name, idx_header.header_offset, f"expected member {meta.idx_member}"
        )
    # The json (already verified) fixes the idx size; a larger header is refused unread.
    idx_size = idx_nbytes(meta.num_documents)
    if idx_header.size != idx_size:
        raise CorruptShardError(
            where,
            idx_header.name,
            idx_header.header_offset + 124,
            f"member claims {idx_header.size} bytes, {meta.num_documents} documents need {idx_size}",
        )
    idx_data = _exact(read_exact, idx_header.data_offset, idx_header.size, where, idx_header.name)
    if hashlib.sha256(idx_data).hexdigest() != meta.idx_sha256:
        raise CorruptShardError(
            where,
            idx_header.name,
            idx_header.data_offset,
            "index sha256 does not match the metadata",
        )
    index = decode_idx(idx_data, where, idx_header.name)
    check_against_index(meta, index, where, idx_header.name, idx_header.data_offset)

    bin_header = member(idx_header.end_offset, (".bin", ".bin.zst"))
    if bin_header.name != meta.bin_member:
        raise CorruptShardError(
            where, bin_header.name, bin_header.header_offset, f"expected member {meta.bin_member}"
        )
    if bin_header.size != meta.stored_bin_nbytes:
        raise CorruptShardError(
            where,
            bin_header.name,
            bin_header.header_offset,
            f"member holds {bin_header.size} bytes, frame table says {meta.stored_bin_nbytes}",
        )
    return ShardHead(meta, index, bin_header)


def _exact(read_exact, offset: int, n: int, where: str, member: str) -> bytes:
    data = read_exact(offset, n)
    if len(data) != n:
        raise CorruptShardError(
            where, member, offset + len(data), f"truncated: {len(data)} of {n} bytes"
        )
    return data


def read_mask_header(
    read_exact: Callable[[int, int], bytes], head: ShardHead, where: str, size: int | None = None
) -> MemberHeader:
    """The mask member's header, right after the bin member, checked against the json's mask
    section (name, and size = the mask frame table's total) before anything is read for it."""
    meta, offset = head.meta, head.bin_header.end_offset
    header = decode_header(read_exact(offset, BLOCK), offset, where)
    if header is None or header.name != meta.mask.member:
        raise CorruptShardError(
            where,
            None if header is None else header.name,
            offset,
            f"expected member {meta.mask.member} here",
        )
    if header.size != meta.mask.stored_nbytes or (
        size is not None and header.data_offset + header.size > size
    ):
        raise CorruptShardError(
            where,
            header.name,
            offset + 124,
            f"member claims {header.size} bytes, the mask frame table says "
            f"{meta.mask.stored_nbytes} (file: {size} bytes)",
        )
    return header
