"""Conformance with the real thing: megatron-core 0.16.1 reads what we write and we read what it writes."""

from __future__ import annotations

import subprocess
import warnings

import numpy as np
import pytest

from shardtok.cli import main
from shardtok.format import MegatronPair, encode_idx, load_manifest
from shardtok.format.megatron_io import iter_dataset_documents
from tests.helpers.format_data import random_documents, write_dataset

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def megatron_build(prefix, documents, dtype):
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        builder.add_item(torch.from_numpy(np.asarray(doc, dtype=np.int64)))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def assert_megatron_reads(prefix, documents):
    dataset = IndexedDataset(str(prefix), mmap=True)
    assert len(dataset) == len(documents)
    for i, doc in enumerate(documents):
        np.testing.assert_array_equal(dataset[i], doc)


@pytest.mark.parametrize("vocab_size", [50_000, 128_256])
def test_builder_bytes_equal_ours(tmp_path, vocab_size):
    docs = random_documents(1, 300, vocab_size) + [
        np.array([], dtype=np.int64),
        np.array([vocab_size - 1]),
    ]
    dtype = np.uint16 if vocab_size <= 65500 else np.int32
    megatron_build(tmp_path / "m", docs, dtype)
    sizes = np.array([len(d) for d in docs])
    assert encode_idx(sizes, np.dtype(dtype)) == (tmp_path / "m.idx").read_bytes()


@pytest.mark.parametrize("vocab_size", [50_000, 128_256])
def test_export_import_and_extracted_shard_are_read_by_megatron(tmp_path, vocab_size):
    docs = random_documents(2, 400, vocab_size, mean_log_len=5.0)
    dtype = np.uint16 if vocab_size <= 65500 else np.int32
    write_dataset(tmp_path / "ds", docs, vocab_size, shard_size=64 << 10, frame_size=16 << 10)
    assert len(load_manifest(tmp_path / "ds").shards) > 1

    # export-megatron: one merged pair, byte-identical to megatron's builder, readable by megatron.
    assert main(["export-megatron", str(tmp_path / "ds"), str(tmp_path / "exported")]) == 0
    megatron_build(tmp_path / "reference", docs, dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"exported{ext}").read_bytes() == (
            tmp_path / f"reference{ext}"
        ).read_bytes()
    assert_megatron_reads(tmp_path / "exported", docs)

    # tar -x then zstd -d turns a shard into a pair megatron reads unchanged.
    manifest = load_manifest(tmp_path / "ds")
    first = manifest.shards[0]
    extract = tmp_path / "extract"
    extract.mkdir()
    subprocess.run(
        ["tar", "-xf", str(tmp_path / "ds" / first.file), "-C", str(extract)], check=True
    )
    key = first.file.removesuffix(".tar")
    subprocess.run(["zstd", "-d", "-q", str(extract / f"{key}.bin.zst")], check=True)
    assert_megatron_reads(extract / key, docs[: first.num_documents])

    # import-megatron reads what megatron's builder wrote.
    assert (
        main(
            [
                "import-megatron",
                str(tmp_path / "reference"),
                str(tmp_path / "imported"),
                "--vocab-size",
                str(vocab_size),
            ]
        )
        == 0
    )
    imported = list(iter_dataset_documents(tmp_path / "imported"))
    assert len(imported) == len(docs)
    assert all(np.array_equal(a, b) for a, b in zip(imported, docs))
    assert load_manifest(tmp_path / "imported").dtype == dtype


def test_megatron_pair_reader_matches_megatron(tmp_path):
    docs = random_documents(3, 100, 1000)
    megatron_build(tmp_path / "m", docs, np.uint16)
    pair = MegatronPair(tmp_path / "m")
    assert len(pair) == len(docs)
    assert all(np.array_equal(pair[i], d) for i, d in enumerate(docs))
