"""``index.compact``: the manifest as columns of integers, read by byte range.

``index.json`` lists every shard; at a million shards it is hundreds of MB that every worker of
every rank would fetch and parse before its first batch. This file holds the same manifest as a
small header (the dataset's fields, totals, one token sum per shard group, checksums) and
fixed-size rows stored group-major (``shard_groups``), so a worker reads the header and the rows
of the groups its own slice touches: two range reads, well under 1 MB at 10^6 shards.

It is written beside ``index.json`` by ``Manifest.write`` (the one manifest writer, through
``compact_writer``), before it, and the two are tied both ways: the header records index.json's
size and sha256, and index.json records the sha256 of this header (``header_digest``) on its
first line, where a worker reads it with the size (one small read instead of a stat), so a
header that lists other shards than index.json is refused without reading index.json whole. The
rows, which a worker reads only in part, are bound to the header by ``rows_sha256`` (checked
whenever every row has been read) and per group by crc32 and the group's token sum.
``shardtok verify`` and ``inspect`` compare the two files row by row. Byte layout:
docs/FORMAT.md ("index.compact").
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from shardtok.errors import CorruptShardError
from shardtok.format.compact_writer import (
    FIXED,
    FLAG_META_SHA256,
    FLAG_NAMES,
    FLAG_TRAINED_TOKENS,
    HEADER_CRC_AT,
    MAGIC,
    VERSION,
    CompactDraft,
    align8,
    compact_bytes,
    header_digest,
    name_pattern,
    pattern_name,
    row_dtype,
    rows_digest_of,
)
from shardtok.format.shard_entry import ShardEntry
from shardtok.format.shard_groups import group_count, group_members, group_size, group_start
from shardtok.format.validate import want_int, want_plain_name, want_sha256, want_str

COMPACT_NAME = "index.compact"
FIRST_READ = 64 << 10  # the fixed header and, for most datasets, everything up to the rows
FIELDS_AT = FIXED.size  # where the dataset fields (JSON) begin
INDEX_SIZE_AT = 96  # FIXED's index_size: the size of the index.json written with this file
NAME_WIDTH_AT = 108
MAX_NAME = 255  # the longest plain file name (validate._PLAIN_NAME)
OWN_NAMES = ("index.json", COMPACT_NAME)  # a manifest never lists itself as a shard
# index.json's first key (sorted keys: it sorts before "dtype"), so its head holds it.
HEADER_DIGEST_KEY = "compact_header_sha256"
INDEX_HEAD = 256  # what a worker reads of index.json: the digest line with room for whitespace
_INDEX_HEAD_DIGEST = re.compile(
    rb'\{\s*"' + HEADER_DIGEST_KEY.encode() + rb'"\s*:\s*"([0-9a-f]{64})"'
)

ReadRange = Callable[[int, int], bytes]


def index_head_digest(head: bytes) -> str | None:
    """The compact header digest that index.json's first bytes record, None when they record
    none (index.json of an earlier release)."""
    match = _INDEX_HEAD_DIGEST.match(head)
    return match.group(1).decode() if match else None


class CompactHeader:
    """The parsed header: counts, flags, the dataset's fields and the group token sums."""

    def __init__(self, read: ReadRange, size: int, where: str):
        self.where = where
        self.bytes_read = 0
        self.first = first = self._read(read, 0, min(size, FIRST_READ))
        if not MAGIC.startswith(first[:8]):
            raise self.fail(0, "not a shardtok compact manifest (bad magic)")
        if len(first) < FIXED.size:  # the magic (what is left of it) is ours: cut short
            raise self.fail(
                size, f"file is {size} bytes, shorter than its {FIXED.size}-byte header"
            )
        (
            _, version, flags, n, groups, row_size, self.num_tokens, self.num_documents,
            self.num_bytes, trained, index_sha, self.index_size, meta_size, name_width,
            records_at, _, crc,
        ) = FIXED.unpack_from(first)  # fmt: skip
        if version != VERSION:
            raise self.fail(
                8, f"compact manifest version {version} is not supported (reads {VERSION})"
            )
        if groups != group_count(n):
            raise self.fail(24, f"{groups} groups for {n} shards (expected {group_count(n)})")
        sums_at = align8(FIXED.size + meta_size)
        if records_at != sums_at + 8 * groups:
            raise self.fail(112, f"rows at offset {records_at}, expected {sums_at + 8 * groups}")
        if flags & ~(FLAG_META_SHA256 | FLAG_TRAINED_TOKENS | FLAG_NAMES):
            raise self.fail(12, f"unknown flags {flags:#x}")
        # Before row_dtype: a width from an untrusted header must not size a numpy dtype.
        widths = (1, MAX_NAME) if flags & FLAG_NAMES else (0, 0)
        if not widths[0] <= name_width <= widths[1]:
            raise self.fail(NAME_WIDTH_AT, f"name width {name_width}, the flags allow {widths}")
        if trained > self.num_tokens or (trained and not flags & FLAG_TRAINED_TOKENS):
            raise self.fail(56, f"{trained} trained tokens of {self.num_tokens}, flags {flags:#x}")
        self.flags, self.num_shards, self.groups, self.records_at = flags, n, groups, records_at
        self.dtype = row_dtype(flags, name_width)
        if row_size != self.dtype.itemsize:
            raise self.fail(28, f"row size {row_size}, the flags give {self.dtype.itemsize}")
        expected = records_at + n * row_size + 4 * groups
        if size != expected:
            raise self.fail(size, f"file is {size} bytes, its header describes {expected}")
        head = first if records_at <= len(first) else first + self._read(
            read, len(first), records_at - len(first)
        )  # fmt: skip
        head = head[:records_at]
        if zlib.crc32(head[FIXED.size :], zlib.crc32(head[:HEADER_CRC_AT])) != crc:
            raise self.fail(HEADER_CRC_AT, "header crc32 mismatch (damaged or truncated)")
        self.trained_tokens = trained if flags & FLAG_TRAINED_TOKENS else None
        self.index_sha256 = index_sha.hex()
        try:  # ValueError: an integer of more digits than Python converts; RecursionError: nesting
            self.meta = json.loads(head[FIXED.size : FIXED.size + meta_size])
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise self.fail(FIELDS_AT, f"dataset fields are not valid JSON ({exc})") from None
        if not isinstance(self.meta, dict):
            raise self.fail(FIELDS_AT, "dataset fields are not a JSON object")
        self.rows_sha256 = self.meta.get("rows_sha256")  # None: written by 0.3
        if self.rows_sha256 is not None:
            want_sha256(self.meta, "rows_sha256", lambda r: self.fail(FIELDS_AT, r))
        self.digest = header_digest(head)
        self.pattern = self.meta.get("names")
        if (self.pattern is None) != bool(flags & FLAG_NAMES) and n:
            raise self.fail(12, "names: the flags and the name pattern disagree")
        if self.pattern is not None:
            self._check_pattern(self.pattern, n)
        sums = np.frombuffer(head, dtype="<u8", count=groups, offset=sums_at)
        # In Python integers: an int64 sum would wrap, and a hostile header could pick sums
        # that wrap to its total (negative token counts for the epoch plan).
        if int(sums.max(initial=0)) >= 1 << 63 or sum(sums.tolist()) != self.num_tokens:
            raise self.fail(sums_at, "group token sums do not add up to the header's num_tokens")
        self.group_tokens = sums.astype(np.int64)

    def _check_pattern(self, pattern, n: int) -> None:
        """The names pattern must make plain file names (validate.is_plain_name) for every
        shard: a prefix such as ``../x/`` or ``http://other/`` would send reads outside the
        dataset. The checks bound width and first before any name is formatted (a width of
        10^9 would build a gigabyte string)."""

        def fail(reason: str) -> CorruptShardError:
            return self.fail(FIELDS_AT, f"names: {reason}")

        if not isinstance(pattern, dict) or set(pattern) != {"prefix", "first", "width", "suffix"}:
            raise fail(f"{pattern!r} is not {{prefix, first, width, suffix}}")
        want_str(pattern, "prefix", fail)
        want_str(pattern, "suffix", fail)
        want_int(pattern, "width", fail, minimum=1, maximum=MAX_NAME)
        if want_int(pattern, "first", fail, minimum=0) >= 10**MAX_NAME:
            raise fail(f"first has more than {MAX_NAME} digits")
        for i in {0, max(n - 1, 0)}:  # the longest name is the last; ".." can only be in a part
            name = pattern_name(pattern, i)
            want_plain_name({"file": name}, "file", lambda r, i=i: fail(f"shard {i}: {r}"))

    def _read(self, read: ReadRange, offset: int, length: int) -> bytes:
        data = read(offset, length)
        self.bytes_read += len(data)
        if len(data) != length:  # the file changed, or a server answered with other bytes
            raise self.fail(offset, f"read {len(data)} bytes of {length} (truncated or changed)")
        return data

    def fail(self, offset: int, reason: str) -> CorruptShardError:
        return CorruptShardError(self.where, None, offset, reason)


class ShardTable(Sequence):
    """A compact manifest's shard entries, fetched a group at a time and kept once read.

    Looks like the tuple of ``ShardEntry`` an index.json gives (``len``, indexing, iteration);
    also knows the totals, group sums and index.json's sha256 without reading any row."""

    def __init__(self, read: ReadRange, size: int, where: str):
        self._read = read
        self.header = h = CompactHeader(read, size, where)
        self.where = where
        self.sums = {
            "num_tokens": h.num_tokens, "num_documents": h.num_documents,
            "bytes": h.num_bytes, "trained_tokens": h.trained_tokens,
        }  # fmt: skip
        self.group_tokens = h.group_tokens
        self.index_sha256 = h.index_sha256
        self._groups: dict[int, list] = {}
        self._group_digests: dict[int, bytes] = {}
        self._positions: dict[str, int] | None = None

    @property
    def bytes_read(self) -> int:
        return self.header.bytes_read

    def __len__(self) -> int:
        return self.header.num_shards

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n, groups = self.header.num_shards, self.header.groups
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"shard {i} of {n}")
        return self.group(i % groups)[i // groups]

    def __iter__(self) -> Iterator:
        self.load_groups(range(self.header.groups))
        n, groups = self.header.num_shards, self.header.groups
        for i in range(n):
            yield self._groups[i % groups][i // groups]

    def file(self, i: int) -> str:
        """Shard i's file name (no read when names follow the header's pattern)."""
        if self.header.pattern is not None:
            return pattern_name(self.header.pattern, i)
        return self[i].file

    def position_of(self, name: str) -> int | None:
        """The index of shard file `name`, or None when the manifest does not list it."""
        pattern = self.header.pattern
        if pattern is not None:
            p, s = pattern["prefix"], pattern["suffix"]
            digits = name[len(p) : len(name) - len(s)] if s else name[len(p) :]
            # isdigit() alone admits "²" and other digits int() refuses or reads differently
            ok = digits.isascii() and digits.isdigit() and len(name) <= MAX_NAME
            if not (ok and name.startswith(p) and name.endswith(s)):
                return None
            i = int(digits) - pattern["first"]
            ok = 0 <= i < len(self) and pattern_name(pattern, i) == name
            return i if ok else None
        if self._positions is None:
            self._positions = {e.file: i for i, e in enumerate(self)}
        return self._positions.get(name)

    def group(self, g: int) -> list:
        if g not in self._groups:
            self.load_groups([g])
        return self._groups[g]

    def load_groups(self, wanted) -> None:
        """Read the groups of `wanted` not read yet, consecutive ones in one range read."""
        missing = sorted(set(wanted) - set(self._groups))
        run: list[int] = []
        for g in missing:
            if run and (g != run[-1] + 1 or len(run) >= 4096):
                self._load_run(run)
                run = []
            run.append(g)
        if run:
            self._load_run(run)

    def _load_run(self, run: list[int]) -> None:
        h = self.header
        n, groups, width = h.num_shards, h.groups, h.dtype.itemsize
        begin = h.records_at + group_start(run[0], n, groups) * width + 4 * run[0]
        last = run[-1]
        end = h.records_at + (group_start(last, n, groups) + group_size(last, n, groups)) * width
        end += 4 * (last + 1)
        if end <= len(h.first):  # a small manifest: the first read held every row
            data = h.first[begin:end]
        else:
            data = h._read(self._read, begin, end - begin)
        at = 0
        loaded, digests = {}, {}
        for g in run:
            count = group_size(g, n, groups)
            record = data[at : at + count * width]
            (crc,) = struct.unpack_from("<I", data, at + count * width)
            if zlib.crc32(record) != crc:
                raise h.fail(begin + at, f"rows of shard group {g}: crc32 mismatch (damaged)")
            rows = np.frombuffer(record, dtype=h.dtype)
            if sum(rows["num_tokens"].tolist()) != h.group_tokens[g]:  # what the plan used
                raise h.fail(begin + at, f"rows of shard group {g}: tokens differ from its sum")
            members = group_members(g, n, groups)
            loaded[g] = [self._entry(int(i), row) for i, row in zip(members, rows)]
            if h.rows_sha256 is not None:
                digests[g] = hashlib.sha256(record).digest()
            at += count * width + 4
        digests.update(self._group_digests)
        # Every row is now known: before any is used, they must be the rows the header (and
        # through it index.json) was written with. Nothing is kept on failure, so every later
        # read refuses too.
        complete = h.rows_sha256 is not None and len(digests) == groups
        if complete and rows_digest_of(digests[g] for g in range(groups)) != h.rows_sha256:
            raise h.fail(h.records_at, "the rows are not the ones rows_sha256 in its header names")
        self._group_digests = digests
        self._groups.update(loaded)

    def _entry(self, i: int, row):
        h = self.header
        flags, n, groups = h.flags, h.num_shards, h.groups
        g = i % groups
        at = h.records_at + (group_start(g, n, groups) + i // groups) * h.dtype.itemsize + 4 * g

        def fail(reason: str) -> CorruptShardError:
            return h.fail(at, f"shard {i}: {reason}")

        if flags & FLAG_NAMES:
            file = bytes(row["name"]).rstrip(b"\0").decode("ascii", "replace")
            want_plain_name({"file": file}, "file", fail)
            if file in OWN_NAMES:
                raise fail(f"{file} is listed as a shard")
        else:
            file = pattern_name(h.pattern, i)
        if flags & FLAG_TRAINED_TOKENS and row["trained_tokens"] > row["num_tokens"]:
            raise fail(f"{int(row['trained_tokens'])} trained tokens of {int(row['num_tokens'])}")
        return ShardEntry(
            file,
            int(row["bytes"]),
            int(row["num_documents"]),
            int(row["num_tokens"]),
            bytes(row["sha256"]).hex(),
            bytes(row["meta_sha256"]).hex() if flags & FLAG_META_SHA256 else None,
            int(row["trained_tokens"]) if flags & FLAG_TRAINED_TOKENS else None,
        )


def differences(index_manifest, index_bytes: bytes, table: ShardTable) -> list[str]:
    """What differs between an index.json (parsed, and its bytes) and a compact manifest: empty
    when they agree on every field and every row."""
    out = []
    h = table.header
    if h.index_size != len(index_bytes):
        out.append(
            f"index.json is {len(index_bytes)} bytes, the compact header records {h.index_size}"
        )
    if h.index_sha256 != hashlib.sha256(index_bytes).hexdigest():
        out.append("index.json's sha256 is not the one the compact header records")
    m = index_manifest
    recorded = index_head_digest(index_bytes[:INDEX_HEAD])  # where a worker finds it
    if recorded is not None and recorded != h.digest:
        out.append(f"index.json's {HEADER_DIGEST_KEY} is not the sha256 of this header")
    elif recorded is None and h.rows_sha256 is not None:
        out.append(f"index.json records no {HEADER_DIGEST_KEY} but this header has rows_sha256")
    fields = {"dtype": m.dtype.name, "extra": m.extra, "name": m.name, "tokenizer": m.tokenizer,
              "vocab_size": m.vocab_size}  # fmt: skip
    if m.masked:
        fields["sft"] = m.sft
    for key, value in fields.items():
        if h.meta.get(key) != value:
            out.append(f"field {key!r} differs")
    if len(m.shards) != len(table):
        out.append(f"{len(m.shards)} shards in index.json, {len(table)} in the compact manifest")
        return out
    try:
        for i, (a, b) in enumerate(zip(m.shards, table)):
            if a != b:
                out.append(f"shard {i} ({a.file}) differs")
                break
    except CorruptShardError as exc:  # the rows are damaged or not the header's
        out.append(exc.reason)
    return out


__all__ = [
    "COMPACT_NAME",
    "CompactHeader",
    "ShardTable",
    "CompactDraft",
    "compact_bytes",
    "differences",
    "header_digest",
    "index_head_digest",
    "name_pattern",
]
