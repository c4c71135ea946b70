"""Loss masks (`<key>.mask[.zst]`): every read path, verify, inspect, export --mask, golden bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardtok.dataset.source import DatasetSource
from shardtok.errors import CorruptShardError
from shardtok.format.dataset_writer import DatasetWriter
from shardtok.format.frames import FrameBuilder
from shardtok.format.manifest import Manifest, load_manifest
from shardtok.format.megatron_io import export_megatron
from shardtok.format.shard_reader import PathSource, ShardReader, ShardStreamReader
from shardtok.format.shard_writer import ShardBuilder
from shardtok.format.verify import verify_shard

GOLDEN = Path(__file__).parent / "golden"
THREE_DOCS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
THREE_MASKS = [[0, 1, 1], [1, 0, 0, 1], [0, 0]]


def build_three_masked(path: Path) -> Path:
    """Writes tests/format/golden/three_docs_masked.tar (uncompressed: zstd's bytes depend on
    the library version, the uncompressed layout only on the spec)."""
    builder = ShardBuilder(
        "three",
        np.dtype(np.uint16),
        10,
        None,
        tokenizer={"name": "letters", "fingerprint": "sha256:none", "eos_id": None, "bos_id": None},
        masked=True,
    )
    for i, (doc, mask) in enumerate(zip(THREE_DOCS, THREE_MASKS)):
        builder.add(np.array(doc), ("letters.txt", i), np.array(mask))
    builder.write(path)
    return path


def test_masked_shard_is_byte_identical_to_golden(tmp_path):
    path = build_three_masked(tmp_path / "three.tar")
    assert path.read_bytes() == (GOLDEN / "three_docs_masked.tar").read_bytes()


def test_golden_members_extract_to_megatron_bin_and_mask(tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(
        ["tar", "-xf", str(GOLDEN / "three_docs_masked.tar"), "-C", str(out)], check=True
    )
    names = sorted(p.name for p in out.iterdir())
    assert names == ["three.bin", "three.idx", "three.json", "three.mask"]
    assert (out / "three.mask").read_bytes() == bytes(sum(THREE_MASKS, []))
    assert (out / "three.idx").read_bytes() == (GOLDEN / "three_docs_uint16.idx").read_bytes()
    meta = json.loads((out / "three.json").read_bytes())
    assert meta["mask"]["member"] == "three.mask" and meta["mask"]["trained_tokens"] == 4


def _write(folder: Path, docs, masks, level=3, frame_size=16, sft=None, shard_size=64) -> Manifest:
    with DatasetWriter(
        folder,
        vocab_size=1000,
        masks=True,
        sft=sft if sft is not None else {"template": "chat"},
        compression_level=level,
        frame_size=frame_size,
        shard_size=shard_size,
    ) as writer:
        for doc, mask in zip(docs, masks):
            writer.add(doc, mask=mask)
    return load_manifest(folder)


def _docs(n=30, seed=0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 1000, rng.integers(0, 20)) for _ in range(n)]
    return docs, [rng.integers(0, 2, len(d)).astype(bool) for d in docs]


def _all_paths(folder: Path, manifest: Manifest):
    """(tokens, mask) pairs of the whole dataset through each read path."""
    source = DatasetSource(folder)
    paths = {"random": [], "stream": [], "source_stream": [], "source_random": []}
    for entry in manifest.shards:
        path = folder / entry.file
        paths["random"] += list(ShardReader(path).documents(with_masks=True))
        reader = ShardReader(path)
        assert all(
            np.array_equal(reader.document_mask(i), m)
            for i, (_, m) in enumerate(reader.documents(with_masks=True))
        )
        with open(path, "rb") as raw:
            stream = ShardStreamReader(raw, str(path), mask_source=PathSource(path))
            paths["stream"] += list(stream.documents(with_masks=True))
        stream, fileobj = source.open_stream(entry.file, with_masks=True)
        with fileobj:
            paths["source_stream"] += list(stream.documents(with_masks=True))
        paths["source_random"] += list(source.open_random(entry.file).documents(with_masks=True))
    return paths


@pytest.mark.parametrize("level", [None, 3])
def test_masks_round_trip_through_every_read_path(tmp_path, level):
    docs, masks = _docs()
    manifest = _write(tmp_path, docs, masks, level=level)
    assert len(manifest.shards) > 1
    assert manifest.trained_tokens == sum(int(m.sum()) for m in masks)
    assert manifest.sft == {"template": "chat"}
    for name, pairs in _all_paths(tmp_path, manifest).items():
        assert len(pairs) == len(docs), name
        for (tokens, mask), doc, want in zip(pairs, docs, masks):
            assert tokens.tolist() == doc.tolist(), name
            assert mask.dtype == np.uint8 and mask.tolist() == want.astype(int).tolist(), name
    for entry in manifest.shards:
        assert verify_shard(lambda e=entry: open(tmp_path / e.file, "rb"), "s", entry, manifest).ok  # noqa: SIM115


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), max_size=25),
    frame_size=st.integers(1, 64),
    level=st.sampled_from([None, 1]),
    seed=st.integers(0, 1000),
)
def test_masks_round_trip_property(tmp_path_factory, sizes, frame_size, level, seed):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 1000, n) for n in sizes]
    masks = [rng.integers(0, 2, n).astype(np.uint8) for n in sizes]
    folder = tmp_path_factory.mktemp("p")
    manifest = _write(folder, docs, masks, level=level, frame_size=frame_size, shard_size=100)
    for name, pairs in _all_paths(folder, manifest).items():
        got = [(t.tolist(), m.tolist()) for t, m in pairs]
        assert got == [(d.tolist(), m.tolist()) for d, m in zip(docs, masks)], name


def test_add_frames_with_raw_masks(tmp_path):
    docs, masks = _docs(12, seed=3)
    tokens = np.concatenate(docs).astype(np.uint16)
    sizes = np.array([len(d) for d in docs])
    import io

    out = io.BytesIO()
    fb = FrameBuilder(16, 3, out)
    fb.add(tokens, sizes)
    with DatasetWriter(tmp_path / "a", vocab_size=1000, masks=True, frame_size=16) as w:
        w.add_frames(tokens, sizes, fb.finish(), out.getvalue(), masks=np.concatenate(masks))
    _write(tmp_path / "b", docs, masks, frame_size=16, sft={}, shard_size=64 << 20)
    a = (tmp_path / "a" / "shard-000000.tar").read_bytes()
    assert a == (tmp_path / "b" / "shard-000000.tar").read_bytes()


def test_masked_and_unmasked_do_not_mix(tmp_path):
    with pytest.raises(ValueError, match="masks=True"):
        DatasetWriter(tmp_path / "a", vocab_size=10).add([1], mask=[1])
    with pytest.raises(ValueError, match="needs a mask"):
        DatasetWriter(tmp_path / "b", vocab_size=10, masks=True).add([1])
    with pytest.raises(ValueError, match="0 or 1"):
        DatasetWriter(tmp_path / "c", vocab_size=10, masks=True).add([1], mask=[2])
    with pytest.raises(ValueError, match="one 0/1 per token"):
        DatasetWriter(tmp_path / "d", vocab_size=10, masks=True).add([1, 2], mask=[1])
    with pytest.raises(ValueError, match="sft"):
        DatasetWriter(tmp_path / "e", vocab_size=10, sft={"x": 1})


def test_unmasked_shards_have_no_mask(tmp_path):
    with DatasetWriter(tmp_path, vocab_size=10) as w:
        w.add([1, 2])
    manifest = load_manifest(tmp_path)
    assert manifest.sft is None and manifest.trained_tokens is None
    assert b"trained_tokens" not in (tmp_path / "index.json").read_bytes()
    reader = ShardReader(tmp_path / manifest.shards[0].file)
    assert reader.meta.mask is None
    with pytest.raises(ValueError, match="no loss masks"):
        reader.document_mask(0)


@pytest.mark.parametrize("level", [None, 3])
def test_verify_catches_a_flipped_mask_byte(tmp_path, level):
    docs, masks = _docs(8, seed=1)
    manifest = _write(tmp_path, docs, masks, level=level, shard_size=1 << 20)
    entry = manifest.shards[0]
    path = tmp_path / entry.file
    reader = ShardReader(path)
    header_end = reader._mask.header.data_offset
    data = bytearray(path.read_bytes())
    data[header_end + 1] ^= 1 if level is None else 0x40
    path.write_bytes(bytes(data))
    report = verify_shard(lambda: open(path, "rb"), str(path), entry, manifest)  # noqa: SIM115
    assert not report.ok
    assert ".mask" in report.error and "shard-000000.tar" in report.error
    with pytest.raises(CorruptShardError, match=r"\.mask"):
        list(ShardReader(path).documents(with_masks=True))


def test_mask_value_other_than_0_1_is_corrupt(tmp_path):
    docs, masks = _docs(4, seed=2)
    manifest = _write(tmp_path, docs, masks, level=None, shard_size=1 << 20)
    path = tmp_path / manifest.shards[0].file
    reader = ShardReader(path)
    frame = reader.meta.frames[0]
    raw = bytearray(masks[0].astype(np.uint8).tobytes())
    assert raw and frame.first_document == 0
    data = bytearray(path.read_bytes())
    data[reader._mask.header.data_offset] = 2  # crc32 then fails first: it must fail either way
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="mask"):
        ShardReader(path).document_mask(0)


def test_manifest_validation_of_mask_fields(tmp_path):
    docs, masks = _docs(5)
    _write(tmp_path, docs, masks, shard_size=1 << 20)
    doc = json.loads((tmp_path / "index.json").read_bytes())
    for change, match in (
        (lambda d: d.update(trained_tokens=d["trained_tokens"] + 1), "add up"),
        (lambda d: d["shards"][0].update(trained_tokens=-1), "trained_tokens"),
        (lambda d: d["shards"][0].update(trained_tokens=True), "trained_tokens"),
        (lambda d: d.pop("sft"), "all present or all absent"),
        (lambda d: d.update(sft=[1]), "sft"),
        (lambda d: d["shards"][0].update(trained_tokens=10**9), "trained tokens of"),
    ):
        bad = json.loads(json.dumps(doc))
        change(bad)
        with pytest.raises(CorruptShardError, match=match):
            Manifest.from_bytes(json.dumps(bad).encode(), "index.json")


def test_inspect_shows_trained_share(tmp_path):
    docs, masks = _docs(10)
    manifest = _write(tmp_path, docs, masks)
    share = round(100 * manifest.trained_tokens / manifest.num_tokens, 2)
    run = [sys.executable, "-m", "shardtok", "inspect"]
    text = subprocess.run([*run, str(tmp_path)], capture_output=True, text=True, check=True)
    assert f"trained tokens  {manifest.trained_tokens:,} ({share}%)" in text.stdout
    out = subprocess.run(
        [*run, "--json", str(tmp_path)], capture_output=True, text=True, check=True
    )
    summary = json.loads(out.stdout)
    assert summary["trained_tokens"] == manifest.trained_tokens
    assert summary["trained_percent"] == share and summary["sft"] == {"template": "chat"}
    shard = tmp_path / manifest.shards[0].file
    out = subprocess.run([*run, "--json", str(shard)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["trained_tokens"] == manifest.shards[0].trained_tokens


def test_export_mask_is_read_by_megatron_core(tmp_path):
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    docs, masks = _docs(20, seed=5)
    docs = [d for d in docs if len(d)]  # megatron-core's reader does not take empty sequences
    masks = [m for m in masks if len(m)]
    _write(tmp_path / "d", docs, masks)
    prefix = tmp_path / "out" / "corpus"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "shardtok",
            "export-megatron",
            "--mask",
            str(tmp_path / "d"),
            str(prefix),
        ],
        check=True,
        capture_output=True,
    )
    tokens = indexed.IndexedDataset(str(prefix))
    mask_ds = indexed.IndexedDataset(f"{prefix}_mask")
    assert (Path(f"{prefix}_mask.idx").read_bytes())[17] == 1
    assert len(mask_ds) == len(tokens) == len(docs)
    assert np.array_equal(mask_ds.sequence_lengths, tokens.sequence_lengths)
    for i, (doc, mask) in enumerate(zip(docs, masks)):
        assert tokens[i].tolist() == doc.tolist()
        assert mask_ds[i].dtype == np.uint8 and mask_ds[i].tolist() == mask.astype(int).tolist()


def test_export_mask_refused_without_masks(tmp_path):
    with DatasetWriter(tmp_path, vocab_size=10) as w:
        w.add([1, 2])
    with pytest.raises(ValueError, match="no loss masks"):
        export_megatron(tmp_path, tmp_path / "x", masks=True)


def test_mask_header_claiming_more_than_the_frame_table_is_refused_unread(tmp_path):
    from shardtok.format.tar import encode_header

    docs, masks = _docs(6, seed=4)
    manifest = _write(tmp_path, docs, masks, shard_size=1 << 20)
    path = tmp_path / manifest.shards[0].file
    reader = ShardReader(path)
    at = reader._mask.header.header_offset
    data = bytearray(path.read_bytes())
    data[at : at + 512] = encode_header(reader.meta.mask.member, (1 << 33) - 1)
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptShardError, match="mask frame table says"):
        ShardReader(path)
    with open(path, "rb") as raw:
        stream = ShardStreamReader(raw, str(path), mask_source=PathSource(path))
        with pytest.raises(CorruptShardError, match="mask frame table says"):
            next(stream.documents(with_masks=True))
    report = verify_shard(lambda: open(path, "rb"), str(path), manifest.shards[0], manifest)  # noqa: SIM115
    assert not report.ok and "mask frame table says" in report.error
