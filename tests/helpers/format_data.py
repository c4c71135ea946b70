"""Small builders for format tests (imported by several test modules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardtok.format import DatasetWriter, Manifest


def random_documents(
    seed: int, count: int, vocab_size: int, mean_log_len: float = 4.0
) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.lognormal(mean_log_len, 1.0, size=count).astype(np.int64)
    return [rng.integers(0, vocab_size, size=int(n)) for n in lengths]


def write_dataset(folder: Path, documents, vocab_size: int, **options) -> Manifest:
    with DatasetWriter(folder, vocab_size=vocab_size, **options) as writer:
        for i, doc in enumerate(documents):
            writer.add(doc, provenance=("input.jsonl", i))
    from shardtok.format import load_manifest

    return load_manifest(folder)
