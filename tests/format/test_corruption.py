"""Damage never becomes wrong tokens: every flipped byte or truncation raises CorruptShardError."""

from __future__ import annotations

import numpy as np
import pytest

from shardtok.cli import main
from shardtok.errors import CorruptShardError
from shardtok.format import ShardReader, ShardStreamReader, load_manifest
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.format.tar import BLOCK
from shardtok.storage import open_source
from tests.helpers.format_data import random_documents, write_dataset


def _members(path):
    reader = ShardReader(open_source(path))
    head = reader.head
    json_data = BLOCK
    idx_header = json_data + (len(head.meta.to_json_bytes()) + BLOCK - 1) // BLOCK * BLOCK
    return {
        "json header": 0,
        "json": json_data + 40,
        "idx header": idx_header,
        "idx": idx_header + BLOCK + 30,
        "bin header": head.bin_header.header_offset,
        "bin first frame": head.bin_header.data_offset + 5,
        "bin last frame": head.bin_header.data_offset + head.bin_header.size - 3,
        "end of archive": head.bin_header.end_offset + 10,
    }


def _read_all(path):
    reader = ShardReader(open_source(path))
    out = list(reader.documents())
    with open(path, "rb") as f:
        out += list(ShardStreamReader(f, str(path)).documents())
    return out


@pytest.fixture(params=[3, None], ids=["zstd", "uncompressed"])
def dataset(request, tmp_path):
    docs = random_documents(7, 200, 50_000, mean_log_len=4.5)
    write_dataset(
        tmp_path / "ds",
        docs,
        50_000,
        compression_level=request.param,
        frame_size=8 << 10,
        shard_size=1 << 30,
    )
    return tmp_path / "ds"


@pytest.mark.parametrize(
    "where",
    [
        "json header",
        "json",
        "idx header",
        "idx",
        "bin header",
        "bin first frame",
        "bin last frame",
        "end of archive",
    ],
)
def test_flipped_byte_is_named(dataset, where, capsys):
    (entry,) = load_manifest(dataset).shards
    path = dataset / entry.file
    offset = _members(path)[where]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))
    if where != "end of archive":  # the zero blocks are only read by the sequential path and verify
        with pytest.raises(CorruptShardError) as info:
            _read_all(path)
        assert str(path) in str(info.value)
    assert main(["verify", str(dataset)]) == 1
    assert main(["verify", str(path)]) == 1
    assert "BAD" in capsys.readouterr().out


@pytest.mark.parametrize("keep", [0, 100, 511, 512, 1500, 0.5, 0.99, -1024, -1])
def test_truncation_is_named(dataset, keep):
    (entry,) = load_manifest(dataset).shards
    path = dataset / entry.file
    data = path.read_bytes()
    cut = (
        int(len(data) * keep) if isinstance(keep, float) else keep % len(data) if keep < 0 else keep
    )
    path.write_bytes(data[:cut])
    with pytest.raises(CorruptShardError) as info:
        _read_all(path)
    assert str(path) in str(info.value)
    assert main(["verify", str(dataset), "--quiet"]) == 1


def test_error_names_member_and_offset(dataset):
    (entry,) = load_manifest(dataset).shards
    path = dataset / entry.file
    offset = _members(path)["bin first frame"]
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError) as info:
        list(ShardReader(open_source(path)).documents())
    assert info.value.member is not None and info.value.member.startswith(
        entry.file.removesuffix(".tar") + ".bin"
    )
    assert info.value.offset is not None and info.value.offset <= offset


def test_manifest_disagreeing_with_shard_fails_verify(dataset, capsys):
    manifest_path = dataset / MANIFEST_NAME
    text = manifest_path.read_text()
    (entry,) = load_manifest(dataset).shards
    manifest_path.write_text(
        text.replace(
            f'"num_tokens": {entry.num_tokens}', f'"num_tokens": {entry.num_tokens + 1}', 1
        )
    )
    with pytest.raises(CorruptShardError):  # the totals no longer add up
        load_manifest(dataset)
    assert main(["verify", str(dataset)]) == 1
    manifest_path.write_text(text.replace(entry.sha256, "0" * 64))
    assert main(["verify", str(dataset)]) == 1
    assert "sha256" in capsys.readouterr().out


def test_megatron_pair_damage(tmp_path):
    from shardtok.format import MegatronPair, write_megatron_pair

    write_megatron_pair(tmp_path / "p", [np.arange(10), np.arange(5)], np.uint16)
    (tmp_path / "p.bin").write_bytes((tmp_path / "p.bin").read_bytes()[:-2])
    with pytest.raises(CorruptShardError, match="p.bin"):
        MegatronPair(tmp_path / "p")
    write_megatron_pair(tmp_path / "q", [np.arange(10)], np.uint16)
    idx = bytearray((tmp_path / "q.idx").read_bytes())
    idx[0] = ord("X")
    (tmp_path / "q.idx").write_bytes(bytes(idx))
    with pytest.raises(CorruptShardError, match="magic"):
        MegatronPair(tmp_path / "q")
