"""index.compact: golden bytes, the same manifest as index.json, range reads, damage named."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError
from shardtok.format import shard_groups
from shardtok.format.compact_manifest import COMPACT_NAME, ShardTable, differences, name_pattern
from shardtok.format.manifest import MANIFEST_NAME, Manifest, ShardEntry

GOLDEN = Path(__file__).parent / "golden"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def golden_manifest() -> Manifest:
    entries = (
        ShardEntry("shard-000000.tar", 10240, 3, 9, sha("a"), sha("ma")),
        ShardEntry("shard-000001.tar", 12288, 2, 7, sha("b"), sha("mb")),
    )
    return Manifest("shard", np.dtype("uint16"), 50000, {"name": "golden"}, entries)


def table_of(path: Path) -> ShardTable:
    data = path.read_bytes()
    return ShardTable(lambda offset, length: data[offset : offset + length], len(data), str(path))


def manifest_of(n: int, *, names=True, masked=False, meta=True) -> Manifest:
    entries = tuple(
        ShardEntry(
            f"shard-{i:06d}.tar" if names else f"part{i * 7 % 11}-{i}.tar",
            1000 + i, 1 + i % 3, 500 + (i * 37) % 101, sha(f"s{i}"),
            sha(f"m{i}") if meta else None, (i * 13) % 400 if masked else None,
        )
        for i in range(n)
    )  # fmt: skip
    sft = {"template": "chat"} if masked else None
    return Manifest("shard", np.dtype("int32"), 70000, {"name": "t"}, entries, {"k": 1}, sft)


def test_golden_bytes_are_what_the_writer_writes_and_the_spec_says(tmp_path):
    golden_manifest().write(tmp_path)
    data = (GOLDEN / "two_shards.index.compact").read_bytes()
    index = (GOLDEN / "two_shards.index.json").read_bytes()
    assert (tmp_path / COMPACT_NAME).read_bytes() == data
    assert (tmp_path / MANIFEST_NAME).read_bytes() == index
    # docs/FORMAT.md, field by field, independent of the module's own struct
    assert data[:8] == b"STKCMAN\x00"
    assert struct.unpack_from("<IIQII", data, 8) == (1, 1, 2, 2, 88)  # version, flags, N, B, W
    assert struct.unpack_from("<QQQQ", data, 32) == (16, 5, 22528, 0)  # totals
    assert data[64:96] == hashlib.sha256(index).digest()
    assert struct.unpack_from("<QII", data, 96) == (len(index), 259, 0)
    meta_size, records_at = 259, struct.unpack_from("<Q", data, 112)[0]
    assert records_at == 392 + 8 * 2 == 408  # 128 + M 8-aligned, then two u64 sums
    meta = json.loads(data[128 : 128 + meta_size])
    assert meta["names"] == {"prefix": "shard-", "first": 0, "width": 6, "suffix": ".tar"}
    assert struct.unpack_from("<QQ", data, 392) == (9, 7)  # group sums (one shard per group)
    (crc,) = struct.unpack_from("<I", data, 124)
    assert crc == zlib.crc32(data[128:records_at], zlib.crc32(data[:124]))
    row = data[records_at : records_at + 88]
    assert struct.unpack_from("<QQQ", row) == (10240, 3, 9)
    assert row[24:56].hex() == sha("a") and row[56:88].hex() == sha("ma")
    assert struct.unpack_from("<I", data, records_at + 88) == (zlib.crc32(row),)
    assert len(data) == records_at + 2 * 88 + 2 * 4
    # The two files name each other: the rows' digest is in the header, the header's (index.json
    # and crc32 bytes zeroed) on index.json's first line
    rows = [data[records_at + g * 92 : records_at + g * 92 + 88] for g in range(2)]
    assert (
        meta["rows_sha256"]
        == hashlib.sha256(b"".join(hashlib.sha256(r).digest() for r in rows)).hexdigest()
    )
    head = bytearray(data[:records_at])
    head[64:104], head[124:128] = bytes(40), bytes(4)
    digest = hashlib.sha256(head).hexdigest()
    assert index.startswith(b'{\n "compact_header_sha256": "' + digest.encode() + b'",\n')

    # 0.3's golden pair, without either digest, is read as 0.3 read it (index.compact trusted
    # beside an index.json of its size)
    old = tmp_path / "0.3"
    old.mkdir()
    for name in (COMPACT_NAME, MANIFEST_NAME):
        (old / name).write_bytes((GOLDEN / f"two_shards_0_3.{name}").read_bytes())
    compact = DatasetSource(old).manifest
    assert isinstance(compact.shards, ShardTable) and list(compact.shards) == list(
        golden_manifest().shards
    )
    index = (old / MANIFEST_NAME).read_bytes()
    assert compact.sha256 == hashlib.sha256(index).hexdigest()
    assert differences(Manifest.from_bytes(index, "x"), index, compact.shards) == []
    assert Manifest.from_bytes(index, "x").to_bytes() == index


@pytest.mark.parametrize(
    ("n", "names", "masked", "meta"),
    [
        (0, True, False, True),
        (1, True, False, False),
        (9, False, True, True),
        (23, True, True, True),
    ],
)
def test_the_compact_manifest_holds_what_index_json_holds(
    tmp_path, monkeypatch, n, names, masked, meta
):
    monkeypatch.setattr(shard_groups, "GROUP_LIMIT", 4)  # groups of several shards
    manifest = manifest_of(n, names=names, masked=masked, meta=meta)
    manifest.write(tmp_path)
    table = table_of(tmp_path / COMPACT_NAME)
    compact = Manifest.from_compact(table)
    assert table.bytes_read <= 64 << 10
    assert compact.num_tokens == manifest.num_tokens and compact.masked == masked
    assert compact.trained_tokens == manifest.trained_tokens
    assert compact.sha256 == hashlib.sha256((tmp_path / MANIFEST_NAME).read_bytes()).hexdigest()
    assert list(compact.group_tokens()) == list(manifest.group_tokens())
    assert list(compact.shards) == list(manifest.shards)
    assert [table.position_of(e.file) for e in manifest.shards] == list(range(n))
    assert table.position_of("shard-999999.tar") is None
    assert table.position_of("shard-0000001.tar") is None  # the pattern's exact spelling only
    assert differences(manifest, (tmp_path / MANIFEST_NAME).read_bytes(), table) == []


def test_names_that_follow_no_pattern_are_stored():
    assert name_pattern(["a-7.tar", "a-8.tar", "a-9.tar", "a-10.tar"]) == {
        "prefix": "a-", "first": 7, "width": 1, "suffix": ".tar"
    }  # fmt: skip
    assert name_pattern(["a-07.tar", "a-09.tar"]) is None
    assert name_pattern(["x.tar"]) is None


def test_a_worker_reads_the_header_and_its_own_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(shard_groups, "GROUP_LIMIT", 64)
    manifest_of(5000).write(tmp_path)
    table = table_of(tmp_path / COMPACT_NAME)
    header = table.bytes_read
    assert table[4321] == manifest_of(5000).shards[4321]
    assert (
        table.bytes_read - header
        == shard_groups.group_size(4321 % 64, 5000, 64) * (table.header.dtype.itemsize) + 4
    )  # one group's rows and its crc


def damaged(tmp_path: Path, offset: int) -> Path:
    path = tmp_path / COMPACT_NAME
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("offset", "message"),
    [
        (0, "offset 0: not a shardtok compact manifest"),
        (8, "offset 8: compact manifest version 0 is not supported"),
        (40, "offset 124: header crc32 mismatch"),  # num_documents
        (140, "offset 124: header crc32 mismatch"),  # the dataset fields' JSON
        (400, "offset 124: header crc32 mismatch"),  # a group sum
        (418, "offset 408: rows of shard group 0: crc32 mismatch"),  # a row
        (408 + 88 + 4 + 17, "offset 500: rows of shard group 1: crc32 mismatch"),
    ],
)
def test_damage_is_one_line_naming_the_file_and_offset(tmp_path, offset, message):
    golden_manifest().write(tmp_path)
    path = damaged(tmp_path, offset)
    with pytest.raises(CorruptShardError) as info:
        list(table_of(path))
    text = str(info.value)
    assert str(path) in text and message.split(": ", 1)[1] in text and "\n" not in text
    assert f"byte offset {message.split(':')[0].split()[-1]}" in text


def test_a_truncated_file_is_refused(tmp_path):
    golden_manifest().write(tmp_path)
    path = tmp_path / COMPACT_NAME
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CorruptShardError, match="file is 589 bytes, its header describes 592"):
        table_of(path)


@pytest.mark.parametrize("size", [0, 100])
def test_a_file_cut_inside_its_fixed_header_is_named_truncated_not_foreign(tmp_path, size):
    golden_manifest().write(tmp_path)
    path = tmp_path / COMPACT_NAME
    path.write_bytes(path.read_bytes()[:size])  # the magic is intact at 100 bytes
    with pytest.raises(CorruptShardError, match=f"file is {size} bytes, shorter than its 128"):
        table_of(path)


def test_an_index_json_edited_without_its_compact_manifest_is_a_difference(tmp_path):
    manifest = golden_manifest()
    manifest.write(tmp_path)
    index = (tmp_path / MANIFEST_NAME).read_bytes().replace(b'"num_tokens": 9', b'"num_tokens": 8')
    edited = Manifest.from_bytes(index.replace(b'"num_tokens": 16', b'"num_tokens": 15'), "x")
    problems = differences(edited, index, table_of(tmp_path / COMPACT_NAME))
    assert "sha256" in problems[0] and "shard 0 (shard-000000.tar) differs" in problems[-1]


def test_os_pread_ranges_read_the_same(tmp_path):
    manifest_of(40).write(tmp_path)
    path = tmp_path / COMPACT_NAME
    with open(path, "rb") as f:
        table = ShardTable(lambda o, n: os.pread(f.fileno(), n, o), path.stat().st_size, "x")
        assert list(table) == list(manifest_of(40).shards)


def test_a_failed_fsync_publishes_neither_manifest_and_leaves_no_temporaries(tmp_path, monkeypatch):
    """Both manifests are written and fsynced (at once) before either is moved into place."""
    from shardtok.format import manifest as manifest_module

    synced = []

    def fsync(path):
        synced.append(Path(path).name)
        if Path(path).name.startswith(f".{COMPACT_NAME}"):
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(manifest_module, "_fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        golden_manifest().write(tmp_path)
    assert sorted(synced) == sorted(
        f".{n}.tmp-{os.getpid()}" for n in (COMPACT_NAME, MANIFEST_NAME)
    )
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    golden_manifest().write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([COMPACT_NAME, MANIFEST_NAME])
