"""Fuzzing damaged datasets: whatever is changed in the manifest or in a shard's bytes, reading
gives a ShardtokError or exactly the tokens of the undamaged dataset, never anything else.

Every path that serves tokens is read: the stream (SliceReader over DatasetSource), ShardReader
(DatasetSource.open_random) and, for uncompressed shards, the memmap path.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardtok.errors import ShardtokError
from shardtok.format import ShardReader
from shardtok.format.manifest import MANIFEST_NAME
from shardtok.memmap.tokens import open_local_tokens
from tests.adversarial.helpers import random_tokens, stream_tokens
from tests.helpers.format_data import random_documents, write_dataset

FUZZ = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is never a fluke
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module", params=[3, None], ids=["zstd", "uncompressed"])
def clean(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean") / "ds"
    docs = random_documents(5, 40, 3000, mean_log_len=3.0)
    write_dataset(
        folder, docs, 3000, compression_level=request.param, frame_size=256, shard_size=600
    )
    tokens = [d.tolist() for d in docs]
    assert stream_tokens(folder) == tokens and random_tokens(folder) == tokens
    return folder, tokens, request.param is None


def _regions(path: Path) -> dict[str, tuple[int, int]]:
    """Byte ranges of a shard worth aiming at: headers, json, idx, frames, the archive end."""
    head = ShardReader(path).head
    json_end = 512 + len(head.meta.to_json_bytes())
    idx_header = -(-json_end // 512) * 512
    bin_header = head.bin_header
    return {
        "json header": (0, 512),
        "json": (512, json_end),
        "idx header": (idx_header, idx_header + 512),
        "idx": (idx_header + 512, bin_header.header_offset),
        "bin header": (bin_header.header_offset, bin_header.data_offset),
        "frames": (bin_header.data_offset, bin_header.data_offset + bin_header.size),
        "end": (bin_header.data_offset + bin_header.size, path.stat().st_size),
    }


def _check_reads(folder: Path, tokens, uncompressed: bool) -> None:
    readers = [stream_tokens, random_tokens]
    if uncompressed:
        readers.append(_memmap_tokens)
    for read in readers:
        try:
            got = read(folder)
        except ShardtokError:
            continue
        assert got == tokens, f"{read.__name__} served other tokens"


def _memmap_tokens(folder: Path):
    flat, sizes = open_local_tokens(folder)
    ends = np.cumsum(sizes)
    return [flat[int(e - n) : int(e)].tolist() for e, n in zip(ends, sizes)]


VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 65536, 65500, 1e3, 0.5, True, None]),
    st.text(max_size=12),
    st.sampled_from(["../x.tar", "/etc/passwd", "s3://b/k", "shard-000000.tar", "int32", "a" * 64]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
TOP_KEYS = ["dtype", "vocab_size", "tokenizer", "num_documents", "num_tokens", "shards", "name"]
SHARD_KEYS = ["file", "bytes", "num_documents", "num_tokens", "sha256", "meta_sha256"]


@FUZZ
@given(data=st.data())
def test_manifest_mutations(clean, data):
    folder, tokens, uncompressed = clean
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "ds"
        shutil.copytree(folder, work)
        doc = json.loads((work / MANIFEST_NAME).read_text())
        for _ in range(data.draw(st.integers(1, 3))):
            shards = doc.get("shards")
            entries = [e for e in shards if isinstance(e, dict)] if isinstance(shards, list) else []
            if not entries or data.draw(st.booleans()):
                target, key = doc, data.draw(st.sampled_from(TOP_KEYS))
            else:
                target = data.draw(st.sampled_from(entries))
                key = data.draw(st.sampled_from(SHARD_KEYS))
            if data.draw(st.integers(0, 5)) == 0:
                target.pop(key, None)
            else:
                target[key] = data.draw(VALUES)
        raw = json.dumps(doc).encode()
        if data.draw(st.integers(0, 3)) == 0:  # and sometimes a byte of the text itself
            at = data.draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1 :]
        (work / MANIFEST_NAME).write_bytes(raw)
        _check_reads(work, tokens, uncompressed)


@FUZZ
@given(data=st.data())
def test_shard_byte_mutations(clean, data):
    folder, tokens, uncompressed = clean
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "ds"
        shutil.copytree(folder, work)
        shards = sorted(work.glob("*.tar"))
        path = data.draw(st.sampled_from(shards))
        regions = _regions(path)
        raw = bytearray(path.read_bytes())
        for _ in range(data.draw(st.integers(1, 3))):
            lo, hi = regions[data.draw(st.sampled_from(sorted(regions)))]
            hi = min(hi, len(raw))  # an earlier truncation may have cut the region
            if hi <= lo:
                continue
            at = data.draw(st.integers(lo, hi - 1))
            kind = data.draw(st.sampled_from(["flip", "byte", "digit", "truncate"]))
            if kind == "flip":
                raw[at] ^= 1 << data.draw(st.integers(0, 7))
            elif kind == "byte":
                raw[at] = data.draw(st.integers(0, 255))
            elif kind == "digit":  # a plausible octal digit: sizes in tar headers
                raw[at] = data.draw(st.sampled_from(b"01234567"))
            else:
                del raw[at:]
        if data.draw(st.booleans()) and len(shards) > 1:  # sometimes also another shard's bytes
            other = data.draw(st.sampled_from([s for s in shards if s != path]))
            raw = bytearray(other.read_bytes()) if data.draw(st.booleans()) else raw
        path.write_bytes(bytes(raw))
        _check_reads(work, tokens, uncompressed)
