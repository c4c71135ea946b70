"""Build a real megatron-core 0.16.1 GPTDataset on CPU, to compare shardtok's index math against."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from megatron.core.datasets.utils import Split


class MinimalTokenizer:
    """What GPTDatasetConfig needs from a tokenizer: a vocab size, an EOD id and an identity for
    Megatron's cache key. No pad id: Megatron then pads with -1, which never occurs here."""

    vocab_size = 1000
    eod = 0
    unique_identifiers = {"class": "MinimalTokenizer"}


def random_sizes(seed: int, num_documents: int, max_len: int = 60) -> np.ndarray:
    """Document lengths, including a few empty documents (Megatron allows them)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_len, size=num_documents).astype(np.int32)
    sizes[rng.choice(num_documents, size=max(1, num_documents // 20), replace=False)] = 0
    return sizes


def write_megatron_pair(prefix: Path, sizes: np.ndarray, seed: int = 0) -> np.ndarray:
    """Write ``prefix.bin/.idx`` with Megatron's own builder; returns all tokens end to end."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, MinimalTokenizer.vocab_size, size=int(sizes.sum())).astype(np.uint16)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    start = 0
    for size in sizes:
        builder.add_item(torch.from_numpy(tokens[start : start + size].astype(np.int64)))
        builder.end_document()
        start += int(size)
    builder.finalize(f"{prefix}.idx")
    return tokens


def megatron_gpt_dataset(
    prefix: Path,
    cache: Path,
    seq_length: int,
    num_samples: int | None,
    seed: int,
    documents: np.ndarray,
    split: Split = Split.train,
    drop_last_partial_validation_sequence: bool = True,
) -> GPTDataset:
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=([str(prefix)], None),
        split="1,1,1",
        tokenizer=MinimalTokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        path_to_cache=str(cache),
        drop_last_partial_validation_sequence=drop_last_partial_validation_sequence,
    )
    indexed = IndexedDataset(str(prefix))
    return GPTDataset(indexed, str(prefix), documents.astype(np.int32), num_samples, split, config)


def megatron_sample(dataset: GPTDataset, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample i as shardtok returns it (tokens + the last label) and Megatron's document ids."""
    item = dataset[i]
    text = torch.cat([item["tokens"], item["labels"][-1:]]).numpy()
    _, document_ids = dataset._query_document_sample_shuffle_indices(i)
    return text, document_ids
