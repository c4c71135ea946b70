"""Reading a dataset every way that serves tokens, for the adversarial tests."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np

from shardtok.dataset.source import DatasetSource
from shardtok.format.compact_manifest import COMPACT_NAME
from shardtok.format.manifest import MANIFEST_NAME, Manifest
from shardtok.format.mmidx import token_dtype
from shardtok.format.shard_entry import ShardEntry
from shardtok.stream.nodes.reader import SliceReader
from shardtok.stream.plan import Piece


def stream_tokens(path) -> list[list[int]]:
    """Every document through the stream path (SliceReader over DatasetSource)."""
    source = DatasetSource(path)
    pieces = [
        Piece(n, e.file, 0, e.num_tokens)
        for n, e in enumerate(source.manifest.shards)
        if e.num_tokens > 0
    ]
    reader = SliceReader(source, pieces, interleave=1)
    reader.reset(None)
    return [np.asarray(d).tolist() for d in reader]


def random_tokens(path) -> list[list[int]]:
    """Every document through ShardReader, opened by DatasetSource.open_random."""
    source = DatasetSource(path)
    out = []
    for entry in source.manifest.shards:
        out += [d.tolist() for d in source.open_random(entry.file).documents()]
    return out


# The two kinds of dataset a hostile or old manifest comes in: as an earlier release wrote it
# (index.json alone), and published through this release's writer (index.compact beside
# index.json, both telling the same story). A test of a manifest-level defence runs on both.
KINDS = ["index.json", "both"]


def republish(folder, edit, kind: str) -> None:
    """Rewrite dataset `folder`'s manifest as `edit(doc)` (index.json's dict, edited in place)
    says, as a dataset of `kind` (``KINDS``). For "both" the edited manifest goes through
    ``Manifest.write`` unvalidated (``Manifest.from_bytes`` would refuse some lies), so
    index.compact encodes the same fields, counts and file names."""
    folder = Path(folder)
    doc = json.loads((folder / MANIFEST_NAME).read_text())
    edit(doc)
    if kind == "index.json":
        (folder / COMPACT_NAME).unlink()
        (folder / MANIFEST_NAME).write_text(json.dumps(doc))
        return
    assert kind == "both", kind
    shards = tuple(
        ShardEntry(
            s["file"],
            s["bytes"],
            s["num_documents"],
            s["num_tokens"],
            s["sha256"],
            s.get("meta_sha256"),
            s.get("trained_tokens"),
        )  # fmt: skip
        for s in doc["shards"]
    )
    Manifest(
        name=doc["name"],
        dtype=token_dtype(doc["dtype"]),
        vocab_size=doc["vocab_size"],
        tokenizer=doc["tokenizer"],
        shards=shards,
        extra=doc.get("extra") or {},
        sft=doc.get("sft"),
    ).write(folder)
    assert (folder / COMPACT_NAME).exists()  # what DatasetSource reads first


def peak_while(fn) -> int:
    """Peak bytes Python allocated while `fn` ran (tracemalloc): what a bomb made us allocate."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak
