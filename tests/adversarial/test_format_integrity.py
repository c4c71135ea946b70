"""Damage never becomes wrong tokens: shard identity, manifest values, the memmap path, the GPT
index cache and resource bombs (declared sizes far beyond the data)."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import zstandard

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError
from shardtok.format import ShardReader, ShardStreamReader
from shardtok.format.manifest import MANIFEST_NAME, load_manifest
from shardtok.format.mmidx import encode_idx
from shardtok.format.tar import BLOCK, MAX_SIZE, encode_header
from shardtok.format.verify import verify_dataset
from shardtok.index.cache import cached_gpt_indices, gpt_indices_cache_key
from shardtok.index.gpt import build_gpt_indices
from shardtok.memmap.samples import GPTSamples
from shardtok.memmap.tokens import open_local_tokens
from tests.adversarial.helpers import KINDS, peak_while, random_tokens, republish, stream_tokens
from tests.helpers.format_data import write_dataset

VOCAB = 5000


def _equal_documents(seed: int, count: int = 6, length: int = 40):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=length) for _ in range(count)]


def _write(folder, docs, compression_level=3, **options):
    # One document per frame; shards of 2 documents, so every shard has the same token count.
    options = {"frame_size": 64, "shard_size": 100, **options}
    return write_dataset(folder, docs, VOCAB, compression_level=compression_level, **options)


def _both_paths_refuse(path, match):
    for read in (stream_tokens, random_tokens):
        with pytest.raises(CorruptShardError, match=match):
            read(path)


def _verify(path):
    source = DatasetSource(path)
    return verify_dataset(
        lambda: source.manifest,
        lambda name: lambda: open(source.path_of(name), "rb"),
        source.where_of,
    )


@pytest.fixture(params=[3, None], ids=["zstd", "uncompressed"])
def level(request):
    return request.param


# -- 4: a shard's identity -------------------------------------------------------------------


def test_swapped_shards_of_equal_token_count_are_refused(tmp_path, level):
    docs = _equal_documents(0)
    manifest = _write(tmp_path / "ds", docs, level)
    assert len({e.num_tokens for e in manifest.shards}) == 1 and len(manifest.shards) == 3
    assert stream_tokens(tmp_path / "ds") == [d.tolist() for d in docs]
    a, b = (tmp_path / "ds" / e.file for e in manifest.shards[:2])
    a.rename(tmp_path / "tmp")
    b.rename(a)
    (tmp_path / "tmp").rename(b)
    _both_paths_refuse(tmp_path / "ds", "not the shard index.json lists")
    assert not _verify(tmp_path / "ds").ok


def test_shard_copied_from_another_dataset_is_refused(tmp_path, level):
    _write(tmp_path / "ds", _equal_documents(0), level)
    _write(tmp_path / "other", _equal_documents(1), level)
    shutil.copyfile(tmp_path / "other" / "shard-000001.tar", tmp_path / "ds" / "shard-000001.tar")
    _both_paths_refuse(tmp_path / "ds", "meta_sha256")
    if level is None:
        with pytest.raises(CorruptShardError, match="meta_sha256"):
            open_local_tokens(tmp_path / "ds")


def _without_meta_sha256(doc):
    for shard in doc["shards"]:
        del shard["meta_sha256"]  # as written by 0.1


@pytest.mark.parametrize("kind", KINDS)
def test_old_manifest_without_meta_sha256_still_streams_and_checks_keys(tmp_path, kind):
    docs = _equal_documents(0)
    _write(tmp_path / "ds", docs)
    republish(tmp_path / "ds", _without_meta_sha256, kind)
    assert all(e.meta_sha256 is None for e in DatasetSource(tmp_path / "ds").manifest.shards)
    assert stream_tokens(tmp_path / "ds") == [d.tolist() for d in docs]
    a, b = tmp_path / "ds" / "shard-000000.tar", tmp_path / "ds" / "shard-000002.tar"
    a.rename(tmp_path / "tmp")
    b.rename(a)
    (tmp_path / "tmp").rename(b)
    _both_paths_refuse(tmp_path / "ds", "the file name its key gives")


@pytest.mark.parametrize(
    "field, value",
    [("dtype", "int32"), ("vocab_size", VOCAB + 1), ("tokenizer", {"fingerprint": "sha256:x"})],
)
@pytest.mark.parametrize("kind", KINDS)
def test_manifest_contradicting_the_shards_is_refused_and_verify_fails(
    tmp_path, field, value, kind
):
    _write(tmp_path / "ds", _equal_documents(0))
    republish(tmp_path / "ds", lambda doc: doc.update({field: value}), kind)
    assert getattr(DatasetSource(tmp_path / "ds").manifest, field) == value  # the lie is read
    _both_paths_refuse(tmp_path / "ds", field)
    report = _verify(tmp_path / "ds")
    assert not report.ok and all(field in s.error for s in report.shards)


# -- 6: manifest values --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda d: d["shards"][1].update(num_tokens=-294), "below 0"),
        (lambda d: d["shards"][1].update(num_tokens=80.0), "not an integer"),
        (lambda d: d["shards"][1].update(bytes="10240"), "not an integer"),
        (lambda d: d["shards"][1].update(num_documents=True), "not an integer"),
        (lambda d: d["shards"][1].update(file="../x/shard-000001.tar"), "plain|file name"),
        (lambda d: d["shards"][1].update(file="s3://bucket/a.tar"), "file name"),
        (lambda d: d["shards"][1].update(file=".hidden.tar"), "file name"),
        (lambda d: d["shards"][1].update(sha256="xyz"), "sha256"),
        (lambda d: d.update(num_tokens=d["num_tokens"] + 1), "add up"),
        (lambda d: d.update(dtype="float32"), "dtype"),
        (lambda d: d.update(vocab_size=0), "vocab_size"),
        (lambda d: d.update(vocab_size=70000), "does not fit uint16"),
        (lambda d: d.update(shards={}), "not a list"),
        (lambda d: d.update(tokenizer=[1]), "tokenizer"),
    ],
)
def test_manifest_values_are_validated_on_load(tmp_path, edit, match):
    _write(tmp_path / "ds", _equal_documents(0))
    doc = json.loads((tmp_path / "ds" / MANIFEST_NAME).read_text())
    edit(doc)
    (tmp_path / "ds" / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(CorruptShardError, match=match):
        load_manifest(tmp_path / "ds")
    assert not _verify(tmp_path / "ds").ok


# -- 7: the memmap path and the GPT index cache --------------------------------------------------


def test_memmap_flipped_byte_is_an_error_naming_shard_and_offset(tmp_path):
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, VOCAB, size=int(n)) for n in rng.integers(50, 400, size=60)]
    manifest = _write(tmp_path / "ds", docs, None, frame_size=2048, shard_size=8192)
    tokens, sizes = open_local_tokens(tmp_path / "ds")
    samples = GPTSamples(tokens, sizes, seq_length=64, seed=1)
    clean = [samples[i].tolist() for i in range(len(samples))]
    entry = manifest.shards[1]
    reader = ShardReader(tmp_path / "ds" / entry.file)
    frame = reader.meta.frames[1]
    at = reader.head.bin_header.data_offset + frame.uncompressed_offset + 7
    with open(tmp_path / "ds" / entry.file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    tokens, sizes = open_local_tokens(tmp_path / "ds")  # opening reads no token bytes
    samples = GPTSamples(tokens, sizes, seq_length=64, seed=1)
    errors = 0
    for i in range(len(samples)):
        try:
            assert samples[i].tolist() == clean[i]
        except CorruptShardError as exc:
            errors += 1
            assert exc.path.endswith(entry.file) and exc.member == f"{reader.meta.key}.bin"
            assert exc.offset == at - 7
    assert errors > 0
    with pytest.raises(CorruptShardError, match="crc32"):
        samples.gather(list(range(len(samples))))


def test_damaged_gpt_index_cache_is_rebuilt_with_a_warning(tmp_path, caplog):
    sizes = np.random.default_rng(0).integers(1, 300, size=500).astype(np.int32)
    inputs = {"sizes": sizes, "seq_length": 128, "num_samples": 900, "seed": 7}
    expected = build_gpt_indices(**inputs)
    cached_gpt_indices(tmp_path, **inputs)
    damaged = tmp_path / f"gpt-{gpt_indices_cache_key(**inputs)}" / "shuffle_index.npy"
    data = bytearray(damaged.read_bytes())
    data[-5] ^= 0x01  # one bit: the arrays still load, one sample repeats, another is lost
    damaged.write_bytes(bytes(data))
    rebuilt = cached_gpt_indices(tmp_path, **inputs)
    warned = [r for r in caplog.records if r.name == "shardtok.index.cache"]
    assert len(warned) == 1 and "shuffle_index.npy" in warned[0].getMessage()
    assert warned[0].levelname == "WARNING"
    for got, want in zip(rebuilt, expected, strict=True):
        np.testing.assert_array_equal(got, want)


# -- 11: resource bombs ----------------------------------------------------------------------------


def _readers(path):
    yield lambda: ShardReader(path)

    def from_file():
        with open(path, "rb") as f:
            return list(ShardStreamReader(f, str(path)).documents())

    yield from_file
    yield lambda: list(ShardStreamReader(io.BytesIO(path.read_bytes()), str(path)).documents())


def test_idx_header_declaring_8_gib_is_refused_without_allocating(tmp_path):
    manifest = _write(tmp_path / "ds", _equal_documents(0), shard_size=1 << 20)
    path = tmp_path / "ds" / manifest.shards[0].file
    reader = ShardReader(path)
    data = bytearray(path.read_bytes())
    at = reader.head.bin_header.header_offset
    idx_offset = BLOCK * (1 + -(-len(reader.meta.to_json_bytes()) // BLOCK))
    data[idx_offset : idx_offset + BLOCK] = encode_header(
        reader.meta.idx_member, MAX_SIZE
    )  # 8 GiB - 1
    assert at > idx_offset
    path.write_bytes(bytes(data))
    for read in _readers(path):
        assert peak_while(lambda read=read: _expect_corrupt(read)) < 16 << 20
    _both_paths_refuse(tmp_path / "ds", "claims")


def _zstd_bomb_dataset(tmp_path, declare_size: bool, kind: str):
    """A shard whose only frame is 64 MiB of zeros compressed to a few KB, listed in the frame
    table with its honest 400 bytes of tokens (the frame header may declare its true size)."""
    docs = [np.arange(200) % VOCAB]
    manifest = _write(tmp_path / "ds", docs, shard_size=1 << 20, frame_size=1 << 20)
    path = tmp_path / "ds" / manifest.shards[0].file
    reader = ShardReader(path)
    bomb = zstandard.ZstdCompressor(
        level=3, write_checksum=True, write_content_size=declare_size
    ).compress(b"\0" * (64 << 20))
    assert len(bomb) < 1 << 16
    # Rebuild the shard around the bomb with a consistent json (the meta_sha256 recomputed).
    frame = reader.meta.frames[0]
    meta = reader.meta.__class__(
        **{
            **{k: getattr(reader.meta, k) for k in reader.meta.__dataclass_fields__},
            "frames": (frame.__class__(0, len(bomb), 0, 0, frame.uncompressed_size, frame.crc32),),
            "read_sha256": None,
        }
    )
    json_bytes = meta.to_json_bytes()
    idx_bytes = encode_idx(np.asarray(reader.head.index.sizes), meta.dtype)
    out = bytearray()
    for name, member in ((meta.json_member, json_bytes), (meta.idx_member, idx_bytes)):
        out += encode_header(name, len(member)) + member + b"\0" * (-len(member) % BLOCK)
    out += encode_header(meta.bin_member, len(bomb)) + bomb + b"\0" * (-len(bomb) % BLOCK)
    out += b"\0" * (2 * BLOCK)
    path.write_bytes(bytes(out))
    republish(  # the manifest agrees with the bomb
        tmp_path / "ds",
        lambda doc: doc["shards"][0].update(bytes=len(out), meta_sha256=meta.sha256),
        kind,
    )
    return path


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("declare_size", [True, False], ids=["declared", "undeclared"])
def test_zstd_bomb_is_refused_without_decoding_it(tmp_path, declare_size, kind):
    path = _zstd_bomb_dataset(tmp_path, declare_size, kind)
    for read in _readers(path):
        assert peak_while(lambda read=read: _expect_corrupt(read)) < 16 << 20
    _both_paths_refuse(tmp_path / "ds", "frame 0")


def _expect_corrupt(read):
    with pytest.raises(CorruptShardError):
        got = read()
        if isinstance(got, (ShardReader, ShardStreamReader)):
            list(got.documents())
