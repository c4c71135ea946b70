"""Golden bytes: the reference notes' three-document example, and the deterministic shard layout."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import numpy as np
import pytest

from shardtok.format.mmidx import decode_idx, dtype_for_vocab, encode_idx
from shardtok.format.shard_reader import ShardReader
from shardtok.format.shard_writer import ShardBuilder
from shardtok.format.tar import encode_header
from shardtok.storage import open_source

GOLDEN = Path(__file__).parent / "golden"
# Reference note 000: documents [a,b,c], [d,e,f,g], [h,i]; here a..i are token ids 1..9.
THREE_DOCS = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("dtype", ["uint16", "int32"])
def test_three_document_idx_is_byte_identical_to_megatron(dtype):
    # The golden .idx files were written by megatron-core 0.16.1's IndexedDatasetBuilder.
    golden = (GOLDEN / f"three_docs_{dtype}.idx").read_bytes()
    assert encode_idx(np.array([3, 4, 2]), np.dtype(dtype)) == golden
    index = decode_idx(golden, "golden")
    assert index.sizes.tolist() == [3, 4, 2]
    assert index.doc_idx.tolist() == [0, 1, 2, 3]
    itemsize = np.dtype(dtype).itemsize
    assert index.pointers.tolist() == [0, 3 * itemsize, 7 * itemsize]
    assert golden[:9] == b"MMIDIDX\x00\x00"
    assert golden[17] == {"uint16": 8, "int32": 4}[dtype]


def test_dtype_boundary():
    assert dtype_for_vocab(65500) == np.uint16
    assert dtype_for_vocab(65501) == np.int32
    assert dtype_for_vocab(128256) == np.int32


def test_ustar_header_is_pinned():
    header = encode_header("x.json", 5)
    assert len(header) == 512
    assert header[:6] == b"x.json"
    assert header[100:108] == b"0000644\0"
    assert header[124:136] == b"00000000005\0"
    assert header[136:148] == b"00000000000\0"
    assert header[148:156] == b"%06o\0 " % (sum(header[:148]) + 256 + sum(header[156:]))
    assert header[257:265] == b"ustar\x0000"
    info = tarfile.TarInfo.frombuf(header, "ascii", "strict")
    assert (info.name, info.size, info.mtime, info.uid, info.gid, info.mode) == (
        "x.json",
        5,
        0,
        0,
        0,
        0o644,
    )


def _build_three(tmp_path: Path, level) -> Path:
    builder = ShardBuilder(
        "three",
        np.dtype(np.uint16),
        10,
        level,
        tokenizer={"name": "letters", "fingerprint": "sha256:none", "eos_id": None, "bos_id": None},
    )
    for i, doc in enumerate(THREE_DOCS):
        builder.add(np.array(doc), ("letters.txt", i))
    path = tmp_path / f"three-{level}.tar"
    builder.write(path)
    return path


def test_uncompressed_shard_is_byte_identical_to_golden(tmp_path):
    path = _build_three(tmp_path, None)
    assert path.read_bytes() == (GOLDEN / "three_docs_uncompressed.tar").read_bytes()
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["three.json", "three.idx", "three.bin"]
        assert (
            tar.extractfile("three.idx").read() == (GOLDEN / "three_docs_uint16.idx").read_bytes()
        )
        assert (
            tar.extractfile("three.bin").read() == (GOLDEN / "three_docs_uint16.bin").read_bytes()
        )
        for member in tar.getmembers():
            assert (member.mtime, member.uid, member.gid, member.mode, member.pax_headers) == (
                0,
                0,
                0,
                0o644,
                {},
            )
    reader = ShardReader(open_source(path))
    assert [d.tolist() for d in reader.documents()] == THREE_DOCS
    assert reader.memmap_tokens().tolist() == sum(THREE_DOCS, [])


def test_same_documents_same_bytes(tmp_path):
    digests = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        digests.append(hashlib.sha256(_build_three(tmp_path / run, 3).read_bytes()).hexdigest())
    assert digests[0] == digests[1]
