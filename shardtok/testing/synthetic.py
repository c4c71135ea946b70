"""Synthetic token datasets for tests, benchmarks and demos (real, valid shardtok datasets).

Document lengths are log-normal (mean ``mean_length``), token ids Zipf-distributed like text
(so zstd sees realistic redundancy), every document ends with ``eos_id``. With
``unique_tokens`` every token id is its global position instead, so coverage checks can tell
exactly which tokens a stream produced.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shardtok.format.dataset_writer import DEFAULT_SHARD_SIZE, DatasetWriter
from shardtok.format.frames import DEFAULT_COMPRESSION_LEVEL, DEFAULT_FRAME_SIZE
from shardtok.format.manifest import Manifest

SYNTHETIC_TOKENIZER = {"name": "synthetic", "fingerprint": None, "eos_id": 0, "bos_id": None}


def lognormal_lengths(rng: np.random.Generator, count: int, mean_length: float) -> np.ndarray:
    """Log-normal lengths (sigma 1) with the given mean, at least 1."""
    mu = np.log(mean_length) - 0.5  # mean of lognormal(mu, 1) is exp(mu + 1/2)
    return np.maximum(1, rng.lognormal(mu, 1.0, size=count)).astype(np.int64)


def write_synthetic_dataset(
    out_dir: str | Path,
    *,
    num_tokens: int | None = None,
    lengths: Sequence[int] | None = None,
    vocab_size: int = 128256,
    mean_length: float = 1000.0,
    seed: int = 0,
    unique_tokens: bool = False,
    eos_id: int = 0,
    shard_size: int = DEFAULT_SHARD_SIZE,
    frame_size: int = DEFAULT_FRAME_SIZE,
    compression_level: int | None = DEFAULT_COMPRESSION_LEVEL,
    name: str = "shard",
    first_token: int = 0,
) -> Manifest:
    """Write a dataset of about `num_tokens` tokens (or of documents with exactly `lengths`).

    With `unique_tokens`, token ids count up from `first_token`.
    """
    if (num_tokens is None) == (lengths is None):
        raise ValueError("give num_tokens or lengths")
    rng = np.random.default_rng(seed)
    if unique_tokens and lengths is None:
        raise ValueError("unique_tokens needs explicit lengths")
    tokenizer = dict(SYNTHETIC_TOKENIZER, eos_id=None if unique_tokens else eos_id)
    written = first_token if unique_tokens else 0
    with DatasetWriter(
        out_dir,
        vocab_size=vocab_size,
        tokenizer=tokenizer,
        name=name,
        shard_size=shard_size,
        frame_size=frame_size,
        compression_level=compression_level,
    ) as writer:
        if lengths is not None:
            for i, n in enumerate(lengths):
                if unique_tokens:
                    doc = np.arange(written, written + n) % vocab_size
                else:
                    doc = _text_like(rng, int(n), vocab_size, eos_id)
                writer.add(doc, provenance=("synthetic", i))
                written += int(n)
            return writer.close(extra={"synthetic": {"seed": seed}})
        record = 0
        assert num_tokens is not None
        while written < num_tokens:
            block = lognormal_lengths(rng, 4096, mean_length)
            tokens = _text_like(rng, int(block.sum()), vocab_size, eos_id)
            ends = np.cumsum(block)
            tokens[ends - 1] = eos_id
            for start, end in zip(ends - block, ends):
                writer.add(tokens[start:end], provenance=("synthetic", record))
                record += 1
                written += int(end - start)
                if written >= num_tokens:
                    break
        return writer.close(extra={"synthetic": {"seed": seed, "mean_length": mean_length}})


def _text_like(rng: np.random.Generator, n: int, vocab_size: int, eos_id: int) -> np.ndarray:
    """n Zipf-distributed ids that avoid `eos_id`, the last one being `eos_id`."""
    ids = rng.zipf(1.2, size=n) % (vocab_size - 1)
    tokens = np.where(ids >= eos_id, ids + 1, ids)  # skip the EOS id
    if n:
        tokens[-1] = eos_id
    return tokens
